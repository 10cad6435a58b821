# opforge-check-library.cmake -- run after an op library links (opforge_add_library's POST_BUILD):
#
#   cmake -DLIBRARY=<lib.so> -DNAME=<name> -DSOURCES=<files, comma-separated> -DNM=<nm> -P opforge-check-library.cmake
#
# An op library exports its entry point, opforge_library_v1, only when one of its files declares
# an op or a class: the declarations are what pull the op-library runtime, and with it the entry
# point, out of its archive. A library without one would build and then fail to load ("is not an
# opforge op library"); this stops the build instead, naming the files, and removes the library.
execute_process(COMMAND "${NM}" -D --defined-only "${LIBRARY}" OUTPUT_VARIABLE symbols RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "opforge_add_library(${NAME}): ${NM} cannot read the symbols of ${LIBRARY}")
endif()
if(NOT symbols MATCHES "[ \n]opforge_library_v1\n")
  file(REMOVE "${LIBRARY}")
  message(FATAL_ERROR "opforge_add_library(${NAME}): no OPFORGE_OP or OPFORGE_CLASS declaration in ${SOURCES}; "
                      "an op library declares at least one op (see opforge/op.h)")
endif()
