// CPU adapter of skinny_linear (a draft model's decode-step projections); kernels in specdec/linear.h.
#include <ATen/ops/empty.h>

#include <algorithm>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "cpu/common.h"
#include "cpu/ops.h"
#include "specdec/linear.h"

#if defined(SPECDEC_LINEAR_AMX)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace specdec::cpu {

// Linux hands out the AMX tile state only to a process that asks for it (arch_prctl ARCH_REQ_XCOMP_PERM for
// XFEATURE_XTILEDATA); asked once, the answer holds for the process, so every call takes the same path.
bool amx_ready() {
#if defined(SPECDEC_LINEAR_AMX)
  static const bool ready = [] {
#if defined(__linux__) && defined(SYS_arch_prctl)
    constexpr int kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
#else
    return false;
#endif
  }();
  return ready;
#else
  return false;  // a build without the AMX kernels
#endif
}

#if defined(SPECDEC_LINEAR_AMX)
namespace {

// All rows, groups of up to kAmxRows: x packed per group, blocks of kAmxBlock outputs spread over the threads.
void skinny_linear_amx(const uint16_t* x, const uint16_t* w, int64_t n, int64_t in, int64_t out, uint16_t* y) {
  const int64_t in32 = in / 32 * 32, blocks = (out + kAmxBlock - 1) / kAmxBlock;
  std::vector<uint32_t> xp(static_cast<size_t>(in32 / 2 * kAmxRows));
  for (int64_t r0 = 0; r0 < n; r0 += kAmxRows) {
    const int nr = static_cast<int>(n - r0 < kAmxRows ? n - r0 : kAmxRows);
    amx_pack_rows(x, in, in32, r0, nr, xp.data());
#pragma omp parallel num_threads(omp_threads(blocks, nr * out * in))
    {
      std::vector<uint16_t> pad(out % 16 != 0 ? 16 * in : 0);
      amx_configure(nr);  // tile configuration is per thread
#pragma omp for schedule(static)
      for (int64_t b = 0; b < blocks; ++b) {
        const int64_t o0 = b * kAmxBlock, m = out - o0 < kAmxBlock ? out - o0 : kAmxBlock;
        skinny_block_bf16_amx(x, xp.data(), w, in, out, r0, nr, o0, m, pad.data(), y);
      }
      _tile_release();
    }
  }
}

}  // namespace
#endif

namespace {

// Blocks [0, blocks) of ``block`` outputs each, split over ``threads`` threads as schedule(static) splits them (one
// contiguous range per thread), each thread's range in one call fn(o_begin, o_end): its tiles then sweep the range
// without a call and a new prefetch run per block. Each output's sum is the same whichever range holds it.
template <typename F>
void over_thread_ranges(int64_t blocks, int64_t block, int64_t out, int threads, const F& fn) {
#ifdef _OPENMP
  if (threads <= 1) return fn(int64_t{0}, out);
#pragma omp parallel num_threads(threads)
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t b0 = blocks * t / nt, b1 = blocks * (t + 1) / nt;
    if (b0 < b1) fn(b0 * block, std::min(out, b1 * block));
  }
#else
  (void)blocks, (void)block, (void)threads;
  fn(int64_t{0}, out);
#endif
}

// The output [..., out] of a linear on x [..., in] (x's dtype and device) and its row count n, the product of x's
// leading dimensions (x.numel() / in fails for in = 0).
at::Tensor linear_output(const at::Tensor& x, int64_t out, int64_t& n) {
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  n = 1;
  for (size_t d = 0; d + 1 < shape.size(); ++d) n *= shape[d];
  shape.back() = out;
  return at::empty(shape, x.options());
}

}  // namespace

at::Tensor skinny_linear(const at::Tensor& x_in, const at::Tensor& weight_in) {
  check_cpu(x_in, "x");
  check_cpu(weight_in, "weight");
  TORCH_CHECK(weight_in.dim() == 2, "weight must be [out, in], got ", weight_in.sizes());
  TORCH_CHECK(x_in.dim() >= 1 && x_in.size(-1) == weight_in.size(1), "x must be [..., in=", weight_in.size(1),
              "], got ", x_in.sizes());
  TORCH_CHECK(x_in.scalar_type() == weight_in.scalar_type(), "x and weight must share a dtype, got ",
              x_in.scalar_type(), " and ", weight_in.scalar_type());
  const at::ScalarType st = x_in.scalar_type();
  TORCH_CHECK(at::isFloatingType(st), "x must be floating, got ", st);
  const int64_t in = weight_in.size(1), out = weight_in.size(0);
  if (st == at::kHalf) return skinny_linear(x_in.to(at::kFloat), weight_in.to(at::kFloat)).to(at::kHalf);
  const at::Tensor x = x_in.contiguous(), w = weight_in.contiguous();
  int64_t n = 0;
  at::Tensor y = linear_output(x, out, n);
  if (n == 0 || out == 0) return y;
  if (in == 0) return y.zero_();  // an empty sum
#if defined(SPECDEC_LINEAR_AMX)
  if (st == at::kBFloat16 && amx_ready()) {
    skinny_linear_amx(static_cast<const uint16_t*>(x.const_data_ptr()),
                      static_cast<const uint16_t*>(w.const_data_ptr()), n, in, out,
                      static_cast<uint16_t*>(y.mutable_data_ptr()));
    return y;
  }
#endif
  const int64_t block = st == at::kBFloat16 ? kLinearBlockBf16 : kLinearBlock;
  const int64_t blocks = (out + block - 1) / block;
  const int threads = omp_threads(blocks, n * out * in);
#if defined(SPECDEC_LINEAR_AVX2) || defined(SPECDEC_LINEAR_AVX512F)
  // x widened once here, not once per block of W
  const at::Tensor xf = st == at::kBFloat16 ? x.to(at::kFloat).contiguous() : at::Tensor();
#endif
  over_thread_ranges(blocks, block, out, threads, [&](int64_t o0, int64_t o1) {
    if (st == at::kBFloat16) {
#if defined(SPECDEC_LINEAR_AVX512BF16)
      skinny_linear_block_bf16_avx512(static_cast<const uint16_t*>(x.const_data_ptr()),
                                      static_cast<const uint16_t*>(w.const_data_ptr()), n, in, out, o0, o1,
                                      static_cast<uint16_t*>(y.mutable_data_ptr()));
#elif defined(SPECDEC_LINEAR_AVX512F)
      skinny_linear_block_avx512f(xf.const_data_ptr<float>(), static_cast<const uint16_t*>(w.const_data_ptr()),
                                  nullptr, n, in, out, o0, o1, static_cast<uint16_t*>(y.mutable_data_ptr()));
#elif defined(SPECDEC_LINEAR_AVX2)
      skinny_linear_block_avx2(xf.const_data_ptr<float>(), static_cast<const uint16_t*>(w.const_data_ptr()), nullptr,
                               n, in, out, o0, o1, static_cast<uint16_t*>(y.mutable_data_ptr()));
#else
      skinny_linear_block_bf16(static_cast<const uint16_t*>(x.const_data_ptr()),
                               static_cast<const uint16_t*>(w.const_data_ptr()), n, in, out, o0, o1,
                               static_cast<uint16_t*>(y.mutable_data_ptr()));
#endif
    } else if (st == at::kFloat) {
      skinny_linear_block<float>(x.const_data_ptr<float>(), w.const_data_ptr<float>(), nullptr, n, in, out, o0, o1,
                                 y.mutable_data_ptr<float>());
    } else {
      skinny_linear_block<double>(x.const_data_ptr<double>(), w.const_data_ptr<double>(), nullptr, n, in, out, o0,
                                  o1, y.mutable_data_ptr<double>());
    }
  });
  return y;
}

at::Tensor skinny_linear_int8(const at::Tensor& x_in, const at::Tensor& weight_in, const at::Tensor& scale_in) {
  check_cpu(x_in, "x");
  check_cpu(weight_in, "weight");
  check_cpu(scale_in, "scale");
  TORCH_CHECK(weight_in.dim() == 2 && weight_in.scalar_type() == at::kChar, "weight must be int8 [out, in], got ",
              weight_in.scalar_type(), " ", weight_in.sizes());
  const int64_t in = weight_in.size(1), out = weight_in.size(0);
  TORCH_CHECK(scale_in.dim() == 1 && scale_in.size(0) == out && scale_in.scalar_type() == at::kFloat,
              "scale must be float32 [out=", out, "], got ", scale_in.scalar_type(), " ", scale_in.sizes());
  TORCH_CHECK(x_in.dim() >= 1 && x_in.size(-1) == in, "x must be [..., in=", in, "], got ", x_in.sizes());
  const at::ScalarType st = x_in.scalar_type();
  TORCH_CHECK(at::isFloatingType(st), "x must be floating, got ", st);
  if (st == at::kHalf) return skinny_linear_int8(x_in.to(at::kFloat), weight_in, scale_in).to(at::kHalf);
#if !defined(__AVX512F__) && !defined(SPECDEC_LINEAR_AVX2)
  // the portable loop computes in float x: bf16 goes through it and rounds once at the end
  if (st == at::kBFloat16) return skinny_linear_int8(x_in.to(at::kFloat), weight_in, scale_in).to(at::kBFloat16);
#endif
  const at::Tensor x = x_in.contiguous(), w = weight_in.contiguous(), scale = scale_in.contiguous();
  int64_t n = 0;
  at::Tensor y = linear_output(x, out, n);
  if (n == 0 || out == 0) return y;
  if (in == 0) return y.zero_();  // an empty sum
  const int8_t* wp = w.const_data_ptr<int8_t>();
  const float* sp = scale.const_data_ptr<float>();
  if (st == at::kDouble) {
    const int64_t blocks = (out + kLinearBlock - 1) / kLinearBlock;
#pragma omp parallel for num_threads(omp_threads(blocks, n * out * in)) schedule(static)
    for (int64_t b = 0; b < blocks; ++b)
      skinny_linear_block<double, int8_t>(x.const_data_ptr<double>(), wp, sp, n, in, out, b * kLinearBlock,
                                       std::min(out, (b + 1) * kLinearBlock), y.mutable_data_ptr<double>());
    return y;
  }
  // float32 and bf16 x: fp32 products of x (widened once here) and the int8 weights widened in registers
  const at::Tensor xf = st == at::kFloat ? x : x.to(at::kFloat).contiguous();
  const float* xp = xf.const_data_ptr<float>();
  const int64_t blocks = (out + kLinearBlockBf16 - 1) / kLinearBlockBf16;
  over_thread_ranges(blocks, kLinearBlockBf16, out, omp_threads(blocks, n * out * in), [&](int64_t o0, int64_t o1) {
#if defined(__AVX512F__)
    if (st == at::kBFloat16)
      skinny_linear_block_avx512f(xp, wp, sp, n, in, out, o0, o1, static_cast<uint16_t*>(y.mutable_data_ptr()));
    else
      skinny_linear_block_avx512f(xp, wp, sp, n, in, out, o0, o1, y.mutable_data_ptr<float>());
#elif defined(SPECDEC_LINEAR_AVX2)
    if (st == at::kBFloat16)
      skinny_linear_block_avx2(xp, wp, sp, n, in, out, o0, o1, static_cast<uint16_t*>(y.mutable_data_ptr()));
    else
      skinny_linear_block_avx2(xp, wp, sp, n, in, out, o0, o1, y.mutable_data_ptr<float>());
#else
    skinny_linear_block<float, int8_t>(xp, wp, sp, n, in, out, o0, o1, y.mutable_data_ptr<float>());
#endif
  });
  return y;
}

std::string skinny_linear_isa() {
#if defined(SPECDEC_LINEAR_AMX)
  if (amx_ready()) return "amx";
#endif
#if defined(SPECDEC_LINEAR_AVX512BF16)
  return "avx512bf16";  // also an AMX build where the OS refuses the tile state
#elif defined(SPECDEC_LINEAR_AVX512F)
  return "avx512";
#elif defined(SPECDEC_LINEAR_AVX2)
  return "avx2";
#else
  return "portable";
#endif
}

}  // namespace specdec::cpu
