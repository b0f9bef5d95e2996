// CPU adapter of decode_attention (a draft model's decode-step attention); kernel in specdec/attention.h.
#include <ATen/ops/empty.h>

#include <type_traits>

#include "cpu/common.h"
#include "cpu/ops.h"
#include "specdec/attention.h"

namespace specdec::cpu {

namespace {

#if defined(__AVX512BF16__) && defined(__AVX512F__)
// bf16 with VDPBF16PS: the rows of one KV head (its query heads x the n new tokens) in blocks whose weighted sums of v
// stay in registers, so each cache slot's v is widened once per block instead of once per row; the softmax of each
// row is computed alone (decode_attention_softmax_bf16) from its dot products, which AMX tiles compute for the whole
// block where this process has them (decode_attention_dots_amx), VDPBF16PS one row at a time elsewhere. Work items:
// (batch row, KV head, block).
void attention_rows_bf16_grouped(const uint16_t* q, const uint16_t* k, const uint16_t* v, const float* mask,
                                 int64_t batch, int64_t heads, int64_t kv_heads, int64_t n, int64_t s_len, int64_t dim,
                                 int64_t kv_batch_stride, int64_t kv_head_stride, float scale, uint16_t* out) {
  const int64_t per_kv = heads / kv_heads * n, block = decode_attention_row_block_bf16(dim);
  const int64_t blocks = (per_kv + block - 1) / block, items = batch * kv_heads * blocks;
  const int64_t stride = 2 * ((s_len + 15) / 16 * 16);  // a row's weights, then their packed copy
#if defined(SPECDEC_LINEAR_AMX)
  static_assert(kAttentionSumRegs512 / 2 <= kAmxRows, "a block of rows must fit one AMX accumulator tile");
  const bool amx = amx_ready();  // the dots of a block's rows by AMX tiles (decode_attention_dots_amx)
#else
  constexpr bool amx = false;
#endif
#pragma omp parallel num_threads(omp_threads(items, batch * heads * n * s_len * dim))
  {
    std::vector<float> scores(block * stride), inv(block);
#if defined(SPECDEC_LINEAR_AMX)
    std::vector<uint32_t> qp(amx ? dim / 2 * block : 0);
    std::vector<uint16_t> pad(amx ? 16 * dim : 0);
    int configured = 0;  // the rows this thread's tiles are configured for (0: none)
#endif
#pragma omp for schedule(static)
    for (int64_t it = 0; it < items; ++it) {
      const int64_t bk = it / blocks, first = it % blocks * block;
      const int64_t b = bk / kv_heads, h = bk % kv_heads;
      const int64_t r0 = (b * kv_heads + h) * per_kv + first;  // rows (b, head, i) of this KV head are contiguous
      const int rows = static_cast<int>(per_kv - first < block ? per_kv - first : block);
      const int64_t kv = b * kv_batch_stride + h * kv_head_stride;
#if defined(SPECDEC_LINEAR_AMX)
      if (amx) {
        if (configured != rows) amx_configure(rows), configured = rows;
        decode_attention_dots_amx(q + r0 * dim, k + kv, s_len, dim, rows, qp.data(), pad.data(), scores.data(),
                                  stride);
      }
#endif
      for (int j = 0; j < rows; ++j) {
        const int64_t i = (r0 + j) % n;
        float* sj = scores.data() + j * stride;
        if (!amx) decode_attention_dots_bf16(q + (r0 + j) * dim, k + kv, s_len, dim, sj);
        inv[j] = decode_attention_softmax_bf16(mask + (b * n + i) * s_len, s_len, scale, sj);
      }
      decode_attention_values_bf16_any(v + kv, s_len, dim, scores.data(), stride, inv.data(), rows, out + r0 * dim);
    }
#if defined(SPECDEC_LINEAR_AMX)
    if (configured != 0) _tile_release();
#endif
  }
}
#endif

template <typename T, typename Acc>
void attention_rows(const T* q, const T* k, const T* v, const float* mask, int64_t batch, int64_t heads,
                    int64_t kv_heads, int64_t n, int64_t s_len, int64_t dim, int64_t kv_batch_stride,
                    int64_t kv_head_stride, double scale, T* out) {
  const int64_t group = heads / kv_heads, rows = batch * heads * n;
#if defined(__AVX512BF16__) && defined(__AVX512F__)
  if constexpr (std::is_same_v<T, uint16_t>) {
    if (dim % 32 == 0 && dim <= kAttentionMaxDim512) {
      attention_rows_bf16_grouped(q, k, v, mask, batch, heads, kv_heads, n, s_len, dim, kv_batch_stride,
                                  kv_head_stride, static_cast<float>(scale), out);
      return;
    }
  }
#endif
#pragma omp parallel num_threads(omp_threads(rows, rows * s_len * dim))
  {
    // whole groups of 16 slots for the vector paths, twice (the AVX-512 path packs the nonzero weights after them)
    std::vector<Acc> scores(2 * ((s_len + 15) / 16 * 16)), acc(dim);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t b = r / (heads * n), h = (r / n) % heads, i = r % n;
      const int64_t kv = b * kv_batch_stride + (h / group) * kv_head_stride;
#if defined(__AVX2__) && defined(__FMA__)  // in AVX512-BF16 builds: the head widths the grouped path leaves
      if constexpr (std::is_same_v<T, uint16_t>) {
        if (dim % 16 == 0 && dim <= kAttentionMaxDimAvx2) {
          decode_attention_row_bf16(q + r * dim, k + kv, v + kv, mask + (b * n + i) * s_len, s_len, dim,
                                    static_cast<float>(scale), scores.data(), acc.data(), out + r * dim);
          continue;
        }
      }
#endif
      decode_attention_row<T, Acc>(q + r * dim, k + kv, v + kv, mask + (b * n + i) * s_len, s_len, dim,
                                   static_cast<Acc>(scale), scores.data(), acc.data(), out + r * dim);
    }
  }
}

}  // namespace

at::Tensor decode_attention(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                            const at::Tensor& mask_in, double scale) {
  for (const auto* t : {&q_in, &k_in, &v_in, &mask_in}) check_cpu(*t, "q/k/v/mask");
  TORCH_CHECK(q_in.dim() == 4 && k_in.dim() == 4 && v_in.dim() == 4, "q, k, v must be 4-D [B, H, n|S, D]");
  const int64_t batch = q_in.size(0), heads = q_in.size(1), n = q_in.size(2), dim = q_in.size(3);
  const int64_t kv_heads = k_in.size(1), s_len = k_in.size(2);
  TORCH_CHECK(k_in.sizes() == v_in.sizes() && k_in.size(0) == batch && k_in.size(3) == dim,
              "k and v must be [B=", batch, ", Hkv, S, D=", dim, "], got ", k_in.sizes(), " and ", v_in.sizes());
  TORCH_CHECK(kv_heads > 0 && heads % kv_heads == 0, "H=", heads, " must be a multiple of Hkv=", kv_heads);
  TORCH_CHECK(q_in.scalar_type() == k_in.scalar_type() && q_in.scalar_type() == v_in.scalar_type(),
              "q, k, v must share a dtype");
  const at::ScalarType st = q_in.scalar_type();
  TORCH_CHECK(at::isFloatingType(st), "q must be floating, got ", st);
  if (st == at::kHalf)
    return decode_attention(q_in.to(at::kFloat), k_in.to(at::kFloat), v_in.to(at::kFloat), mask_in, scale)
        .to(at::kHalf);
  const at::Tensor mask = mask_in.expand({batch, 1, n, s_len}).to(at::kFloat).contiguous();
  const at::Tensor q = q_in.contiguous();
  // A cache with room to grow hands views [B, Hkv, S, D] of [B, Hkv, capacity, D] buffers: each head's slots are
  // contiguous, only the head and batch strides differ, so such k/v are read in place instead of copied.
  const bool slots_dense = k_in.stride(3) == 1 && k_in.stride(2) == dim && k_in.strides() == v_in.strides();
  const at::Tensor k = slots_dense ? k_in : k_in.contiguous(), v = slots_dense ? v_in : v_in.contiguous();
  const int64_t kv_batch_stride = k.stride(0), kv_head_stride = k.stride(1);
  at::Tensor out = at::empty(q.sizes(), q.options());
  if (out.numel() == 0) return out;
  TORCH_CHECK(s_len > 0, "the cache must hold at least one key (S > 0)");
  const float* m = mask.const_data_ptr<float>();
  if (st == at::kBFloat16) {
    attention_rows<uint16_t, float>(static_cast<const uint16_t*>(q.const_data_ptr()),
                                    static_cast<const uint16_t*>(k.const_data_ptr()),
                                    static_cast<const uint16_t*>(v.const_data_ptr()), m, batch, heads, kv_heads, n,
                                    s_len, dim, kv_batch_stride, kv_head_stride, scale,
                                    static_cast<uint16_t*>(out.mutable_data_ptr()));
  } else if (st == at::kFloat) {
    attention_rows<float, float>(q.const_data_ptr<float>(), k.const_data_ptr<float>(), v.const_data_ptr<float>(), m,
                                 batch, heads, kv_heads, n, s_len, dim, kv_batch_stride, kv_head_stride, scale,
                                 out.mutable_data_ptr<float>());
  } else {
    attention_rows<double, double>(q.const_data_ptr<double>(), k.const_data_ptr<double>(),
                                   v.const_data_ptr<double>(), m, batch, heads, kv_heads, n, s_len, dim, kv_batch_stride,
                                   kv_head_stride, scale, out.mutable_data_ptr<double>());
  }
  return out;
}

}  // namespace specdec::cpu
