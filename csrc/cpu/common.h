// Helpers shared by the CPU adapters (tensor checks, OpenMP thread count).
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "specdec/common.h"

namespace specdec::cpu {

// OpenMP team size: follow torch.set_num_threads, and stay serial for small work (thread start-up ~ microseconds).
inline int omp_threads(int64_t rows, int64_t work) {
  if (rows < 2 || work < (1 << 18)) return 1;
  const int64_t t = at::get_num_threads();
  return static_cast<int>(t < rows ? t : rows);
}

inline void check_cpu(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), "specdec cpu backend: ", name, " must be a CPU tensor, got ", t.device());
}

inline at::Tensor as_long(const at::Tensor& t, const char* name) {
  check_cpu(t, name);
  TORCH_CHECK(!at::isFloatingType(t.scalar_type()) && t.scalar_type() != at::kBool, name,
              " must be an integer tensor, got ", t.scalar_type());
  return t.to(at::kLong).contiguous();
}

// fp16/bf16 -> fp32 with torch's vectorised conversion (exact), so the kernels only see float or double.
inline at::Tensor widen(const at::Tensor& t) {
  const at::ScalarType st = t.scalar_type();
  return (st == at::kHalf || st == at::kBFloat16) ? t.to(at::kFloat).contiguous() : t.contiguous();
}

inline at::Tensor as_bool(const at::Tensor& t, const char* name) {
  check_cpu(t, name);
  TORCH_CHECK(t.scalar_type() == at::kBool, name, " must be a bool tensor, got ", t.scalar_type());
  return t.contiguous();
}

// Round keys of Philox-4x32-10 for a seed, precomputed so that the rounds below vectorise.
struct PhiloxKeys {
  uint32_t a[10], b[10];
  explicit PhiloxKeys(uint64_t seed) {
    a[0] = static_cast<uint32_t>(seed);
    b[0] = static_cast<uint32_t>(seed >> 32);
    for (int r = 1; r < 10; ++r) {
      a[r] = a[r - 1] + 0x9E3779B9u;
      b[r] = b[r - 1] + 0xBB67AE85u;
    }
  }
};

// The 10 rounds of philox4x32_10 (common.h) on scalars, branch-free: loops over counters vectorise (AVX2/AVX-512
// 32x32->64 multiplies).
inline void philox_rounds(uint32_t& c0, uint32_t& c1, uint32_t& c2, uint32_t& c3, const PhiloxKeys& k) {
  for (int r = 0; r < 10; ++r) {
    const uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * c0;
    const uint64_t p1 = static_cast<uint64_t>(0xCD9E8D57u) * c2;
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k.a[r];
    const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k.b[r];
    c1 = static_cast<uint32_t>(p1);
    c3 = static_cast<uint32_t>(p0);
    c0 = n0;
    c2 = n2;
  }
}

// philox_u52 (common.h) with the integer->double conversion by the 2^52 bit trick (exact for m < 2^52), which
// vectorises without AVX-512DQ: (m + 0.5) 2^-52 = (2m + 1) 2^-53.
inline double philox_u52_bits(uint32_t a, uint32_t b) {
  const uint64_t bits = ((static_cast<uint64_t>(a >> 12) << 32) | b) | 0x4330000000000000ull;  // the double 2^52 + m
  double d;
  std::memcpy(&d, &bits, sizeof d);
  return (d - 4503599627370496.0 + 0.5) * 2.220446049250313e-16;
}

// Philox uniforms (stream (seed, purpose), row `row`) for elements [lo, hi) of the row, lo even: one Philox call
// per element pair.
inline void philox_fill_span(double* out, int64_t lo, int64_t hi, uint64_t seed, uint32_t purpose, uint64_t row) {
  const PhiloxKeys keys(seed);
  const uint32_t r0 = static_cast<uint32_t>(row), r1 = static_cast<uint32_t>(row >> 32);
  const int64_t j0 = lo / 2, full = (hi - lo) / 2;  // pairs that lie entirely in [lo, hi)
  double* o = out + lo;
#pragma omp simd
  for (int64_t t = 0; t < full; ++t) {
    uint32_t c0 = static_cast<uint32_t>(j0 + t), c1 = r0, c2 = r1, c3 = purpose;
    philox_rounds(c0, c1, c2, c3, keys);
    o[2 * t] = philox_u52_bits(c0, c1);
    o[2 * t + 1] = philox_u52_bits(c2, c3);
  }
  if (lo + 2 * full < hi) out[hi - 1] = philox_uniform(seed, purpose, row, static_cast<uint64_t>(hi - 1));  // odd tail
}

// Philox uniforms of one row where lp is finite; masked tokens (-inf) get 0.5, which never matters: their race
// score is -inf whatever the noise. Top-k/top-p laws and reduced-vocabulary drafts mask most of the vocabulary, so
// this draws a fraction of the row; dense rows fall back to the pairwise fill. idx: scratch. Returns the number m of
// finite entries when the row was sparse (idx[0..m) then lists them in increasing order; the masked entries are
// left unwritten unless fill_masked), -1 when it was filled densely.
template <typename T>
int64_t philox_fill_finite(double* out, const T* lp, int64_t n, uint64_t seed, uint32_t purpose, uint64_t row,
                           std::vector<int64_t>& idx, bool fill_masked = true) {
  idx.resize(n);
  int64_t m = 0;
  for (int64_t v = 0; v < n; ++v) {  // branch-free compaction
    idx[m] = v;
    m += static_cast<double>(lp[v]) != -INFINITY;
  }
  if (3 * m > n) {  // one Philox call per element below vs one per pair here
    philox_fill_span(out, 0, n, seed, purpose, row);
    return -1;
  }
  if (fill_masked) std::fill(out, out + n, 0.5);  // a caller that reads only idx[0..m) skips this write
  const PhiloxKeys keys(seed);
  const uint32_t r0 = static_cast<uint32_t>(row), r1 = static_cast<uint32_t>(row >> 32);
  const int64_t* ids = idx.data();
#pragma omp simd
  for (int64_t t = 0; t < m; ++t) {
    const int64_t v = ids[t];
    uint32_t c0 = static_cast<uint32_t>(v >> 1), c1 = r0, c2 = r1, c3 = purpose;
    philox_rounds(c0, c1, c2, c3, keys);
    out[v] = (v & 1) ? philox_u52_bits(c2, c3) : philox_u52_bits(c0, c1);
  }
  return m;
}

// Noise of one op call (docs/kernels.md): the caller's uniforms as contiguous float64 (test mode), or, when the
// argument is None, the Philox stream (seed, purpose) of specdec_kernels/_rng.py drawn here in parallel. `shape` is
// the shape the noise tensor would have; row r of the result is the flat leading index r.
inline at::Tensor noise_or_philox(const std::optional<at::Tensor>& noise, at::IntArrayRef shape, int64_t seed,
                                  NoisePurpose purpose, const char* name) {
  if (noise.has_value()) {
    check_cpu(*noise, name);
    TORCH_CHECK(noise->sizes() == shape, name, " must have shape ", shape, ", got ", noise->sizes());
    return noise->to(at::kDouble).contiguous();
  }
  TORCH_CHECK(seed >= 0, "seed must be >= 0, got ", seed);
  at::Tensor out = at::empty(shape, at::TensorOptions().dtype(at::kDouble));
  const int64_t n = shape.empty() ? 1 : shape.back();
  const int64_t rows = n ? out.numel() / n : 0;
  // blocks of up to 8192 elements (even) so that a few long rows still use every thread
  const int64_t block = 8192, per_row = (n + block - 1) / block, tasks = rows * per_row;
  double* o = out.mutable_data_ptr<double>();
#pragma omp parallel for num_threads(omp_threads(tasks, rows * n * 4)) schedule(static)
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t r = t / per_row, lo = (t % per_row) * block;
    philox_fill_span(o + r * n, lo, lo + block < n ? lo + block : n, static_cast<uint64_t>(seed), purpose,
                     static_cast<uint64_t>(r));
  }
  return out;
}

}  // namespace specdec::cpu
