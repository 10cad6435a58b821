// Loading op libraries: see Note [One core for every adapter] in library.h.
#include "library.h"

#include <dlfcn.h>

#include <cerrno>
#include <climits>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>

#include "backward.h"
#include "classes.h"
#include "declaration_checks.h"
#include "description.h"
#include "opforge/detail/names.h"
#include "opforge/error.h"
#include "records.h"
#include "schema.h"
#include "shared_object.h"

namespace opforge::core {
namespace {

std::mutex g_mutex;
std::deque<Library>& libraries() {  // a deque: loaded Library objects never move
  static std::deque<Library> libs;
  return libs;
}

const OpforgeOpSpec* find_locked(const std::string& qualified, const Library** owner) {
  for (const Library& l : libraries()) {
    if (const OpforgeOpSpec* op = find_op(*l.lib, qualified)) {
      if (owner) *owner = &l;
      return op;
    }
  }
  return nullptr;
}

const OpforgeClassSpec* find_class_locked(const std::string& qualified, const Library** owner) {
  for (const Library& l : libraries()) {
    for (const OpforgeClassSpec* c : library_classes(*l.lib)) {
      if (qualified_name(*c) == qualified) {
        if (owner) *owner = &l;
        return c;
      }
    }
  }
  return nullptr;
}

/// Every problem that keeps `lib` from loading, one line each: its declarations
/// (library_declaration_problems), then ops and classes that a library loaded earlier declares.
std::vector<std::string> problems_of(const OpforgeLibrary& lib) {
  std::vector<std::string> problems = library_declaration_problems(lib);
  for (const OpforgeClassSpec* c : library_classes(lib)) {
    const Library* other = nullptr;
    if (const OpforgeClassSpec* first = find_class_locked(qualified_name(*c), &other))
      problems.push_back(opforge::detail::declared_at(c->file, c->line, qualified_name(*c)) + "already loaded from " +
                         other->path + " (declared at " + first->file + ":" + std::to_string(first->line) + ")");
  }
  for (int32_t i = 0; i < lib.num_ops; ++i) {
    const OpforgeOpSpec& op = *lib.ops[i];
    const Library* other = nullptr;
    if (const OpforgeOpSpec* first = find_locked(qualified_name(op), &other))
      problems.push_back(declared_at(op) + "already loaded from " + other->path + " (declared at " + first->file + ":" +
                         std::to_string(first->line) + ")");
  }
  return problems;
}

}  // namespace

const Library& load_library(const std::string& path) {
  std::lock_guard<std::mutex> lock(g_mutex);
  char resolved[PATH_MAX];
  if (realpath(path.c_str(), resolved) == nullptr)
    throw InternalError("opforge: cannot open the op library " + path + ": " + std::strerror(errno));
  const std::string real(resolved);
  for (const Library& l : libraries())
    if (l.path == real) return l;

  void* handle = open_shared_object(real, "the op library", RTLD_NOW | RTLD_LOCAL);
  auto entry = reinterpret_cast<OpforgeLibraryFn>(dlsym(handle, OPFORGE_LIBRARY_SYMBOL));
  // A library that fails a check stays mapped (dlclose could run static destructors of code we
  // never asked to run); its ops are never registered.
  if (entry == nullptr)
    throw InvalidArgument("opforge: " + path + " is not an opforge op library (no " + OPFORGE_LIBRARY_SYMBOL +
                          " symbol; build it with opforge_add_library or opforge.build_library)");
  const OpforgeLibrary* lib = entry();
  if (lib == nullptr || lib->abi_version != OPFORGE_ABI_VERSION)
    throw InvalidArgument("opforge: " + path + " was built for opforge ABI version " +
                          std::to_string(lib ? lib->abi_version : -1) + ", and this opforge reads version " +
                          std::to_string(OPFORGE_ABI_VERSION) + ": rebuild the op library");
  const std::vector<std::string> problems = problems_of(*lib);
  if (!problems.empty()) {
    std::string message = "opforge: " + path + " has invalid op declarations:";
    for (const auto& p : problems) message += "\n" + p;
    throw InvalidArgument(message);
  }
  Library& l = libraries().emplace_back();
  l.path = real;
  l.lib = lib;
  l.json = description_json(*lib);
  return l;
}

std::vector<const Library*> loaded_libraries() {
  std::lock_guard<std::mutex> lock(g_mutex);
  std::vector<const Library*> out;
  for (const Library& l : libraries()) out.push_back(&l);
  return out;
}

const OpforgeOpSpec* find_loaded_op(const std::string& qualified, const Library** owner) {
  std::lock_guard<std::mutex> lock(g_mutex);
  return find_locked(qualified, owner);
}

const OpforgeClassSpec* find_loaded_class(const std::string& qualified, const Library** owner) {
  std::lock_guard<std::mutex> lock(g_mutex);
  return find_class_locked(qualified, owner);
}

void reload_kernels() {
  std::lock_guard<std::mutex> lock(g_mutex);
  for (const Library& l : libraries()) {
    if (const ReloadFn reload = reload_entry(*l.lib)) reload();
  }
}

}  // namespace opforge::core
