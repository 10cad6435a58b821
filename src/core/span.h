// opforge::core::Span: a view of contiguous elements, the C++17 core's stand-in for C++20's
// std::span (a subset of its interface). The core's per-call functions (checks, the kernel call)
// take their argument arrays as spans, so that an adapter can keep those arrays in inline
// storage (c10::SmallVector, std::array) rather than a std::vector allocated on every call.
#pragma once

#include <cstddef>
#include <type_traits>
#include <utility>

namespace opforge::core {

/// `size()` elements of type T at `data()`, owned by someone else: the view must not outlive
/// them. Converts implicitly from a contiguous container held by name (an lvalue: std::vector,
/// std::array, c10::SmallVector) whose data() gives a pointer convertible to T*; not from a
/// temporary container or a braced list, whose elements die with the statement (std::span
/// allows both for const T; here a view that would dangle does not compile).
template <class T>
class Span {
 public:
  constexpr Span() = default;
  constexpr Span(T* data, size_t size) : data_(data), size_(size) {}
  template <class C, class = std::enable_if_t<!std::is_same_v<std::remove_const_t<C>, Span> &&
                                              std::is_convertible_v<decltype(std::declval<C&>().data()), T*>>>
  constexpr Span(C& c) : data_(c.data()), size_(static_cast<size_t>(c.size())) {}
  template <class C, class = std::enable_if_t<!std::is_same_v<std::remove_cv_t<C>, Span>>>
  Span(const C&&) = delete;

  constexpr T* data() const { return data_; }
  constexpr size_t size() const { return size_; }
  constexpr bool empty() const { return size_ == 0; }
  constexpr T* begin() const { return data_; }
  constexpr T* end() const { return data_ + size_; }
  /// Element i; i must be < size() (unchecked, as std::span's).
  constexpr T& operator[](size_t i) const { return data_[i]; }

 private:
  T* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace opforge::core
