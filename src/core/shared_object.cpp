#include "shared_object.h"

#include <dlfcn.h>
#include <elf.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <vector>

#include "opforge/error.h"

namespace opforge::core {

namespace {

/// `count` records of type R at `offset` of the file, or none where the file is too short.
template <class R>
std::vector<R> read_records(std::ifstream& f, uint64_t offset, uint64_t count, uint64_t file_size) {
  std::vector<R> records;
  if (count == 0 || offset > file_size || (file_size - offset) / sizeof(R) < count) return records;
  records.resize(count);
  f.seekg(static_cast<std::streamoff>(offset));
  f.read(reinterpret_cast<char*>(records.data()), static_cast<std::streamsize>(count * sizeof(R)));
  if (!f) records.clear();
  return records;
}

}  // namespace

std::string truncation_problem(const std::string& path, const std::string& what) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) throw InternalError("opforge: cannot read " + what + " " + path + ": " + std::strerror(errno));
  const auto file_size = static_cast<uint64_t>(f.tellg());
  Elf64_Ehdr header{};
  f.seekg(0);
  if (!f.read(reinterpret_cast<char*>(&header), sizeof(header)) || std::memcmp(header.e_ident, ELFMAG, SELFMAG) != 0 ||
      header.e_ident[EI_CLASS] != ELFCLASS64)
    return "";  // not a 64-bit ELF file (or shorter than its header): dlopen's own message says so
  uint64_t needed = sizeof(header);
  needed = std::max<uint64_t>(needed, header.e_phoff + uint64_t{header.e_phnum} * header.e_phentsize);
  needed = std::max<uint64_t>(needed, header.e_shoff + uint64_t{header.e_shnum} * header.e_shentsize);
  if (header.e_phentsize == sizeof(Elf64_Phdr)) {
    for (const Elf64_Phdr& p : read_records<Elf64_Phdr>(f, header.e_phoff, header.e_phnum, file_size))
      if (p.p_type == PT_LOAD) needed = std::max<uint64_t>(needed, p.p_offset + p.p_filesz);
  }
  if (needed <= file_size) return "";
  return what + " " + path + " is truncated: its ELF headers describe " + std::to_string(needed) +
         " bytes and the file has " + std::to_string(file_size) + " (build or copy it again)";
}

void* open_shared_object(const std::string& path, const std::string& what, int flags) {
  if (std::string problem = truncation_problem(path, what); !problem.empty())
    throw InvalidArgument("opforge: " + problem);
  void* handle = dlopen(path.c_str(), flags);
  if (handle == nullptr) throw InternalError("opforge: cannot load " + what + " " + path + ": " + dlerror());
  return handle;
}

}  // namespace opforge::core
