// CUDA implementations of the torch.ops.specdec schemas (declared once in csrc/torch_bindings.cpp): tensor checks,
// dtype/layout adaptation, scratch buffers and the current stream live here; the kernels (csrc/cuda/*.cu) only
// see raw pointers. Built only when torch has CUDA (setup.py); nothing here can be compiled with the CPU wheel.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAStream.h>  // the stream alone: CUDAContext.h would need the cuBLAS/cuSPARSE headers too
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "launchers.h"

namespace specdec {
namespace cuda_binding {

using at::Tensor;

void check(int err, const char* op) {
  TORCH_CHECK(err == 0, "specdec::", op, " CUDA launch failed: ", cudaGetErrorString(static_cast<cudaError_t>(err)));
}

void* stream() { return c10::cuda::getCurrentCUDAStream().stream(); }

Tensor f32(const Tensor& t) { return t.to(at::kFloat).contiguous(); }
Tensor i64(const Tensor& t) { return t.to(at::kLong).contiguous(); }
Tensor f64(const Tensor& t) { return t.to(at::kDouble).contiguous(); }

// Noise of one op call (docs/kernels.md): the caller's uniforms as contiguous float64 (test mode), or, when the
// argument is None, an undefined tensor: the kernel then draws the Philox stream (seed, purpose) of
// specdec_kernels/_rng.py itself, element by element where it uses it (no fill pass). `shape` is the shape the noise
// tensor would have.
Tensor noise_or_none(const std::optional<Tensor>& noise, at::IntArrayRef shape, int64_t seed, const Tensor& like,
                     const char* name) {
  if (noise.has_value()) {
    TORCH_CHECK(noise->device() == like.device(), "specdec: ", name, " must be on ", like.device(), ", got ",
                noise->device());
    TORCH_CHECK(noise->sizes() == shape, "specdec: ", name, " must have shape ", shape, ", got ", noise->sizes());
    return f64(*noise);
  }
  TORCH_CHECK(seed >= 0, "seed must be >= 0, got ", seed);
  return Tensor();
}

// Kernel argument of a noise tensor: nullptr = draw in the kernel.
const double* noise_ptr(const Tensor& u) { return u.defined() ? u.data_ptr<double>() : nullptr; }

int method_code(const std::string& m) {
  if (m == "sd" || m == "rrs") return 0;
  if (m == "rrsw") return 1;
  if (m == "kseq") return 2;
  if (m == "spechub") return 3;
  if (m == "block") return 4;
  if (m == "traversal" || m == "traversalw") return 5;  // its own kernel (verify_traversal_kernel)
  if (m == "gds") return 6;
  TORCH_CHECK(false, "specdec: unknown method '", m, "'");
}

Tensor tree_positions(const Tensor& depth, const Tensor& prefix_len) {
  const c10::cuda::CUDAGuard guard(depth.device());
  Tensor d = i64(depth), out = at::empty_like(d);
  check(specdec_cuda_tree_positions(d.data_ptr<int64_t>(), i64(prefix_len).data_ptr<int64_t>(),
                                    out.data_ptr<int64_t>(), d.size(0), d.size(1), stream()),
        "tree_positions");
  return out;
}

Tensor tree_mask(const Tensor& parent, const Tensor& valid, const Tensor& past_valid, at::ScalarType dtype) {
  const c10::cuda::CUDAGuard guard(parent.device());
  const int64_t B = parent.size(0), N = parent.size(1), P = past_valid.size(1);
  Tensor allowed = at::zeros({B, N, P + N}, parent.options().dtype(at::kBool));
  check(specdec_cuda_tree_mask(i64(parent).data_ptr<int64_t>(), valid.to(at::kBool).contiguous().data_ptr<bool>(),
                               past_valid.to(at::kBool).contiguous().data_ptr<bool>(), allowed.data_ptr<bool>(), B, N,
                               P, stream()),
        "tree_mask");
  double lowest = 0.0;  // torch.finfo(dtype).min, as in the reference
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "tree_mask",
                                  [&] { lowest = static_cast<double>(std::numeric_limits<scalar_t>::lowest()); });
  Tensor mask = at::zeros({B, N, P + N}, parent.options().dtype(dtype));
  mask.masked_fill_(allowed.logical_not(), lowest);
  return mask.unsqueeze(1);
}

Tensor filter_kv(at::TensorList kv, const Tensor& prefix_len, const Tensor& accepted, const Tensor& n_accepted) {
  const c10::cuda::CUDAGuard guard(accepted.device());
  Tensor p = i64(prefix_len), acc = i64(accepted), n = i64(n_accepted);
  for (const Tensor& t : kv) {
    TORCH_CHECK(t.dim() == 4, "specdec::filter_kv: kv tensors must be [B, H, S, D]");
    check(specdec_cuda_filter_kv(t.data_ptr(), t.element_size(), t.size(0), t.size(1), t.size(3), t.stride(0),
                                 t.stride(1), t.stride(2), t.stride(3), p.data_ptr<int64_t>(), acc.data_ptr<int64_t>(),
                                 n.data_ptr<int64_t>(), acc.size(1), stream()),
          "filter_kv");
  }
  return p + n;
}

Tensor sample_categorical(const Tensor& logp, const std::optional<Tensor>& noise, int64_t seed) {
  const c10::cuda::CUDAGuard guard(logp.device());
  const int64_t V = logp.size(-1);
  Tensor lp = f32(logp).view({-1, V}), u = noise_or_none(noise, logp.sizes(), seed, logp, "noise");
  Tensor out = at::empty({lp.size(0)}, logp.options().dtype(at::kLong));
  check(specdec_cuda_sample_categorical(lp.data_ptr<float>(), noise_ptr(u), static_cast<uint64_t>(seed),
                                        out.data_ptr<int64_t>(), lp.size(0), V, stream()),
        "sample_categorical");
  auto shape = logp.sizes().vec();
  shape.pop_back();
  return out.view(shape);
}

std::tuple<Tensor, Tensor, Tensor> gumbel_topk(const Tensor& logp, int64_t k, const std::optional<Tensor>& noise,
                                               int64_t seed) {
  const c10::cuda::CUDAGuard guard(logp.device());
  const int64_t V = logp.size(-1);
  Tensor lp = f32(logp).view({-1, V}), u = noise_or_none(noise, logp.sizes(), seed, logp, "noise");
  const int64_t R = lp.size(0);
  Tensor tok = at::empty({R, k}, logp.options().dtype(at::kLong));
  Tensor valid = at::empty({R, k}, logp.options().dtype(at::kBool));
  Tensor score = at::empty({R, k}, logp.options().dtype(at::kDouble));
  check(specdec_cuda_gumbel_topk(lp.data_ptr<float>(), noise_ptr(u), static_cast<uint64_t>(seed),
                                 tok.data_ptr<int64_t>(), valid.data_ptr<bool>(), score.data_ptr<double>(), R, V, k,
                                 stream()),
        "gumbel_topk");
  auto shape = logp.sizes().vec();
  shape.back() = k;
  return {tok.view(shape), valid.view(shape), score.view(shape)};
}

Tensor process_logits(const Tensor& logits, double temperature, int64_t top_k, double top_p, bool log) {
  const c10::cuda::CUDAGuard guard(logits.device());
  const int64_t V = logits.size(-1);
  Tensor x = f32(logits).view({-1, V});
  Tensor out = at::empty_like(x);
  check(specdec_cuda_process_logits(x.data_ptr<float>(), out.data_ptr<float>(), x.size(0), V, temperature, top_k,
                                    top_p, stream()),
        "process_logits");
  // log=False: the law from the log-probs (torch's softmax; the CUDA kernel itself writes log-probs)
  if (!log) out = at::softmax(out, -1);
  return out.view(logits.sizes());
}

// sbs_step: fp64 sigma/gamma and noise (row b * Win + w when drawn); scratch holds each parent's top-min(Wout, V)
// candidates.
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> sbs_step(const Tensor& logp, const Tensor& sigma,
                                                            const Tensor& gamma, const Tensor& beam_valid,
                                                            int64_t w_out, const std::optional<Tensor>& noise,
                                                            int64_t seed) {
  const c10::cuda::CUDAGuard guard(logp.device());
  TORCH_CHECK(logp.dim() == 3, "specdec::sbs_step: logp must be [B, Win, V], got ", logp.sizes());
  const int64_t B = logp.size(0), Win = logp.size(1), V = logp.size(2);
  TORCH_CHECK(w_out >= 1 && w_out <= Win * V, "specdec::sbs_step: w_out must be in [1, Win*V=", Win * V, "]");
  const int64_t C = Win * (w_out < V ? w_out : V);
  Tensor lp = f32(logp), u = noise_or_none(noise, logp.sizes(), seed, logp, "noise");
  Tensor sg = f64(sigma), gm = f64(gamma);
  Tensor bv = beam_valid.to(at::kBool).contiguous();
  auto dopt = logp.options().dtype(at::kDouble), lopt = logp.options().dtype(at::kLong);
  Tensor cpsi = at::empty({B, C}, dopt), cphi = at::empty({B, C}, dopt), cidx = at::empty({B, C}, lopt);
  Tensor parent_slot = at::empty({B, w_out}, lopt), tokens = at::empty({B, w_out}, lopt);
  Tensor sigma_out = at::empty({B, w_out}, dopt), gamma_out = at::empty({B, w_out}, dopt);
  Tensor valid = at::empty({B, w_out}, logp.options().dtype(at::kBool));
  check(specdec_cuda_sbs_step(lp.data_ptr<float>(), sg.data_ptr<double>(), gm.data_ptr<double>(),
                              bv.data_ptr<bool>(), noise_ptr(u), static_cast<uint64_t>(seed),
                              cpsi.data_ptr<double>(), cidx.data_ptr<int64_t>(), cphi.data_ptr<double>(),
                              parent_slot.data_ptr<int64_t>(), tokens.data_ptr<int64_t>(),
                              sigma_out.data_ptr<double>(), gamma_out.data_ptr<double>(), valid.data_ptr<bool>(), B,
                              Win, V, w_out, stream()),
        "sbs_step");
  return {parent_slot, tokens, sigma_out, gamma_out, valid};
}

// SpecHub drafting: rows of any leading shape.
std::tuple<Tensor, Tensor, Tensor> spechub_sample(const Tensor& logp, const std::optional<Tensor>& noise,
                                                  int64_t seed) {
  const c10::cuda::CUDAGuard guard(logp.device());
  const int64_t V = logp.size(-1);
  Tensor lp = f32(logp).view({-1, V}), u = noise_or_none(noise, logp.sizes(), seed, logp, "noise");
  const int64_t R = lp.size(0);
  Tensor tokens = at::empty({R, 2}, logp.options().dtype(at::kLong));
  Tensor hub = at::empty({R}, logp.options().dtype(at::kLong));
  Tensor valid = at::empty({R, 2}, logp.options().dtype(at::kBool));
  check(specdec_cuda_spechub_sample(lp.data_ptr<float>(), noise_ptr(u), static_cast<uint64_t>(seed),
                                    tokens.data_ptr<int64_t>(), hub.data_ptr<int64_t>(), valid.data_ptr<bool>(), R, V,
                                    stream()),
        "spechub_sample");
  auto lead = logp.sizes().vec();
  lead.pop_back();
  auto pair = lead;
  pair.push_back(2);
  return {tokens.view(pair), hub.view(lead), valid.view(pair)};
}

// K-SEQ gamma: p, q [B, V] (fp32 in the kernel), k [B] -> gamma [B], beta [B] float64.
std::tuple<Tensor, Tensor> kseq_gamma(const Tensor& p, const Tensor& q, const Tensor& k) {
  const c10::cuda::CUDAGuard guard(p.device());
  TORCH_CHECK(p.dim() == 2 && q.sizes() == p.sizes(), "specdec::kseq_gamma: p and q must be [B, V]");
  const int64_t B = p.size(0), V = p.size(1);
  Tensor gamma = at::empty({B}, p.options().dtype(at::kDouble)), beta = at::empty_like(gamma);
  check(specdec_cuda_kseq_gamma(f32(p).data_ptr<float>(), f32(q).data_ptr<float>(), i64(k).data_ptr<int64_t>(),
                                gamma.data_ptr<double>(), beta.data_ptr<double>(), B, V, stream()),
        "kseq_gamma");
  return {gamma, beta};
}

Tensor eos_or_empty(const std::optional<Tensor>& eos, const Tensor& like) {
  return eos.has_value() ? i64(*eos) : at::empty({0}, like.options().dtype(at::kLong));
}

// accept_u [B, L] (row b, element j), final_noise [B, V] (row b): both unused when greedy.
std::tuple<Tensor, Tensor> verify_chain(const Tensor& draft, const std::optional<Tensor>& p, const Tensor& q,
                                        const Tensor& lengths, const std::optional<Tensor>& accept_u,
                                        const std::optional<Tensor>& final_noise, bool greedy,
                                        const std::optional<Tensor>& eos, int64_t seed, double leniency) {
  const c10::cuda::CUDAGuard guard(q.device());
  const int64_t B = draft.size(0), L = draft.size(1), V = q.size(-1);
  TORCH_CHECK(leniency >= 1.0, "specdec::verify_chain: leniency must be >= 1, got ", leniency);
  const bool use_p = !greedy || leniency > 1.0;  // the lenient greedy rule reads p
  TORCH_CHECK(!use_p || p.has_value(), "specdec::verify_chain: p is required unless greedy (with leniency 1)");
  Tensor qf = f32(q), pf = use_p ? f32(*p) : qf, e = eos_or_empty(eos, draft);
  Tensor n_acc = at::empty({B}, draft.options().dtype(at::kLong)), next = at::empty_like(n_acc);
  Tensor u = noise_or_none(accept_u, {B, L}, seed, q, "accept_u");
  Tensor fin = noise_or_none(final_noise, {B, V}, seed, q, "final_noise");
  check(specdec_cuda_verify_chain(i64(draft).data_ptr<int64_t>(), pf.data_ptr<float>(), qf.data_ptr<float>(),
                                  i64(lengths).data_ptr<int64_t>(), noise_ptr(u), noise_ptr(fin),
                                  static_cast<uint64_t>(seed), e.data_ptr<int64_t>(), e.numel(),
                                  n_acc.data_ptr<int64_t>(), next.data_ptr<int64_t>(), B, L, V, greedy, leniency,
                                  stream()),
        "verify_chain");
  return {n_acc, next};
}

// p, q [..., V] of one shape -> E [..., V]; computed in fp32, returned in the reference's compute dtype.
Tensor emission_law(const Tensor& p, const Tensor& q, double leniency) {
  const c10::cuda::CUDAGuard guard(q.device());
  TORCH_CHECK(p.dim() >= 1 && p.sizes() == q.sizes(), "specdec::emission_law: p and q must be [..., V] of one shape");
  TORCH_CHECK(leniency >= 1.0, "specdec::emission_law: leniency must be >= 1, got ", leniency);
  Tensor pf = f32(p), qf = f32(q), out = at::empty_like(pf);
  const int64_t V = p.size(-1), rows = V ? p.numel() / V : 0;
  check(specdec_cuda_emission_law(pf.data_ptr<float>(), qf.data_ptr<float>(), out.data_ptr<float>(), rows, V,
                                  leniency, stream()),
        "emission_law");
  const auto cd = (p.scalar_type() == at::kDouble || q.scalar_type() == at::kDouble) ? at::kDouble : at::kFloat;
  return out.to(cd);
}

// accept_u [B, K] (row b, element = slot), final_noise [B, V] (row b).
std::tuple<Tensor, Tensor, Tensor, Tensor> verify_node(const std::string& method, const Tensor& cand,
                                                       const Tensor& cand_valid, const Tensor& p, const Tensor& q,
                                                       const std::optional<Tensor>& accept_u,
                                                       const std::optional<Tensor>& final_noise,
                                                       const std::optional<Tensor>& hub, int64_t seed) {
  const c10::cuda::CUDAGuard guard(q.device());
  const int64_t B = cand.size(0), K = cand.size(1), V = q.size(-1);
  Tensor r = at::empty({B, V}, q.options().dtype(at::kFloat));
  Tensor s = at::empty_like(r), ap = at::zeros({B, K}, r.options());
  Tensor slot = at::empty({B}, cand.options().dtype(at::kLong)), token = at::empty_like(slot);
  Tensor h = hub.has_value() ? i64(*hub) : at::zeros({B}, slot.options());
  Tensor u = noise_or_none(accept_u, {B, K}, seed, q, "accept_u");
  Tensor fin = noise_or_none(final_noise, {B, V}, seed, q, "final_noise");
  check(specdec_cuda_verify_node(i64(cand).data_ptr<int64_t>(), cand_valid.to(at::kBool).contiguous().data_ptr<bool>(),
                                 f32(p).data_ptr<float>(), f32(q).data_ptr<float>(), noise_ptr(u), noise_ptr(fin),
                                 static_cast<uint64_t>(seed), h.data_ptr<int64_t>(), r.data_ptr<float>(),
                                 s.data_ptr<float>(), ap.data_ptr<float>(), slot.data_ptr<int64_t>(),
                                 token.data_ptr<int64_t>(), B, K, V, method_code(method), stream()),
        "verify_node");
  const auto cd = (p.scalar_type() == at::kDouble || q.scalar_type() == at::kDouble) ? at::kDouble : at::kFloat;
  return {slot, token, ap.to(cd), r.to(cd)};
}

// accept_u [B, N, Kmax] (row b * N + node, element = candidate rank; drawn: any rank), final_noise [B, V] (row b).
std::tuple<Tensor, Tensor, Tensor, Tensor> verify_tree(const Tensor& tokens, const Tensor& parent,
                                                       const Tensor& valid, const std::optional<Tensor>& p_rows,
                                                       const Tensor& q_rows, const std::string& method,
                                                       const std::optional<Tensor>& hub,
                                                       const std::optional<Tensor>& accept_u,
                                                       const std::optional<Tensor>& final_noise, bool greedy,
                                                       const std::optional<Tensor>& eos, int64_t max_depth,
                                                       int64_t seed) {
  const c10::cuda::CUDAGuard guard(q_rows.device());
  // greedy, traversal verification walks as rrs / rrsw do (accept the child equal to the target's argmax)
  const std::string walk = !greedy ? method : method == "traversal" ? "rrs" : method == "traversalw" ? "rrsw" : method;
  const int64_t B = tokens.size(0), N = tokens.size(1), V = q_rows.size(-1), KC = N > 1 ? N - 1 : 1;
  const int64_t L = max_depth > 0 ? max_depth : 1;
  Tensor qf = f32(q_rows), pf = (greedy || !p_rows.has_value()) ? qf : f32(*p_rows);
  auto lopt = tokens.options().dtype(at::kLong);
  Tensor acc = at::full({B, L}, -1, lopt), rank = at::full({B, L}, -1, lopt);
  Tensor n_acc = at::empty({B}, lopt), next = at::empty({B}, lopt);
  Tensor alive = at::full({B, N}, -1, tokens.options().dtype(at::kInt));
  Tensor ctok = at::empty({B, KC}, lopt), cnode = at::empty({B, KC}, lopt);
  Tensor ones = at::ones({KC}, tokens.options().dtype(at::kBool));
  Tensor r = at::empty({B, V}, q_rows.options().dtype(at::kFloat)), s = at::empty_like(r);
  Tensor h = hub.has_value() ? i64(*hub) : at::zeros({B, N}, lopt), e = eos_or_empty(eos, tokens);
  if (accept_u.has_value()) {
    TORCH_CHECK(accept_u->dim() == 3 && accept_u->size(0) == B && accept_u->size(1) == N,
                "specdec::verify_tree: accept_u must be [B, N, Kmax], got ", accept_u->sizes());
  }
  // drawn: the row width is irrelevant (KU only strides a given tensor)
  const std::vector<int64_t> u_shape = accept_u.has_value() ? accept_u->sizes().vec() : std::vector<int64_t>{B, N, KC};
  Tensor u = noise_or_none(accept_u, u_shape, seed, q_rows, "accept_u");
  Tensor fin = noise_or_none(final_noise, {B, V}, seed, q_rows, "final_noise");
  const int64_t KU = u.defined() ? u.size(2) : KC;
  TORCH_CHECK(greedy || KU >= 1, "specdec::verify_tree: accept_u must hold at least one uniform per node");
  if (!greedy && (method == "traversal" || method == "traversalw")) {
    auto dopt = q_rows.options().dtype(at::kDouble);
    Tensor removed = at::zeros({B, N}, tokens.options().dtype(at::kInt));
    Tensor lv_node = at::zeros({B, L + 1}, lopt), lv = at::zeros({B, L + 1, 3}, dopt);
    Tensor rr = at::empty({B, L + 1, V}, dopt), dd = at::empty_like(rr);
    check(specdec_cuda_verify_traversal(i64(tokens).data_ptr<int64_t>(), i64(parent).data_ptr<int64_t>(),
                                        valid.to(at::kBool).contiguous().data_ptr<bool>(), pf.data_ptr<float>(),
                                        qf.data_ptr<float>(), noise_ptr(u), noise_ptr(fin), static_cast<uint64_t>(seed),
                                        e.data_ptr<int64_t>(), e.numel(), removed.data_ptr<int>(),
                                        lv_node.data_ptr<int64_t>(), lv.data_ptr<double>(), rr.data_ptr<double>(),
                                        dd.data_ptr<double>(), acc.data_ptr<int64_t>(), rank.data_ptr<int64_t>(),
                                        n_acc.data_ptr<int64_t>(), next.data_ptr<int64_t>(), B, N, V, KU, L,
                                        method == "traversalw", stream()),
          "verify_tree");
    TORCH_CHECK(B == 0 || n_acc.min().item<int64_t>() >= 0,
                "specdec::verify_tree: a tree is deeper than max_depth; pass the tree's real depth");
    if (max_depth == 0) return {acc.narrow(1, 0, 0), n_acc, next, rank.narrow(1, 0, 0)};
    return {acc, n_acc, next, rank};
  }
  check(specdec_cuda_verify_tree(i64(tokens).data_ptr<int64_t>(), i64(parent).data_ptr<int64_t>(),
                                 valid.to(at::kBool).contiguous().data_ptr<bool>(), pf.data_ptr<float>(),
                                 qf.data_ptr<float>(), h.data_ptr<int64_t>(), noise_ptr(u), noise_ptr(fin),
                                 static_cast<uint64_t>(seed), e.data_ptr<int64_t>(), e.numel(),
                                 alive.data_ptr<int>(), ctok.data_ptr<int64_t>(), cnode.data_ptr<int64_t>(),
                                 ones.data_ptr<bool>(), r.data_ptr<float>(), s.data_ptr<float>(),
                                 acc.data_ptr<int64_t>(), rank.data_ptr<int64_t>(), n_acc.data_ptr<int64_t>(),
                                 next.data_ptr<int64_t>(), B, N, V, KU, KC, L, method_code(walk),
                                 method == "kseq", greedy, stream()),
        "verify_tree");
  if (method == "block" && !greedy)
    TORCH_CHECK(B == 0 || n_acc.min().item<int64_t>() >= 0,
                "specdec::verify_tree: a chain is longer than max_depth; pass the tree's real depth");
  if (max_depth == 0) return {acc.narrow(1, 0, 0), n_acc, next, rank.narrow(1, 0, 0)};
  return {acc, n_acc, next, rank};
}

}  // namespace cuda_binding
}  // namespace specdec

TORCH_LIBRARY_IMPL(specdec, CUDA, m) {
  using namespace specdec::cuda_binding;
  m.impl("tree_positions", &tree_positions);
  m.impl("tree_mask", &tree_mask);
  m.impl("filter_kv", &filter_kv);
  m.impl("sample_categorical", &sample_categorical);
  m.impl("gumbel_topk", &gumbel_topk);
  m.impl("process_logits", &process_logits);
  m.impl("sbs_step", &sbs_step);
  m.impl("spechub_sample", &spechub_sample);
  m.impl("kseq_gamma", &kseq_gamma);
  m.impl("verify_chain", &verify_chain);
  m.impl("emission_law", &emission_law);
  m.impl("verify_node", &verify_node);
  m.impl("verify_tree", &verify_tree);
}
