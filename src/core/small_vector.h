// opforge::core::SmallVector: a vector that holds up to N elements inline, for containers built
// on every op call (the call protocol's output plans and views), so that the usual call
// allocates nothing. Past N elements it moves to the heap. The subset of std::vector's interface
// the core's templates use (check.h's Outs and Sizes).
#pragma once

#include <array>
#include <cstddef>
#include <utility>
#include <vector>

namespace opforge::core {

template <class T, size_t N>
class SmallVector {
 public:
  using value_type = T;

  SmallVector() = default;
  explicit SmallVector(size_t n, const T& value = T()) { resize(n, value); }

  T* data() { return heap_ ? vec_.data() : inline_.data(); }
  const T* data() const { return heap_ ? vec_.data() : inline_.data(); }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T* begin() { return data(); }
  T* end() { return data() + size_; }
  const T* begin() const { return data(); }
  const T* end() const { return data() + size_; }
  T& operator[](size_t i) { return data()[i]; }
  const T& operator[](size_t i) const { return data()[i]; }
  T& back() { return data()[size_ - 1]; }

  void clear() {
    vec_.clear();
    heap_ = false;
    size_ = 0;
  }
  void push_back(T value) {
    if (!heap_ && size_ < N) {
      inline_[size_++] = std::move(value);
      return;
    }
    spill();
    vec_.push_back(std::move(value));
    ++size_;
  }
  void resize(size_t n, const T& value = T()) {
    while (size_ > n) pop_back();
    while (size_ < n) push_back(value);
  }
  template <class It>
  void assign(It first, It last) {
    clear();
    for (; first != last; ++first) push_back(*first);
  }

 private:
  void pop_back() {
    if (heap_) vec_.pop_back();
    --size_;
  }
  void spill() {
    if (heap_) return;
    vec_.assign(std::make_move_iterator(inline_.begin()), std::make_move_iterator(inline_.begin() + size_));
    heap_ = true;
  }

  std::array<T, N> inline_{};
  std::vector<T> vec_;
  size_t size_ = 0;
  bool heap_ = false;
};

}  // namespace opforge::core
