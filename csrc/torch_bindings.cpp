// torch.ops.specdec: every schema declared once; CPU implementations registered per dispatch key.
// Only torch/library.h + ATen core headers (torch/extension.h would cost ~50 s per compile).
#include <Python.h>
#include <torch/library.h>

#include "cpu/ops.h"

// Importing the module (specdec_kernels._C, or one of its instruction-set variants _C_avx2, _C_avx512,
// _C_avx512bf16: the same sources compiled with other -m flags, SPECDEC_MODULE names it) runs the TORCH_LIBRARY
// static initialisers below; the module itself has no Python methods (the ops live under torch.ops.specdec). One
// process loads one variant: specdec_kernels.native picks it from the CPU's features.
#ifndef SPECDEC_MODULE
#define SPECDEC_MODULE _C
#endif
#define SPECDEC_STR2(x) #x
#define SPECDEC_STR(x) SPECDEC_STR2(x)
#define SPECDEC_PYINIT2(x) PyInit_##x
#define SPECDEC_PYINIT(x) SPECDEC_PYINIT2(x)

extern "C" PyObject* SPECDEC_PYINIT(SPECDEC_MODULE)(void) {
  static PyModuleDef module_def = {PyModuleDef_HEAD_INIT, SPECDEC_STR(SPECDEC_MODULE),
                                   "specdec C++ ops (see torch.ops.specdec)", -1, nullptr};
  return PyModule_Create(&module_def);
}

// Stochastic ops take their noise either as float64 uniform tensors (test mode) or, when a noise argument is None,
// draw it from the Philox stream of `seed` (docs/kernels.md; layout in specdec_kernels/_rng.py): purpose DRAFT for
// `noise`, ACCEPT for `accept_u`, FINAL for `final_noise`.
TORCH_LIBRARY(specdec, m) {
  // depth [B, N], prefix_len [B] -> position ids [B, N]
  m.def("tree_positions(Tensor depth, Tensor prefix_len) -> Tensor");
  // parent [B, N], valid [B, N], past_valid [B, P_kv] -> additive mask [B, 1, N, P_kv + N]
  m.def("tree_mask(Tensor parent, Tensor valid, Tensor past_valid, ScalarType dtype) -> Tensor");
  // in place on every [B, H, S, D] tensor of kv; returns the new lengths [B]
  m.def("filter_kv(Tensor(a!)[] kv, Tensor prefix_len, Tensor accepted_nodes, Tensor n_accepted) -> Tensor");
  // kv [B, H, S, D] each -> the same tensors with S = length (in place; a helper of the driver's KV cache, not an op)
  m.def("crop_slots_(Tensor(a!)[] kv, int length) -> ()");
  // logp [..., V], noise [..., V] float64 uniforms -> tokens [...] int64
  m.def("sample_categorical(Tensor logp, Tensor? noise, int seed=0) -> Tensor");
  // logp [..., V], noise [..., V] -> tokens [..., k] int64, valid [..., k] bool, score [..., k] float64
  m.def("gumbel_topk(Tensor logp, int k, Tensor? noise, int seed=0) -> (Tensor, Tensor, Tensor)");
  // logits [..., V] -> fp32 log-probs [..., V] (-inf = masked), or the probabilities when log=False
  m.def("process_logits(Tensor logits, float temperature, int top_k, float top_p, bool log=True) -> Tensor");
  // logp [B, Win, V], sigma/gamma/beam_valid [B, Win], noise [B, Win, V] float64 uniforms
  // -> parent_slot [B, Wout] int64, tokens [B, Wout] int64, sigma [B, Wout] float64, gamma [B, Wout] float64
  // (descending), valid [B, Wout] bool
  m.def(
      "sbs_step(Tensor logp, Tensor sigma, Tensor gamma, Tensor beam_valid, int w_out, Tensor? noise, int seed=0) "
      "-> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  // logp [..., V], noise [..., V] -> tokens [..., 2] int64, hub [...] int64, valid [..., 2] bool
  m.def("spechub_sample(Tensor logp, Tensor? noise, int seed=0) -> (Tensor, Tensor, Tensor)");
  // p, q [B, V], k [B] -> gamma [B] float64, beta [B] float64
  m.def("kseq_gamma(Tensor p, Tensor q, Tensor k) -> (Tensor, Tensor)");
  // draft [B, L], p [B, L, V] (None when greedy with leniency 1), q [B, L+1, V], lengths [B], accept_u [B, L],
  // final_noise [B, V], eos [E] -> n_accepted [B], next_token [B]
  m.def(
      "verify_chain(Tensor draft, Tensor? p, Tensor q, Tensor lengths, Tensor? accept_u, Tensor? final_noise, "
      "bool greedy, Tensor? eos, int seed=0, float leniency=1.0) -> (Tensor, Tensor)");
  // p, q [..., V] -> the law a lenient review emits [..., V] (float64 if an input is, else float32)
  m.def("emission_law(Tensor p, Tensor q, float leniency=1.0) -> Tensor");
  // cand [B, K], cand_valid [B, K], p, q [B, V], accept_u [B, K], final_noise [B, V], hub [B]
  // -> slot [B], token [B], accept_prob [B, K], final_residual [B, V] (compute dtype)
  m.def(
      "verify_node(str method, Tensor cand, Tensor cand_valid, Tensor p, Tensor q, Tensor? accept_u, "
      "Tensor? final_noise, Tensor? hub, int seed=0) -> (Tensor, Tensor, Tensor, Tensor)");
  // tokens/parent/valid [B, N], p_rows/q_rows [B, N, V], hub [B, N], accept_u [B, N, Kmax],
  // final_noise [B, V] -> accepted_nodes [B, max_depth], n_accepted [B], next_token [B], accepted_rank [B, max_depth]
  m.def(
      "verify_tree(Tensor tokens, Tensor parent, Tensor valid, Tensor? p_rows, Tensor q_rows, str method, "
      "Tensor? hub, Tensor? accept_u, Tensor? final_noise, bool greedy, Tensor? eos, int max_depth, int seed=0) "
      "-> (Tensor, Tensor, Tensor, Tensor)");
  // x [..., in], weight [out, in] -> x weight^T [..., out] (a decode step's projections: few rows of x)
  m.def("skinny_linear(Tensor x, Tensor weight) -> Tensor");
  // x [..., in], weight int8 [out, in], scale float32 [out] -> (x weight^T) * scale [..., out] (int8 weights)
  m.def("skinny_linear_int8(Tensor x, Tensor weight, Tensor scale) -> Tensor");
  // the bf16 path skinny_linear was built with: "avx512bf16", "avx2" or "portable" (no tensors: a catch-all kernel)
  m.def("skinny_linear_isa() -> str", &specdec::cpu::skinny_linear_isa);
  // q [B, H, n, D], k/v [B, Hkv, S, D], mask [B, 1, n, S] additive -> [B, H, n, D] (a decode step's attention)
  m.def("decode_attention(Tensor q, Tensor k, Tensor v, Tensor mask, float scale) -> Tensor");
  // x [..., D], weight [D] -> [..., D] (HF Llama's RMSNorm)
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  // q [B, H, n, D], k [B, Hkv, n, D], cos/sin [B or 1, n, D] -> rotated q, k (HF's apply_rotary_pos_emb)
  m.def("rotary_embedding(Tensor q, Tensor k, Tensor cos, Tensor sin) -> (Tensor, Tensor)");
  // one Llama decoder layer of a decode step: h [B, n, E] -> [B, n, E]; writes cache slots [length, length + n)
  m.def(
      "decoder_layer(Tensor h, Tensor[] weights, Tensor[] scales, Tensor ln1, Tensor ln2, Tensor cos, Tensor sin, "
      "Tensor(a!) k_cache, Tensor(b!) v_cache, int length, Tensor mask, float eps1, float eps2, float scale) "
      "-> Tensor");
  // decoder_layer over L layers in turn: weights and scales layer after layer, one cache pair and norm pair per layer
  m.def(
      "decoder_stack(Tensor h, Tensor[] weights, Tensor[] scales, Tensor[] ln1, Tensor[] ln2, Tensor cos, "
      "Tensor sin, Tensor(a!)[] k_caches, Tensor(b!)[] v_caches, int length, Tensor mask, float eps1, float eps2, "
      "float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(specdec, CPU, m) {
  m.impl("tree_positions", &specdec::cpu::tree_positions);
  m.impl("tree_mask", &specdec::cpu::tree_mask);
  m.impl("filter_kv", &specdec::cpu::filter_kv);
  m.impl("crop_slots_", &specdec::cpu::crop_slots_);
  m.impl("sample_categorical", &specdec::cpu::sample_categorical);
  m.impl("gumbel_topk", &specdec::cpu::gumbel_topk);
  m.impl("process_logits", &specdec::cpu::process_logits);
  m.impl("sbs_step", &specdec::cpu::sbs_step);
  m.impl("spechub_sample", &specdec::cpu::spechub_sample);
  m.impl("kseq_gamma", &specdec::cpu::kseq_gamma);
  m.impl("verify_chain", &specdec::cpu::verify_chain);
  m.impl("emission_law", &specdec::cpu::emission_law);
  m.impl("verify_node", &specdec::cpu::verify_node);
  m.impl("verify_tree", &specdec::cpu::verify_tree);
  m.impl("skinny_linear", &specdec::cpu::skinny_linear);
  m.impl("skinny_linear_int8", &specdec::cpu::skinny_linear_int8);
  m.impl("decode_attention", &specdec::cpu::decode_attention);
  m.impl("rms_norm", &specdec::cpu::rms_norm);
  m.impl("rotary_embedding", &specdec::cpu::rotary_embedding);
  m.impl("decoder_layer", &specdec::cpu::decoder_layer);
  m.impl("decoder_stack", &specdec::cpu::decoder_stack);
}
