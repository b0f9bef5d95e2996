// CPU adapter of decoder_layer: one Llama decoder layer of a decode step in one call. The parts are the adapters of
// linear.cpp, norm.cpp and attention.cpp called directly, and ATen's add, silu and mul for the rest, so the layer
// computes what the same ops called one by one from Python compute, bit for bit, without the ~15 Python-level
// calls (and their dispatch) per layer that cost a small model most of its step.
#include <ATen/ops/add.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/silu.h>

#include "cpu/common.h"
#include "cpu/ops.h"

namespace specdec::cpu {

at::Tensor decoder_layer(const at::Tensor& h, at::TensorList weights, at::TensorList scales, const at::Tensor& ln1,
                         const at::Tensor& ln2, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& k_cache,
                         const at::Tensor& v_cache, int64_t length, const at::Tensor& mask, double eps1, double eps2,
                         double scale) {
  check_cpu(h, "h");
  check_cpu(k_cache, "k_cache");
  check_cpu(v_cache, "v_cache");
  const size_t nw = weights.size();
  TORCH_CHECK(nw == 7 || nw == 4, "weights must be (q, k, v, o, gate, up, down) or (qkv, o, gate_up, down), got ",
              nw, " tensors");
  TORCH_CHECK(scales.empty() || scales.size() == nw, "scales must be empty or one per weight, got ", scales.size());
  TORCH_CHECK(h.dim() == 3, "h must be [B, n, E], got ", h.sizes());
  TORCH_CHECK(k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes(), "k_cache and v_cache must be one [B, Hkv, "
              "capacity, D] shape, got ", k_cache.sizes(), " and ", v_cache.sizes());
  const int64_t b = h.size(0), n = h.size(1), hkv = k_cache.size(1), d = k_cache.size(3);
  TORCH_CHECK(k_cache.size(0) == b, "k_cache must hold B=", b, " rows, got ", k_cache.sizes());
  TORCH_CHECK(length >= 0 && length + n <= k_cache.size(2), "length + n must fit the cache's capacity ",
              k_cache.size(2), ", got length ", length, " and n ", n);
  const int64_t nkv = hkv * d;
  const int64_t nq = (nw == 7 ? weights[0].size(0) : weights[0].size(0) - 2 * nkv);
  TORCH_CHECK(nq > 0 && nq % d == 0, "the query projection's outputs must be a multiple of D=", d, ", got ", nq);
  const int64_t heads = nq / d;

  auto linear = [&](const at::Tensor& x, size_t i) {
    return scales.empty() ? skinny_linear(x, weights[i]) : skinny_linear_int8(x, weights[i], scales[i]);
  };
  at::Tensor x = rms_norm(h, ln1, eps1);
  at::Tensor q, k, v;
  if (nw == 7) {
    q = linear(x, 0), k = linear(x, 1), v = linear(x, 2);
  } else {
    const at::Tensor qkv = linear(x, 0);
    q = qkv.narrow(-1, 0, nq), k = qkv.narrow(-1, nq, nkv), v = qkv.narrow(-1, nq + nkv, nkv);
  }
  q = q.view({b, n, heads, d}).transpose(1, 2);
  k = k.view({b, n, hkv, d}).transpose(1, 2);
  v = v.view({b, n, hkv, d}).transpose(1, 2);
  auto [qr, kr] = rotary_embedding(q, k, cos, sin);
  // the new keys and values go to slots [length, length + n); attention reads slots [0, length + n)
  k_cache.narrow(2, length, n).copy_(kr);
  v_cache.narrow(2, length, n).copy_(v);
  const at::Tensor att = decode_attention(qr, k_cache.narrow(2, 0, length + n), v_cache.narrow(2, 0, length + n),
                                          mask, scale);
  const size_t o = nw == 7 ? 3 : 1;
  at::Tensor out = at::add(h, linear(att.transpose(1, 2).reshape({b, n, nq}), o));
  x = rms_norm(out, ln2, eps2);
  at::Tensor gate, up;
  if (nw == 7) {
    gate = linear(x, 4), up = linear(x, 5);
  } else {
    const at::Tensor gu = linear(x, 2);
    const int64_t half = gu.size(-1) / 2;
    gate = gu.narrow(-1, 0, half), up = gu.narrow(-1, half, half);
  }
  return at::add(out, linear(at::mul(at::silu(gate), up), nw - 1));
}

at::Tensor decoder_stack(const at::Tensor& h, at::TensorList weights, at::TensorList scales, at::TensorList ln1,
                         at::TensorList ln2, const at::Tensor& cos, const at::Tensor& sin, at::TensorList k_caches,
                         at::TensorList v_caches, int64_t length, const at::Tensor& mask, double eps1, double eps2,
                         double scale) {
  const size_t layers = k_caches.size();
  TORCH_CHECK(layers > 0, "k_caches must hold one cache per layer, got none");
  TORCH_CHECK(v_caches.size() == layers && ln1.size() == layers && ln2.size() == layers,
              "v_caches, ln1 and ln2 must hold one tensor per layer (", layers, "), got ", v_caches.size(), ", ",
              ln1.size(), " and ", ln2.size());
  TORCH_CHECK(weights.size() % layers == 0, "weights must hold the same number of matrices per layer, got ",
              weights.size(), " for ", layers, " layers");
  const size_t per = weights.size() / layers;
  TORCH_CHECK(scales.empty() || scales.size() == weights.size(), "scales must be empty or one per weight, got ",
              scales.size());
  // the layers one after another, each as decoder_layer computes it (and checks its arguments); the mask in fp32
  // once for all of them, as decode_attention would convert it in every layer
  const at::Tensor mask32 = mask.to(at::kFloat).contiguous();
  at::Tensor x = h;
  for (size_t i = 0; i < layers; ++i)
    x = decoder_layer(x, weights.slice(i * per, per), scales.empty() ? scales : scales.slice(i * per, per), ln1[i],
                      ln2[i], cos, sin, k_caches[i], v_caches[i], length, mask32, eps1, eps2, scale);
  return x;
}

}  // namespace specdec::cpu
