// Triton kernels, the backend-neutral half (see triton.h, Note [Triton kernels] in
// opforge/op_launch.h).
#include "triton.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>

namespace opforge::detail::triton {
namespace {

using nlohmann::json;

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

/// The parameter's name as rule 2 of Note [Triton kernels] matches it: lower case, without `_ptr`.
std::string tensor_name(const std::string& param) {
  std::string n = lower(param);
  if (n.size() > 4 && n.compare(n.size() - 4, 4, "_ptr") == 0) n.resize(n.size() - 4);
  return n;
}

Constant constant_of(const json& v) {
  Constant c;
  if (v.is_null()) return c;
  if (v.is_boolean()) {
    c.kind = Constant::kBool;
    c.i = v.get<bool>();
  } else if (v.is_number_integer()) {
    c.kind = Constant::kInt;
    c.i = v.get<int64_t>();
  } else if (v.is_number()) {
    c.kind = Constant::kFloat;
    c.f = v.get<double>();
  } else if (v.is_object() && v.contains("dtype")) {
    c.kind = Constant::kDtype;
    c.dtype = v["dtype"].get<std::string>();
  } else {
    throw InternalError("opforge: a Triton constexpr default or config value opforge cannot pass: " + v.dump());
  }
  return c;
}

/// "the function _k of kernels/k.py of ns::op", the subject of every message about one kernel.
std::string subject(const RuntimeKernel& rk) { return "the Triton function " + rk.name + " of " + rk.file; }

const char* kind_name(TritonLaunch::Value::Kind k) {
  switch (k) {
    case TritonLaunch::Value::kInt:
    case TritonLaunch::Value::kFloat:
    case TritonLaunch::Value::kBool:
      return "a runtime value (TritonLaunch::set)";
    case TritonLaunch::Value::kTensor:
    case TritonLaunch::Value::kPartials:
      return "a pointer";
    default:
      return "a constant (TritonLaunch::constant)";
  }
}

std::mutex g_sources_mutex;
std::string* g_sources = nullptr;

void read_tree(const std::string& root, const std::string& rel, std::vector<std::pair<std::string, std::string>>& out) {
  DIR* d = ::opendir((root + rel).c_str());
  if (d == nullptr) return;
  std::vector<std::string> names;
  while (const dirent* e = ::readdir(d)) names.emplace_back(e->d_name);
  ::closedir(d);
  std::sort(names.begin(), names.end());
  for (const std::string& n : names) {
    if (n == "." || n == ".." || n == "cache" || n == "__pycache__") continue;
    const std::string path = rel.empty() ? n : rel + "/" + n;
    struct stat st;
    if (::stat((root + path).c_str(), &st) != 0) continue;
    if (S_ISDIR(st.st_mode)) {
      read_tree(root, path, out);
    } else if (n.size() > 3 && n.compare(n.size() - 3, 3, ".py") == 0) {
      std::string text;
      rtc::read_file(root + path, text);
      out.emplace_back(path, std::move(text));
    }
  }
}

}  // namespace

std::string Constant::json() const {
  switch (kind) {
    case kInt:
      return std::to_string(i);
    case kFloat:
      return nlohmann::json(f).dump();
    case kBool:
      return i ? "true" : "false";
    case kDtype:
      return "{\"dtype\": \"" + dtype + "\"}";
    default:
      return "null";
  }
}

Function parse_inspection(const std::string& text) {
  Function fn;
  try {
    const json a = json::parse(text);
    fn.triton_version = a.value("triton_version", "");
    for (const json& p : a.at("params")) {
      Param q;
      q.name = p.at("name").get<std::string>();
      q.is_constexpr = p.value("constexpr", false);
      q.annotation = p.value("annotation", json("")).is_string() ? p.value("annotation", "") : "";
      if (q.annotation == "constexpr") q.annotation.clear();
      q.has_default = p.value("has_default", false);
      if (q.has_default && q.is_constexpr) q.default_value = constant_of(p.at("default"));
      q.do_not_specialize = p.value("do_not_specialize", false);
      q.do_not_specialize_on_alignment = p.value("do_not_specialize_on_alignment", false);
      fn.params.push_back(std::move(q));
    }
    if (a.contains("heuristics") && !a["heuristics"].is_null())
      fn.needs_python.push_back("triton.heuristics (" + a["heuristics"].dump() + ")");
    if (a.contains("autotune") && !a["autotune"].is_null()) {
      const json& t = a["autotune"];
      fn.autotuned = true;
      for (const json& c : t.at("configs")) {
        Config cfg;
        for (const auto& [k, v] : c.at("kwargs").items()) cfg.kwargs.emplace_back(k, constant_of(v));
        cfg.num_warps = c.value("num_warps", 4);
        cfg.num_stages = c.value("num_stages", 3);
        cfg.num_ctas = c.value("num_ctas", 1);
        cfg.maxnreg = c.contains("maxnreg") && c["maxnreg"].is_number() ? c["maxnreg"].get<int32_t>() : 0;
        if (c.value("pre_hook", false)) fn.needs_python.push_back("a config's pre_hook");
        fn.configs.push_back(std::move(cfg));
      }
      for (const char* list : {"key", "reset_to_zero", "restore_value"}) {
        std::vector<std::string>& into = list[0] == 'k'                     ? fn.key
                                         : list[0] == 'r' && list[2] == 's' ? fn.reset_to_zero
                                                                            : fn.restore_value;
        if (t.contains(list) && t[list].is_array())
          for (const json& n : t[list]) into.push_back(n.get<std::string>());
      }
      for (const char* hook : {"prune_configs_by", "early_config_prune", "perf_model", "pre_hook", "post_hook"})
        if (t.contains(hook) && t[hook].is_boolean() && t[hook].get<bool>())
          fn.needs_python.push_back(std::string("triton.autotune's ") + hook);
    }
  } catch (const json::exception& e) {
    throw InternalError(std::string("opforge: the Triton worker's answer cannot be read: ") + e.what());
  }
  return fn;
}

std::vector<Source> static_sources(const RuntimeKernel& rk, const Function& fn) {
  const OpDef& def = *rk.def;
  const int32_t n = static_cast<int32_t>(def.args.size());
  std::vector<Source> out(fn.params.size());
  for (size_t p = 0; p < fn.params.size(); ++p) {
    const Param& param = fn.params[p];
    const std::string as_tensor = tensor_name(param.name), as_name = lower(param.name);
    Source& s = out[p];
    for (int32_t i = 0; i < n && s.kind == Source::kNone; ++i) {
      const std::string arg = lower(def.args[i].name);
      if (def.args[i].kind == OPFORGE_ARG_TENSOR && arg == as_tensor) s = {Source::kTensor, i};
      else if (def.args[i].kind != OPFORGE_ARG_TENSOR && arg == as_name) s = {Source::kOpParam, i};
    }
    for (size_t o = 0; o < def.outputs.size() && s.kind == Source::kNone; ++o)
      if (lower(def.outputs[o].name) == as_tensor) s = {Source::kTensor, n + static_cast<int32_t>(o)};
    if (s.kind == Source::kNone) {
      const LaunchRule::Kind rule = rk.rule.kind;
      if ((rule == LaunchRule::kRows && param.name == "n_rows") ||
          (rule == LaunchRule::kElementwise && param.name == "n_elements"))
        s = {Source::kLaunchValue, 0};
      else if (rule == LaunchRule::kRows && param.name == "n_cols") s = {Source::kLaunchValue, 1};
    }
    if (s.kind == Source::kNone && param.is_constexpr && param.has_default) s = {Source::kDefault, -1};
  }
  return out;
}

Bound bind(const RuntimeKernel& rk, const Function& fn, const std::vector<Source>& sources, const OpforgeCallFrame* f,
           const TritonLaunch& cfg) {
  const size_t np = fn.params.size();
  const int32_t n = f->num_args;
  Bound b;
  b.values.resize(np);
  b.constants.resize(np);
  b.is_constant.assign(np, 0);
  b.partial_rows.assign(np, 0);
  b.partial_into.resize(np);
  std::vector<uint8_t> given(np, 0);
  for (const TritonLaunch::Value& v : cfg.values) {
    if (v.kind == TritonLaunch::Value::kCopy) continue;  // no parameter: the launcher copies first
    size_t p = 0;
    while (p < np && fn.params[p].name != v.name) ++p;
    if (p == np) throw InternalError(subject(rk) + " has no parameter '" + v.name + "', which the grid function sets");
    const Param& param = fn.params[p];
    const bool constant = v.kind == TritonLaunch::Value::kConstInt || v.kind == TritonLaunch::Value::kConstFloat ||
                          v.kind == TritonLaunch::Value::kConstBool || v.kind == TritonLaunch::Value::kConstDtype;
    if (constant != param.is_constexpr)
      throw InternalError(subject(rk) + ": parameter '" + param.name + "' is " +
                          (param.is_constexpr ? "a tl.constexpr" : "a runtime parameter") +
                          ", but the grid function gives it " + kind_name(v.kind));
    given[p] = 1;
    switch (v.kind) {
      case TritonLaunch::Value::kInt:
        b.values[p] = {Value::kInt, nullptr, -1, v.i, 0};
        break;
      case TritonLaunch::Value::kFloat:
        b.values[p] = {Value::kFloat, nullptr, -1, 0, v.f};
        break;
      case TritonLaunch::Value::kBool:
        b.values[p] = {Value::kBool, nullptr, -1, v.i, 0};
        break;
      case TritonLaunch::Value::kTensor:
        b.values[p] = {Value::kPointer, v.tensor.data, v.tensor.dtype, 0, 0};
        break;
      case TritonLaunch::Value::kPartials:
        b.values[p] = {Value::kPointer, nullptr, OPFORGE_DTYPE_FLOAT32, 0, 0};  // the scratch, at launch
        b.partial_rows[p] = v.i;
        b.partial_into[p] = v.tensor;
        break;
      case TritonLaunch::Value::kConstInt:
        b.constants[p].kind = Constant::kInt, b.constants[p].i = v.i, b.is_constant[p] = 1;
        break;
      case TritonLaunch::Value::kConstFloat:
        b.constants[p].kind = Constant::kFloat, b.constants[p].f = v.f, b.is_constant[p] = 1;
        break;
      case TritonLaunch::Value::kConstBool:
        b.constants[p].kind = Constant::kBool, b.constants[p].i = v.i, b.is_constant[p] = 1;
        break;
      case TritonLaunch::Value::kConstDtype:
        b.constants[p].kind = Constant::kDtype, b.constants[p].dtype = type_name(static_cast<int32_t>(v.i)).substr(1);
        b.is_constant[p] = 1;
        break;
      case TritonLaunch::Value::kCopy:
        break;
    }
  }
  for (size_t p = 0; p < np; ++p) {
    if (given[p]) continue;
    const Param& param = fn.params[p];
    const Source& s = sources[p];
    switch (s.kind) {
      case Source::kTensor: {
        if (param.is_constexpr)
          throw InternalError(subject(rk) + ": parameter '" + param.name +
                              "' is a tl.constexpr, but it names the tensor " +
                              (s.index < n ? rk.def->args[s.index].name : rk.def->outputs[s.index - n].name));
        const OpforgeTensor& t = s.index < n ? f->args[s.index].tensor : f->outputs[s.index - n];
        if (t.ndim < 0) {  // an optional input left out: None, which Triton compiles in as a constant
          b.constants[p] = Constant{};
          b.is_constant[p] = 1;
        } else {
          b.values[p] = {Value::kPointer, t.data, t.dtype, 0, 0};
        }
        break;
      }
      case Source::kOpParam: {
        const ArgDecl& a = rk.def->args[s.index];
        const OpforgeValue& v = f->args[s.index].value;
        const bool compile_time = a.param.compile_time;
        if (compile_time != param.is_constexpr)
          throw InternalError(subject(rk) + ": parameter '" + param.name + "' is " +
                              (param.is_constexpr ? "a tl.constexpr" : "a runtime parameter") +
                              ", but the op's parameter " + a.name + " is " +
                              (compile_time ? "opforge::compile_time" : "not opforge::compile_time"));
        if (a.kind != OPFORGE_ARG_INT && a.kind != OPFORGE_ARG_FLOAT && a.kind != OPFORGE_ARG_BOOL)
          throw InternalError(subject(rk) + ": parameter '" + param.name + "' gets the op's parameter " + a.name +
                              ", whose type a Triton kernel cannot take (an integer, float or bool)");
        if (compile_time) {
          Constant& c = b.constants[p];
          c.kind = a.kind == OPFORGE_ARG_FLOAT  ? Constant::kFloat
                   : a.kind == OPFORGE_ARG_BOOL ? Constant::kBool
                                                : Constant::kInt;
          c.i = v.i;
          c.f = v.f;
          b.is_constant[p] = 1;
        } else {
          b.values[p] = {a.kind == OPFORGE_ARG_FLOAT  ? Value::kFloat
                         : a.kind == OPFORGE_ARG_BOOL ? Value::kBool
                                                      : Value::kInt,
                         nullptr, -1, v.i, v.f};
        }
        break;
      }
      case Source::kLaunchValue: {
        const int32_t t = rk.rule_tensor;
        const OpforgeTensor& view = t < n ? f->args[t].tensor : f->outputs[t - n];
        int64_t numel = 1;
        for (int32_t d = 0; d < view.ndim; ++d) numel *= view.sizes[d];
        const int64_t cols = view.ndim > 0 ? view.sizes[view.ndim - 1] : 1;
        const int64_t value =
            rk.rule.kind == LaunchRule::kRows ? (s.index == 0 ? (cols ? numel / cols : 0) : cols) : numel;
        if (param.is_constexpr) {
          b.constants[p].kind = Constant::kInt, b.constants[p].i = value, b.is_constant[p] = 1;
        } else {
          b.values[p] = {Value::kInt, nullptr, -1, value, 0};
        }
        break;
      }
      case Source::kDefault:
        b.constants[p] = param.default_value;
        b.is_constant[p] = 1;
        break;
      case Source::kNone: {
        // A tl.constexpr that every autotune config sets gets its value from the chosen config.
        bool configured = fn.autotuned && !fn.configs.empty();
        for (const Config& c : fn.configs) {
          bool here = false;
          for (const auto& kv : c.kwargs) here |= kv.first == param.name;
          configured &= here;
        }
        if (configured && param.is_constexpr) break;
        throw InternalError(subject(rk) + ": parameter '" + param.name +
                            "' gets no value: name a tensor or parameter of the op after it (ignoring case and _ptr), "
                            "or set it in the grid function (TritonLaunch::" +
                            (param.is_constexpr ? "constant" : "set") + "); see Note [Triton kernels]");
      }
    }
  }
  return b;
}

std::string type_name(int32_t dtype) {
  static const char* const kTypes[] = {"*fp32", "*fp64", "*fp16", "*bf16",    "*i8",    "*i16", "*i32",
                                       "*i64",  "*u8",   "*u1",   "*fp8e4nv", "*fp8e5", "*u8"};
  static_assert(sizeof(kTypes) / sizeof(kTypes[0]) == OPFORGE_NUM_DTYPES, "a Triton type per OpforgeDtype");
  return dtype >= 0 && dtype < OPFORGE_NUM_DTYPES ? kTypes[dtype] : "*i8";
}

Variant specialise(const Function& fn, const Bound& b, int32_t num_warps, int32_t num_stages, bool general) {
  Variant v;
  const size_t np = fn.params.size();
  v.types.resize(np);
  v.divisible.assign(np, 0);
  v.constants.resize(np);
  v.num_warps = num_warps;
  v.num_stages = num_stages;
  for (size_t p = 0; p < np; ++p) {
    const Param& param = fn.params[p];
    if (param.is_constexpr || b.is_constant[p]) {
      v.types[p] = "constexpr";
      v.constants[p] = b.constants[p];
      continue;
    }
    const Value& x = b.values[p];
    const bool specialise = !general && !param.do_not_specialize;
    const bool align = specialise && !param.do_not_specialize_on_alignment;
    switch (x.kind) {
      case Value::kPointer:
        v.types[p] = param.annotation.empty() ? type_name(x.dtype) : param.annotation;
        // A null pointer (an optional input left out, a scratch bound at launch) is aligned.
        v.divisible[p] = align && reinterpret_cast<uintptr_t>(x.pointer) % 16 == 0 && b.partial_rows[p] == 0;
        break;
      case Value::kInt:
        if (specialise && param.annotation.empty() && x.i == 1) {
          v.types[p] = "constexpr";
          v.constants[p].kind = Constant::kInt;
          v.constants[p].i = 1;
          break;
        }
        v.types[p] = !param.annotation.empty()              ? param.annotation
                     : general                              ? "i64"
                     : x.i >= INT32_MIN && x.i <= INT32_MAX ? "i32"
                                                            : "i64";
        v.divisible[p] = align && x.i % 16 == 0;
        break;
      case Value::kFloat:
        v.types[p] = param.annotation.empty() ? "fp32" : param.annotation;
        break;
      case Value::kBool:
        v.types[p] = param.annotation.empty() ? "u1" : param.annotation;
        break;
    }
  }
  return v;
}

void apply_config(const Function& fn, int32_t config, Variant& v) {
  const Config& c = fn.configs[config];
  for (const auto& [name, value] : c.kwargs)
    for (size_t p = 0; p < fn.params.size(); ++p)
      if (fn.params[p].name == name) {
        v.types[p] = "constexpr";
        v.constants[p] = value;
      }
  v.num_warps = c.num_warps;
  v.num_stages = c.num_stages;
  v.num_ctas = c.num_ctas;
  v.maxnreg = c.maxnreg;
  v.config = config;
}

std::string Variant::request(const Function& fn) const {
  std::string sig, consts, attrs;
  for (size_t p = 0; p < types.size(); ++p) {
    const std::string name = json(fn.params[p].name).dump();
    if (types[p] == "constexpr") {
      consts += (consts.empty() ? "" : ", ") + name + ": " + constants[p].json();
    } else {
      sig += (sig.empty() ? "" : ", ") + name + ": \"" + types[p] + "\"";
      if (divisible[p]) attrs += (attrs.empty() ? "" : ", ") + name + ": [[\"tt.divisibility\", 16]]";
    }
  }
  std::string options = "\"num_warps\": " + std::to_string(num_warps) +
                        ", \"num_stages\": " + std::to_string(num_stages) +
                        ", \"num_ctas\": " + std::to_string(num_ctas);
  if (maxnreg > 0) options += ", \"maxnreg\": " + std::to_string(maxnreg);
  return "{\"signature\": {" + sig + "}, \"constexprs\": {" + consts + "}, \"attrs\": {" + attrs + "}, \"options\": {" +
         options + "}}";
}

uint64_t Variant::hash() const {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const void* data, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      h ^= static_cast<const unsigned char*>(data)[i];
      h *= 1099511628211ull;
    }
  };
  for (size_t p = 0; p < types.size(); ++p) {
    mix(types[p].data(), types[p].size());
    mix(&divisible[p], 1);
    const Constant& c = constants[p];
    mix(&c.kind, sizeof(c.kind));
    mix(&c.i, sizeof(c.i));
    mix(&c.f, sizeof(c.f));
    mix(c.dtype.data(), c.dtype.size());
  }
  for (int32_t v : {num_warps, num_stages, num_ctas, maxnreg, config}) mix(&v, sizeof(v));
  return h;
}

std::string Variant::key() const {
  std::string k;
  for (size_t p = 0; p < types.size(); ++p)
    k += types[p] + (types[p] == "constexpr" ? "=" + constants[p].json() : divisible[p] ? ":16" : "") + ",";
  return k + " warps " + std::to_string(num_warps) + " stages " + std::to_string(num_stages) + " ctas " +
         std::to_string(num_ctas) + " maxnreg " + std::to_string(maxnreg);
}

std::string Variant::describe(const Function& fn) const {
  std::string d;
  for (size_t p = 0; p < types.size(); ++p) {
    d += (p ? ", " : "") + fn.params[p].name + ": " + types[p];
    if (types[p] == "constexpr") d += " = " + constants[p].json();
    else if (divisible[p]) d += " (divisible by 16)";
  }
  return d + "; num_warps " + std::to_string(num_warps) + ", num_stages " + std::to_string(num_stages);
}

const std::string& sources_text() {
  std::lock_guard<std::mutex> lock(g_sources_mutex);
  if (g_sources == nullptr) {
    std::vector<std::pair<std::string, std::string>> files;
    read_tree(kernel_dir() + "/", "", files);
    auto* text = new std::string;  // kept for the process: keys being built may hold a reference
    for (const auto& [path, body] : files) *text += "file " + path + " " + std::to_string(body.size()) + "\n" + body;
    g_sources = text;
  }
  return *g_sources;
}

void forget_sources() {
  std::lock_guard<std::mutex> lock(g_sources_mutex);
  g_sources = nullptr;  // the old text stays allocated: a caller may still read it
}

std::string base64_decode(const std::string& text) {
  std::string out;
  out.reserve(text.size() / 4 * 3);
  uint32_t bits = 0;
  int count = 0;
  for (const char ch : text) {
    int v;
    if (ch >= 'A' && ch <= 'Z') v = ch - 'A';
    else if (ch >= 'a' && ch <= 'z') v = ch - 'a' + 26;
    else if (ch >= '0' && ch <= '9') v = ch - '0' + 52;
    else if (ch == '+') v = 62;
    else if (ch == '/') v = 63;
    else continue;  // padding and line breaks
    bits = (bits << 6) | static_cast<uint32_t>(v);
    if ((count += 6) >= 8) {
      count -= 8;
      out.push_back(static_cast<char>((bits >> count) & 0xff));
    }
  }
  return out;
}

}  // namespace opforge::detail::triton
