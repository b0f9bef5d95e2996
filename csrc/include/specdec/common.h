// Scalar helpers shared by the CPU and CUDA kernels. Framework-free: no torch headers, raw values only.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define SPECDEC_HD __host__ __device__ __forceinline__
#else
#define SPECDEC_HD inline
#endif

namespace specdec {

// Standard Gumbel from a uniform in (0, 1), in double like the torch reference (spec §1.4, §2.1).
SPECDEC_HD double gumbel(double u) { return -::log(-::log(u)); }

// Total order of the Gumbel races: larger score first, ties to the lower index (DESIGN.md §3).
SPECDEC_HD bool beats(double a, int64_t ia, double b, int64_t ib) { return a > b || (a == b && ia < ib); }

}  // namespace specdec
