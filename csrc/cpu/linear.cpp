// CPU adapter of skinny_linear (a draft model's decode-step projections); kernels in specdec/linear.h.
#include <ATen/ops/empty.h>

#include "cpu/common.h"
#include "cpu/ops.h"
#include "specdec/linear.h"

namespace specdec::cpu {

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
  std::vector<int64_t> shape(x_in.sizes().begin(), x_in.sizes().end());
  int64_t n = 1;  // rows: the product of the leading dimensions (x.numel() / in fails for in = 0)
  for (size_t d = 0; d + 1 < shape.size(); ++d) n *= shape[d];
  shape.back() = out;
  if (st == at::kHalf) return skinny_linear(x_in.to(at::kFloat), weight_in.to(at::kFloat)).to(at::kHalf);
  const at::Tensor x = x_in.contiguous(), w = weight_in.contiguous();
  at::Tensor y = at::empty(shape, x.options());
  if (n == 0 || out == 0) return y;
  if (in == 0) return y.zero_();  // an empty sum
  const int64_t block = st == at::kBFloat16 ? kLinearBlockBf16 : kLinearBlock;
  const int64_t blocks = (out + block - 1) / block;
  const int threads = omp_threads(blocks, n * out * in);
#if defined(SPECDEC_LINEAR_AVX2)
  // x widened once here, not once per block of W
  const at::Tensor xf = st == at::kBFloat16 ? x.to(at::kFloat).contiguous() : at::Tensor();
#endif
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t o0 = b * block, o1 = std::min(out, o0 + block);
    if (st == at::kBFloat16) {
#if defined(SPECDEC_LINEAR_AVX512BF16)
      skinny_linear_block_bf16_avx512(static_cast<const uint16_t*>(x.const_data_ptr()),
                                      static_cast<const uint16_t*>(w.const_data_ptr()), n, in, out, o0, o1,
                                      static_cast<uint16_t*>(y.mutable_data_ptr()));
#elif defined(SPECDEC_LINEAR_AVX2)
      skinny_linear_block_bf16_avx2(xf.const_data_ptr<float>(), static_cast<const uint16_t*>(w.const_data_ptr()), n,
                                    in, out, o0, o1, static_cast<uint16_t*>(y.mutable_data_ptr()));
#else
      skinny_linear_block_bf16(static_cast<const uint16_t*>(x.const_data_ptr()),
                               static_cast<const uint16_t*>(w.const_data_ptr()), n, in, out, o0, o1,
                               static_cast<uint16_t*>(y.mutable_data_ptr()));
#endif
    } else if (st == at::kFloat) {
      skinny_linear_block<float>(x.const_data_ptr<float>(), w.const_data_ptr<float>(), n, in, out, o0, o1,
                                 y.mutable_data_ptr<float>());
    } else {
      skinny_linear_block<double>(x.const_data_ptr<double>(), w.const_data_ptr<double>(), n, in, out, o0, o1,
                                  y.mutable_data_ptr<double>());
    }
  }
  return y;
}

std::string skinny_linear_isa() {
#if defined(SPECDEC_LINEAR_AVX512BF16)
  return "avx512bf16";
#elif defined(SPECDEC_LINEAR_AVX2)
  return "avx2";
#else
  return "portable";
#endif
}

}  // namespace specdec::cpu
