// int8_linear's packed weight layout, shared by the CPU reference (int8_linear.cpp) and the CUDA
// kernels (int8_linear.cu).
//
// qweight has the weight's shape [N, K] and its N * K bytes (a weight of any shape packs into its
// own bytes), in three parts:
//   - the aligned block, rows n < N8 = N / 8 * 8 and columns k < K64 = K / 64 * 64, in the order
//     the tensor-core kernels load it: per strip of 8 output channels and chunk of 64 input
//     channels, 32 lanes x 16 bytes, where lane l's 16 bytes are its B fragments of
//     mma.m16n8k16 (PTX ISA, "Matrix Fragments for mma.m16n8k16", .f16/.bf16 B operand) for the
//     chunk's four k16 tiles: W[n][k] with n = 8 * strip + l / 4 and
//     k = 64 * chunk + 16 * tile + 2 * (l % 4) + {0, 1, 8, 9}. One 16-byte load per lane then
//     feeds four mma's;
//   - then the tail columns k >= K64 of rows n < N8, row-major ([N8, K - K64]);
//   - then the tail rows n >= N8, row-major ([N - N8, K]), so W[n][k] is at n * K + k.
// Where N % 8 == 0 and K % 64 == 0 the aligned block is the whole weight.
#pragma once

#include <cmath>
#include <cstdint>

#ifdef __CUDACC__
#define INT8_LINEAR_HD __host__ __device__
#else
#define INT8_LINEAR_HD
#endif

namespace int8_linear {

inline constexpr int64_t kStrip = 8;   // output channels per strip (mma's n)
inline constexpr int64_t kChunk = 64;  // input channels per chunk (four mma k16 tiles)

/// The int8 value of weight `w` in a row whose scale is `scale` (max |w| / 127): round half to
/// even of w / scale, within [-127, 127]; 0 where that is not a finite number (a NaN or infinite
/// weight, or an all-zero row), on the host and on the GPU alike.
INT8_LINEAR_HD inline int8_t quantise(float w, float scale) {
  const float v = w / scale;
  if (!(v - v == 0.0f)) return 0;  // NaN or infinite (isfinite without <cmath> on the device)
  const float r = rintf(v);
  return static_cast<int8_t>(r < -127.0f ? -127.0f : r > 127.0f ? 127.0f : r);
}

/// The weight q * scale in float32. The reference and the large-batch (cuBLAS) path round it to
/// x's dtype once and multiply; the small-batch kernel multiplies exact q (|q| <= 127 is exact in
/// float16 and bfloat16) and scales each float32 sum once, which differs only by that rounding.
INT8_LINEAR_HD inline float dequantise(int8_t q, float scale) { return static_cast<float>(q) * scale; }

/// Offset in the packed qweight of W[n][k], for a weight of N output and K input channels
/// (0 <= n < N, 0 <= k < K; the layout above).
INT8_LINEAR_HD inline int64_t packed_offset(int64_t n, int64_t k, int64_t N, int64_t K) {
  const int64_t N8 = N / kStrip * kStrip, K64 = K / kChunk * kChunk;
  if (n >= N8) return n * K + k;                              // the tail rows
  if (k >= K64) return N8 * K64 + n * (K - K64) + (k - K64);  // the tail columns of the strips
  const int64_t strip = n / kStrip, chunk = k / kChunk, kk = k % kChunk;
  const int64_t tile = kk / 16, w = kk % 16;
  const int64_t lane = (n % kStrip) * 4 + (w % 8) / 2;
  const int64_t byte = tile * 4 + (w / 8) * 2 + w % 2;
  return ((strip * (K64 / kChunk) + chunk) * 32 + lane) * 16 + byte;
}

}  // namespace int8_linear
