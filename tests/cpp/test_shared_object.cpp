// opforge::core::truncation_problem and open_shared_object: a shared object shorter than its ELF
// headers describe is caught before dlopen maps it, on deliberately damaged copies of a real one.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "../../src/core/shared_object.h"
#include "opforge/error.h"

namespace {

std::vector<char> read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

/// A file of `bytes` in the test's temporary folder, removed with the object.
struct TempFile {
  std::string path;
  explicit TempFile(const std::vector<char>& bytes, const char* name) {
    path = ::testing::TempDir() + name + std::to_string(::getpid());
    std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  ~TempFile() { std::remove(path.c_str()); }
};

/// This test program: a whole 64-bit ELF file.
std::vector<char> whole_elf() { return read_all("/proc/self/exe"); }

TEST(SharedObject, AWholeFileHasNoProblem) {
  const TempFile f(whole_elf(), "whole");
  EXPECT_EQ(opforge::core::truncation_problem(f.path, "the op library"), "");
}

TEST(SharedObject, EveryCutThatLosesDescribedBytesIsNamed) {
  const std::vector<char> whole = whole_elf();
  for (const size_t keep : {size_t{64}, size_t{2000}, whole.size() / 2, whole.size() - 1}) {
    const TempFile f(std::vector<char>(whole.begin(), whole.begin() + static_cast<std::ptrdiff_t>(keep)), "cut");
    EXPECT_EQ(opforge::core::truncation_problem(f.path, "the op library"),
              "the op library " + f.path + " is truncated: its ELF headers describe " + std::to_string(whole.size()) +
                  " bytes and the file has " + std::to_string(keep) + " (build or copy it again)")
        << "kept " << keep << " of " << whole.size() << " bytes";
    EXPECT_THROW(opforge::core::open_shared_object(f.path, "the op library", RTLD_NOW), opforge::InvalidArgument);
  }
}

TEST(SharedObject, FilesThatAreNoElf64AreLeftToDlopen) {
  const std::vector<char> whole = whole_elf(), not_elf(4096, 'x'), short_header(whole.begin(), whole.begin() + 20);
  std::vector<char> elf32 = whole;
  elf32[4] = 1;  // EI_CLASS = ELFCLASS32
  for (const auto& bytes : {not_elf, elf32, short_header}) {
    const TempFile f(bytes, "other");
    EXPECT_EQ(opforge::core::truncation_problem(f.path, "the op library"), "");
  }
  const TempFile f(not_elf, "junk");
  try {
    opforge::core::open_shared_object(f.path, "the op library", RTLD_NOW);
    FAIL() << "dlopen accepted a file of x's";
  } catch (const opforge::InternalError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("opforge: cannot load the op library " + f.path + ": ", 0), 0u) << e.what();
  }
}

TEST(SharedObject, AMissingFileCannotBeRead) {
  const std::string missing = ::testing::TempDir() + "no_such_library.so";
  try {
    opforge::core::truncation_problem(missing, "the op library");
    FAIL() << "a missing file was read";
  } catch (const opforge::InternalError& e) {
    EXPECT_EQ(std::string(e.what()), "opforge: cannot read the op library " + missing + ": No such file or directory");
  }
}

}  // namespace
