// Scalar helpers shared by the CPU and CUDA kernels. Framework-free: no torch headers, raw values only.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define SPECDEC_HD __host__ __device__ __forceinline__
#else
#define SPECDEC_HD inline
#endif

namespace specdec {

constexpr double kLn2 = 0.69314718055994530942;

SPECDEC_HD uint64_t bits_of(double x) {
  uint64_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

SPECDEC_HD uint32_t bits_of(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

SPECDEC_HD float float_of(uint32_t b) {
  float x;
  std::memcpy(&x, &b, sizeof x);
  return x;
}

// Standard Gumbel from a uniform in (0, 1), in double like the torch reference.
SPECDEC_HD double gumbel(double u) { return -::log(-::log(u)); }

// Cheap upper bound of gumbel(u) for pruning Gumbel races (no transcendental call, vectorises):
// -log u >= 1 - u gives G(u) <= -log(1 - u), and 1 - u >= 2^e (e = binary exponent of 1 - u) gives
// G(u) <= -e ln 2. Exact skips need a margin only for the rounding of the exact score (see race_margin).
SPECDEC_HD double gumbel_upper(double u) {
  const double w = 1.0 - u;
  const int64_t e = static_cast<int64_t>((bits_of(w) >> 52) & 0x7ff) - 1023;
  return -static_cast<double>(e) * kLn2;
}

// Upper bounds of log(x) for x >= 0 from the binary exponent: x < 2^(e+1); log(0) = -inf. Subnormals get the
// bound of the smallest normal, which is still above their log.
SPECDEC_HD double log_upper(float x) {
  const int64_t e = static_cast<int64_t>((bits_of(x) >> 23) & 0xff) - 127;
  return x > 0.0f ? static_cast<double>(e + 1) * kLn2 : -INFINITY;
}

SPECDEC_HD double log_upper(double x) {
  const int64_t e = static_cast<int64_t>((bits_of(x) >> 52) & 0x7ff) - 1023;
  return x > 0.0 ? static_cast<double>(e + 1) * kLn2 : -INFINITY;
}

// An element whose bound is below (best - race_margin(best)) cannot beat or tie best: the bound is exact in real
// arithmetic and the computed scores carry relative errors of a few 1e-16.
SPECDEC_HD double race_margin(double best) { return 1e-9 * (1.0 + ::fabs(best)); }

// Total order of the Gumbel races: larger score first, ties to the lower index.
SPECDEC_HD bool beats(double a, int64_t ia, double b, int64_t ib) { return a > b || (a == b && ia < ib); }

// exp for x <= 0 in fp32 (Cephes polynomial, ~1 ulp), branch-free so loops over it vectorise; x below -87 (incl.
// -inf) returns exp(-87) ~ 1.6e-38, which is negligible wherever it is used (sums that contain exp(0) = 1).
SPECDEC_HD float exp_nonpos(float x) {
  x = x < -87.0f ? -87.0f : x;
  // round to nearest by the 1.5 * 2^23 trick: floorf would block vectorisation (it may trap on inexact)
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  const float r2 = r * r;
  float y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * r2 + r + 1.0f;
  const int32_t ni = static_cast<int32_t>(n);
  return y * float_of(static_cast<uint32_t>(ni + 127) << 23);
}

// ---- counter-based noise (docs/kernels.md); the stream is defined in specdec_kernels/_rng.py ----
enum NoisePurpose : uint32_t { kDraftNoise = 0, kAcceptNoise = 1, kFinalNoise = 2 };

// Philox-4x32-10 (Salmon et al., SC'11) on c[0..3] in place, key (k0, k1).
SPECDEC_HD void philox4x32_10(uint32_t c[4], uint32_t k0, uint32_t k1) {
  for (int rnd = 0; rnd < 10; ++rnd) {
    if (rnd) {
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    const uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * c[0];
    const uint64_t p1 = static_cast<uint64_t>(0xCD9E8D57u) * c[2];
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k0;
    const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k1;
    c[0] = n0;
    c[1] = static_cast<uint32_t>(p1);
    c[2] = n2;
    c[3] = static_cast<uint32_t>(p0);
  }
}

// Two 32-bit words -> a uniform in (0, 1) with 52 random bits: (2m + 1) 2^-53 is exact in double.
SPECDEC_HD double philox_u52(uint32_t a, uint32_t b) {
  const uint64_t m = (static_cast<uint64_t>(a >> 12) << 32) | b;
  return static_cast<double>(2 * m + 1) * 1.1102230246251565e-16;  // 2^-53
}

// Element `index` of noise row `row` of stream (seed, purpose).
SPECDEC_HD double philox_uniform(uint64_t seed, uint32_t purpose, uint64_t row, uint64_t index) {
  uint32_t c[4] = {static_cast<uint32_t>(index >> 1), static_cast<uint32_t>(row), static_cast<uint32_t>(row >> 32),
                   purpose};
  philox4x32_10(c, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  return (index & 1) ? philox_u52(c[2], c[3]) : philox_u52(c[0], c[1]);
}

}  // namespace specdec
