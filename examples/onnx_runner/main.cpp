// opforge-onnx-runner: runs an ONNX model whose nodes include opforge ops in ONNX Runtime, from
// C++ alone: ONNX Runtime's shared library is loaded at run time (the pip wheel's
// onnxruntime/capi/libonnxruntime.so.*, or any other build), the opforge ONNX Runtime adapter
// registered as a custom-op library with the op libraries named in the session's configuration,
// inputs read from .npy files and outputs written as .npy files.
//
//   opforge-onnx-runner --onnxruntime .../onnxruntime/capi/libonnxruntime.so.1.30.0
//       --adapter build/lib/libopforge_ort.so --op-library build/lib/libbias_gelu.so
//       --model model.onnx --input x.npy --output-dir out/ [--cuda]
//
// Inputs are given in the model's input order; each output is written as <output-dir>/<name>.npy
// and printed as "name dtype [shape]". Exit codes: 0 success, 1 the run failed, 2 bad arguments.
#include <dlfcn.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "../../src/ort/ort_abi.h"

namespace ort = opforge::ort;
using ort::Slot;

namespace {

/// numpy's dtype codes ("<f4") of the element types the runner reads and writes.
struct NpyType {
  ort::ElementType type;
  const char* descr;
  size_t size;
};
constexpr NpyType kNpyTypes[] = {
    {ort::kFloat, "<f4", 4}, {ort::kDouble, "<f8", 8}, {ort::kFloat16, "<f2", 2}, {ort::kInt64, "<i8", 8},
    {ort::kInt32, "<i4", 4}, {ort::kInt8, "|i1", 1},   {ort::kUint8, "|u1", 1},   {ort::kBool, "|b1", 1},
};

const NpyType& npy_type(const std::string& descr) {
  for (const NpyType& t : kNpyTypes)
    if (descr == t.descr) return t;
  throw std::runtime_error("unsupported .npy dtype " + descr);
}
const NpyType& npy_type(int32_t type) {
  for (const NpyType& t : kNpyTypes)
    if (t.type == type) return t;
  throw std::runtime_error("unsupported output element type " + std::to_string(type));
}

/// A dense row-major array: element type, shape, bytes.
struct Array {
  ort::ElementType type = ort::kUndefined;
  std::vector<int64_t> shape;
  std::vector<char> data;
};

/// Reads a .npy file (format 1.0 or 2.0, C order).
Array read_npy(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + path);
  char magic[8];
  f.read(magic, 8);
  if (std::memcmp(magic, "\x93NUMPY", 6) != 0) throw std::runtime_error(path + " is not a .npy file");
  uint32_t header_len = 0;
  if (magic[6] == 1) {
    uint16_t n = 0;
    f.read(reinterpret_cast<char*>(&n), 2);
    header_len = n;
  } else {
    f.read(reinterpret_cast<char*>(&header_len), 4);
  }
  std::string header(header_len, '\0');
  f.read(header.data(), header_len);
  auto field = [&](const char* key) {
    const size_t at = header.find(key);
    if (at == std::string::npos) throw std::runtime_error(path + ": no " + key + " in the .npy header");
    return at + std::strlen(key);
  };
  size_t at = header.find('\'', field("'descr':")) + 1;
  const NpyType& t = npy_type(header.substr(at, header.find('\'', at) - at));
  if (header.find("'fortran_order': True") != std::string::npos)
    throw std::runtime_error(path + ": Fortran-ordered arrays are not supported");
  Array a;
  a.type = t.type;
  at = header.find('(', field("'shape':")) + 1;
  std::stringstream dims(header.substr(at, header.find(')', at) - at));
  size_t count = 1;
  for (std::string d; std::getline(dims, d, ',');)
    if (d.find_first_not_of(' ') != std::string::npos) {
      a.shape.push_back(std::stoll(d));
      count *= static_cast<size_t>(a.shape.back());
    }
  a.data.resize(count * t.size);
  f.read(a.data.data(), static_cast<std::streamsize>(a.data.size()));
  if (!f) throw std::runtime_error(path + ": the file ends before its data");
  return a;
}

void write_npy(const std::string& path, ort::ElementType type, const std::vector<int64_t>& shape, const void* data,
               size_t bytes) {
  std::string dims;
  for (int64_t d : shape) dims += std::to_string(d) + ", ";
  if (shape.size() > 1) dims.resize(dims.size() - 2);
  std::string header =
      std::string("{'descr': '") + npy_type(type).descr + "', 'fortran_order': False, 'shape': (" + dims + "), }";
  header.append(64 - (10 + header.size() + 1) % 64, ' ');
  header += '\n';
  std::ofstream f(path, std::ios::binary);
  const uint16_t n = static_cast<uint16_t>(header.size());
  f.write("\x93NUMPY\x01\x00", 8);
  f.write(reinterpret_cast<const char*>(&n), 2);
  f << header;
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  if (!f) throw std::runtime_error("cannot write " + path);
}

/// ONNX Runtime's API table, with its failures as exceptions.
struct Runtime {
  ort::Api api{nullptr};

  void check(ort::Status* s, const char* what) const {
    if (s == nullptr) return;
    const std::string message =
        std::string(what) + ": " + api.call<const char*>(Slot::GetErrorMessage, static_cast<const ort::Status*>(s));
    api.call<void>(Slot::ReleaseStatus, s);
    throw std::runtime_error(message);
  }
};

/// The element type and shape of a tensor value.
void type_and_shape(const Runtime& rt, const ort::Value* v, ort::ElementType& type, std::vector<int64_t>& shape) {
  ort::TensorTypeAndShapeInfo* info = nullptr;
  rt.check(rt.api.call<ort::Status*>(Slot::GetTensorTypeAndShape, v, &info), "GetTensorTypeAndShape");
  const auto* c = static_cast<const ort::TensorTypeAndShapeInfo*>(info);
  size_t rank = 0;
  rt.check(rt.api.call<ort::Status*>(Slot::GetTensorElementType, c, &type), "GetTensorElementType");
  rt.check(rt.api.call<ort::Status*>(Slot::GetDimensionsCount, c, &rank), "GetDimensionsCount");
  shape.resize(rank);
  rt.check(rt.api.call<ort::Status*>(Slot::GetDimensions, c, shape.data(), rank), "GetDimensions");
  rt.api.call<void>(Slot::ReleaseTensorTypeAndShapeInfo, info);
}

int run(const std::string& onnxruntime, const std::string& adapter, const std::vector<std::string>& op_libraries,
        const std::string& model, const std::vector<std::string>& inputs, const std::string& output_dir, bool cuda) {
  void* handle = ::dlopen(onnxruntime.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) throw std::runtime_error(std::string("cannot load ONNX Runtime: ") + ::dlerror());
  using GetApiBase = const ort::ApiBase* (*)();
  auto get_base = reinterpret_cast<GetApiBase>(::dlsym(handle, "OrtGetApiBase"));
  if (get_base == nullptr) throw std::runtime_error(onnxruntime + " has no OrtGetApiBase");
  const ort::ApiBase* base = get_base();
  Runtime rt{ort::Api{base->GetApi(ort::kApiVersion)}};
  if (rt.api.table == nullptr)
    throw std::runtime_error(std::string("ONNX Runtime ") + base->GetVersionString() + " is older than 1.17");

  ort::Env* env = nullptr;
  rt.check(rt.api.call<ort::Status*>(Slot::CreateEnv, ort::kLogWarning, "opforge-onnx-runner", &env), "CreateEnv");
  ort::SessionOptions* options = nullptr;
  rt.check(rt.api.call<ort::Status*>(Slot::CreateSessionOptions, &options), "CreateSessionOptions");
  std::string libraries;
  for (const std::string& l : op_libraries) libraries += (libraries.empty() ? "" : ":") + l;
  rt.check(rt.api.call<ort::Status*>(Slot::AddSessionConfigEntry, options, "opforge.op_libraries", libraries.c_str()),
           "AddSessionConfigEntry");
  rt.check(rt.api.call<ort::Status*>(Slot::RegisterCustomOpsLibrary_V2, options, adapter.c_str()),
           "RegisterCustomOpsLibrary_V2");
  if (cuda) {
    // The CUDA execution provider with its default options (device 0).
    void* cuda_options = nullptr;
    rt.check(rt.api.call<ort::Status*>(Slot::CreateCUDAProviderOptions, &cuda_options), "CreateCUDAProviderOptions");
    ort::Status* s = rt.api.call<ort::Status*>(Slot::SessionOptionsAppendExecutionProvider_CUDA_V2, options,
                                               static_cast<const void*>(cuda_options));
    rt.api.call<void>(Slot::ReleaseCUDAProviderOptions, cuda_options);
    rt.check(s, "SessionOptionsAppendExecutionProvider_CUDA_V2");
  }
  ort::Session* session = nullptr;
  rt.check(rt.api.call<ort::Status*>(Slot::CreateSession, static_cast<const ort::Env*>(env), model.c_str(),
                                     static_cast<const ort::SessionOptions*>(options), &session),
           "CreateSession");

  ort::Allocator* allocator = nullptr;
  rt.check(rt.api.call<ort::Status*>(Slot::GetAllocatorWithDefaultOptions, &allocator),
           "GetAllocatorWithDefaultOptions");
  auto names = [&](Slot count_slot, Slot name_slot) {
    size_t n = 0;
    rt.check(rt.api.call<ort::Status*>(count_slot, static_cast<const ort::Session*>(session), &n), "SessionGet*Count");
    std::vector<std::string> out;
    for (size_t i = 0; i < n; ++i) {
      char* name = nullptr;
      rt.check(rt.api.call<ort::Status*>(name_slot, static_cast<const ort::Session*>(session), i, allocator, &name),
               "SessionGet*Name");
      out.emplace_back(name);
      rt.check(rt.api.call<ort::Status*>(Slot::AllocatorFree, allocator, static_cast<void*>(name)), "AllocatorFree");
    }
    return out;
  };
  const std::vector<std::string> input_names = names(Slot::SessionGetInputCount, Slot::SessionGetInputName);
  const std::vector<std::string> output_names = names(Slot::SessionGetOutputCount, Slot::SessionGetOutputName);
  if (inputs.size() != input_names.size())
    throw std::invalid_argument(model + " takes " + std::to_string(input_names.size()) + " inputs, got " +
                                std::to_string(inputs.size()));

  ort::MemoryInfo* cpu = nullptr;
  rt.check(rt.api.call<ort::Status*>(Slot::CreateCpuMemoryInfo, ort::kArenaAllocator, ort::kMemDefault, &cpu),
           "CreateCpuMemoryInfo");
  std::vector<Array> arrays;
  std::vector<ort::Value*> values;
  for (const std::string& path : inputs) {
    Array& a = arrays.emplace_back(read_npy(path));
    ort::Value* v = nullptr;
    rt.check(rt.api.call<ort::Status*>(Slot::CreateTensorWithDataAsOrtValue, static_cast<const ort::MemoryInfo*>(cpu),
                                       static_cast<void*>(a.data.data()), a.data.size(),
                                       static_cast<const int64_t*>(a.shape.data()), a.shape.size(), a.type, &v),
             "CreateTensorWithDataAsOrtValue");
    values.push_back(v);
  }
  std::vector<const char*> in_names, out_names;
  for (const auto& n : input_names) in_names.push_back(n.c_str());
  for (const auto& n : output_names) out_names.push_back(n.c_str());
  std::vector<ort::Value*> outputs(output_names.size(), nullptr);
  rt.check(rt.api.call<ort::Status*>(Slot::Run, session, static_cast<const ort::RunOptions*>(nullptr), in_names.data(),
                                     const_cast<const ort::Value* const*>(values.data()), values.size(),
                                     out_names.data(), out_names.size(), outputs.data()),
           "Run");
  for (size_t k = 0; k < outputs.size(); ++k) {
    ort::ElementType type = ort::kUndefined;
    std::vector<int64_t> shape;
    type_and_shape(rt, outputs[k], type, shape);
    void* data = nullptr;
    rt.check(rt.api.call<ort::Status*>(Slot::GetTensorMutableData, outputs[k], &data), "GetTensorMutableData");
    size_t count = 1;
    for (int64_t d : shape) count *= static_cast<size_t>(d);
    write_npy(output_dir + "/" + output_names[k] + ".npy", type, shape, data, count * npy_type(type).size);
    std::string dims;
    for (size_t d = 0; d < shape.size(); ++d) dims += (d ? ", " : "") + std::to_string(shape[d]);
    std::printf("%s %s [%s]\n", output_names[k].c_str(), npy_type(type).descr, dims.c_str());
    rt.api.call<void>(Slot::ReleaseValue, outputs[k]);
  }
  for (ort::Value* v : values) rt.api.call<void>(Slot::ReleaseValue, v);
  rt.api.call<void>(Slot::ReleaseMemoryInfo, cpu);
  rt.api.call<void>(Slot::ReleaseSession, session);
  rt.api.call<void>(Slot::ReleaseSessionOptions, options);
  rt.api.call<void>(Slot::ReleaseEnv, env);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Runs an ONNX model with opforge ops in ONNX Runtime (no Python)"};
  std::string onnxruntime, adapter, model, output_dir = ".";
  std::vector<std::string> op_libraries, inputs;
  bool cuda = false;
  app.add_option("--onnxruntime", onnxruntime, "ONNX Runtime's shared library (libonnxruntime.so.*)")->required();
  app.add_option("--adapter", adapter, "opforge's ONNX Runtime library (libopforge_ort.so)")->required();
  app.add_option("--op-library", op_libraries, "an op library whose ops the model uses (repeatable)")->required();
  app.add_option("--model", model, "the .onnx model")->required();
  app.add_option("--input", inputs, "a .npy file per model input, in the model's order");
  app.add_option("--output-dir", output_dir, "where <output name>.npy files are written");
  app.add_flag("--cuda", cuda, "run on the CUDA execution provider (device 0)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // 0: --help; CLI11's own codes (106: a missing option) are not passed on
  }
  try {
    return run(onnxruntime, adapter, op_libraries, model, inputs, output_dir, cuda);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "opforge-onnx-runner: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "opforge-onnx-runner: %s\n", e.what());
    return 1;
  }
}
