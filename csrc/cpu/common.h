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
#include "specdec/sampling.h"

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
