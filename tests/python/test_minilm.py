"""The demo model: the reference is the real sentence-transformers model, swapping in
bias_gelu keeps its embeddings, the mixed model (attention, add_layer_norm and bias_gelu in
every layer) matches it through the C++ runner, and so does the model whose linear layers hold
int8 weights (examples::Int8Linear objects carried by the package); the runner tests take the
model's first two encoder layers (RUNNER_LAYERS)."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "models"))
import minilm  # noqa: E402

import opforge  # noqa: E402
from conftest import DEVICES  # noqa: E402
from opforge import verify  # noqa: E402


@pytest.fixture(scope="module")
def model():
    bert, tokenizer = minilm.load()
    return minilm.SentenceEmbedder(bert).eval(), tokenizer


#: Encoder layers the runner tests keep: every layer is the same graph with other weights, so two
#: show that layers chain through the runner at a third of the compile time (`make demo` and the
#: benchmarks run all six).
RUNNER_LAYERS = 2


@pytest.fixture(scope="module")
def short_model(model):
    """``model`` with its first RUNNER_LAYERS encoder layers (a copy; the weights are the real ones)."""
    reference, tokenizer = model
    short = copy.deepcopy(reference)
    short.bert.encoder.layer = short.bert.encoder.layer[:RUNNER_LAYERS]
    short.bert.config.num_hidden_layers = RUNNER_LAYERS
    return short, tokenizer


def test_reference_matches_sentence_transformers(model):
    st = pytest.importorskip("sentence_transformers")
    reference, tokenizer = model
    # .float(): a float16 copy of the weights (tools/make_device_weights.py) loads as float16.
    expected = (
        st.SentenceTransformer(str(minilm.model_dir()), device="cpu")
        .float()
        .encode(minilm.SENTENCES, convert_to_tensor=True)
    )
    batch = tokenizer(minilm.SENTENCES, padding=True, return_tensors="pt")
    with torch.inference_mode():
        got = reference(batch["input_ids"], batch["attention_mask"])
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)


def test_bias_gelu_swap_keeps_embeddings(model):
    reference, tokenizer = model
    custom = minilm.with_bias_gelu(reference)
    assert all(isinstance(layer.intermediate, minilm.BiasGeluIntermediate) for layer in custom.bert.encoder.layer)
    batch = tokenizer(minilm.SENTENCES, padding=True, return_tensors="pt")
    with torch.inference_mode():
        a = reference(batch["input_ids"], batch["attention_mask"])
        b = custom(batch["input_ids"], batch["attention_mask"])
    assert torch.nn.functional.cosine_similarity(a, b).min() > 0.99999


def in_the_runner(candidate, reference, tokenizer, device, tmp_path, **tolerances) -> list[verify.ModelReport]:
    """``candidate`` exported with dynamic batch and sequence, AOTInductor-compiled and run by the
    C++ runner on two batches of sentences, against ``reference`` in eager on the CPU."""
    batches = [tokenizer(s, padding=True, return_tensors="pt") for s in (minilm.SENTENCES, minilm.SENTENCES[5:7])]
    inputs = [[b["input_ids"], b["attention_mask"]] for b in batches]
    auto = {0: torch.export.Dim.AUTO, 1: torch.export.Dim.AUTO}
    reports = verify.verify_model(
        candidate,
        inputs[0],
        device=device,
        dynamic_shapes={"input_ids": auto, "attention_mask": auto},
        check_inputs=inputs,
        reference=reference,
        package_dir=tmp_path,
        iters=1,
        **tolerances,
    )
    assert [r.outputs[0].shape for r in reports] == [[8, 384], [2, 384]]
    return reports


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
def test_mixed_model_with_three_opforge_ops_in_the_cpp_runner(short_model, device, tmp_path):
    """attention, add_layer_norm and bias_gelu in every layer, float16, exported with dynamic
    batch and sequence, AOTInductor-compiled, run by the C++ runner, against the float32 model in
    eager on the CPU."""
    for op in ("attention", "add_layer_norm", "bias_gelu"):
        opforge.load_library(opforge.example_library(op))
    reference, tokenizer = short_model
    mixed = minilm.with_opforge_ops(reference, torch.float16)
    assert len(mixed.bert.layers) == RUNNER_LAYERS and all(
        isinstance(layer, minilm.OpforgeBertLayer) for layer in mixed.bert.layers
    )
    reports = in_the_runner(mixed, reference, tokenizer, device, tmp_path, atol=1e-3)
    assert all(r.ok and r.outputs[0].cosine > 0.99999 for r in reports), [r.outputs for r in reports]
    program_ops = (tmp_path / "opforge_ops.txt").read_text()
    assert all(f"examples::{op}" in program_ops for op in ("attention", "add_layer_norm", "bias_gelu"))


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
def test_int8_linears_in_the_cpp_runner(short_model, device, tmp_path):
    """Every encoder linear layer an Int8Linear object (float16 activations on CUDA, float32 on the
    CPU), exported with dynamic batch and sequence, AOTInductor-compiled, run by the C++ runner:
    embeddings within cosine 0.999 of the float32 model in eager on the CPU."""
    reference, tokenizer = short_model
    dtype = torch.float16 if device == "cuda" else torch.float32
    quantised = minilm.with_int8_linears(reference, device, dtype)
    assert sum(isinstance(m, minilm.Int8Linear) for m in quantised.modules()) == 6 * RUNNER_LAYERS
    assert not any(isinstance(m, torch.nn.Linear) for m in quantised.bert.encoder.modules())
    reports = in_the_runner(quantised, reference, tokenizer, device, tmp_path, atol=1e-2, min_cosine=0.999)
    assert all(r.ok and r.outputs[0].cosine >= 0.999 for r in reports), [r.outputs for r in reports]
    assert "class examples::Int8Linear libint8_linear.so" in (tmp_path / "opforge_ops.txt").read_text()


def test_with_opforge_ops_refuses_float32(model):
    with pytest.raises(
        ValueError, match="examples::attention's CUDA kernel takes float16 or bfloat16; got torch.float32"
    ):
        minilm.with_opforge_ops(model[0], torch.float32)
