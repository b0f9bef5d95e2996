// Helpers shared by the CPU adapters (tensor checks, OpenMP thread count).
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <string>

namespace specdec::cpu {

// OpenMP team size: follow torch.set_num_threads, and stay serial for small work (thread start-up ~ microseconds).
inline int omp_threads(int64_t rows, int64_t work) {
  if (rows < 2 || work < (1 << 18)) return 1;
  const int64_t t = at::get_num_threads();
  return static_cast<int>(t < rows ? t : rows);
}

inline void check_cpu(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), "specdec cpu backend: ", name, " must be a CPU tensor, got ", t.device());
}

inline at::Tensor as_long(const at::Tensor& t, const char* name) {
  check_cpu(t, name);
  TORCH_CHECK(!at::isFloatingType(t.scalar_type()) && t.scalar_type() != at::kBool, name,
              " must be an integer tensor, got ", t.scalar_type());
  return t.to(at::kLong).contiguous();
}

// fp16/bf16 -> fp32 with torch's vectorised conversion (exact), so the kernels only see float or double.
inline at::Tensor widen(const at::Tensor& t) {
  const at::ScalarType st = t.scalar_type();
  return (st == at::kHalf || st == at::kBFloat16) ? t.to(at::kFloat).contiguous() : t.contiguous();
}

inline at::Tensor as_bool(const at::Tensor& t, const char* name) {
  check_cpu(t, name);
  TORCH_CHECK(t.scalar_type() == at::kBool, name, " must be a bool tensor, got ", t.scalar_type());
  return t.contiguous();
}

}  // namespace specdec::cpu
