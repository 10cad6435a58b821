"""Run-time kernels: NVRTC compilation, the on-disk cache, compile errors, edits and reload."""

from __future__ import annotations

import ctypes
import re
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch

import opforge
from conftest import CASES, requires_cuda

ROOT = Path(__file__).resolve().parents[2]
#: Example ops with run-time kernel sources (examples/ops/<op>/kernels/).
RUNTIME_OPS = [name for name in CASES if (ROOT / "examples" / "ops" / name / "kernels").is_dir()]
# Each test here compiles into, and finds in, an empty kernel cache of its own.
pytestmark = pytest.mark.usefixtures("private_kernel_cache")


def entries(cache: Path) -> list[Path]:
    return sorted(cache.glob("*.bin"))


@pytest.mark.parametrize("name", RUNTIME_OPS)
def test_every_example_kernel_compiles_for_sm90(name, tmp_path):
    case = CASES[name]
    tensors = [a.name for a in opforge.find_op(f"examples::{name}").tensors]
    for dtype in case.dtypes:
        dtypes = dict.fromkeys(tensors, dtype)
        assert opforge.precompile(f"examples::{name}", dtypes, arch="sm_90", cache_dir=tmp_path) is False
        assert opforge.precompile(f"examples::{name}", dtypes, arch="sm_90", cache_dir=tmp_path) is True
    binaries = entries(tmp_path)
    assert len(binaries) == len(case.dtypes)
    assert all(b.read_bytes()[:8] == b"OPFGRTC1" and b"\x7fELF" in b.read_bytes() for b in binaries)  # CUBINs


def test_ptx_for_an_architecture_name(tmp_path):
    assert (
        opforge.precompile("examples::softshrink", {"x": torch.float32}, arch="compute_90", cache_dir=tmp_path) is False
    )
    (entry,) = entries(tmp_path)
    assert b".target sm_90" in entry.read_bytes()


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_damaged_entry_is_recompiled(damage, tmp_path):
    args = ("examples::softshrink", {"x": torch.float16})
    assert opforge.precompile(*args, arch="sm_90", cache_dir=tmp_path) is False
    (entry,) = entries(tmp_path)
    data = bytearray(entry.read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 2]
    else:
        data[-100] ^= 0xFF  # inside the binary: the checksum no longer matches
    entry.write_bytes(bytes(data))
    assert opforge.precompile(*args, arch="sm_90", cache_dir=tmp_path) is False  # recompiled
    assert opforge.precompile(*args, arch="sm_90", cache_dir=tmp_path) is True  # and rewritten whole


def test_concurrent_first_use_from_threads_and_processes(tmp_path):
    args = ("examples::softshrink", {"x": torch.bfloat16})
    errors = []

    def work():
        try:
            opforge.precompile(*args, arch="sm_90", cache_dir=tmp_path)
        except Exception as e:  # noqa: BLE001 -- collected and asserted below
            errors.append(e)

    script = textwrap.dedent(f"""
        import torch, opforge
        opforge.load_library(opforge.example_library("softshrink"))
        opforge.precompile("examples::softshrink", {{"x": torch.bfloat16}}, arch="sm_90", cache_dir={str(tmp_path)!r})
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script]) for _ in range(3)]
    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [p.wait(timeout=300) for p in procs] == [0, 0, 0]
    assert errors == []
    assert len(entries(tmp_path)) == 1
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary files left
    assert opforge.precompile(*args, arch="sm_90", cache_dir=tmp_path) is True


def test_unwritable_cache_warns_and_keeps_working(tmp_path, capfd):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    assert (
        opforge.precompile("examples::softshrink", {"x": torch.float64}, arch="sm_90", cache_dir=blocker / "cache")
        is False
    )
    err = capfd.readouterr().err
    assert f"opforge: warning: cannot write the kernel cache {blocker / 'cache'}" in err
    assert "compiled kernels are kept in memory only" in err


OP_FILE = """
#include <opforge/op.h>
static void ref(opforge::Tensor x, int64_t k, opforge::MutableTensor y) {
  for (int64_t i = 0; i < x.numel(); ++i) y.data<float>()[i] = x.data<float>()[i] * static_cast<float>(k);
}
OPFORGE_OP(rtc_test, {name})
    .input("x", opforge::kFloat32)
    .param<int64_t>("k", 2, opforge::compile_time)
    .output("y", opforge::like("x"))
    .reference(ref)
    .cuda_source("scale.cu", "scale<{k}>")
    .launch(opforge::elementwise("y"));
"""

KERNEL = """#include <opforge/kernel.cuh>
template <int K>
__global__ void scale(const float* x, float* y, int64_t n) {
  const int64_t i = opforge::kernel::global_index();
  if (i < n) y[i] = x[i] * K * MULTIPLIER;
}
"""


def build_op_library(folder: Path, name: str, op_file: str, kernels: dict[str, str]):
    """Writes `op_file` as folder/<name>.cpp and each of `kernels` (file name: source) beside it,
    then builds lib<name>_lib.so from them into folder/build and loads it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.cpp").write_text(op_file)
    for file, source in kernels.items():
        (folder / file).write_text(source)
    return opforge.load_library(
        opforge.build_library(
            f"{name}_lib", [folder / f"{name}.cpp"], kernels=[folder / f for f in kernels], build_dir=folder / "build"
        )
    )


def build_scale_op(tmp_path: Path, name: str, kernel: str):
    return build_op_library(tmp_path, name, OP_FILE.replace("{name}", name), {"scale.cu": kernel})


def test_compile_error_names_file_and_line(tmp_path):
    lib = build_scale_op(tmp_path, "broken", KERNEL.replace("MULTIPLIER", "undefined_name"))
    assert (lib.kernel_dir / "scale.cu").resolve() == (tmp_path / "scale.cu").resolve()
    with pytest.raises(opforge.OpforgeError) as err:
        opforge.precompile("rtc_test::broken", {"x": torch.float32}, {"k": 3}, arch="sm_90", cache_dir=tmp_path / "c")
    message = str(err.value)
    assert message.startswith(
        f"rtc_test::broken: compiling scale<3> from {tmp_path / 'scale.cu'} for sm_90a failed:"
    )  # sm_90: Hopper's arch features
    assert f'{tmp_path / "scale.cu"}(5): error: identifier "undefined_name" is undefined' in message


def test_edit_and_compile_time_parameters_select_new_binaries(tmp_path):
    build_scale_op(tmp_path, "edited", KERNEL.replace("MULTIPLIER", "1"))
    cache = tmp_path / "c"
    for k, hit in [(3, False), (3, True), (4, False)]:  # each compile-time value is an instantiation
        assert (
            opforge.precompile("rtc_test::edited", {"x": torch.float32}, {"k": k}, arch="sm_90", cache_dir=cache) is hit
        )
    (tmp_path / "scale.cu").write_text(KERNEL.replace("MULTIPLIER", "2"))  # an edit is a new source
    assert (
        opforge.precompile("rtc_test::edited", {"x": torch.float32}, {"k": 3}, arch="sm_90", cache_dir=cache) is False
    )
    assert len(entries(cache)) == 3


@requires_cuda
def test_edit_then_reload_changes_behaviour(tmp_path):
    build_scale_op(tmp_path, "live", KERNEL.replace("MULTIPLIER", "1"))
    x = torch.randn(1000, device="cuda")
    torch.testing.assert_close(torch.ops.rtc_test.live(x, 3), x * 3)
    (tmp_path / "scale.cu").write_text(KERNEL.replace("MULTIPLIER", "2"))
    torch.testing.assert_close(torch.ops.rtc_test.live(x, 3), x * 3)  # compiled kernels stay until reload
    opforge.reload()
    torch.testing.assert_close(torch.ops.rtc_test.live(x, 3), x * 6)
    torch.testing.assert_close(torch.ops.rtc_test.live(x, 5), x * 10)  # another instantiation, on demand


@requires_cuda
def test_first_launch_on_a_thread_without_a_current_context():
    """A thread that never made a CUDA context current (torch's autograd engine runs backward
    ops on such a device thread) loads and launches run-time kernels: cuModuleLoadData failed
    there with "invalid device context"."""
    opforge.load_library(CASES["softshrink"].library_path)
    x = torch.randn(1000, device="cuda")
    torch.ops.examples.softshrink(x, 0.5)
    opforge.reload()  # the thread's launch loads the module again
    result = {}

    def work():
        try:
            # No context current here, as on the autograd engine's device thread.
            assert ctypes.CDLL("libcuda.so.1").cuCtxSetCurrent(None) == 0
            result["y"] = torch.ops.examples.softshrink(x, 0.5)
        except Exception as e:  # noqa: BLE001 -- asserted below
            result["error"] = e

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert "error" not in result, result.get("error")
    torch.testing.assert_close(result["y"], torch.nn.functional.softshrink(x, 0.5))


@requires_cuda
def test_launch_with_unwritable_cache_keeps_working(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    script = textwrap.dedent("""
        import torch, torch.nn.functional as F, opforge
        opforge.load_library(opforge.example_library("softshrink"))
        x = torch.randn(4096, device="cuda", dtype=torch.float16)
        torch.testing.assert_close(torch.ops.examples.softshrink(x, 0.25), F.softshrink(x, 0.25))
        print("ok")
    """)
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env={**__import__("os").environ, "OPFORGE_CACHE_DIR": str(blocker)},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"
    assert "opforge: warning: cannot write the kernel cache" in proc.stderr


ATTENTION = (
    "examples::attention(Tensor q, Tensor k, Tensor v, int head_dim, Tensor? mask=None, bool causal=False, "
    "float scale=0.0) -> (Tensor, Tensor): invalid arguments\n"
)


def test_precompile_checks_dtypes_and_parameters_first(tmp_path):
    opforge.load_library(opforge.example_library("attention"))
    with pytest.raises(ValueError) as err:  # k and v follow q's dtype: only q is reported
        opforge.precompile(
            "examples::attention", dict.fromkeys("qkv", torch.float32), {"head_dim": 64}, cache_dir=tmp_path
        )
    assert str(err.value) == ATTENTION + (
        "  q: expected dtype one of {float16, bfloat16} on cuda (its cuda kernel takes no other), got float32"
    )
    with pytest.raises(ValueError) as err:
        opforge.precompile(
            "examples::attention", dict.fromkeys("qkv", torch.float16), {"head_dim": 96}, cache_dir=tmp_path
        )
    assert str(err.value) == ATTENTION + "  head_dim: expected one of 32, 64, 128, got 96"
    assert not entries(tmp_path)  # nothing was compiled


def test_missing_kernel_source_warns_at_load(tmp_path):
    src = tmp_path / "nofile.cpp"
    src.write_text(OP_FILE.replace("{name}", "nofile"))
    path = opforge.build_library("nofile_lib", [src], build_dir=tmp_path / "build")  # scale.cu not given
    with pytest.warns(UserWarning) as warned:
        lib = opforge.load_library(path)
    assert [str(w.message) for w in warned] == [
        f"opforge.load_library: rtc_test::nofile's run-time kernel source scale.cu is not in {lib.kernel_dir} (name "
        "it in build_library(kernels=...) or opforge_add_library(... KERNELS ...)); its CUDA calls will fail"
    ]
    x = torch.randn(5)
    torch.testing.assert_close(torch.ops.rtc_test.nofile(x, 3), x * 3)  # the CPU reference still works
    # A deployment fault, not the caller's: RuntimeError (OpforgeError), the op named once.
    with pytest.raises(opforge.OpforgeError) as err:
        opforge.precompile("rtc_test::nofile", {"x": torch.float32}, {"k": 2}, cache_dir=tmp_path / "c")
    assert str(err.value) == (
        f"rtc_test::nofile: the run-time kernel source {lib.kernel_dir}/scale.cu cannot be read (it ships beside the "
        f"op library, in {lib.kernel_dir})"
    )


def test_precompile_fills_compile_time_defaults_and_refuses_missing_ones(tmp_path):
    build_scale_op(tmp_path, "defaults", KERNEL.replace("MULTIPLIER", "1"))
    cache = tmp_path / "c"
    assert opforge.precompile("rtc_test::defaults", {"x": torch.float32}, arch="sm_90", cache_dir=cache) is False
    assert opforge.precompile("rtc_test::defaults", {"x": torch.float32}, {"k": 2}, arch="sm_90", cache_dir=cache)
    opforge.load_library(opforge.example_library("attention"))
    with pytest.raises(ValueError) as err:
        opforge.precompile("examples::attention", dict.fromkeys("qkv", torch.float16), cache_dir=cache)
    assert (
        str(err.value)
        == ATTENTION + "  head_dim: expected a value for this compile-time parameter, which has no default"
    )


def test_precompile_stores_a_binary_found_in_another_cache(tmp_path, monkeypatch):
    """A package must carry its binaries even when the user cache already had them (as it does
    on a machine that ran the op): precompile copies a binary it finds into cache_dir."""
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(tmp_path / "user"))
    build_scale_op(tmp_path, "copied", KERNEL.replace("MULTIPLIER", "4"))
    assert opforge.precompile("rtc_test::copied", {"x": torch.float32}, {"k": 2}, arch="sm_90") is False
    user_bins = list((tmp_path / "user" / "kernels").glob("*.bin"))
    assert len(user_bins) == 1
    package_cache = tmp_path / "package" / "cache"
    assert (
        opforge.precompile("rtc_test::copied", {"x": torch.float32}, {"k": 2}, arch="sm_90", cache_dir=package_cache)
        is True
    )  # found, not compiled
    package_bins = list(package_cache.glob("*.bin"))
    assert [p.name for p in package_bins] == [user_bins[0].name]
    assert package_bins[0].read_bytes() == user_bins[0].read_bytes()


def test_precompile_infers_the_dtypes_the_description_fixes(tmp_path):
    # weight is same_dtype("x"); positions takes only int64, cos_sin_cache follows query, key is optional
    assert opforge.precompile("examples::rms_norm", {"x": torch.float16}, cache_dir=tmp_path) is False
    assert opforge.precompile("examples::rms_norm", {"x": torch.float16, "weight": torch.float16}, cache_dir=tmp_path)
    opforge.load_library(opforge.example_library("rotary_embedding"))
    assert opforge.precompile("examples::rotary_embedding", {"query": torch.bfloat16}, cache_dir=tmp_path) is False
    assert opforge.precompile(
        "examples::rotary_embedding",
        {"positions": torch.int64, "query": torch.bfloat16, "cos_sin_cache": torch.bfloat16},
        cache_dir=tmp_path,
    )


TMA_OP = """
#include <opforge/op.h>
static void ref(opforge::Tensor x, opforge::MutableTensor y) {
  for (int64_t b = 0; b < x.size(0); ++b)
    for (int64_t r = 0; r < 64; ++r)
      for (int64_t c = 0; c < 32; ++c)
        y.data<float>()[(b * 64 + r) * 32 + c] = x.data<float>()[b * x.stride(0) + r * x.stride(1) + c];
}
static opforge::LaunchConfig grid(opforge::Tensor x, opforge::MutableTensor) {
  opforge::LaunchConfig c;
  c.grid[0] = static_cast<unsigned>(x.size(0));
  c.block[0] = 128;
  c.args = {x.size(0)};
  c.tensor_maps = {opforge::tensor_map(x, {32, 64, 1})};
  return c;
}
OPFORGE_OP(rtc_test, tma_copy)
    .input("x", opforge::kFloat32, opforge::shape({opforge::any, 64, 32}), opforge::contiguous_last_dim)
    .output("y", opforge::like("x"))
    .reference(ref)
    .cuda_source("tma_copy.cu", "tma_copy")
    .launch_grid(grid);
"""

TMA_KERNEL = """#include <opforge/kernel.cuh>
#include <opforge/tma.cuh>
// One block per batch: its [64, 32] box lands in shared memory by one bulk tensor copy.
__global__ void tma_copy(const float* x, float* y, int64_t batches,
                         const __grid_constant__ opforge::kernel::TensorMap x_map) {
#if __CUDA_ARCH__ >= 900  // bulk tensor copies; opforge verify also compiles for sm_80
  __shared__ alignas(128) float tile[64 * 32];
  __shared__ alignas(8) uint64_t full;
  if (threadIdx.x == 0) {
    opforge::tma::mbarrier_init(&full, 1);
    opforge::tma::fence_mbarrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    opforge::tma::mbarrier_arrive_expect_tx(&full, sizeof(tile));
    opforge::tma::copy_3d(tile, x_map, 0, 0, blockIdx.x, &full, opforge::tma::evict_first());
  }
  opforge::tma::mbarrier_wait(&full, 0);
  for (int i = threadIdx.x; i < 64 * 32; i += blockDim.x) y[blockIdx.x * 64 * 32 + i] = tile[i];
#endif
}
"""


def build_tma_copy(tmp: Path, name: str, kernel: str):
    return build_op_library(tmp, name, TMA_OP.replace("tma_copy)", f"{name})"), {"tma_copy.cu": kernel})


@pytest.fixture(scope="module")
def tma_copy(tmp_path_factory):
    return build_tma_copy(tmp_path_factory.mktemp("tma"), "tma_copy", TMA_KERNEL)


def test_a_kernel_taking_tensor_maps_compiles_with_the_shipped_tma_header(tma_copy, tmp_path):
    assert (tma_copy.kernel_dir / "opforge" / "tma.cuh").is_file()
    # NVRTC with the kernel folder's headers; the signature check lets the grid function's int64
    # args and then its tensor maps stand between the pointers and the parameters.
    for arch in ("sm_90", "sm_80"):
        assert opforge.precompile("rtc_test::tma_copy", {"x": torch.float32}, arch=arch, cache_dir=tmp_path) is False


def test_bulk_tensor_copies_outside_an_sm90_guard_are_refused_for_older_gpus(tmp_path):
    unguarded = TMA_KERNEL.replace("#if __CUDA_ARCH__ >= 900", "").replace("#endif\n}", "}")
    build_tma_copy(tmp_path, "tma_unguarded", unguarded)
    dtypes = {"x": torch.float32}
    assert opforge.precompile("rtc_test::tma_unguarded", dtypes, arch="sm_90", cache_dir=tmp_path) is False
    with pytest.raises(opforge.OpforgeError, match="bulk tensor copies need sm_90; put this code under #if"):
        opforge.precompile("rtc_test::tma_unguarded", dtypes, arch="sm_80", cache_dir=tmp_path)


@requires_cuda
def test_tensor_maps_copy_a_strided_view_in_place(tma_copy):
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("bulk tensor copies need a compute capability 9.0 GPU")
    base = torch.randn(3, 64, 48, device="cuda")
    x = base[:, :, 8:40]  # rows 192 bytes apart, a view the kernel reads in place
    torch.testing.assert_close(torch.ops.rtc_test.tma_copy(x), x.contiguous(), rtol=0, atol=0)


HEAVY_OP_FILE = """
#include <opforge/op.h>
#include <cstring>
static void ref(opforge::Tensor x, opforge::MutableTensor y) {
  std::memcpy(y.raw_data(), x.raw_data(), x.numel() * sizeof(float));
}
OPFORGE_OP(rtc_test, heavy_auto)
    .input("x", opforge::kFloat32)
    .output("y", opforge::like("x"))
    .reference(ref)
    .cuda_source("heavy.cu", "heavy_rows<{T}>")
    .launch(opforge::rows("x"));
OPFORGE_OP(rtc_test, heavy_1024)
    .input("x", opforge::kFloat32)
    .output("y", opforge::like("x"))
    .reference(ref)
    .cuda_source("heavy.cu", "heavy_rows<{T}>")
    .launch(opforge::rows("x", 1024));
"""

# y = x, one block per row, any block size: each thread holds 64 of the row's elements in
# registers (168 registers a thread on sm_90, too many for 1024 threads on an SM).
HEAVY_KERNEL = """#include <opforge/kernel.cuh>
template <class T>
__global__ void heavy_rows(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int64_t cols) {
  constexpr int kHeld = 64;
  const T* in = x + static_cast<int64_t>(blockIdx.x) * cols;
  T* out = y + static_cast<int64_t>(blockIdx.x) * cols;
  for (int64_t base = 0; base < cols; base += int64_t(blockDim.x) * kHeld) {
    T held[kHeld];
#pragma unroll
    for (int k = 0; k < kHeld; ++k) {
      const int64_t c = base + int64_t(k) * blockDim.x + threadIdx.x;
      held[k] = c < cols ? in[c] : T(0);
    }
#pragma unroll
    for (int k = 0; k < kHeld; ++k) {
      const int64_t c = base + int64_t(k) * blockDim.x + threadIdx.x;
      if (c < cols) out[c] = held[k];
    }
  }
}
"""


@requires_cuda
def test_rows_picks_no_more_threads_than_the_kernel_s_registers_allow(tmp_path):
    """opforge::rows() with its threads left to opforge launches at most the kernel's most threads
    a block (here fewer than the 1024 a 40000-wide row asks for); with 1024 threads fixed by the
    declaration, the refusal says how many the kernel takes and how to fit more."""
    build_op_library(tmp_path, "heavy", HEAVY_OP_FILE, {"heavy.cu": HEAVY_KERNEL})
    x = torch.randn(3, 40000, device="cuda")
    torch.testing.assert_close(torch.ops.rtc_test.heavy_auto(x), x, rtol=0, atol=0)
    with pytest.raises(RuntimeError) as err:
        torch.ops.rtc_test.heavy_1024(x)
    message = str(err.value)
    assert "cuLaunchKernelEx(heavy_rows<float>) failed" in message, message
    assert re.search(
        r"a block of 1024 threads, and the kernel takes at most \d+ \(\d+ registers a thread\); declare it "
        r"`__global__ void __launch_bounds__\(1024\)` so that the compiler fits that many, or launch fewer threads",
        message,
    ), message


GATHER_OP_FILE = """
#include <opforge/op.h>
static void ref(opforge::Tensor table, opforge::Tensor rows, opforge::MutableTensor y) {
  for (int64_t i = 0; i < rows.numel(); ++i) y.data<float>()[i] = table.data<float>()[rows.data<int64_t>()[i]];
}
static opforge::LaunchConfig grid(opforge::Tensor, opforge::Tensor rows, opforge::MutableTensor) {
  opforge::LaunchConfig cfg;
  cfg.grid[0] = static_cast<unsigned>((rows.numel() + 255) / 256);
  cfg.block[0] = 256;
  cfg.args = {rows.numel()};
  return cfg;
}
OPFORGE_OP(rtc_test, {name})
    .input("table", opforge::kFloat32, opforge::rank(1))
    .input("rows", opforge::kInt64, opforge::rank(1), opforge::values_in(0, opforge::dim("table", 0)))
    .output("y", opforge::shape({opforge::dim("rows", 0)}), opforge::kFloat32)
    .reference(ref)
    .cuda_source("gather.cu", "gather")
    .launch_grid(grid)
    .checks_values_in_kernel();
"""

# y[i] = table[rows[i]], each row index checked before the load.
GATHER_KERNEL = """#include <opforge/kernel.cuh>
__global__ void gather(const float* table, const int64_t* rows, float* y, int64_t n,
                       const __grid_constant__ opforge::kernel::ValueDomain domain) {
  const int64_t i = opforge::kernel::global_index();
  if (i >= n) return;
  opforge::kernel::check_value(domain, rows[i], i);
  y[i] = table[rows[i]];
}
"""


def test_a_kernel_that_checks_its_own_values_takes_their_domains(tmp_path):
    """Without a GPU (NVRTC and the signature check): a kernel declared .checks_values_in_kernel()
    compiles with opforge::kernel::ValueDomain after its launch values; one that leaves the domain
    out is refused naming the parameter it lacks."""
    unchecked = GATHER_KERNEL.replace(
        ",\n                       const __grid_constant__ opforge::kernel::ValueDomain domain", ""
    ).replace("opforge::kernel::check_value(domain, rows[i], i);", "")
    assert "ValueDomain" not in unchecked and "check_value" not in unchecked
    for name, kernel in (("gather_checked", GATHER_KERNEL), ("gather_unchecked", unchecked)):
        build_op_library(tmp_path / name, name, GATHER_OP_FILE.replace("{name}", name), {"gather.cu": kernel})
    dtypes = {"table": torch.float32, "rows": torch.int64}
    shapes = {"table": [10], "rows": [4]}
    assert (
        opforge.precompile("rtc_test::gather_checked", dtypes, arch="sm_90", cache_dir=tmp_path / "c", shapes=shapes)
        is False
    )
    with pytest.raises(opforge.OpforgeError) as err:
        opforge.precompile("rtc_test::gather_unchecked", dtypes, arch="sm_90", cache_dir=tmp_path / "c", shapes=shapes)
    assert "(value domain of rows): expected opforge::kernel::ValueDomain, found long long" in str(err.value), err.value
