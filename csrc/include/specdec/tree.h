// Tree layout kernels: one batch row per call, raw pointers + sizes.
#pragma once

#include <cstdint>
#include <cstring>

#include "specdec/common.h"

namespace specdec {

// Node n sits at position P - 1 + depth[n].
SPECDEC_HD void tree_positions_row(const int64_t* depth,  // [N]
                                   int64_t prefix_len,    // P, committed tokens incl. the root
                                   int64_t n,
                                   int64_t* out) {  // [N]
  for (int64_t i = 0; i < n; ++i) out[i] = prefix_len - 1 + depth[i];
}

// RSD Alg. 5 row by row: a valid node's tree row is its parent's row plus its own diagonal; the past
// part is past_valid for valid nodes; padding nodes (and nodes with an out-of-range parent) see only themselves.
// Level order (parent[i] < i) makes the parent's row final before it is copied.
template <typename T>
void tree_mask_row(const int64_t* parent,    // [N]
                   const bool* valid,        // [N]
                   const bool* past_valid,   // [P_kv]
                   int64_t n, int64_t past,  // N, P_kv
                   T allow, T blocked,
                   T* out) {  // [N, P_kv + N]
  const int64_t width = past + n;
  for (int64_t i = 0; i < n; ++i) {
    T* row = out + i * width;
    const bool vi = valid[i];
    for (int64_t j = 0; j < past; ++j) row[j] = (vi && past_valid[j]) ? allow : blocked;
    T* tree = row + past;
    const int64_t par = parent[i];
    if (vi && i > 0 && par >= 0 && par < i) {
      const T* src = out + par * width + past;
      for (int64_t j = 0; j < i; ++j) tree[j] = src[j];
    } else {
      for (int64_t j = 0; j < i; ++j) tree[j] = blocked;
    }
    tree[i] = allow;
    for (int64_t j = i + 1; j < n; ++j) tree[j] = blocked;
  }
}

// filter_kv on one [S, D] slab of a K or V cache: slot P-1+nodes[j] moves to slot P+j for j < m.
// nodes[j] > j gives dst_j = P+j <= src_j and src_j' >= P+j' > dst_j for every later j', so copying in increasing
// j never overwrites a source that is still needed (same result as gathering first, as the reference does).
inline void filter_kv_slab(char* base,            // slot 0 of the slab
                           int64_t slot_stride,   // bytes between slots
                           int64_t d, int64_t d_stride, int64_t elem,  // D elements, bytes between them, bytes each
                           int64_t prefix_len,    // P
                           const int64_t* nodes,  // [m] accepted node ids (>= 1)
                           int64_t m) {
  for (int64_t j = 0; j < m; ++j) {
    const int64_t src = prefix_len - 1 + nodes[j];
    const int64_t dst = prefix_len + j;
    if (src == dst) continue;
    char* to = base + dst * slot_stride;
    const char* from = base + src * slot_stride;
    if (d_stride == elem) {
      std::memcpy(to, from, static_cast<size_t>(d * elem));
    } else {
      for (int64_t e = 0; e < d; ++e) std::memcpy(to + e * d_stride, from + e * d_stride, static_cast<size_t>(elem));
    }
  }
}

}  // namespace specdec
