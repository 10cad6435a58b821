# opforge-config.cmake -- CMake support for building opforge op libraries.
#
#   find_package(opforge REQUIRED PATHS /path/to/opforge/cmake)
#   opforge_add_library(my_ops SOURCES my_op.cpp my_op.cu)
#
# An op library is a shared object built from op files (which include <opforge/op.h>) and
# their CUDA sources. It links no framework: the adapters (libopforge_torch, the C++ runner)
# load it at run time and register its ops.
get_filename_component(OPFORGE_ROOT "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)
set(OPFORGE_INCLUDE_DIR "${OPFORGE_ROOT}/include")
if(NOT DEFINED OPFORGE_CUDA_ARCHITECTURES)
  # sm_90 machine code plus compute_90 PTX (Hopper; the PTX serves newer architectures).
  set(OPFORGE_CUDA_ARCHITECTURES "90")
endif()

# opforge_add_library(<name> SOURCES <files>... [KERNELS <files>...] [CUDA_ARCHITECTURES <archs>...])
#
# Builds lib<name>.so from op files (.cpp) and ahead-of-time CUDA sources (.cu, compiled by
# nvcc). KERNELS are run-time kernel sources (see Note [Run-time kernels] in opforge/op.h): they
# are not compiled here but linked into the library's kernel folder, lib<name>.kernels/ beside
# the .so, together with opforge/kernel.cuh, so that editing the source and running again (or
# calling opforge.reload()) is the whole redeploy. Symbols are hidden except the library's
# entry point, so several op libraries coexist in one process.
find_package(CUDAToolkit REQUIRED)

# The op-library runtime, built once per build tree and linked into every op library: the
# declaration records and the backend-neutral half of run-time kernels (opforge_oplib), and the
# CUDA half (NVRTC, driver launch; opforge_oplib_cuda), which the linker takes from the archive
# only for a library that declares a .cuda_source() kernel. Hidden visibility: each op library
# keeps its own registry.
if(NOT TARGET opforge_oplib)
  add_library(opforge_oplib STATIC "${OPFORGE_ROOT}/src/oplib/op_library.cpp" "${OPFORGE_ROOT}/src/oplib/runtime_kernel.cpp")
  add_library(opforge_oplib_cuda STATIC "${OPFORGE_ROOT}/src/oplib/rtc_cuda.cpp")
  target_link_libraries(opforge_oplib_cuda PUBLIC CUDA::cudart)
  foreach(_lib opforge_oplib opforge_oplib_cuda)
    target_include_directories(${_lib} PUBLIC "${OPFORGE_INCLUDE_DIR}")
    target_link_libraries(${_lib} PUBLIC ${CMAKE_DL_LIBS})
    set_target_properties(${_lib} PROPERTIES
      CXX_STANDARD 20
      POSITION_INDEPENDENT_CODE ON
      CXX_VISIBILITY_PRESET hidden
      VISIBILITY_INLINES_HIDDEN ON)
  endforeach()
endif()

function(opforge_add_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;KERNELS;CUDA_ARCHITECTURES" ${ARGN})
  if(NOT ARG_SOURCES)
    message(FATAL_ERROR "opforge_add_library(${name}): no SOURCES given")
  endif()
  add_library(${name} SHARED ${ARG_SOURCES})
  target_include_directories(${name} PRIVATE "${OPFORGE_INCLUDE_DIR}")
  # The CUDA half first: it refers to the neutral half, which follows.
  target_link_libraries(${name} PRIVATE opforge_oplib_cuda opforge_oplib)
  set_target_properties(${name} PROPERTIES
    CXX_STANDARD 20
    CUDA_STANDARD 20
    CXX_VISIBILITY_PRESET hidden
    CUDA_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON
    CUDA_RUNTIME_LIBRARY Shared)
  # --as-needed: a library without CUDA code records no dependency on the CUDA runtime.
  target_link_options(${name} PRIVATE "LINKER:--no-undefined" "LINKER:--as-needed"
    "LINKER:--version-script=${OPFORGE_ROOT}/cmake/exports.map")
  set(cuda_sources ${ARG_SOURCES})
  list(FILTER cuda_sources INCLUDE REGEX "\\.cu$")
  if(cuda_sources)
    if(NOT ARG_CUDA_ARCHITECTURES)
      set(ARG_CUDA_ARCHITECTURES ${OPFORGE_CUDA_ARCHITECTURES})
    endif()
    set_target_properties(${name} PROPERTIES CUDA_ARCHITECTURES "${ARG_CUDA_ARCHITECTURES}")
    target_compile_options(${name} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr>)
  endif()
  # The kernel folder: links to the run-time kernel sources (edits show at once) and the
  # device-side helper header they include.
  get_target_property(out_dir ${name} LIBRARY_OUTPUT_DIRECTORY)
  if(NOT out_dir)
    set(out_dir "${CMAKE_CURRENT_BINARY_DIR}")
  endif()
  set(kernel_dir "${out_dir}/lib${name}.kernels")
  file(MAKE_DIRECTORY "${kernel_dir}/opforge")
  file(CREATE_LINK "${OPFORGE_INCLUDE_DIR}/opforge/kernel.cuh" "${kernel_dir}/opforge/kernel.cuh" SYMBOLIC)
  foreach(kernel ${ARG_KERNELS})
    get_filename_component(kernel_path "${kernel}" ABSOLUTE)
    get_filename_component(kernel_name "${kernel}" NAME)
    file(CREATE_LINK "${kernel_path}" "${kernel_dir}/${kernel_name}" SYMBOLIC)
  endforeach()
endfunction()
