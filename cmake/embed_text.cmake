# cmake -DIN=<file> -DOUT=<file.cpp> -DSYMBOL=<name> -P embed_text.cmake
# Writes OUT defining `extern "C" const char SYMBOL[]`: IN's text, NUL-terminated (a PTX module
# for cuModuleLoadData). The text is split into string literals of at most 2000 bytes each, below
# every compiler's limit on one literal.
file(READ "${IN}" _text HEX)
string(LENGTH "${_text}" _len)
set(_out "// Generated from ${IN} by cmake/embed_text.cmake; do not edit.\nextern \"C\" const char ${SYMBOL}[] =\n")
set(_pos 0)
while(_pos LESS _len)
  string(SUBSTRING "${_text}" ${_pos} 4000 _chunk)
  string(REGEX REPLACE "([0-9a-f][0-9a-f])" "\\\\x\\1" _chunk "${_chunk}")
  string(APPEND _out "    \"${_chunk}\"\n")
  math(EXPR _pos "${_pos} + 4000")
endwhile()
string(APPEND _out "    ;\n")
file(WRITE "${OUT}" "${_out}")
