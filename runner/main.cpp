// opforge-runner: runs an AOTInductor package (.pt2) that uses opforge ops, with no Python.
//
//   opforge-runner PACKAGE.pt2 --inputs in.pt --output out.pt [--inputs-after after.pt]
//                  [--device cpu|cuda[:N]] [--warmup N] [--iters N]
//
// Before loading the model it loads the op libraries that the package's manifest
// (opforge_ops.txt, written beside the .pt2 by opforge.aoti.package) lists, and fails with the
// names of any ops and libraries that are missing. Inputs are a list of tensors saved with
// torch.save; outputs are saved the same way (read them with torch.load). The first run works on
// the inputs as given, so a model that writes its inputs in place (opforge::mutated ops, a KV
// cache) leaves its result in them, which --inputs-after saves; warm-up and timed runs work on
// fresh copies of the original inputs, so each computes what the first did. Prints one JSON line:
// {"device": ..., "outputs": N, "iters": N, "latency_ms": {"median": ..., "min": ..., "max": ...}}.
// Inputs that do not match the package (dtype, sizes outside the export's bounds, device, layout)
// fail the run with AOTInductor's message naming the input.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/cuda.h>
#include <torch/custom_class.h>
#include <torch/serialize.h>

#include <dlfcn.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "opforge/torch.h"

namespace fs = std::filesystem;

namespace {

struct Options {
  std::string package, inputs, output, inputs_after, device = "cpu";
  int warmup = 1, iters = 1;
};

/// What the runner refuses or what failed: main prints "opforge-runner: <message>" and returns 2.
/// Thrown rather than exited on, so that destructors run: AOTIModelPackageLoader's removes the
/// copy of the package it extracted into /tmp.
struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] void fail(const std::string& msg) { throw Failure(msg); }

int report(const std::string& msg) {
  std::cerr << "opforge-runner: " << msg << "\n";
  return 2;
}

/// The command line, parsed with CLI11; a bad one prints CLI11's message and a pointer to
/// --help and exits 2, the `opforge` command's code for bad arguments (CLI11's own codes, 105
/// for a value out of range, 106 for a missing required option, ..., are not passed on).
Options parse(int argc, char** argv) {
  Options o;
  CLI::App app{"Runs an AOTInductor package (.pt2) that uses opforge ops, with no Python.", "opforge-runner"};
  app.add_option("package", o.package,
                 "model.pt2 written by opforge.aoti.package, its op manifest beside it, or the package folder that "
                 "holds them")
      ->required()
      ->check(CLI::ExistingPath);
  app.add_option("--inputs", o.inputs, "the model's inputs: a tensor or a list of tensors saved with torch.save")
      ->required()
      ->check(CLI::ExistingFile);
  app.add_option(
         "--output", o.output,
         "where to torch.save the outputs (a tuple of CPU tensors, None for an output the model returns as None)")
      ->required();
  app.add_option("--inputs-after", o.inputs_after,
                 "where to torch.save the inputs after the first run, with what the model wrote into them");
  app.add_option("--device", o.device, "cpu, cuda or cuda:N; the inputs are moved there")->capture_default_str();
  app.add_option("--warmup", o.warmup, "untimed runs before the timed ones")
      ->check(CLI::Range(0, INT_MAX))
      ->capture_default_str();
  app.add_option("--iters", o.iters, "timed runs")->check(CLI::Range(1, INT_MAX))->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::exit(app.exit(e) == 0 ? 0 : 2);  // 0: --help
  }
  // Where the results go is checked before the model runs, not found unwritable after it.
  for (const std::string* path : {&o.output, &o.inputs_after}) {
    const fs::path parent = fs::path(*path).parent_path();
    if (!path->empty() && !parent.empty() && !fs::is_directory(parent)) {
      report("cannot write " + *path + ": the folder " + parent.string() + " does not exist");
      std::exit(2);
    }
  }
  if (fs::is_directory(o.package)) {  // the folder opforge.aoti.package wrote
    const fs::path model = fs::path(o.package) / "model.pt2";
    if (!fs::is_regular_file(model)) {
      report("the package folder " + o.package + " holds no model.pt2 (opforge.aoti.package writes one there)");
      std::exit(2);
    }
    o.package = model.string();
  }
  return o;
}

/// Saves `tensors` (copied to the CPU; None for an undefined one, an output the model returns as
/// None) as a tuple, which torch.load(weights_only=True) reads.
void save(const std::vector<at::Tensor>& tensors, const std::string& path) {
  std::vector<c10::IValue> cpu;
  for (const auto& t : tensors) cpu.emplace_back(t.defined() ? c10::IValue(t.cpu()) : c10::IValue());
  const std::vector<char> bytes = torch::pickle_save(c10::ivalue::Tuple::create(std::move(cpu)));
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  f.close();
  if (!f) fail("cannot write " + path + ": " + std::strerror(errno));
}

std::vector<char> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("cannot read " + path);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

/// Loads the op libraries listed in the manifest beside the package, then checks that every
/// listed op and custom class is registered. Manifest lines: "<ns>::<op> <library file>",
/// "class <ns>::<Class> <library file>" for a class whose objects the package holds (they are
/// unpickled when the package loads, which needs the class registered first), and "shims
/// <library file>" for the C shims the model links (Note [AOTInductor C shims] in
/// src/torch/aoti_shims.cpp), loaded last and globally, so the model's reference to the library
/// finds it already loaded.
void load_ops(const fs::path& package) {
  const fs::path dir = package.parent_path().empty() ? fs::path(".") : package.parent_path();
  const fs::path manifest = dir / "opforge_ops.txt";
  if (!fs::exists(manifest)) {
    fail("no op manifest " + manifest.string() + " beside " + package.string() +
         "; packages written by opforge.aoti.package carry one");
  }
  std::ifstream in(manifest);
  std::map<std::string, std::vector<std::string>> ops_by_library;
  std::vector<std::string> shims;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string op, lib;
    if (!(ls >> op) || op[0] == '#') continue;
    if (op == "shims") {
      if (ls >> lib) shims.push_back(lib);
      continue;
    }
    if (op == "class" && !(ls >> op)) continue;
    if (!(ls >> lib)) continue;
    const bool is_class = line.rfind("class ", 0) == 0;
    ops_by_library[lib].push_back(is_class ? "class " + op : op);
  }
  std::vector<std::string> missing;
  for (const auto& [lib, ops] : ops_by_library) {
    const fs::path path = dir / lib;
    if (!fs::exists(path)) {
      for (const auto& op : ops) missing.push_back(op + " (from " + lib + ", not found in " + dir.string() + ")");
      continue;
    }
    opforge::torch::load_library(path.string());
    for (const auto& op : ops) {
      if (op.rfind("class ", 0) == 0) {  // "class ns::Class": torch's name is __torch__.torch.classes.ns.Class
        std::string name = op.substr(6);
        if (const size_t sep = name.find("::"); sep != std::string::npos) name.replace(sep, 2, ".");
        if (!::torch::getCustomClass("__torch__.torch.classes." + name))
          missing.push_back(op + " (" + lib + " loaded but does not declare it)");
      } else if (!c10::Dispatcher::singleton().findSchema({op, ""}).has_value()) {
        missing.push_back(op + " (" + lib + " loaded but does not declare it)");
      }
    }
  }
  if (!missing.empty()) {
    std::string m = package.string() + " needs ops or classes that are not available:";
    for (const auto& s : missing) m += "\n  " + s;
    fail(m);
  }
  for (const auto& lib : shims) {
    const fs::path path = dir / lib;
    try {
      opforge::torch::open_shared_object(path.string(), "the C shim library", RTLD_NOW | RTLD_GLOBAL);
    } catch (const c10::Error& e) {
      fail(package.string() + " links the C shim library " + path.string() +
           ", which cannot be loaded: " + e.what_without_backtrace());
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  // AOTInductor checks each run's inputs against what the package was compiled for (dtype,
  // static sizes, strides, device, dynamic sizes within their export bounds) only when this is
  // set: otherwise a float64 input given to a float32 graph is read as float32, silently. A
  // value the caller set (0 to skip the checks) is kept.
  setenv("AOTI_RUNTIME_CHECK_INPUTS", "1", /*overwrite=*/0);
  try {
    load_ops(o.package);
    const c10::Device device(o.device);
    c10::IValue loaded = torch::pickle_load(read_file(o.inputs));
    std::vector<at::Tensor> inputs;
    if (loaded.isTensor()) {
      inputs.push_back(loaded.toTensor());
    } else if (loaded.isList() || loaded.isTuple()) {
      for (const auto& v : loaded.isList() ? loaded.toListRef() : loaded.toTupleRef().elements()) {
        if (!v.isTensor()) fail(o.inputs + ": expected a list of tensors");
        inputs.push_back(v.toTensor());
      }
    } else {
      fail(o.inputs + ": expected a tensor or a list of tensors (saved with torch.save)");
    }
    for (auto& t : inputs) t = t.to(device);

    torch::inductor::AOTIModelPackageLoader loader(o.package, "model", false, 1,
                                                   device.is_cuda() && device.has_index() ? device.index() : -1);
    auto sync = [&] {
      if (device.is_cuda()) torch::cuda::synchronize(device.has_index() ? device.index() : -1);
    };
    std::vector<at::Tensor> original;
    for (const auto& t : inputs) original.push_back(t.clone());
    auto fresh = [&] {  // the original inputs again, for a run that must compute what the first did
      for (size_t k = 0; k < inputs.size(); ++k) inputs[k].copy_(original[k]);
      sync();
    };
    // An op's exception can be logged and swallowed by AOTInductor's proxy executor, leaving an
    // undefined output: every run asks the adapter whether an op failed.
    auto run = [&] {
      opforge::torch::take_call_error();
      std::vector<at::Tensor> out;
      try {
        out = loader.run(inputs);
      } catch (const std::exception& e) {  // AOTInductor printed what failed (an input it refused) above
        const auto* error = dynamic_cast<const c10::Error*>(&e);
        fail("running " + o.package +
             " failed (AOTInductor's message is above): " + (error ? error->what_without_backtrace() : e.what()));
      }
      if (const std::string error = opforge::torch::take_call_error(); !error.empty())
        fail("an op failed while running " + o.package + ":\n" + error);
      return out;
    };
    const std::vector<at::Tensor> outputs = run();
    save(outputs, o.output);
    if (!o.inputs_after.empty()) save(inputs, o.inputs_after);
    for (int i = 0; i < o.warmup; ++i) {
      fresh();
      run();
    }
    std::vector<double> ms;
    for (int i = 0; i < o.iters; ++i) {
      fresh();
      const auto t0 = std::chrono::steady_clock::now();
      run();
      sync();
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }

    std::sort(ms.begin(), ms.end());
    std::cout << "{\"device\": \"" << device.str() << "\", \"outputs\": " << outputs.size()
              << ", \"iters\": " << ms.size() << ", \"latency_ms\": {\"median\": " << ms[ms.size() / 2]
              << ", \"min\": " << ms.front() << ", \"max\": " << ms.back() << "}}" << std::endl;
  } catch (const c10::Error& e) {
    return report(e.what_without_backtrace());
  } catch (const std::exception& e) {  // a Failure among them
    return report(e.what());
  }
  return 0;
}
