# opforge-config.cmake -- CMake support for building opforge op libraries.
#
#   find_package(opforge REQUIRED PATHS /path/to/opforge/cmake)
#   opforge_add_library(my_ops SOURCES my_op.cpp my_op.cu)
#   opforge_add_op_folder(path/to/my_op)   # lib<folder name>.so from an op folder
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
# nvcc). KERNELS are run-time kernel sources and prebuilt kernels (see Note [Run-time kernels] and
# Note [Prebuilt kernels] in opforge/op_launch.h): they are not compiled here but linked into the
# library's kernel folder, lib<name>.kernels/ beside
# the .so, together with opforge/kernel.cuh and opforge/tma.cuh, so that editing the source and running again (or
# calling opforge.reload()) is the whole redeploy. Symbols are hidden except the library's
# entry point, so several op libraries coexist in one process.
find_package(CUDAToolkit REQUIRED)

# ccache, where installed, for every build that reads this file: the opforge build, op libraries
# (opforge.build_library) and an installed opforge's adapter. Files compiled with a precompiled
# header (opforge/op.h for op files, torch's headers for the adapter) are cached only with this
# sloppiness (ccache manual, "Precompiled headers"); otherwise ccache compiles them every time.
find_program(OPFORGE_CCACHE ccache)
if(OPFORGE_CCACHE AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  set(_opforge_launcher "${CMAKE_COMMAND}" -E env
      "CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime" "${OPFORGE_CCACHE}")
  set(CMAKE_CXX_COMPILER_LAUNCHER ${_opforge_launcher})
  set(CMAKE_CUDA_COMPILER_LAUNCHER ${_opforge_launcher})
endif()

# An installed opforge's core library (in the opforge build, the target itself), for code that
# links it: the PyTorch adapter built per torch version (src/torch/CMakeLists.txt).
if(NOT TARGET opforge_core AND EXISTS "${OPFORGE_ROOT}/lib/libopforge_core.so")
  add_library(opforge_core SHARED IMPORTED)
  set_target_properties(opforge_core PROPERTIES
    IMPORTED_LOCATION "${OPFORGE_ROOT}/lib/libopforge_core.so"
    INTERFACE_INCLUDE_DIRECTORIES "${OPFORGE_INCLUDE_DIR}")
endif()

# The op-library runtime, linked into every op library: the declaration records and the
# backend-neutral half of run-time kernels (opforge_oplib), and the CUDA half (NVRTC, prebuilt
# binaries, driver launch, and Triton kernels; opforge_oplib_cuda), whose parts the linker takes
# from the archive only for a library that declares a .cuda_source(), .cuda_binary() or
# .triton_source() kernel. Hidden visibility: each op library keeps its own registry.
# An installed opforge ships the two archives, built once (lib/ beside this folder); a build
# may name a folder holding them with -DOPFORGE_RUNTIME_DIR=<dir> (opforge.build_library passes
# the opforge build's lib/); otherwise they are built from src/oplib in this build tree.
if(NOT TARGET opforge_oplib)
  if(NOT OPFORGE_RUNTIME_DIR AND EXISTS "${OPFORGE_ROOT}/lib/libopforge_oplib.a")
    set(OPFORGE_RUNTIME_DIR "${OPFORGE_ROOT}/lib")
  endif()
  if(OPFORGE_RUNTIME_DIR)
    foreach(_lib opforge_oplib opforge_oplib_cuda)
      if(NOT EXISTS "${OPFORGE_RUNTIME_DIR}/lib${_lib}.a")
        message(FATAL_ERROR "opforge: ${OPFORGE_RUNTIME_DIR}/lib${_lib}.a not found (OPFORGE_RUNTIME_DIR names the "
                            "folder holding the op-library runtime; build opforge first)")
      endif()
      add_library(${_lib} STATIC IMPORTED)
      set_target_properties(${_lib} PROPERTIES
        IMPORTED_LOCATION "${OPFORGE_RUNTIME_DIR}/lib${_lib}.a"
        INTERFACE_INCLUDE_DIRECTORIES "${OPFORGE_INCLUDE_DIR}"
        INTERFACE_LINK_LIBRARIES "${CMAKE_DL_LIBS}")
    endforeach()
    set_property(TARGET opforge_oplib_cuda APPEND PROPERTY INTERFACE_LINK_LIBRARIES CUDA::cudart)
  else()
    add_library(opforge_oplib STATIC "${OPFORGE_ROOT}/src/oplib/op_library.cpp" "${OPFORGE_ROOT}/src/oplib/runtime_kernel.cpp"
      "${OPFORGE_ROOT}/src/oplib/kernel_image.cpp")
    # The partial sums of TritonLaunch::sum_into are a CUDA kernel compiled to PTX by nvcc and
    # embedded in the archive, loaded with the CUDA driver on first use.
    set(_sum_ptx "${CMAKE_BINARY_DIR}/generated/sum_partials.ptx")
    set(_sum_cpp "${CMAKE_BINARY_DIR}/generated/sum_partials_ptx.cpp")
    add_custom_command(OUTPUT "${_sum_ptx}"
      COMMAND "${CUDAToolkit_NVCC_EXECUTABLE}" -ptx -arch=compute_75 -O3 -o "${_sum_ptx}"
              "${OPFORGE_ROOT}/src/oplib/kernels/sum_partials.cu"
      DEPENDS "${OPFORGE_ROOT}/src/oplib/kernels/sum_partials.cu"
      COMMENT "opforge: the partial-sum kernel's PTX")
    add_custom_command(OUTPUT "${_sum_cpp}"
      COMMAND "${CMAKE_COMMAND}" -DIN=${_sum_ptx} -DOUT=${_sum_cpp} -DSYMBOL=opforge_sum_partials_ptx
              -P "${OPFORGE_ROOT}/cmake/embed_text.cmake"
      DEPENDS "${_sum_ptx}" "${OPFORGE_ROOT}/cmake/embed_text.cmake")
    add_library(opforge_oplib_cuda STATIC "${OPFORGE_ROOT}/src/oplib/cuda_launch.cpp" "${OPFORGE_ROOT}/src/oplib/rtc_cuda.cpp"
      "${OPFORGE_ROOT}/src/oplib/binary_cuda.cpp" "${OPFORGE_ROOT}/src/oplib/triton.cpp"
      "${OPFORGE_ROOT}/src/oplib/triton_cuda.cpp"
      "${OPFORGE_ROOT}/src/oplib/triton_worker.cpp" "${_sum_cpp}")
    target_link_libraries(opforge_oplib_cuda PUBLIC CUDA::cudart)
    # nlohmann/json (vendored, header-only): the Triton worker's answers.
    target_include_directories(opforge_oplib_cuda SYSTEM PRIVATE "${OPFORGE_ROOT}/third_party/nlohmann_json/include")
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
endif()

# The shared precompiled header: <opforge/op.h> compiled once with the flags of an op file
# under opforge.build_library (a Release build), shipped as <runtime dir>/pch/opforge/op.h.gch.
# GCC looks for it before op.h itself and uses it only when the compiler and these flags match
# (otherwise it reads op.h: slower, never different), so an op file skips parsing the header.
set(OPFORGE_PCH_FLAGS -O3 -DNDEBUG -std=gnu++20 -fPIC -fvisibility=hidden -fvisibility-inlines-hidden)

function(opforge_add_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;KERNELS;CUDA_ARCHITECTURES" ${ARGN})
  if(NOT ARG_SOURCES)
    message(FATAL_ERROR "opforge_add_library(${name}): no SOURCES given")
  endif()
  add_library(${name} SHARED ${ARG_SOURCES})
  target_include_directories(${name} PRIVATE "${OPFORGE_INCLUDE_DIR}")
  set(pch "${OPFORGE_RUNTIME_DIR}/pch/opforge/op.h.gch")
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND OPFORGE_RUNTIME_DIR AND EXISTS "${pch}")
    target_include_directories(${name} BEFORE PRIVATE "$<$<COMPILE_LANGUAGE:CXX>:${OPFORGE_RUNTIME_DIR}/pch>")
    # GCC's dependency output names neither the .gch it read nor the headers inside it, so an op
    # file depends on the .gch explicitly: when opforge's headers change (the .gch is rebuilt
    # with them), the op files compile again instead of linking objects of the old struct layouts
    # against the new runtime.
    set(cxx_sources ${ARG_SOURCES})
    list(FILTER cxx_sources EXCLUDE REGEX "\\.cu$")
    set_property(SOURCE ${cxx_sources} APPEND PROPERTY OBJECT_DEPENDS "${pch}")
  endif()
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
  # A library none of whose files declares an op fails here, not when it is loaded.
  if(CMAKE_NM)
    set(shown)
    foreach(source ${ARG_SOURCES})
      get_filename_component(source "${source}" ABSOLUTE)
      list(APPEND shown "${source}")
    endforeach()
    list(JOIN shown ", " shown)
    add_custom_command(TARGET ${name} POST_BUILD VERBATIM
      COMMAND "${CMAKE_COMMAND}" "-DLIBRARY=$<TARGET_FILE:${name}>" "-DNAME=${name}" "-DSOURCES=${shown}"
              "-DNM=${CMAKE_NM}" -P "${OPFORGE_ROOT}/cmake/opforge-check-library.cmake")
  endif()
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
  foreach(header kernel.cuh tma.cuh)  # each is part of the kernels' cache key (rtc_cuda.cpp's make_job)
    file(CREATE_LINK "${OPFORGE_INCLUDE_DIR}/opforge/${header}" "${kernel_dir}/opforge/${header}" SYMBOLIC)
  endforeach()
  foreach(kernel ${ARG_KERNELS})
    get_filename_component(kernel_path "${kernel}" ABSOLUTE)
    get_filename_component(kernel_name "${kernel}" NAME)
    file(CREATE_LINK "${kernel_path}" "${kernel_dir}/${kernel_name}" SYMBOLIC)
  endforeach()
endfunction()

# opforge_add_op_folder(<dir> [NAME <name>] [CUDA_ARCHITECTURES <archs>...])
#
# Builds the op library of an op folder, lib<name>.so (default: the folder's name): its op
# files (*.cpp) and ahead-of-time CUDA sources (*.cu) are the SOURCES, its kernels/*.cu,
# kernels/*.py (with the folders of Python modules beside them) and the prebuilt kernels
# kernels/*.cubin, *.fatbin and *.ptx the run-time KERNELS. The layout of examples/ops/<op>/ and of `opforge build <dir>`.
function(opforge_add_op_folder dir)
  cmake_parse_arguments(ARG "" "NAME" "CUDA_ARCHITECTURES" ${ARGN})
  get_filename_component(dir "${dir}" ABSOLUTE)
  if(NOT ARG_NAME)
    get_filename_component(ARG_NAME "${dir}" NAME)
  endif()
  file(GLOB sources CONFIGURE_DEPENDS "${dir}/*.cpp" "${dir}/*.cu")
  # Run-time kernels: CUDA sources, Triton files, folders of Python modules a Triton file imports,
  # and prebuilt kernels.
  file(GLOB entries CONFIGURE_DEPENDS LIST_DIRECTORIES true "${dir}/kernels/*")
  set(kernels)
  foreach(entry ${entries})
    get_filename_component(entry_name "${entry}" NAME)
    if(entry MATCHES "\\.(cu|py|cubin|fatbin|ptx)$" OR (IS_DIRECTORY "${entry}" AND NOT entry_name STREQUAL "__pycache__"))
      list(APPEND kernels "${entry}")
    endif()
  endforeach()
  if(NOT sources)
    message(FATAL_ERROR "opforge_add_op_folder(${dir}): no op files (*.cpp) or CUDA sources (*.cu) in it")
  endif()
  set(archs)
  if(ARG_CUDA_ARCHITECTURES)
    set(archs CUDA_ARCHITECTURES ${ARG_CUDA_ARCHITECTURES})
  endif()
  opforge_add_library(${ARG_NAME} SOURCES ${sources} KERNELS ${kernels} ${archs})
endfunction()
