// extern "C" launchers of the CUDA kernels: raw pointers, sizes and a cudaStream_t passed as void*. The tensor
// binding (cuda_bindings.cpp, built only with a CUDA torch) checks tensors and calls these. Return: cudaError_t.
// Noise pointers (noise, accept_u, fin: contiguous float64 uniforms) may be nullptr: the kernel then draws the same
// elements from the Philox stream of `seed` (specdec_kernels/_rng.py) with the purpose of the argument:
// DRAFT for noise, ACCEPT for accept_u, FINAL for fin.
#pragma once

#include <cstdint>

extern "C" {
int specdec_cuda_sample_categorical(const float* logp, const double* noise, uint64_t seed, int64_t* out, int64_t rows,
                                    int64_t V, void* stream);
int specdec_cuda_gumbel_topk(const float* logp, const double* noise, uint64_t seed, int64_t* tokens, bool* valid,
                             double* score, int64_t rows, int64_t V, int64_t K, void* stream);
int specdec_cuda_process_logits(const float* logits, float* out, int64_t rows, int64_t V, double temperature,
                                int64_t top_k, double top_p, void* stream);
int specdec_cuda_tree_positions(const int64_t* depth, const int64_t* prefix_len, int64_t* out, int64_t B, int64_t N,
                                void* stream);
int specdec_cuda_tree_mask(const int64_t* parent, const bool* valid, const bool* past_valid, bool* allowed, int64_t B,
                           int64_t N, int64_t P, void* stream);
int specdec_cuda_filter_kv(void* kv, int64_t elem_size, int64_t B, int64_t H, int64_t D, int64_t sb, int64_t sh,
                           int64_t ss, int64_t sd, const int64_t* prefix_len, const int64_t* accepted,
                           const int64_t* n_accepted, int64_t L, void* stream);
int specdec_cuda_verify_chain(const int64_t* draft, const float* p, const float* q, const int64_t* lengths,
                              const double* accept_u, const double* fin, uint64_t seed, const int64_t* eos,
                              int64_t n_eos, int64_t* n_acc, int64_t* next, int64_t B, int64_t L, int64_t V,
                              bool greedy, double leniency, void* stream);
// p, q, out [rows, V] fp32 (float64 rows are computed in float32 by this backend)
int specdec_cuda_emission_law(const float* p, const float* q, float* out, int64_t rows, int64_t V, double leniency,
                              void* stream);
int specdec_cuda_verify_node(const int64_t* cand, const bool* cvalid, const float* p, const float* q,
                             const double* accept_u, const double* fin, uint64_t seed, const int64_t* hub, float* r,
                             float* s, float* ap, int64_t* slot, int64_t* token, int64_t B, int64_t K, int64_t V,
                             int method, void* stream);
int specdec_cuda_verify_tree(const int64_t* tokens, const int64_t* parent, const bool* valid, const float* p,
                             const float* q, const int64_t* hub, const double* accept_u, const double* fin,
                             uint64_t seed, const int64_t* eos, int64_t n_eos, int* alive, int64_t* ctok,
                             int64_t* cnode, const bool* ones, float* r, float* s, int64_t* acc, int64_t* rank,
                             int64_t* n_acc, int64_t* next, int64_t B, int64_t N, int64_t V, int64_t KU, int64_t KC,
                             int64_t L, int method, bool kseq, bool greedy, void* stream);
int specdec_cuda_verify_traversal(const int64_t* tokens, const int64_t* parent, const bool* valid, const float* p,
                                  const float* q, const double* accept_u, const double* fin, uint64_t seed,
                                  const int64_t* eos, int64_t n_eos, int* removed, int64_t* lv_node, double* lv,
                                  double* r, double* d, int64_t* acc, int64_t* rank, int64_t* n_acc, int64_t* next,
                                  int64_t B, int64_t N, int64_t V, int64_t KU, int64_t L, bool swor, void* stream);
}

extern "C" {
int specdec_cuda_spechub_sample(const float* logp, const double* noise, uint64_t seed, int64_t* tokens, int64_t* hub,
                                bool* valid, int64_t rows, int64_t V, void* stream);
int specdec_cuda_kseq_gamma(const float* p, const float* q, const int64_t* k, double* gamma, double* beta, int64_t B,
                            int64_t V, void* stream);
// scratch: cpsi/cphi [B, Win * min(Wout, V)] fp64, cidx [B, Win * min(Wout, V)] int64
int specdec_cuda_sbs_step(const float* logp, const double* sigma, const double* gamma, const bool* bvalid,
                          const double* noise, uint64_t seed, double* cpsi, int64_t* cidx, double* cphi,
                          int64_t* parent_slot, int64_t* tokens, double* sigma_out, double* gamma_out, bool* valid,
                          int64_t B, int64_t Win, int64_t V, int64_t Wout, void* stream);
}
