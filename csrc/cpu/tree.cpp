// CPU adapters for the tree layout ops; kernels in specdec/tree.h.
#include <ATen/Dispatch.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <limits>
#include <vector>

#include "cpu/common.h"
#include "cpu/ops.h"
#include "specdec/tree.h"

namespace specdec::cpu {

at::Tensor tree_positions(const at::Tensor& depth_in, const at::Tensor& prefix_in) {
  const at::Tensor depth = as_long(depth_in, "depth");
  const at::Tensor prefix = as_long(prefix_in, "prefix_len");
  TORCH_CHECK(depth.dim() == 2, "depth must be [B, N], got ", depth.sizes());
  const int64_t batch = depth.size(0), n = depth.size(1);
  TORCH_CHECK(prefix.dim() == 1 && prefix.size(0) == batch, "prefix_len must be [B=", batch, "], got ",
              prefix.sizes());
  at::Tensor out = at::empty({batch, n}, depth.options());
  const int64_t* d = depth.const_data_ptr<int64_t>();
  const int64_t* p = prefix.const_data_ptr<int64_t>();
  int64_t* o = out.mutable_data_ptr<int64_t>();
#pragma omp parallel for num_threads(omp_threads(batch, batch * n))
  for (int64_t b = 0; b < batch; ++b) tree_positions_row(d + b * n, p[b], n, o + b * n);
  return out;
}

namespace {

template <typename T>
void mask_rows(const int64_t* par, const bool* val, const bool* pv, int64_t batch, int64_t n, int64_t past, T* out) {
  // finfo(dtype).min like the reference (HF adds the mask to scores; -inf would give NaN on empty rows)
  const T blocked = std::numeric_limits<T>::lowest();
  const T allow = static_cast<T>(0);
#pragma omp parallel for num_threads(omp_threads(batch, batch * n * (past + n)))
  for (int64_t b = 0; b < batch; ++b)
    tree_mask_row<T>(par + b * n, val + b * n, pv + b * past, n, past, allow, blocked, out + b * n * (past + n));
}

}  // namespace

at::Tensor tree_mask(const at::Tensor& parent_in, const at::Tensor& valid_in, const at::Tensor& past_in,
                     at::ScalarType dtype) {
  const at::Tensor parent = as_long(parent_in, "parent");
  const at::Tensor valid = as_bool(valid_in, "valid");
  const at::Tensor past_valid = as_bool(past_in, "past_valid");
  TORCH_CHECK(parent.dim() == 2, "parent must be [B, N], got ", parent.sizes());
  const int64_t batch = parent.size(0), n = parent.size(1);
  TORCH_CHECK(valid.sizes() == parent.sizes(), "valid must have the shape of parent ", parent.sizes(), ", got ",
              valid.sizes());
  TORCH_CHECK(past_valid.dim() == 2 && past_valid.size(0) == batch, "past_valid must be [B=", batch,
              ", P_kv], got ", past_valid.sizes());
  TORCH_CHECK(at::isFloatingType(dtype), "dtype must be floating, got ", dtype);
  const int64_t past = past_valid.size(1);
  at::Tensor out = at::empty({batch, 1, n, past + n}, parent.options().dtype(dtype));
  const int64_t* par = parent.const_data_ptr<int64_t>();
  const bool* val = valid.const_data_ptr<bool>();
  const bool* pv = past_valid.const_data_ptr<bool>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "specdec_tree_mask", [&] {
    mask_rows<scalar_t>(par, val, pv, batch, n, past, out.mutable_data_ptr<scalar_t>());
  });
  return out;
}

void crop_slots_(at::TensorList kv, int64_t length) {
  for (size_t i = 0; i < kv.size(); ++i) {
    const at::Tensor& t = kv[i];
    TORCH_CHECK_VALUE(t.dim() == 4, "kv[", i, "] must be [B, H, S, D], got ", t.sizes());
    TORCH_CHECK_VALUE(length >= 0 && length <= t.size(2), "length must be in [0, ", t.size(2), "] for kv[", i,
                      "], got ", length);
  }
  // A cache crop is a narrowing view of every layer's keys and values (two Python-level slices per layer, a few
  // microseconds each right after a forward); editing the sizes in place does the same for all layers in one call.
  for (const at::Tensor& t : kv) {
    std::vector<int64_t> sizes(t.sizes().begin(), t.sizes().end());
    sizes[2] = length;
    t.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, t.strides());
  }
}

at::Tensor filter_kv(at::TensorList kv, const at::Tensor& prefix_in, const at::Tensor& nodes_in,
                     const at::Tensor& n_acc_in) {
  const at::Tensor prefix = as_long(prefix_in, "prefix_len");
  const at::Tensor nodes = as_long(nodes_in, "accepted_nodes");
  const at::Tensor n_acc = as_long(n_acc_in, "n_accepted");
  TORCH_CHECK(nodes.dim() == 2, "accepted_nodes must be [B, L], got ", nodes.sizes());
  const int64_t batch = nodes.size(0), max_len = nodes.size(1);
  TORCH_CHECK(prefix.dim() == 1 && prefix.size(0) == batch, "prefix_len must be [B=", batch, "]");
  TORCH_CHECK(n_acc.dim() == 1 && n_acc.size(0) == batch, "n_accepted must be [B=", batch, "]");
  const int64_t* p = prefix.const_data_ptr<int64_t>();
  const int64_t* nd = nodes.const_data_ptr<int64_t>();
  const int64_t* m = n_acc.const_data_ptr<int64_t>();
  // Memory safety for direct torch.ops calls and for filter_kv(validate=False), which relies on these checks
  // (ValueError in Python).
  int64_t need = 0;
  for (int64_t b = 0; b < batch; ++b) {
    TORCH_CHECK_VALUE(m[b] >= 0 && m[b] <= max_len, "n_accepted[", b, "] must be in [0, ", max_len, "]");
    TORCH_CHECK_VALUE(p[b] >= 1, "prefix_len[", b, "] must be >= 1");
    for (int64_t j = 0; j < m[b]; ++j) {
      TORCH_CHECK_VALUE(nd[b * max_len + j] > j, "accepted_nodes[", b, ", ", j, "] must be > ", j);
      need = std::max(need, p[b] - 1 + nd[b * max_len + j] + 1);
    }
    if (m[b] > 0) need = std::max(need, p[b] + m[b]);
  }
  for (size_t i = 0; i < kv.size(); ++i) {
    const at::Tensor& t = kv[i];
    check_cpu(t, "kv");
    TORCH_CHECK_VALUE(t.dim() == 4 && t.size(0) == batch, "kv[", i, "] must be [B=", batch, ", H, S, D], got ",
                t.sizes());
    TORCH_CHECK_VALUE(t.size(2) >= need, "kv[", i, "] has ", t.size(2), " slots, the accepted nodes need ", need);
  }
  // One work item per (tensor, row, head) slab; slabs never overlap.
  struct Slab {
    char* base;
    int64_t slot_stride, d, d_stride, elem, b;
  };
  std::vector<Slab> slabs;
  for (const at::Tensor& t : kv) {
    const int64_t elem = static_cast<int64_t>(t.element_size());
    char* data = static_cast<char*>(t.data_ptr());
    for (int64_t b = 0; b < batch; ++b) {
      if (m[b] == 0) continue;
      for (int64_t h = 0; h < t.size(1); ++h)
        slabs.push_back({data + (b * t.stride(0) + h * t.stride(1)) * elem, t.stride(2) * elem, t.size(3),
                         t.stride(3) * elem, elem, b});
    }
  }
  const int64_t n_slabs = static_cast<int64_t>(slabs.size());
  const int64_t bytes_each = kv.empty() ? 0 : max_len * kv[0].size(3) * kv[0].element_size();
#pragma omp parallel for num_threads(omp_threads(n_slabs, n_slabs * bytes_each))
  for (int64_t s = 0; s < n_slabs; ++s) {
    const Slab& sl = slabs[s];
    filter_kv_slab(sl.base, sl.slot_stride, sl.d, sl.d_stride, sl.elem, p[sl.b], nd + sl.b * max_len, m[sl.b]);
  }
  return prefix.add(n_acc);
}

}  // namespace specdec::cpu
