// CPU adapters: tensors in, raw pointers to the kernels of csrc/include/specdec, tensors out.
// Argument order and meaning follow specdec_kernels/reference (the contract); registered in torch_bindings.cpp.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <optional>
#include <string>
#include <tuple>

namespace specdec::cpu {

// tree.cpp: tree layout
at::Tensor tree_positions(const at::Tensor& depth, const at::Tensor& prefix_len);
at::Tensor tree_mask(const at::Tensor& parent, const at::Tensor& valid, const at::Tensor& past_valid,
                     at::ScalarType dtype);
// Drop trailing slots of every [B, H, S, D] cache tensor in place (metadata only: the first `length` slots stay).
void crop_slots_(at::TensorList kv, int64_t length);
at::Tensor filter_kv(at::TensorList kv, const at::Tensor& prefix_len, const at::Tensor& accepted_nodes,
                     const at::Tensor& n_accepted);

// sampling.cpp; noise = float64 uniforms in (0, 1) of the shape of logp, or None:
// drawn from the Philox stream of seed (cpu/common.h noise_or_philox)
at::Tensor sample_categorical(const at::Tensor& logp, const std::optional<at::Tensor>& noise, int64_t seed);
std::tuple<at::Tensor, at::Tensor, at::Tensor> gumbel_topk(const at::Tensor& logp, int64_t k,
                                                           const std::optional<at::Tensor>& noise, int64_t seed);
at::Tensor process_logits(const at::Tensor& logits, double temperature, int64_t top_k, double top_p,
                          bool log);

// verify.cpp: chain SD (greedy included; leniency > 1: CS Drafting's lenient review)
std::tuple<at::Tensor, at::Tensor> verify_chain(const at::Tensor& draft, const std::optional<at::Tensor>& p,
                                                const at::Tensor& q, const at::Tensor& lengths,
                                                const std::optional<at::Tensor>& accept_u,
                                                const std::optional<at::Tensor>& final_noise, bool greedy,
                                                const std::optional<at::Tensor>& eos, int64_t seed, double leniency);
// verify.cpp: p, q [..., V] -> the law a lenient review emits [..., V] (compute dtype)
at::Tensor emission_law(const at::Tensor& p, const at::Tensor& q, double leniency);
// verify.cpp, node verifiers: accept_prob [B, K] and final residual [B, V] are always returned
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> verify_node(
    const std::string& method, const at::Tensor& cand, const at::Tensor& cand_valid, const at::Tensor& p,
    const at::Tensor& q, const std::optional<at::Tensor>& accept_u, const std::optional<at::Tensor>& final_noise,
    const std::optional<at::Tensor>& hub, int64_t seed);
// verify.cpp: tree walk
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> verify_tree(
    const at::Tensor& tokens, const at::Tensor& parent, const at::Tensor& valid,
    const std::optional<at::Tensor>& p_rows, const at::Tensor& q_rows, const std::string& method,
    const std::optional<at::Tensor>& hub, const std::optional<at::Tensor>& accept_u,
    const std::optional<at::Tensor>& final_noise, bool greedy, const std::optional<at::Tensor>& eos, int64_t max_depth,
    int64_t seed);

// linear.cpp: x [..., in], weight [out, in] (one dtype) -> x weight^T [..., out], accumulated in fp32 (fp64 for
// double); for the few rows of a decode step
at::Tensor skinny_linear(const at::Tensor& x, const at::Tensor& weight);
// x [..., in] (floating), weight int8 [out, in], scale float32 [out] -> (x weight^T) * scale [..., out] in x's
// dtype, accumulated in fp32 (fp64 for double)
at::Tensor skinny_linear_int8(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scale);
// The bf16 path skinny_linear was compiled with: "avx512bf16", "avx2" or "portable".
std::string skinny_linear_isa();
// Whether this process runs the AMX kernels (an AMX build, and the OS handed out the tile state).
bool amx_ready();

// attention.cpp: q [B, H, n, D], k/v [B, Hkv, S, D] (H a multiple of Hkv), mask additive, broadcast to
// [B, 1, n, S] -> softmax(scale q k^T + mask) v [B, H, n, D], fp32 math (fp64 for double)
at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                            double scale);

// norm.cpp: HF Llama's RMSNorm, x [..., D], weight [D] (one dtype) -> [..., D] contiguous; and its rotary embedding,
// q [B, H, n, D], k [B, Hkv, n, D] (any strides, last one 1), cos/sin [B or 1, n, D] -> (q_out, k_out) contiguous
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
std::tuple<at::Tensor, at::Tensor> rotary_embedding(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                                    const at::Tensor& sin);

// layer.cpp: one Llama decoder layer of a decode step (specdec_kernels/reference/decode.py decoder_layer). h [B, n, E];
// weights (q, k, v, o, gate, up, down) or (qkv, o, gate_up, down), floating or int8 with one float32 scale tensor
// each; k_cache/v_cache [B, Hkv, capacity, D], slots [length, length + n) written; mask [B or 1, 1, n, length + n]
at::Tensor decoder_layer(const at::Tensor& h, at::TensorList weights, at::TensorList scales, const at::Tensor& ln1,
                         const at::Tensor& ln2, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& k_cache,
                         const at::Tensor& v_cache, int64_t length, const at::Tensor& mask, double eps1, double eps2,
                         double scale);
// decoder_layer over L layers in turn (one call for a model's stack): weights L x 7 or L x 4 matrices, layer after
// layer; scales empty or one per weight; ln1/ln2/k_caches/v_caches one per layer; length, mask, cos/sin shared
at::Tensor decoder_stack(const at::Tensor& h, at::TensorList weights, at::TensorList scales, at::TensorList ln1,
                         at::TensorList ln2, const at::Tensor& cos, const at::Tensor& sin, at::TensorList k_caches,
                         at::TensorList v_caches, int64_t length, const at::Tensor& mask, double eps1, double eps2,
                         double scale);

// beam.cpp (SpecHub drafting, K-SEQ, beam search); noise = float64 uniforms in (0, 1) of the shape of logp, or None:
// drawn from the Philox stream of seed (cpu/common.h noise_or_philox)
std::tuple<at::Tensor, at::Tensor, at::Tensor> spechub_sample(const at::Tensor& logp,
                                                              const std::optional<at::Tensor>& noise, int64_t seed);
std::tuple<at::Tensor, at::Tensor> kseq_gamma(const at::Tensor& p, const at::Tensor& q, const at::Tensor& k);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> sbs_step(
    const at::Tensor& logp, const at::Tensor& sigma, const at::Tensor& gamma, const at::Tensor& beam_valid,
    int64_t w_out, const std::optional<at::Tensor>& noise, int64_t seed);

}  // namespace specdec::cpu
