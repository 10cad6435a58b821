"""opforge ops in ONNX and ONNX Runtime (python/opforge/onnx, src/ort, examples/onnx_runner):
export through torch.onnx, onnx.checker and ONNX's shape inference with symbolic dims, every
example op run by ONNX Runtime on the CPU against torch's call of its CPU reference, the error
messages of calls through ONNX Runtime, the MiniLM model, and the C++ runner; on a GPU with
onnxruntime's CUDA execution provider, every example op's CUDA kernel through ONNX Runtime against
torch's call of it, and MiniLM in float16."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

onnx = pytest.importorskip("onnx", reason="onnx is not installed (requirements.txt pins it)")
ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (requirements.txt pins it)")
pytest.importorskip("onnxscript", reason="onnxscript is not installed (requirements.txt pins it)")

import opforge  # noqa: E402
import opforge.onnx  # noqa: E402
from opforge import _core  # noqa: E402
from opforge.onnx import _schemas  # noqa: E402
from opforge.verify.cases import dtype_cases, generate_cases  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
#: The example op libraries the ONNX Runtime tests load (every folder under examples/ops).
EXAMPLES = sorted(p.name for p in (ROOT / "examples" / "ops").iterdir() if p.is_dir())
#: Element types numpy (and so onnxruntime's Python API) holds.
NUMPY_DTYPES = {"float32", "float64", "float16", "int8", "int16", "int32", "int64", "uint8", "bool"}


requires_ort_cuda = pytest.mark.skipif(
    not (torch.cuda.is_available() and "CUDAExecutionProvider" in ort.get_available_providers()),
    reason="needs a GPU and an onnxruntime with its CUDA execution provider",
)


def library(name: str) -> opforge.Library:
    return opforge.load_library(opforge.example_library(name))


def session(model: onnx.ModelProto, libs, providers=("CPUExecutionProvider",)):
    return ort.InferenceSession(
        model.SerializeToString(), opforge.onnx.session_options(libs), providers=list(providers)
    )


class Softshrink(torch.nn.Module):
    def forward(self, x):
        return torch.ops.examples.softshrink(x, 0.25) * 2


def export(model, args, **kwargs) -> onnx.ModelProto:
    program = opforge.onnx.export(model, args, **kwargs)
    return program.model_proto


def test_a_model_needs_the_libraries_of_the_ops_its_nodes_call_and_no_other():
    """verify_model's onnxruntime session registers these, not every library loaded (one whose
    file is gone since would fail the session)."""
    from opforge.onnx._runtime import libraries_serving

    softshrink, bias_gelu = library("softshrink"), library("bias_gelu")
    model = export(Softshrink(), (torch.randn(4, 8),))
    assert libraries_serving(model, [bias_gelu, softshrink]) == [softshrink]
    assert libraries_serving(model, [bias_gelu]) == []


def test_export_writes_a_node_of_the_namespace_domain_with_typed_attributes():
    library("softshrink")
    x = torch.randn(4, 8)
    model = export(Softshrink(), (x,), dynamic_shapes={"x": {0: torch.export.Dim("batch")}})
    nodes = [n for n in model.graph.node if n.domain == "examples"]
    assert [(n.op_type, [a.name for a in n.attribute]) for n in nodes] == [("softshrink", ["lambd"])]
    assert nodes[0].attribute[0].type == onnx.AttributeProto.FLOAT and nodes[0].attribute[0].f == 0.25
    assert {(o.domain, o.version) for o in model.opset_import} >= {("examples", 1)}
    onnx.checker.check_model(model, full_check=True)
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    out = {v.name: v for v in inferred.graph.value_info}[nodes[0].output[0]]
    dims = out.type.tensor_type.shape.dim
    assert out.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert dims[0].dim_param != "" and dims[1].dim_value == 8  # the batch dim stays symbolic


def test_export_runs_in_onnxruntime_like_eager():
    lib = library("softshrink")
    x = torch.randn(4, 8)
    model = export(Softshrink(), (x,), dynamic_shapes={"x": {0: torch.export.Dim("batch")}})
    sess = session(model, [lib])
    for rows in (4, 7):
        x = torch.randn(rows, 8)
        (got,) = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})
        torch.testing.assert_close(torch.from_numpy(got), Softshrink()(x))


def _single_node_model(op, args, results) -> onnx.ModelProto:
    """A model of one node of ``op`` (Note [The ONNX node of an op]) over ``args`` (schema order),
    its outputs typed as ``results`` (torch's: the outputs, then the written inputs)."""
    domain, name = _schemas.domain_and_name(op)
    inputs, names, attrs = [], [], {}
    for a, v in zip(op.args, args, strict=True):
        if a.kind == "param":
            if v is not None:
                attrs[a.name] = int(v) if isinstance(v, bool) else v
        elif v is None:
            names.append("")
        else:
            names.append(a.name)
            elem = _schemas.ONNX_TYPES[str(v.dtype).removeprefix("torch.")]
            inputs.append(onnx.helper.make_tensor_value_info(a.name, elem, [f"{a.name}_{d}" for d in range(v.dim())]))
    out_names = [o.name for o in op.outputs] + [_schemas.written_output_name(t) for t in op.mutated]
    outputs = [
        onnx.helper.make_tensor_value_info(n, _schemas.ONNX_TYPES[str(r.dtype).removeprefix("torch.")], None)
        for n, r in zip(out_names, results, strict=True)
        if r is not None
    ]
    node_outputs = [n if r is not None else "" for n, r in zip(out_names, results, strict=True)]
    while names and not names[-1]:  # no empty input after the last given one (Note [The ONNX node of an op])
        names.pop()
    node = onnx.helper.make_node(name, names, node_outputs, domain=domain, **attrs)
    graph = onnx.helper.make_graph([node], f"{domain}_{name}", inputs, outputs)
    return onnx.helper.make_model(
        graph, ir_version=10, opset_imports=[onnx.helper.make_opsetid("", 18), onnx.helper.make_opsetid(domain, 1)]
    )


def _torch_results(op, args) -> list:
    """torch's call of ``op`` (its CPU reference): the outputs, then the written inputs after it."""
    ns, name = _schemas.domain_and_name(op)
    written = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    out = getattr(getattr(torch.ops, ns), name)(*written)
    outs = [] if out is None else [out] if isinstance(out, torch.Tensor) or out is None else list(out)
    outs = outs[: len(op.outputs)] if op.outputs else []
    return outs + [written[t.index] for t in op.mutated]


def _numpy_case(op, device: str = "cpu"):
    """A dtype combination of ``op`` that numpy holds and its kernel on ``device`` takes (float32
    first), or None."""
    cases = [c for c in dtype_cases(op, device=device) if set(c.dtypes.values()) <= NUMPY_DTYPES]
    cases.sort(key=lambda c: "float32" not in c.dtypes.values())
    return cases[0] if cases else None


#: Example folders whose every op takes a dtype numpy does not hold (float8 results).
NOT_IN_NUMPY = {"fp8_quant"}


@pytest.mark.parametrize(
    "folder",
    [
        pytest.param(f, marks=pytest.mark.skip(reason="its ops write float8 tensors, which numpy does not hold"))
        if f in NOT_IN_NUMPY
        else f
        for f in EXAMPLES
    ],
)
def test_every_example_op_runs_in_onnxruntime_on_the_cpu_like_its_reference(folder):
    lib = library(folder)
    checked = 0
    for op in lib.ops:
        case = _numpy_case(op)
        if case is None:
            continue
        for inputs in generate_cases(
            op, case.dtypes, seed=0, only=lambda label: label.startswith("shape 3x"), pinned=case.params
        ):
            args = [a.contiguous() if isinstance(a, torch.Tensor) else a for a in inputs.args]
            want = _torch_results(op, args)
            sess = session(_single_node_model(op, args, want), [lib])
            feed = {a.name: v.numpy() for a, v in zip(op.args, args, strict=True) if isinstance(v, torch.Tensor)}
            got = sess.run(None, feed)
            present = [w for w in want if w is not None]
            assert len(got) == len(present), (op.name, inputs.label)
            for g, w in zip(got, present, strict=True):
                torch.testing.assert_close(
                    torch.from_numpy(np.asarray(g)), w, equal_nan=True, msg=f"{op.name} {inputs.label}"
                )
            checked += 1
    assert checked > 0, f"no op of {folder} has a dtype combination numpy holds"


@requires_ort_cuda
@pytest.mark.parametrize("folder", EXAMPLES)
def test_every_example_op_runs_in_onnxruntime_on_cuda_like_torchs_call(folder):
    """The CUDA kernel through ONNX Runtime's CUDA execution provider (ORT's stream and
    allocator) against the same kernel through torch: the same results, to the rounding of
    atomics where a kernel sums with them."""
    lib = library(folder)
    checked = 0
    for op in lib.ops:
        case = _numpy_case(op, "cuda") if "cuda" in op.devices else None
        if case is None:
            continue
        for inputs in generate_cases(
            op, case.dtypes, seed=0, only=lambda label: label.startswith("shape 3x"), pinned=case.params
        ):
            args = [a.contiguous() if isinstance(a, torch.Tensor) else a for a in inputs.args]
            want = _torch_results(op, [a.cuda() if isinstance(a, torch.Tensor) else a for a in args])
            sess = session(_single_node_model(op, args, want), [lib], ("CUDAExecutionProvider", "CPUExecutionProvider"))
            feed = {a.name: v.numpy() for a, v in zip(op.args, args, strict=True) if isinstance(v, torch.Tensor)}
            got = sess.run(None, feed)
            present = [w.cpu() for w in want if w is not None]
            assert len(got) == len(present), (op.name, inputs.label)
            for g, w in zip(got, present, strict=True):
                torch.testing.assert_close(
                    torch.from_numpy(np.asarray(g)),
                    w,
                    equal_nan=True,
                    atol=1e-3,
                    rtol=1e-3,
                    msg=f"{op.name} {inputs.label}",
                )
            checked += 1
    if not any("cuda" in op.devices for op in lib.ops):
        pytest.skip(f"no op of {folder} has a CUDA kernel")
    assert checked > 0, f"no op of {folder} has a CUDA dtype combination numpy holds"


def test_a_bad_input_fails_the_run_with_the_ops_message():
    lib = library("bias_gelu")
    op = lib.ops[0]
    x, bias = torch.randn(2, 8), torch.randn(8)
    model = _single_node_model(op, [x, bias], [x])
    model.graph.input[1].type.tensor_type.shape.ClearField("dim")  # bias of any shape
    model.graph.input[1].type.tensor_type.shape.dim.add().dim_param = "n"
    sess = session(model, [lib])
    with pytest.raises(Exception) as err:
        sess.run(None, {"x": x.numpy(), "bias": np.zeros(4, np.float32)})
    assert (
        "examples::bias_gelu(Tensor x, Tensor bias) -> Tensor: invalid arguments\n"
        "  bias: expected shape [x.size(-1)] = [8], got [4]"
    ) in str(err.value)


def test_onnx_shape_inference_of_a_graph_that_contradicts_an_ops_rules_gives_its_message():
    lib = library("bias_gelu")
    opforge.onnx.register_schemas([lib])
    x, bias = torch.randn(2, 8), torch.randn(4)
    model = _single_node_model(lib.ops[0], [x, bias], [x])
    for value, dims in ((model.graph.input[0], ["b", 8]), (model.graph.input[1], [4])):
        value.type.CopyFrom(onnx.helper.make_tensor_type_proto(onnx.TensorProto.FLOAT, dims))
    with pytest.raises(ValueError) as err:
        onnx.shape_inference.infer_shapes(model, strict_mode=True)
    assert str(err.value) == (
        "examples::bias_gelu(Tensor x, Tensor bias) -> Tensor: invalid arguments\n"
        "  bias: expected shape [x.size(-1)] = [8], got [4]"
    )


def test_an_attribute_of_another_type_is_refused_by_name():
    lib = library("softshrink")
    op = next(o for o in lib.ops if o.name == "examples::softshrink")
    x = torch.randn(3, 5)
    model = _single_node_model(op, [x, None], [x])
    model.graph.node[0].attribute.append(onnx.helper.make_attribute("lambd", 1))
    with pytest.raises(Exception) as err:
        session(model, [lib])
    assert (
        "examples::softshrink(Tensor x, float lambd=0.5) -> Tensor: invalid arguments\n"
        "  lambd: expected an attribute of type FLOAT (float), got one of another type"
    ) in str(err.value)


def test_session_options_without_libraries_is_refused():
    with pytest.raises(ValueError, match="opforge.onnx: session_options needs at least one op library"):
        opforge.onnx.session_options([])


def test_shape_inference_keeps_derived_dims_symbolic():
    lib = library("silu_and_mul")
    opforge.onnx.register_schemas([lib])
    op = lib.ops[0]
    x = torch.randn(2, 8)
    model = _single_node_model(op, [x], [torch.empty(2, 4)])
    del model.graph.output[:]
    model.graph.output.append(onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None))
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    y = inferred.graph.output[0].type.tensor_type
    assert [d.dim_param or d.dim_value for d in y.shape.dim] == ["x_0", "x_1//2"]


def test_output_types_refuse_contradicting_types_with_the_calls_message():
    lib = library("bias_gelu")
    request = {
        "op": "examples::bias_gelu",
        "inputs": [{"type": 1, "shape": ["b", 8]}, {"type": 1, "shape": [4]}],
        "attributes": {},
    }
    from opforge.onnx import _runtime

    with pytest.raises(ValueError, match=r"bias: expected shape \[x.size\(-1\)\] = \[8\], got \[4\]"):
        _core.call(_runtime.adapter().opforge_ort_output_types, __import__("json").dumps(request), _runtime.adapter())
    assert lib.ops


class _Written(torch.nn.Module):
    def forward(self, x, residual, weight):
        x = x.clone()
        residual = residual.clone()
        torch.ops.examples.fused_add_rms_norm(x, residual, weight, 1e-6)
        return x * 1, residual * 1


@pytest.mark.xfail(
    strict=True,
    reason="torch 2.11's ONNX exporter takes the op argument of auto_functionalized_v2 for a graph node "
    "(its _convert_fx_arg_to_onnx_arg tests hasattr(arg, 'name')) and fails before any translation runs",
)
def test_an_op_that_writes_its_inputs_exports_their_new_values_as_outputs():
    lib = library("fused_add_rms_norm")
    x, residual, weight = torch.randn(3, 16), torch.randn(3, 16), torch.randn(16)
    model = export(_Written(), (x, residual, weight))
    (node,) = [n for n in model.graph.node if n.domain == "examples"]
    assert node.op_type == "fused_add_rms_norm" and len(node.output) == 2
    onnx.checker.check_model(model, full_check=True)
    sess = session(model, [lib])
    got = sess.run(None, {i.name: t.numpy() for i, t in zip(sess.get_inputs(), (x, residual, weight), strict=True)})
    for g, w in zip(got, _Written()(x, residual, weight), strict=True):
        torch.testing.assert_close(torch.from_numpy(g), w)


def _runner() -> Path:
    path = opforge.build_dir() / "bin" / "opforge-onnx-runner"
    if not path.exists():
        pytest.skip(f"{path} is not built (make build)")
    return path


def _libonnxruntime() -> Path:
    capi = Path(ort.__file__).parent / "capi"
    found = sorted(capi.glob("libonnxruntime.so*"))
    if not found:
        pytest.skip(f"the onnxruntime package has no libonnxruntime.so in {capi}")
    return found[0]


def test_the_cpp_runner_exits_2_on_bad_arguments():
    for args in ([], ["--help"]):
        done = subprocess.run([str(_runner()), *args], capture_output=True, text=True, timeout=60)
        if args:
            assert done.returncode == 0 and "--onnxruntime" in done.stdout
        else:
            assert done.returncode == 2, (done.returncode, done.stderr)
            assert "--onnxruntime is required" in done.stderr


def test_the_cpp_runner_runs_an_exported_model_without_python(tmp_path):
    lib = library("softshrink")
    x = torch.randn(5, 8)
    program = opforge.onnx.export(Softshrink(), (x,), dynamic_shapes={"x": {0: torch.export.Dim("batch")}})
    program.save(str(tmp_path / "model.onnx"))
    x = torch.randn(6, 8)
    np.save(tmp_path / "x.npy", x.numpy())
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH"}}
    done = subprocess.run(
        [
            str(_runner()),
            "--onnxruntime",
            str(_libonnxruntime()),
            "--adapter",
            str(opforge.onnx.adapter_path()),
            "--op-library",
            str(lib.path),
            "--model",
            str(tmp_path / "model.onnx"),
            "--input",
            str(tmp_path / "x.npy"),
            "--output-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    name, dtype, shape = done.stdout.split()[0], done.stdout.split()[1], done.stdout.split(" ", 2)[2].strip()
    assert (dtype, shape) == ("<f4", "[6, 8]")
    torch.testing.assert_close(torch.from_numpy(np.load(tmp_path / f"{name}.npy")), Softshrink()(x))


def test_the_cpp_runner_names_a_missing_input(tmp_path):
    lib = library("softshrink")
    program = opforge.onnx.export(Softshrink(), (torch.randn(2, 8),))
    program.save(str(tmp_path / "model.onnx"))
    done = subprocess.run(
        [str(_runner()), "--onnxruntime", str(_libonnxruntime()), "--adapter", str(opforge.onnx.adapter_path()),
         "--op-library", str(lib.path), "--model", str(tmp_path / "model.onnx")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.endswith("takes 1 inputs, got 0\n")


def test_an_op_with_data_dependent_sizes_is_refused_by_name(rule_ops):
    op = next(o for o in rule_ops.ops if o.name == "fixture::compact")
    x = torch.randn(5)
    model = _single_node_model(op, [x, 0.5], [torch.zeros((), dtype=torch.int64), x])
    with pytest.raises(Exception) as err:
        session(model, [rule_ops])
    assert (
        "opforge.ort: fixture::compact: the sizes of its outputs kept depend on the input values (opforge::size_of), "
        "and ONNX Runtime allocates outputs before the kernel runs"
    ) in str(err.value)


def _minilm():
    sys.path.insert(0, str(ROOT / "examples" / "models"))
    try:
        import minilm
    finally:
        sys.path.pop(0)
    try:
        bert, tokenizer = minilm.load()
    except Exception as e:  # noqa: BLE001 -- any way the weights are missing
        pytest.skip(f"the all-MiniLM-L6-v2 weights are not available: {e}")
    return minilm, bert, tokenizer


def test_minilm_with_opforge_ops_runs_in_onnxruntime_like_the_unmodified_model(tmp_path):
    import copy

    from opforge.verify import verify_model

    minilm, bert, tokenizer = _minilm()
    for op in ("attention", "add_layer_norm", "bias_gelu"):
        library(op)
    reference = minilm.SentenceEmbedder(bert).eval()
    model = copy.deepcopy(reference)
    model.bert = minilm.OpforgeBert(model.bert)  # float32: the ops' CPU references
    tokens = tokenizer(minilm.SENTENCES[:3], padding="max_length", max_length=16, return_tensors="pt")
    inputs = [tokens["input_ids"], tokens["attention_mask"]]
    (report,) = verify_model(
        model, inputs, device="cpu", reference=reference, runtime="onnxruntime", package_dir=tmp_path, iters=1
    )
    assert report.ok, report.outputs
    assert report.outputs[0].cosine > 0.9999 and report.package.endswith(".onnx")


@requires_ort_cuda
def test_minilm_in_float16_with_opforge_ops_runs_in_onnxruntime_on_cuda(tmp_path):
    import copy

    from opforge.verify import verify_model

    minilm, bert, tokenizer = _minilm()
    reference = minilm.SentenceEmbedder(bert).eval()
    model = minilm.with_opforge_ops(copy.deepcopy(reference), torch.float16)
    tokens = tokenizer(minilm.SENTENCES[:3], padding="max_length", max_length=16, return_tensors="pt")
    inputs = [tokens["input_ids"], tokens["attention_mask"]]
    (report,) = verify_model(
        model, inputs, device="cuda", reference=reference, runtime="onnxruntime", package_dir=tmp_path, iters=1
    )
    assert report.ok, report.outputs
    assert report.outputs[0].cosine > 0.999 and report.package.endswith(".onnx")


class ToFloat8(torch.nn.Module):
    def forward(self, x):
        return torch.ops.fixture.to_float8(x, False)[0].float()


class Dequantise(torch.nn.Module):
    def forward(self, x, scale):
        return torch.ops.fixture.dequantise(x, scale)


def test_an_op_with_an_output_onnx_has_no_type_for_is_refused_by_name_beside_its_librarys_other_ops(float8_ops):
    """fixture::to_float8 has a float8_e8m0fnu output, which ONNX has no element type for: it gets no
    schema and its export fails naming it; fixture::dequantise of the same library exports."""
    with pytest.raises(Exception) as error:
        export(ToFloat8(), (torch.randn(8),))
    assert (
        "opforge.onnx: fixture::to_float8 cannot be exported to ONNX: ONNX has no element type for its output "
        "e8m0fnu (float8_e8m0fnu)"
    ) in str(error.value)
    model = export(Dequantise(), (torch.randn(8).to(torch.float8_e4m3fn), torch.ones(1)))
    onnx.checker.check_model(model, full_check=True)
    assert [n.op_type for n in model.graph.node if n.domain == "fixture"] == ["dequantise"]
    assert onnx.defs.has("dequantise", "fixture") and not onnx.defs.has("to_float8", "fixture")


def test_verify_model_refuses_an_unknown_runtime_before_it_makes_a_folder(tmp_path, monkeypatch):
    import tempfile

    from opforge.verify import verify_model

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with pytest.raises(ValueError, match="opforge.verify: runtime must be 'aoti' or 'onnxruntime', got 'tvm'"):
        verify_model(Softshrink(), [torch.randn(2, 8)], device="cpu", runtime="tvm")
    assert list(tmp_path.iterdir()) == []


def test_docs_blocks_run_as_written():
    from readme_blocks import blocks

    found = blocks((ROOT / "docs" / "onnx.md").read_text())
    python = [b for b in found if b.lang == "python"]
    sh = [b for b in found if b.lang == "sh"]
    assert len(python) == 1 and len(sh) == 1
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "python"), *sys.path]))
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    ran = subprocess.run(
        [sys.executable, "-c", python[0].text], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert ran.returncode == 0, ran.stderr
    assert 'dim_param: "batch"' in ran.stdout
    ran = subprocess.run(["bash", "-ec", sh[0].text], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split()[1:] == ["<f4", "[6,", "8]"]
