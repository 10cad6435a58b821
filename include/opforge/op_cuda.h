// opforge/op_cuda.h -- the CUDA vocabulary of an op file: what a grid function of a run-time
// kernel asks of CUDA (part of opforge/op.h).
//
//   opforge::LaunchConfig attention_grid(opforge::Tensor q, ...) {
//     opforge::LaunchConfig c;
//     if (opforge::kernel_target(q) == "sm_90a")  // the Hopper path, wgmma and bulk tensor copies
//       c.tensor_maps.push_back(opforge::tensor_map(q, {64, 128, 1, 1}, opforge::TensorMapSwizzle::k128B));
//     ...
//   }
//
// Declarations only: this header parses no CUDA header, so op files stay free of them. The
// definitions are in the op-library runtime's CUDA half (src/oplib/rtc_cuda.cpp), linked into
// libraries that declare a `.cuda_source()` kernel. Code in .cu files uses opforge/cuda.h instead
// (opforge::cuda::tiled_tensor_map for the tensor maps of an ahead-of-time kernel).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "opforge/detail/op_detail.h"
#include "opforge/tensor.h"

namespace opforge {

/// An encoded tensor map for a run-time kernel's bulk tensor copies (see opforge::tensor_map).
using detail::TensorMap;

/// How a tensor map's box is laid out in shared memory: rows as they are, or with their 16-byte
/// chunks XOR-swizzled over spans of 32, 64 or 128 bytes (CU_TENSOR_MAP_SWIZZLE_*; the 128-byte
/// swizzle is the layout wgmma's descriptors of layout type 1 read).
enum class TensorMapSwizzle : int32_t { kNone = 0, k32B = 1, k64B = 2, k128B = 3 };

/// The tensor map of CUDA tensor `t` for a run-time kernel's bulk tensor copies (TMA: PTX's
/// cp.async.bulk.tensor), for a grid function to put in LaunchConfig::tensor_maps. The map's dims
/// are t's, innermost first (a [B, H, S, D] tensor gives coordinates (d, s, h, b)), with t's
/// strides, so a strided view is copied in place; `box` gives the box a copy moves, one size (1 to
/// 256) per dim, innermost first. Elements a box reads past a dim's end arrive as zeros. The kernel
/// takes the map as `const __grid_constant__ opforge::kernel::TensorMap`, after the grid
/// function's int64 args and before the op's parameters (Note [Run-time kernels] in
/// opforge/op_launch.h), and copies through it with opforge/tma.cuh under `#if __CUDA_ARCH__ >= 900`.
///
/// Requires: rank 1 to 5; the last dim contiguous; t's data and its other strides 16-byte aligned;
/// the box's innermost bytes a multiple of 16, and at most the swizzle's span when swizzled.
/// Throws InvalidArgument naming what is off, InternalError where the CUDA driver cannot encode
/// the map (cuTensorMapEncodeTiled; it needs a CUDA 12 driver).
TensorMap tensor_map(const Tensor& t, std::initializer_list<uint32_t> box,
                     TensorMapSwizzle swizzle = TensorMapSwizzle::kNone);

/// The NVRTC target opforge compiles run-time kernels for on the CUDA device holding `t`:
/// "sm_90a" on a compute capability 9.0 GPU (an H100 or H200; NVRTC 12.0 or newer), "sm_XY"
/// machine code for other GPUs NVRTC knows, "compute_XY" PTX for newer ones; "" for a tensor on
/// the CPU. For grid functions of kernels that take another path on some architectures: code
/// under `#if defined(__CUDA_ARCH_FEAT_SM90_ALL)` (wgmma, setmaxnreg) runs exactly when this
/// returns "sm_90a". Throws InternalError if the CUDA runtime or NVRTC cannot answer.
const std::string& kernel_target(const Tensor& t);

}  // namespace opforge
