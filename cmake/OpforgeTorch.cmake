# Flags for code that includes libtorch headers (the torch adapter and the runner), read from
# the Python environment's torch: include paths, the C++11 ABI flag and the library folder.
# Lighter than find_package(Torch), which also insists on a matching CUDA and cuDNN setup.
find_package(Python3 REQUIRED COMPONENTS Interpreter)
execute_process(
  COMMAND "${Python3_EXECUTABLE}" -c
    "import logging, os, torch; logging.disable(logging.WARNING); from torch.utils import cpp_extension as c; print(';'.join(c.include_paths())); print(os.path.join(os.path.dirname(torch.__file__), 'lib')); print(int(torch._C._GLIBCXX_USE_CXX11_ABI)); print(torch.__version__)"
  OUTPUT_VARIABLE _opforge_torch OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "opforge: cannot import torch with ${Python3_EXECUTABLE}")
endif()
string(REPLACE "\n" ";" _opforge_torch "${_opforge_torch}")
list(GET _opforge_torch -3 OPFORGE_TORCH_LIB_DIR)
list(GET _opforge_torch -2 _abi)
list(GET _opforge_torch -1 OPFORGE_TORCH_VERSION)
list(REMOVE_AT _opforge_torch -1 -2 -3)
message(STATUS "opforge: torch ${OPFORGE_TORCH_VERSION} from ${OPFORGE_TORCH_LIB_DIR}")

add_library(opforge_torch_deps INTERFACE)
target_include_directories(opforge_torch_deps SYSTEM INTERFACE ${_opforge_torch})
target_compile_definitions(opforge_torch_deps INTERFACE _GLIBCXX_USE_CXX11_ABI=${_abi})
target_link_directories(opforge_torch_deps INTERFACE "${OPFORGE_TORCH_LIB_DIR}")
target_link_libraries(opforge_torch_deps INTERFACE torch_cpu c10)
