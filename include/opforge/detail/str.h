// opforge/detail/str.h -- message building without iostreams.
//
// Note [No iostreams across the torch boundary]
// ---------------------------------------------
// Code loaded beside libtorch builds its messages with this appender instead of
// std::ostringstream. On the GPU machine (GCC 13 headers, C++20), an ostringstream instantiated
// in a library loaded into a torch process crashed inside basic_ostream::_M_insert<long>
// (seen 2026-11-29): in C++20 mode libstdc++ instantiates the stream templates in the library
// itself rather than using the copies in libstdc++.so that libtorch uses. std::to_chars has no
// such state, so numbers are formatted with it (shortest round-trip form for floating point).
#pragma once

#include <charconv>
#include <string>
#include <string_view>
#include <type_traits>

namespace opforge::detail {

/// Appends strings and numbers to a std::string: `StringBuilder b; b << "n = " << 3; b.str()`.
class StringBuilder {
 public:
  StringBuilder& operator<<(std::string_view s) {
    s_.append(s.data(), s.size());
    return *this;
  }
  StringBuilder& operator<<(const char* s) { return *this << std::string_view(s); }
  StringBuilder& operator<<(const std::string& s) { return *this << std::string_view(s); }
  StringBuilder& operator<<(char c) {
    s_.push_back(c);
    return *this;
  }
  StringBuilder& operator<<(bool b) { return *this << (b ? "true" : "false"); }
  template <class T, std::enable_if_t<std::is_arithmetic_v<T>, int> = 0>
  StringBuilder& operator<<(T v) {
    char buf[64];
    auto r = std::to_chars(buf, buf + sizeof(buf), v);
    s_.append(buf, r.ptr);
    return *this;
  }
  const std::string& str() const { return s_; }

 private:
  std::string s_;
};

/// Concatenates the arguments' text (strings, characters, numbers).
template <class... A>
std::string cat(const A&... a) {
  StringBuilder b;
  (b << ... << a);
  return b.str();
}

}  // namespace opforge::detail
