// The backend-neutral half of run-time kernels (see runtime_kernel.h).
#include "runtime_kernel.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cxxabi.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>

#include "opforge/detail/kernel_name.h"

namespace opforge::detail {

const std::string& kernel_dir() {
  static const std::string dir = [] {
    Dl_info info{};
    if (::dladdr(reinterpret_cast<void*>(&kernel_dir), &info) == 0 || info.dli_fname == nullptr) return std::string();
    std::string path = rtc::real_path(info.dli_fname);
    const size_t slash = path.rfind('/');
    std::string base = path.substr(slash + 1);
    const size_t so = base.find(".so");
    if (so != std::string::npos) base = base.substr(0, so);
    return path.substr(0, slash) + "/" + base + ".kernels";
  }();
  return dir;
}

namespace rtc {

bool read_file(const std::string& path, std::string& out) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return false;
  out.clear();
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
  const bool ok = !std::ferror(f);
  std::fclose(f);
  return ok;
}

namespace {

bool make_dirs(const std::string& dir) {
  std::string partial;
  for (size_t i = 0; i <= dir.size(); ++i) {
    if (i == dir.size() || (dir[i] == '/' && i > 0)) {
      partial = dir.substr(0, i);
      if (::mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) return false;
    }
  }
  return true;
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::string cache_file(const std::string& key) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%016llx.bin", static_cast<unsigned long long>(fnv1a(key)));
  return buf;
}

constexpr char kMagic[8] = {'O', 'P', 'F', 'G', 'R', 'T', 'C', '1'};

void put_u64(std::string& s, uint64_t v) { s.append(reinterpret_cast<const char*>(&v), 8); }
bool get_u64(const std::string& s, size_t& pos, uint64_t& v) {
  if (pos + 8 > s.size()) return false;
  std::memcpy(&v, s.data() + pos, 8);
  pos += 8;
  return true;
}
bool get_str(const std::string& s, size_t& pos, std::string& out) {
  uint64_t n;
  if (!get_u64(s, pos, n) || n > s.size() - pos) return false;
  out.assign(s, pos, n);
  pos += n;
  return true;
}

/// Reads a cache entry; false if missing, truncated, corrupted, or made for another key.
bool read_entry(const std::string& path, const std::string& key, Binary& out) {
  std::string data;
  if (!read_file(path, data) || data.size() < 8 || std::memcmp(data.data(), kMagic, 8) != 0) return false;
  size_t pos = 8;
  std::string stored_key;
  uint64_t checksum;
  if (!get_str(data, pos, stored_key) || stored_key != key) return false;
  if (!get_str(data, pos, out.lowered_name) || !get_u64(data, pos, checksum) || !get_str(data, pos, out.image))
    return false;
  return pos == data.size() && fnv1a(out.image) == checksum && !out.image.empty();
}

std::atomic<bool> g_warned_unwritable{false};

}  // namespace

bool is_file(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return names;
  while (const dirent* e = ::readdir(d))
    if (is_file(dir + "/" + e->d_name)) names.emplace_back(e->d_name);
  ::closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

std::string real_path(const std::string& path) {
  char buf[PATH_MAX];
  return ::realpath(path.c_str(), buf) ? std::string(buf) : path;
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

std::string user_cache_dir() {
  if (!env("OPFORGE_CACHE_DIR").empty()) return env("OPFORGE_CACHE_DIR") + "/kernels";
  if (!env("XDG_CACHE_HOME").empty()) return env("XDG_CACHE_HOME") + "/opforge/kernels";
  return env("HOME") + "/.cache/opforge/kernels";
}

void store(const std::string& dir, const std::string& key, const Binary& b) {
  const std::string file = cache_file(key);
  std::string data(kMagic, 8);
  put_u64(data, key.size());
  data += key;
  put_u64(data, b.lowered_name.size());
  data += b.lowered_name;
  put_u64(data, fnv1a(b.image));
  put_u64(data, b.image.size());
  data += b.image;
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = dir + "/." + file + "." + std::to_string(::getpid()) + "." +
                          std::to_string(std::hash<std::thread::id>{}(std::this_thread::get_id())) + "." +
                          std::to_string(counter++);
  std::string why;
  FILE* f = make_dirs(dir) ? std::fopen(tmp.c_str(), "wb") : nullptr;
  if (f == nullptr) {
    why = std::strerror(errno);
  } else {
    const bool ok = std::fwrite(data.data(), 1, data.size(), f) == data.size();
    const int saved = errno;
    if (std::fclose(f) != 0 || !ok) why = std::strerror(ok ? errno : saved);
    else if (std::rename(tmp.c_str(), (dir + "/" + file).c_str()) != 0) why = std::strerror(errno);
    if (!why.empty()) std::remove(tmp.c_str());
  }
  if (!why.empty() && !g_warned_unwritable.exchange(true))
    std::fprintf(stderr,
                 "opforge: warning: cannot write the kernel cache %s (%s); compiled kernels are kept in memory only\n",
                 dir.c_str(), why.c_str());
}

bool find_cached(const std::string& key, const std::string& write_dir, bool store_in_write_dir, Binary& out) {
  const std::string file = cache_file(key);
  for (const auto& dir : {kernel_dir() + "/cache", user_cache_dir(), write_dir}) {
    if (!read_entry(dir + "/" + file, key, out)) continue;
    Binary stored;
    if (store_in_write_dir && dir != write_dir && !read_entry(write_dir + "/" + file, key, stored))
      store(write_dir, key, out);
    return true;
  }
  return false;
}

bool instantiation_key(const RuntimeKernel& rk, const OpforgeCallFrame* f, int64_t* key, int32_t capacity,
                       int32_t& size) {
  const OpDef& def = *rk.def;
  size = 0;
  auto add = [&](int64_t v) {
    if (size == capacity) return false;
    key[size++] = v;
    return true;
  };
  for (int32_t i = 0; i < f->num_args; ++i) {
    const ArgDecl& a = def.args[i];
    if (a.kind == OPFORGE_ARG_TENSOR) {
      if (!add(f->args[i].tensor.dtype)) return false;
    } else if (a.param.compile_time) {
      if (a.kind == OPFORGE_ARG_STRING || !add(f->args[i].value.i)) return false;
    }
  }
  for (int32_t o = 0; o < f->num_outputs; ++o)
    if (!add(f->outputs[o].dtype)) return false;
  return true;
}

std::string instantiate(const RuntimeKernel& rk, const std::vector<int32_t>& arg_dtypes,
                        const std::vector<int32_t>& out_dtypes, const OpforgeValue* values,
                        const char* (*type_name)(int32_t dtype)) {
  const OpDef& def = *rk.def;
  auto tensor_dtype = [&](const std::string& name) -> int32_t {
    for (size_t i = 0; i < def.args.size(); ++i)
      if (def.args[i].name == name) return arg_dtypes[i];
    for (size_t o = 0; o < def.outputs.size(); ++o)
      if (def.outputs[o].name == name) return out_dtypes[o];
    return -1;
  };
  std::vector<KernelNamePiece> pieces;  // checked at load, so every placeholder names what it may
  parse_kernel_name(rk.name, pieces);
  std::string out;
  for (const KernelNamePiece& p : pieces) {
    if (p.kind == KernelNamePiece::kText) {
      out += p.text;
    } else if (p.kind == KernelNamePiece::kFirstType) {
      for (size_t a = 0; a < def.args.size(); ++a)
        if (def.args[a].kind == OPFORGE_ARG_TENSOR) {
          out += type_name(arg_dtypes[a]);
          break;
        }
    } else if (p.kind == KernelNamePiece::kTypeOf) {
      out += type_name(tensor_dtype(p.text));
    } else {
      for (size_t a = 0; a < def.args.size(); ++a) {
        if (def.args[a].name != p.text || def.args[a].kind == OPFORGE_ARG_TENSOR) continue;
        const OpforgeValue& v = values[a];
        if (def.args[a].kind == OPFORGE_ARG_BOOL) out += v.i ? "true" : "false";
        else if (def.args[a].kind == OPFORGE_ARG_STRING) out.append(v.s, v.len);
        else out += std::to_string(v.i);
      }
    }
  }
  return out;
}

int32_t output_dtype(const OpforgeOutputSpec& o, const std::vector<int32_t>& arg_dtypes) {
  return o.dtype_like >= 0 ? arg_dtypes[o.dtype_like] : o.dtype;
}

namespace {

int64_t numel(const OpforgeTensor& t) {
  int64_t n = 1;
  for (int32_t d = 0; d < t.ndim; ++d) n *= t.sizes[d];
  return n;
}

std::string sizes_text(const OpforgeTensor& t) {
  std::string s = "[";
  for (int32_t d = 0; d < t.ndim; ++d) s += (d ? ", " : "") + std::to_string(t.sizes[d]);
  return s + "]";
}

/// false, or InternalError naming an output with elements: the geometry is empty.
bool nothing_to_launch(const RuntimeKernel& rk, const OpforgeCallFrame* f, const std::string& rule) {
  for (int32_t o = 0; o < f->num_outputs; ++o) {
    if (f->outputs[o].ndim < 0 || numel(f->outputs[o]) == 0) continue;  // absent, or empty
    throw InternalError(rule + " gives no threads, but output '" + rk.def->outputs[o].name + "' of shape " +
                        sizes_text(f->outputs[o]) +
                        " has elements, which would stay unwritten (launch over that output, or with launch_grid)");
  }
  return false;
}

}  // namespace

bool launch_config(const RuntimeKernel& rk, const OpforgeCallFrame* f, LaunchConfig& cfg) {
  const int32_t num_args = f->num_args;
  const OpforgeTensor* rule_tensor = nullptr;
  if (rk.rule_tensor >= 0)
    rule_tensor = rk.rule_tensor < num_args ? &f->args[rk.rule_tensor].tensor : &f->outputs[rk.rule_tensor - num_args];
  std::vector<int64_t> args = std::move(cfg.args);  // its storage is kept for the rules' arguments
  args.clear();
  cfg = LaunchConfig{};
  cfg.args = std::move(args);
  switch (rk.rule.kind) {
    case LaunchRule::kElementwise: {
      const int64_t n = numel(*rule_tensor);
      if (n == 0)
        return nothing_to_launch(rk, f, "elementwise(\"" + rk.rule.tensor + "\") of shape " + sizes_text(*rule_tensor));
      const int64_t items =
          rk.rule.bytes_per_thread > 0
              ? std::max<int64_t>(1, rk.rule.bytes_per_thread / dtype_size(static_cast<Dtype>(rule_tensor->dtype)))
              : rk.rule.items_per_thread;
      const int64_t per_block = int64_t{rk.rule.threads} * items;
      const int64_t blocks = (n + per_block - 1) / per_block;
      OPFORGE_CHECK(blocks <= INT32_MAX, n, " elements exceed one launch's grid");
      cfg.grid[0] = static_cast<unsigned>(blocks);
      cfg.block[0] = static_cast<unsigned>(rk.rule.threads);
      cfg.args.push_back(n);
      return true;
    }
    case LaunchRule::kRows: {
      const OpforgeTensor& t = *rule_tensor;
      const int64_t cols = t.ndim > 0 ? t.sizes[t.ndim - 1] : 1;
      int64_t rows = 1;  // the leading dims' product: a [4, 0] tensor has 4 (empty) rows
      for (int32_t d = 0; d + 1 < t.ndim; ++d) rows *= t.sizes[d];
      if (rows == 0) return nothing_to_launch(rk, f, "rows(\"" + rk.rule.tensor + "\") of shape " + sizes_text(t));
      OPFORGE_CHECK(rows <= INT32_MAX, rows, " rows exceed one launch's grid");
      cfg.grid[0] = static_cast<unsigned>(rows);
      int64_t threads = rk.rule.threads;
      if (threads <= 0) {  // auto: whole warps, at most kRowVectorsPerThread 16-byte vectors of the row each
        constexpr int64_t kRowVectorsPerThread = 4;  // opforge::kernel::RowRegisters' default (kernel.cuh)
        const int64_t vectors = (cols * dtype_size(static_cast<Dtype>(t.dtype)) + 15) / 16;
        const int64_t per_warp = kRowVectorsPerThread * 32;
        threads = std::clamp<int64_t>((vectors + per_warp - 1) / per_warp * 32, 32, 1024);
      }
      cfg.block[0] = static_cast<unsigned>(threads);
      cfg.args.push_back(rows);
      cfg.args.push_back(cols);
      return true;
    }
    case LaunchRule::kGrid:
      cfg = rk.rule.grid_entry(f, rk.rule.grid_fn);
      if (int64_t{cfg.grid[0]} * cfg.grid[1] * cfg.grid[2] == 0) return nothing_to_launch(rk, f, "the grid function");
      return true;
    case LaunchRule::kNone:
      break;
  }
  throw InternalError("run-time kernel without a launch rule");
}

TensorMapLayout tensor_map_layout(const Tensor& t, const uint32_t* box, size_t box_size, TensorMapSwizzle swizzle) {
  const int32_t rank = t.ndim();
  const int64_t size = static_cast<int64_t>(dtype_size(t.dtype()));
  std::string problem;
  if (!t.is_cuda()) problem = "the tensor is not on a CUDA device";
  else if (rank < 1 || rank > 5) problem = "rank " + std::to_string(rank) + " (tensor maps take 1 to 5 dims)";
  else if (box_size != static_cast<size_t>(rank))
    problem = "a box of " + std::to_string(box_size) + " sizes for " + std::to_string(rank) + " dims";
  else if (t.stride(rank - 1) != 1 && t.size(rank - 1) > 1) problem = "the last dim is not contiguous";
  else if (reinterpret_cast<uintptr_t>(t.raw_data()) % 16 != 0) problem = "the data is not 16-byte aligned";
  for (int32_t i = 0; problem.empty() && i < rank; ++i) {
    const int32_t d = rank - 1 - i;  // innermost first
    if (box[i] < 1 || box[i] > 256) problem = "box size " + std::to_string(box[i]) + " (1 to 256)";
    else if (i > 0 && t.size(d) > 1 && t.stride(d) * size % 16 != 0)
      problem = "dim " + std::to_string(d) + "'s stride of " + std::to_string(t.stride(d) * size) +
                " bytes (a multiple of 16 is needed)";
  }
  const int64_t span = swizzle == TensorMapSwizzle::k32B    ? 32
                       : swizzle == TensorMapSwizzle::k64B  ? 64
                       : swizzle == TensorMapSwizzle::k128B ? 128
                                                            : 0;
  if (problem.empty() && box[0] * size % 16 != 0)
    problem = "a box row of " + std::to_string(box[0] * size) + " bytes (a multiple of 16 is needed)";
  if (problem.empty() && span > 0 && box[0] * size > span)
    problem = "a box row of " + std::to_string(box[0] * size) + " bytes under a " + std::to_string(span) +
              "-byte swizzle (at most its span)";
  if (!problem.empty()) {
    std::string shape;
    for (int32_t d = 0; d < rank; ++d) shape += (d ? ", " : "") + std::to_string(t.size(d));
    throw InvalidArgument("opforge::tensor_map of a " + std::string(dtype_name(t.dtype())) + " tensor of shape [" +
                          shape + "]: " + problem);
  }
  TensorMapLayout l;
  l.rank = static_cast<uint32_t>(rank);
  for (int32_t i = 0; i < rank; ++i) {
    const int32_t d = rank - 1 - i;
    l.dims[i] = static_cast<uint64_t>(t.size(d));
    if (i > 0)
      l.strides[i - 1] =
          static_cast<uint64_t>(t.size(d) > 1 ? t.stride(d) * size : 16);  // any stride serves a single index
  }
  return l;
}

Requested requested(const RuntimeKernel& rk, const OpforgePrecompileRequest& request,
                    const char* (*type_name)(int32_t dtype)) {
  const OpforgeOpSpec& spec = *rk.def->spec();
  Requested r;
  r.arg_dtypes.assign(request.dtypes, request.dtypes + spec.num_args);
  for (int32_t o = 0; o < spec.num_outputs; ++o) r.out_dtypes.push_back(output_dtype(spec.outputs[o], r.arg_dtypes));
  r.name = instantiate(rk, r.arg_dtypes, r.out_dtypes, request.values, type_name);
  return r;
}

int32_t rule_launch_values(const RuntimeKernel& rk) {
  return rk.rule.kind == LaunchRule::kElementwise ? 1 : rk.rule.kind == LaunchRule::kRows ? 2 : -1;
}

std::vector<KernelParameter> kernel_parameters(const RuntimeKernel& rk, const std::vector<int32_t>& arg_dtypes,
                                               const std::vector<int32_t>& out_dtypes, int32_t launch_values,
                                               int32_t tensor_maps) {
  const OpDef& def = *rk.def;
  std::vector<KernelParameter> out;
  for (size_t i = 0; i < def.args.size(); ++i)
    if (def.args[i].kind == OPFORGE_ARG_TENSOR)
      out.push_back({KernelParameter::kPointer, "input " + def.args[i].name, arg_dtypes[i], def.args[i].tensor.mutated,
                     def.args[i].tensor.optional});
  for (size_t o = 0; o < def.outputs.size(); ++o)  // one that exists only with an optional input: as it
    out.push_back({KernelParameter::kPointer, "output " + def.outputs[o].name, out_dtypes[o], true,
                   def.spec()->outputs[o].present_with >= 0});
  static const char* const kRows[] = {"rows", "cols"};
  for (int32_t k = 0; k < launch_values; ++k) {
    const std::string name = rk.rule.kind == LaunchRule::kElementwise     ? "n"
                             : rk.rule.kind == LaunchRule::kRows && k < 2 ? kRows[k]
                                                                          : "args[" + std::to_string(k) + "]";
    out.push_back({KernelParameter::kInt64, "launch value " + name});
  }
  for (int32_t m = 0; m < tensor_maps; ++m)
    out.push_back({KernelParameter::kTensorMap, "tensor map " + std::to_string(m)});
  for (const ArgDecl& a : def.args) {
    if (a.kind == OPFORGE_ARG_TENSOR || a.param.compile_time) continue;
    const auto kind = a.kind == OPFORGE_ARG_FLOAT  ? KernelParameter::kDouble
                      : a.kind == OPFORGE_ARG_BOOL ? KernelParameter::kBool
                                                   : KernelParameter::kInt64;
    out.push_back({kind, "parameter " + a.name});
  }
  if (rk.checks_values)
    for (const ArgDecl& a : def.args)
      if (a.kind == OPFORGE_ARG_TENSOR && a.tensor.has_values)
        out.push_back({KernelParameter::kValueDomain, "value domain of " + a.name});
  return out;
}

namespace {

/// The device type of a tensor map parameter (opforge/kernel.cuh), as the demangler prints it.
constexpr const char* kTensorMapType = "opforge::kernel::TensorMap";
/// The device type of a value domain parameter (opforge/kernel.cuh), as the demangler prints it.
constexpr const char* kValueDomainType = "opforge::kernel::ValueDomain";

/// Whether a declared parameter (demangled text) names a tensor map type (opforge's or CUDA's
/// CUtensorMap), by value or not.
bool mentions_tensor_map(const std::string& declared) {
  std::string lower(declared);
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  return lower.find("tensormap") != std::string::npos;
}

/// The C type a parameter must have, as the demangler prints it (int64_t is long long).
std::string expected_type(const KernelParameter& p, const char* (*type_name)(int32_t)) {
  switch (p.kind) {
    case KernelParameter::kPointer:
      return std::string(type_name(p.dtype)) + (p.writes ? "*" : " const*");
    case KernelParameter::kInt64:
      return "int64_t";
    case KernelParameter::kDouble:
      return "double";
    case KernelParameter::kBool:
      return "bool";
    case KernelParameter::kTensorMap:
      return kTensorMapType;
    case KernelParameter::kValueDomain:
      return kValueDomainType;
  }
  return "";
}

/// The top-level comma-separated items of a parameter list, trimmed.
std::vector<std::string> split_parameters(const std::string& text) {
  std::vector<std::string> items;
  std::string cur;
  int depth = 0;
  for (char c : text) {
    if (c == '<' || c == '(' || c == '[') ++depth;
    if (c == '>' || c == ')' || c == ']') --depth;
    if (c == ',' && depth == 0) {
      items.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  items.push_back(cur);
  for (auto& item : items) {
    item.erase(0, item.find_first_not_of(' '));
    item.erase(item.find_last_not_of(' ') + 1);
  }
  if (items.size() == 1 && (items[0].empty() || items[0] == "void")) items.clear();
  return items;
}

/// Whether a declared parameter (demangled text) takes what `p` passes.
bool matches(const std::string& declared, const KernelParameter& p, const char* (*type_name)(int32_t)) {
  switch (p.kind) {
    case KernelParameter::kInt64:
      return declared == "long long" || declared == "long";
    case KernelParameter::kTensorMap:
      return declared == kTensorMapType;
    case KernelParameter::kValueDomain:
      return declared == kValueDomainType;
    case KernelParameter::kDouble:
      return declared == "double";
    case KernelParameter::kBool:
      return declared == "bool";
    case KernelParameter::kPointer:
      break;
  }
  if (declared.size() < 2 || declared.back() != '*' || declared[declared.size() - 2] == '*') return false;
  std::string element = declared.substr(0, declared.size() - 1);
  while (!element.empty() && element.back() == ' ') element.pop_back();
  bool is_const = false;
  if (element.size() > 6 && element.compare(element.size() - 6, 6, " const") == 0) {
    is_const = true;
    element.resize(element.size() - 6);
  }
  if (is_const && p.writes) return false;
  if (element == "void" || p.dtype < 0) return true;  // untyped, or an optional input left out: any pointer
  const std::string want = type_name(p.dtype);
  return element == want || (want == "long long" && element == "long") || (want == "signed char" && element == "char");
}

}  // namespace

std::string parameters_text(const std::vector<KernelParameter>& params, const char* (*type_name)(int32_t dtype),
                            bool grid_values_unknown) {
  std::string text;
  bool pointers = true;
  for (const auto& p : params) {
    if (grid_values_unknown && pointers && p.kind != KernelParameter::kPointer) {
      text += std::string(text.empty() ? "" : ", ") + "the grid function's int64 args and tensor maps";
      pointers = false;
    }
    text += (text.empty() ? "" : ", ") + (p.optional ? "optional*" : expected_type(p, type_name));
  }
  if (grid_values_unknown && pointers)
    text += std::string(text.empty() ? "" : ", ") + "the grid function's int64 args and tensor maps";
  return text;
}

namespace {

/// `expected` aligned to a kernel of `found` parameters. With the launch values unknown, the
/// parameters between the pointers and the op's parameters stand for a grid function's int64
/// args and then its tensor maps, as many as the kernel leaves room for: the trailing ones that
/// `is_map(i)` says are tensor maps are maps, the rest args.
template <class IsMap>
std::vector<KernelParameter> aligned(const std::vector<KernelParameter>& expected, size_t found,
                                     bool launch_values_known, IsMap is_map) {
  std::vector<KernelParameter> want = expected;
  if (launch_values_known || found <= want.size()) return want;
  size_t pointers = 0;
  while (pointers < want.size() && want[pointers].kind == KernelParameter::kPointer) ++pointers;
  const size_t extra = found - want.size();
  size_t args = extra;
  while (args > 0 && is_map(pointers + args - 1)) --args;
  for (size_t k = 0; k < extra; ++k)
    want.insert(want.begin() + static_cast<std::ptrdiff_t>(pointers + k),
                k < args ? KernelParameter{KernelParameter::kInt64, "launch value args[" + std::to_string(k) + "]"}
                         : KernelParameter{KernelParameter::kTensorMap, "tensor map " + std::to_string(k - args)});
  return want;
}

/// One line per parameter where a kernel of `found` parameters differs from `want`:
/// `matches(i)` compares the kernel's parameter i with want[i], `found_text(i)` describes it
/// ("int", "a parameter of 4 bytes"), `want_text(p)` what `p` needs, `hint(i)` is added to a mismatch's line.
template <class Matches, class FoundText, class WantText, class Hint>
std::vector<std::string> differences(const std::vector<KernelParameter>& want, size_t found, Matches matches,
                                     FoundText found_text, WantText want_text, Hint hint) {
  std::vector<std::string> problems;
  for (size_t i = 0; i < std::max(want.size(), found); ++i) {
    const std::string index = "parameter " + std::to_string(i + 1);
    if (i >= found)
      problems.push_back(index + " (" + want[i].what + "): expected " + want_text(want[i]) +
                         ", the kernel has no such parameter");
    else if (i >= want.size())
      problems.push_back(index + ": the kernel declares " + found_text(i) + ", but opforge passes only " +
                         std::to_string(want.size()) + " arguments");
    else if (!matches(i))
      problems.push_back(index + " (" + want[i].what + "): expected " + want_text(want[i]) + ", found " +
                         found_text(i) + hint(i));
  }
  return problems;
}

}  // namespace

std::vector<std::string> signature_problems(const std::string& declared, const std::vector<KernelParameter>& expected,
                                            bool launch_values_known, const char* (*type_name)(int32_t dtype)) {
  const std::vector<std::string> found = split_parameters(declared);
  const std::vector<KernelParameter> want =
      aligned(expected, found.size(), launch_values_known, [&](size_t i) { return found[i] == kTensorMapType; });
  return differences(
      want, found.size(), [&](size_t i) { return matches(found[i], want[i], type_name); },
      [&](size_t i) { return found[i]; }, [&](const KernelParameter& p) { return expected_type(p, type_name); },
      [&](size_t i) {
        return std::string(
            mentions_tensor_map(found[i])
                ? " (a tensor map is taken by value, `const __grid_constant__ opforge::kernel::TensorMap`, "
                  "after the grid function's int64 args and before the op's parameters)"
                : "");
      });
}

uint32_t parameter_size(const KernelParameter& p) {
  switch (p.kind) {
    case KernelParameter::kBool:
      return 1;
    case KernelParameter::kTensorMap:
      return 128;  // CUtensorMap
    case KernelParameter::kValueDomain:
      return sizeof(OpforgeValueDomain);
    case KernelParameter::kPointer:
    case KernelParameter::kInt64:
    case KernelParameter::kDouble:
      break;
  }
  return 8;
}

std::vector<std::string> size_problems(const std::vector<uint32_t>& sizes, const std::vector<KernelParameter>& expected,
                                       bool launch_values_known, const char* (*type_name)(int32_t dtype)) {
  auto bytes = [](uint32_t n) { return std::to_string(n) + (n == 1 ? " byte" : " bytes"); };
  const std::vector<KernelParameter> want =
      aligned(expected, sizes.size(), launch_values_known, [&](size_t i) { return sizes[i] == 128; });
  return differences(
      want, sizes.size(), [&](size_t i) { return sizes[i] == parameter_size(want[i]); },
      [&](size_t i) { return "a parameter of " + bytes(sizes[i]); },
      [&](const KernelParameter& p) { return expected_type(p, type_name) + " (" + bytes(parameter_size(p)) + ")"; },
      [](size_t) { return std::string(); });
}

std::string mismatch_message(const std::string& kernel, const std::vector<KernelParameter>& expected,
                             bool launch_values_known, const char* (*type_name)(int32_t dtype), const char* note,
                             const std::vector<std::string>& problems) {
  std::string message =
      kernel + " but is passed (" + parameters_text(expected, type_name, !launch_values_known) + "); see " + note + ":";
  for (const auto& p : problems) message += "\n  " + p;
  return message;
}

std::optional<std::string> demangled_parameters(const std::string& lowered_name) {
  if (lowered_name.rfind("_Z", 0) != 0) return std::nullopt;
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> text(abi::__cxa_demangle(lowered_name.c_str(), nullptr, nullptr, &status),
                                              std::free);
  if (status != 0 || !text) return std::nullopt;
  const std::string s = text.get();
  // The parameter list is the last parenthesised group at depth 0 ("void f<T>(...)").
  if (s.empty() || s.back() != ')') return std::nullopt;
  int depth = 0;
  for (size_t i = s.size(); i-- > 0;) {
    if (s[i] == ')') ++depth;
    if (s[i] == '(' && --depth == 0) return s.substr(i + 1, s.size() - i - 2);
  }
  return std::nullopt;
}

KernelArguments::KernelArguments(const RuntimeKernel& rk, const OpforgeCallFrame* f, const LaunchConfig& cfg) {
  const OpDef& def = *rk.def;
  const int32_t num_args = f->num_args;
  int32_t domains = 0;  // the value domains a kernel that checks its own values takes
  if (rk.checks_values) {
    for (const ArgDecl& a : def.args) domains += a.kind == OPFORGE_ARG_TENSOR && a.tensor.has_values;
    const OpforgeContext& ctx = *f->ctx;
    const int32_t given = OPFORGE_HAS_FIELD(OpforgeContext, ctx, num_value_domains) ? ctx.num_value_domains : 0;
    if (given != domains)
      throw InternalError(def.ns + "::" + def.name + ": the kernel checks its own values and takes " +
                          std::to_string(domains) + (domains == 1 ? " value domain" : " value domains") +
                          ", but the call's context carries " + std::to_string(given));
  }
  const size_t most =
      static_cast<size_t>(num_args + f->num_outputs + domains) + cfg.args.size() + cfg.tensor_maps.size();
  if (most > kInline) {
    heap_slots_.resize(most);
    heap_params_.resize(most);
    slots_ = heap_slots_.data();
    params_ = heap_params_.data();
  }
  size_t n = 0;
  auto add = [&](Slot v) {
    slots_[n] = v;
    params_[n] = &slots_[n];
    ++n;
  };
  for (int32_t i = 0; i < num_args; ++i)
    if (def.args[i].kind == OPFORGE_ARG_TENSOR) add(Slot{.pointer = f->args[i].tensor.data});
  for (int32_t o = 0; o < f->num_outputs; ++o) add(Slot{.pointer = f->outputs[o].data});
  for (int64_t v : cfg.args) add(Slot{.integer = v});
  for (const TensorMap& m : cfg.tensor_maps) params_[n++] = const_cast<unsigned char*>(m.bytes);  // by value: its bytes
  for (int32_t i = 0; i < num_args; ++i) {
    const ArgDecl& a = def.args[i];
    if (a.kind == OPFORGE_ARG_TENSOR || a.param.compile_time) continue;
    const OpforgeValue& v = f->args[i].value;
    if (a.kind == OPFORGE_ARG_FLOAT) {
      add(Slot{.floating = v.f});
    } else if (a.kind == OPFORGE_ARG_BOOL) {
      Slot b{.integer = 0};
      b.boolean = v.i != 0;
      add(b);
    } else {
      add(Slot{.integer = v.i});
    }
  }
  for (int32_t k = 0; k < domains; ++k)  // by value: its bytes
    params_[n++] = const_cast<OpforgeValueDomain*>(&f->ctx->value_domains[k]);
}

}  // namespace rtc
}  // namespace opforge::detail
