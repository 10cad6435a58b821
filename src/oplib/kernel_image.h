// What a prebuilt kernel file says of itself without a GPU (Note [Prebuilt kernels] in
// opforge/op_launch.h): whether it is a cubin, a fatbin or PTX, the architectures of the code it
// holds, its kernels and the sizes of their parameters. Reads bytes only: no CUDA library.
//
// The formats, as read here:
// - A cubin is an ELF64 object (e_machine EM_CUDA, 190). Its compute capability is in e_flags:
//   the low byte under the ELF ABI version 7, bits 8-15 under version 8 (LLVM's
//   llvm/include/llvm/BinaryFormat/ELF.h, EF_CUDA_SM and EF_CUDA_SM_MASK, as
//   ELFObjectFileBase::getNVPTXCPUName reads them). Each kernel has a section `.nv.info.<kernel>`
//   of attributes, each `u8 format, u8 attribute` and then, by format, a u16 (EIFMT_NVAL 1,
//   EIFMT_BVAL 2, EIFMT_HVAL 3) or a u16 size and that many bytes (EIFMT_SVAL 4).
//   EIATTR_KPARAM_INFO (0x17, 12 bytes) describes one parameter: u32 index, u16 ordinal, u16
//   offset, and a u32 whose bits 18-31 are its size in bytes; EIATTR_CBANK_PARAM_SIZE (0x19) is
//   the parameters' total size. NVIDIA's `cuobjdump -elf` (CUDA Binary Utilities) prints these
//   attributes by name, but their encoding is not documented: this is the reading of public
//   parsers (cudaparsers, github.com/VivekPanyam/cudaparsers, src/cubin.rs), which
//   tests/python/test_binary_ops.py checks against the cubins nvcc 13.0 and CuTe DSL 4.8
//   write.
// - A fatbin starts with the magic 0xBA55ED50, a u16 version, a u16 header size and the u64 size
//   of its entries. Each entry has a header (u16 kind: 1 PTX, 2 ELF; u32 header size at 4; u64
//   payload size at 8; u32 architecture at 28; u64 flags at 40, of which 0x2000 and 0x8000 mark
//   a compressed payload; u64 uncompressed size at 56) and then its payload (cudaparsers,
//   src/fatbin.rs). A compressed entry is not read here: its kernels are checked on the GPU.
// - PTX is text (PTX ISA, "Kernel Function Parameters"): `.target sm_90[a]`, then each kernel
//   `.entry name(.param .u64 a, .param .align 8 .b8 b[16], ...)`, a parameter's size being its
//   type's times its array count.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace opforge::detail::image {

/// What a file holds, decided by its content: an ELF object (a cubin), a fat binary, PTX text (a
/// `.version` or `.target` directive first, comments aside), or none of them.
enum class Kind { kNone, kCubin, kFatbin, kPtx };
Kind kind_of(const std::string& bytes);

/// One kernel of a piece of code.
struct Kernel {
  std::string name;  ///< its symbol
  /// Its parameters' sizes in bytes, in order; nullopt where the code does not record them.
  std::optional<std::vector<uint32_t>> sizes;
};

/// One piece of code: machine code for one architecture (a cubin) or PTX, which the driver
/// compiles for the GPU when it loads it. A cubin and a PTX file hold one; a fatbin several.
struct Code {
  bool ptx = false;
  int arch = 0;                ///< compute capability as major * 10 + minor (90)
  bool arch_specific = false;  ///< PTX for sm_90a and the like: runs on that architecture only
  bool readable = true;        ///< false: compressed in a fatbin, its kernels unknown here
  std::vector<Kernel> kernels;

  /// "sm_90 code" or "PTX for sm_90".
  std::string describe() const;
  /// The kernel named `name`, or nullptr.
  const Kernel* find(const std::string& name) const;
  /// Whether this code runs on a GPU of compute capability `cc`: machine code on one of its
  /// major version and at least its minor (CUDA C++ Programming Guide, "Binary Compatibility"),
  /// PTX on one of at least its architecture (exactly it, for arch-specific PTX).
  bool runs_on(int cc) const;
};

/// The code `bytes` holds. Throws opforge::InternalError saying what is wrong with a file that
/// is none of the three kinds, or one whose structure is damaged (offsets past its end).
std::vector<Code> read(const std::string& bytes);

/// The code the driver runs on a GPU of compute capability `cc`: the newest machine code that
/// runs on it, else the newest PTX that does; nullptr if none.
const Code* code_for(const std::vector<Code>& codes, int cc);

/// "sm_80 code, sm_90 code, PTX for sm_90": what `codes` holds, for messages.
std::string describe(const std::vector<Code>& codes);

}  // namespace opforge::detail::image
