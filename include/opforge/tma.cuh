// opforge/tma.cuh -- device helpers for Hopper's asynchronous copies: mbarriers and the bulk
// tensor copies of the tensor-memory accelerator (TMA), for kernels compiled for sm_90 or newer,
// by nvcc or by NVRTC (run-time kernels, where opforge ships this header in the kernel folder).
// The host half is opforge::cuda::tiled_tensor_map (opforge/cuda.h), whose map a kernel takes as
// a `const __grid_constant__ CUtensorMap` parameter, or, for run-time kernels,
// opforge::tensor_map (opforge/op_cuda.h), taken as `const __grid_constant__
// opforge::kernel::TensorMap`; the copies below take either.
//
// The producer/consumer pipeline these serve (CUTLASS's sm90 pipelines, FlashAttention-3): each
// stage of a ring in shared memory has a "full" mbarrier (1 arrival: the producer's
// arrive_expect_tx, plus the bytes of its copies) and an "empty" one (one arrival per consumer
// warp). The producer waits on `empty` (parity 1 passes a fresh barrier), expects the stage's
// bytes on `full` and issues the copies; consumers wait on `full`, read, and arrive on `empty`.
//
//   if (threadIdx.x == 0) { opforge::tma::mbarrier_init(&full[s], 1); ...; opforge::tma::fence_mbarrier_init(); }
//   __syncthreads();
//   // producer:  mbarrier_wait(&empty[s], phase ^ 1); mbarrier_arrive_expect_tx(&full[s], bytes);
//   //            copy_3d(dst, map, c0, c1, c2, &full[s], opforge::tma::evict_first());
//   // consumers: mbarrier_wait(&full[s], phase); ...read...; __syncwarp(); if (lane == 0) mbarrier_arrive(&empty[s]);
//
// PTX ISA references: "Parallel Synchronization and Communication Instructions: mbarrier" and
// "Data Movement and Conversion Instructions: cp.async.bulk.tensor", "createpolicy".
// Only the tensor form is here: compute-sanitizer's racecheck charges the writes of the
// raw-address form (cp.async.bulk) to the issuing thread and, not following the mbarriers' order,
// reports false hazards against the consumers' reads; the tensor form's writes it charges to no
// thread, so it neither reports nor checks them (FlashAttention's note RACECHECK_TMA_HAZARD).
#pragma once

#if defined(__CUDACC_RTC__)
#include "kernel.cuh"  // the fixed-width integer types, opforge::kernel::TensorMap
/// NVRTC cannot include cuda.h: a run-time kernel's CUtensorMap is opforge's map type, so a
/// kernel written for nvcc compiles unchanged and takes what a grid function passes.
typedef opforge::kernel::TensorMap CUtensorMap;
#else
#include <cuda.h>  // CUtensorMap

#include <cstdint>
#endif

// A tensor map must be read where the launch put it: the kernel takes it as a
// `const __grid_constant__` parameter. One taken by plain value is copied into local memory,
// whose address the copy engine cannot use; the copies below stop the kernel there (a trap,
// after a message naming the rule) rather than copy from it. The check costs nothing where the
// map is a grid constant (the compiler folds __isGridConstant).
//
// The instructions need sm_90; opforge verify and opforge.precompile also compile run-time
// kernels for sm_80, so code that copies through tensor maps sits under
// `#if __CUDA_ARCH__ >= 900` (or `#if defined(__CUDA_ARCH_FEAT_SM90_ALL)` with wgmma), as
// examples/ops/attention/kernels/attention.cu does.

namespace opforge::tma {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900  // the device passes for sm_90 and newer only

namespace detail {
/// Stops the kernel unless `map` is a `const __grid_constant__` kernel parameter.
template <class Map>
__device__ inline void require_grid_constant(const Map& map) {
  if (!__isGridConstant(&map)) {
    printf("opforge/tma.cuh: a tensor map must be a `const __grid_constant__` kernel parameter (block %d)\n",
           static_cast<int>(blockIdx.x));
    __trap();
  }
}
}  // namespace detail

/// The 32-bit shared-memory address of a generic pointer into shared memory.
__device__ inline uint32_t smem_address(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

/// Sets up the mbarrier at `bar` (8 bytes of shared memory, 8-byte aligned) for `arrivals`
/// arrivals a phase. One thread; then fence_mbarrier_init and a barrier before any other use.
__device__ inline void mbarrier_init(uint64_t* bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_address(bar)), "r"(arrivals));
}

/// Makes the calling thread's mbarrier_init's visible to the copy engine and the other threads.
__device__ inline void fence_mbarrier_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

/// Arrives on `bar` and adds `bytes` to the transaction count its phase waits for.
__device__ inline void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_address(bar)), "r"(bytes)
               : "memory");
}

/// Arrives on `bar` (release: the caller's reads and writes before it are ordered before the
/// phase completes).
__device__ inline void mbarrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_address(bar)) : "memory");
}

/// Waits until the phase of `bar` with parity `parity` has completed (a fresh barrier is in the
/// phase of parity 0, so waiting on parity 1 passes at once).
__device__ inline void mbarrier_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n"
      "}\n" ::"r"(smem_address(bar)),
      "r"(parity)
      : "memory");
}

/// Starts fetching the tensor map `map` (a kernel parameter) so that its first copy does not wait
/// for it.
template <class Map>
__device__ inline void prefetch_tensor_map(const Map& map) {
  detail::require_grid_constant(map);
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&map)) : "memory");
}

/// L2 cache policy for data read once: its lines are the first evicted.
__device__ inline uint64_t evict_first() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}

/// L2 cache policy for data many blocks read: its lines are the last evicted.
__device__ inline uint64_t evict_last() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}

/// The box of the 3-d tensor map `map` at element coordinates (c0, c1, c2), innermost first,
/// into shared memory at `dst` (128-byte aligned; 1024 with the 128-byte swizzle), completing on
/// `bar` with the box's bytes (elements past the tensor's end arrive as zeros and count);
/// `policy` from evict_first / evict_last.
template <class Map>
__device__ inline void copy_3d(void* dst, const Map& map, int c0, int c1, int c2, uint64_t* bar, uint64_t policy) {
  detail::require_grid_constant(map);
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%2, %3, %4}], [%5], %6;\n" ::"r"(smem_address(dst)),
      "l"(reinterpret_cast<uint64_t>(&map)), "r"(c0), "r"(c1), "r"(c2), "r"(smem_address(bar)), "l"(policy)
      : "memory");
}

/// copy_3d for a 4-d tensor map, e.g. a [B, H, S, D] tensor's at (d, s, h, b).
template <class Map>
__device__ inline void copy_4d(void* dst, const Map& map, int c0, int c1, int c2, int c3, uint64_t* bar,
                               uint64_t policy) {
  detail::require_grid_constant(map);
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%2, %3, %4, %5}], [%6], %7;\n" ::"r"(smem_address(dst)),
      "l"(reinterpret_cast<uint64_t>(&map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_address(bar)), "l"(policy)
      : "memory");
}

#elif defined(__CUDA_ARCH__)
// Device passes for older architectures: the copies say why they are missing.
template <class Map>
__device__ void copy_3d(void*, const Map&, int, int, int, uint64_t*, uint64_t) {
  static_assert(sizeof(Map) == 0,
                "opforge/tma.cuh: bulk tensor copies need sm_90; put this code under #if __CUDA_ARCH__ >= 900");
}
template <class Map>
__device__ void copy_4d(void*, const Map&, int, int, int, int, uint64_t*, uint64_t) {
  static_assert(sizeof(Map) == 0,
                "opforge/tma.cuh: bulk tensor copies need sm_90; put this code under #if __CUDA_ARCH__ >= 900");
}
#endif
}  // namespace opforge::tma
