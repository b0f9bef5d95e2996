// CUDA kernels: tree_positions, tree_mask, filter_kv.
#include <cuda_runtime.h>

#include "common.cuh"
#include "launchers.h"

namespace specdec {
namespace cuda {

__global__ void tree_positions_kernel(const int64_t* __restrict__ depth,       // [B, N]
                                      const int64_t* __restrict__ prefix_len,  // [B]
                                      int64_t* __restrict__ out,               // [B, N]
                                      int64_t N) {
  const int64_t b = blockIdx.x;
  for (int64_t n = threadIdx.x; n < N; n += blockDim.x) out[b * N + n] = prefix_len[b] - 1 + depth[b * N + n];
}

// One block per (row b, node i): the past columns, then node i and its ancestors (parent pointers).
__global__ void tree_mask_kernel(const int64_t* __restrict__ parent,    // [B, N]
                                 const bool* __restrict__ valid,        // [B, N]
                                 const bool* __restrict__ past_valid,   // [B, P]
                                 bool* __restrict__ allowed,            // [B, N, P + N], zero-initialised
                                 int64_t N, int64_t P) {
  const int64_t b = blockIdx.y, i = blockIdx.x;
  const bool row_valid = valid[b * N + i];
  bool* out = allowed + (b * N + i) * (P + N);
  for (int64_t c = threadIdx.x; c < P; c += blockDim.x) out[c] = row_valid && past_valid[b * P + c];
  if (threadIdx.x == 0) {
    out[P + i] = true;
    for (int64_t cur = (row_valid && i > 0) ? parent[b * N + i] : -1; cur >= 0; cur = parent[b * N + cur])
      out[P + cur] = true;
  }
}

// One block per (row b, head h): accepted slots are moved one at a time in depth order, which is safe in place
// because the source of depth j+1 always lies at or after the destination of depth j (node id > depth).
template <typename T>
__global__ void filter_kv_kernel(T* __restrict__ kv,                        // [B, H, S, D] with strides
                                 int64_t sb, int64_t sh, int64_t ss, int64_t sd, int64_t H, int64_t D,
                                 const int64_t* __restrict__ prefix_len,    // [B]
                                 const int64_t* __restrict__ accepted,      // [B, L]
                                 const int64_t* __restrict__ n_accepted,    // [B]
                                 int64_t L) {
  const int64_t b = blockIdx.x / H, h = blockIdx.x % H;
  const int64_t p = prefix_len[b];
  T* base = kv + b * sb + h * sh;
  for (int64_t j = 0; j < n_accepted[b]; ++j) {
    const int64_t src = p - 1 + accepted[b * L + j], dst = p + j;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) base[dst * ss + d * sd] = base[src * ss + d * sd];
    __syncthreads();
  }
}

}  // namespace cuda
}  // namespace specdec

using namespace specdec::cuda;

extern "C" int specdec_cuda_tree_positions(const int64_t* depth, const int64_t* prefix_len, int64_t* out, int64_t B,
                                           int64_t N, void* stream) {
  if (B == 0 || N == 0) return 0;
  tree_positions_kernel<<<B, 128, 0, static_cast<cudaStream_t>(stream)>>>(depth, prefix_len, out, N);
  return static_cast<int>(cudaGetLastError());
}

extern "C" int specdec_cuda_tree_mask(const int64_t* parent, const bool* valid, const bool* past_valid, bool* allowed,
                                      int64_t B, int64_t N, int64_t P, void* stream) {
  if (B == 0 || N == 0) return 0;
  const dim3 grid(static_cast<unsigned>(N), static_cast<unsigned>(B));
  tree_mask_kernel<<<grid, 128, 0, static_cast<cudaStream_t>(stream)>>>(parent, valid, past_valid, allowed, N, P);
  return static_cast<int>(cudaGetLastError());
}

extern "C" int specdec_cuda_filter_kv(void* kv, int64_t elem_size, int64_t B, int64_t H, int64_t D, int64_t sb,
                                      int64_t sh, int64_t ss, int64_t sd, const int64_t* prefix_len,
                                      const int64_t* accepted, const int64_t* n_accepted, int64_t L, void* stream) {
  if (B == 0 || H == 0 || L == 0) return 0;
  const auto s = static_cast<cudaStream_t>(stream);
  const unsigned grid = static_cast<unsigned>(B * H);
  switch (elem_size) {
    case 2:
      filter_kv_kernel<<<grid, 128, 0, s>>>(static_cast<uint16_t*>(kv), sb, sh, ss, sd, H, D, prefix_len, accepted,
                                            n_accepted, L);
      break;
    case 4:
      filter_kv_kernel<<<grid, 128, 0, s>>>(static_cast<uint32_t*>(kv), sb, sh, ss, sd, H, D, prefix_len, accepted,
                                            n_accepted, L);
      break;
    case 8:
      filter_kv_kernel<<<grid, 128, 0, s>>>(static_cast<uint64_t*>(kv), sb, sh, ss, sd, H, D, prefix_len, accepted,
                                            n_accepted, L);
      break;
    default:
      return static_cast<int>(cudaErrorInvalidValue);
  }
  return static_cast<int>(cudaGetLastError());
}
