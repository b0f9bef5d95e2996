// CPU adapters of rms_norm and rotary_embedding (a Llama decode step's RMSNorm and RoPE); kernels in specdec/norm.h.
#include <ATen/ops/empty.h>

#include <cmath>
#include <vector>

#include "cpu/common.h"
#include "cpu/ops.h"
#include "specdec/norm.h"

namespace specdec::cpu {

namespace {

// The storage format of a floating dtype, passed to fn as a value of that format type.
template <typename Fn>
void with_format(at::ScalarType st, Fn&& fn) {
  switch (st) {
    case at::kBFloat16: fn(Bf16Format{}); break;
    case at::kHalf: fn(HalfFormat{}); break;
    case at::kFloat: fn(PlainFormat<float>{}); break;
    case at::kDouble: fn(PlainFormat<double>{}); break;
    default: TORCH_CHECK(false, "expected a floating dtype (bfloat16, float16, float32, float64), got ", st);
  }
}

template <typename T>
const T* data_as(const at::Tensor& t) {
  return static_cast<const T*>(t.const_data_ptr());
}

// A view whose last dimension is contiguous (the kernels read rows); a copy only where it is not.
at::Tensor rows_contiguous(const at::Tensor& t) { return t.stride(-1) == 1 ? t : t.contiguous(); }

// x [B, H, n, D] with any strides (last one 1), cos/sin rows [B or 1, n, D] -> out [B, H, n, D] contiguous.
template <typename F>
void rotate(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, at::Tensor& out) {
  using T = typename F::T;
  const int64_t batch = x.size(0), heads = x.size(1), n = x.size(2), dim = x.size(3), rows = batch * heads * n;
  const int64_t xb = x.stride(0), xh = x.stride(1), xi = x.stride(2);
  const int64_t cb = cos.size(0) == 1 ? 0 : cos.stride(0), ci = cos.stride(1);  // [1, n, D] serves every batch row
  const int64_t sb = sin.size(0) == 1 ? 0 : sin.stride(0), si = sin.stride(1);
  const T *xp = data_as<T>(x), *cp = data_as<T>(cos), *sp = data_as<T>(sin);
  T* op = static_cast<T*>(out.mutable_data_ptr());
#pragma omp parallel for collapse(3) num_threads(omp_threads(rows, rows * dim)) schedule(static)
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < n; ++i)
        rotary_one<F>(xp + b * xb + h * xh + i * xi, cp + b * cb + i * ci, sp + b * sb + i * si, dim / 2,
                      op + ((b * heads + h) * n + i) * dim);
}

}  // namespace

at::Tensor rms_norm(const at::Tensor& x_in, const at::Tensor& weight_in, double eps) {
  check_cpu(x_in, "x");
  check_cpu(weight_in, "weight");
  TORCH_CHECK(x_in.dim() >= 1, "x must be [..., D], got ", x_in.sizes());
  const int64_t dim = x_in.size(-1);
  TORCH_CHECK(weight_in.dim() == 1 && weight_in.size(0) == dim, "weight must be [D=", dim, "], got ",
              weight_in.sizes());
  TORCH_CHECK(x_in.scalar_type() == weight_in.scalar_type(), "x and weight must share a dtype, got ",
              x_in.scalar_type(), " and ", weight_in.scalar_type());
  TORCH_CHECK(std::isfinite(eps) && eps >= 0, "eps must be a finite number >= 0, got ", eps);
  at::Tensor out = at::empty(x_in.sizes(), x_in.options());
  if (out.numel() == 0) return out;
  const int64_t rows = out.numel() / dim;
  const at::Tensor x = rows_contiguous(x_in.reshape({rows, dim})), w = weight_in.contiguous();
  const int64_t stride = x.stride(0);
  with_format(x.scalar_type(), [&](auto format) {
    using F = decltype(format);
    using T = typename F::T;
    using M = typename F::M;
    const T *xp = data_as<T>(x), *wp = data_as<T>(w);
    T* op = static_cast<T*>(out.mutable_data_ptr());
    const M e = static_cast<M>(eps);  // torch adds eps to an fp32 tensor in fp32
#pragma omp parallel for num_threads(omp_threads(rows, rows * dim)) schedule(static)
    for (int64_t r = 0; r < rows; ++r) rms_norm_one<F>(xp + r * stride, wp, dim, e, op + r * dim);
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> rotary_embedding(const at::Tensor& q_in, const at::Tensor& k_in,
                                                    const at::Tensor& cos_in, const at::Tensor& sin_in) {
  for (const auto* t : {&q_in, &k_in, &cos_in, &sin_in}) check_cpu(*t, "q/k/cos/sin");
  TORCH_CHECK(q_in.dim() == 4 && k_in.dim() == 4, "q and k must be 4-D [B, H, n, D], got ", q_in.sizes(), " and ",
              k_in.sizes());
  const int64_t batch = q_in.size(0), n = q_in.size(2), dim = q_in.size(3);
  TORCH_CHECK(dim % 2 == 0, "the head dim D must be even, got ", dim);
  TORCH_CHECK(k_in.size(0) == batch && k_in.size(2) == n && k_in.size(3) == dim, "k must be [B=", batch,
              ", Hkv, n=", n, ", D=", dim, "], got ", k_in.sizes());
  for (const auto* t : {&cos_in, &sin_in})
    TORCH_CHECK(t->dim() == 3 && (t->size(0) == batch || t->size(0) == 1) && t->size(1) == n && t->size(2) == dim,
                "cos and sin must be [B=", batch, " or 1, n=", n, ", D=", dim, "], got ", t->sizes());
  const at::ScalarType st = q_in.scalar_type();
  TORCH_CHECK(k_in.scalar_type() == st && cos_in.scalar_type() == st && sin_in.scalar_type() == st,
              "q, k, cos and sin must share a dtype");
  at::Tensor q_out = at::empty(q_in.sizes(), q_in.options()), k_out = at::empty(k_in.sizes(), k_in.options());
  const at::Tensor cos = rows_contiguous(cos_in), sin = rows_contiguous(sin_in);
  with_format(st, [&](auto format) {
    using F = decltype(format);
    if (q_out.numel()) rotate<F>(rows_contiguous(q_in), cos, sin, q_out);
    if (k_out.numel()) rotate<F>(rows_contiguous(k_in), cos, sin, k_out);
  });
  return {q_out, k_out};
}

}  // namespace specdec::cpu
