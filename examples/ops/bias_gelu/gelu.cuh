// GELU and its derivative in float for the bias_gelu kernels (bias_gelu.cu, bias_gelu_backward.cu):
// erff (erfcf in the derivative) and expf for float32 elements, a cheaper erfc approximation for
// 16-bit ones.
#pragma once

namespace bias_gelu {

__device__ __forceinline__ float rcp_approx(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

/// The normal tail 1 - Phi(|v|) and exp(-v^2 / 2), for the 16-bit kernels:
/// 1 - Phi(|v|) = erfc(|v| / sqrt 2) / 2 = t * poly(t) * exp(-v^2 / 2), t = 1 / (1 + p |v| / sqrt 2)
/// (Abramowitz & Stegun, Handbook of Mathematical Functions, 1964, formula 7.1.26:
/// |error of erfc| <= 1.5e-7; the factor 1/2 is folded into the coefficients). About 17
/// instructions an element for gelu against about 26 with erff, which made the 16-bit kernel
/// bound by instruction issue (bench/RESULTS.md). The approximate exp2 flushes results below
/// 2^-126 to zero.
struct NormalTail {
  float tail;      // 1 - Phi(|v|)
  float gaussian;  // exp(-v^2 / 2)
};
__device__ __forceinline__ NormalTail normal_tail(float v) {
  constexpr float kP = 0.3275911f * 0.70710678118654752f;  // p / sqrt 2
  constexpr float kExp2 = -0.72134752044448170f;           // -log2(e) / 2: exp(-v^2 / 2) = 2^(kExp2 v^2)
  const float t = rcp_approx(fmaf(kP, fabsf(v), 1.0f));
  const float poly =
      t * fmaf(t, fmaf(t, fmaf(t, fmaf(t, 0.5307027145f, -0.7265760135f), 0.7107068705f), -0.142248368f), 0.127414796f);
  const float gaussian = exp2_approx(v * v * kExp2);
  return {poly * gaussian, gaussian};
}

/// gelu(v) = v * Phi(v) for 16-bit outputs, Phi from normal_tail. Error against the exact GELU,
/// computed in double: at most 2.2e-7 absolute (|v| * 7.5e-8); relative, below 0.01% for
/// v > -3 but growing in the far negative tail, where the outputs are tiny: 0.05% at v = -4
/// (|y| = 1.3e-4), 0.16% at -5 (1.4e-6), 1% at -8 (5e-15).
__device__ __forceinline__ float gelu_16bit(float v) {
  const float tail = normal_tail(v).tail;
  return v * (v < 0.0f ? tail : 1.0f - tail);
}

/// gelu(v) = v * Phi(v) in float: erff for float32 outputs, gelu_16bit for 16-bit ones.
template <class T>
__device__ __forceinline__ float gelu(float v) {
  if constexpr (sizeof(T) == 2) return gelu_16bit(v);
  return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
}

/// gelu'(v) = Phi(v) + v * phi(v), phi the standard normal density exp(-v^2 / 2) / sqrt(2 pi),
/// for 16-bit outputs, both from normal_tail: at most 1.5e-7 absolute error from Phi plus the
/// approximate exp2's relative 2^-22 on v * phi(v).
__device__ __forceinline__ float gelu_grad_16bit(float v) {
  constexpr float kInvSqrt2Pi = 0.39894228040143268f;
  const NormalTail n = normal_tail(v);
  return (v < 0.0f ? n.tail : 1.0f - n.tail) + v * n.gaussian * kInvSqrt2Pi;
}

/// gelu'(v) in float: erfcf and expf for float32 outputs, gelu_grad_16bit for 16-bit ones. Phi(v)
/// is erfc(-v / sqrt 2) / 2, not (1 + erf(v / sqrt 2)) / 2: for negative v the latter cancels,
/// leaving erf's absolute error (~6e-8) on a small Phi (a relative 1e-3 at v = -4), which grad_y
/// then scales past float32's tolerance.
template <class T>
__device__ __forceinline__ float gelu_grad(float v) {
  if constexpr (sizeof(T) == 2) return gelu_grad_16bit(v);
  return 0.5f * erfcf(-v * 0.70710678118654752f) + v * expf(-0.5f * v * v) * 0.39894228040143268f;
}

}  // namespace bias_gelu
