"""The demo model: the reference is the real sentence-transformers model, and swapping in
bias_gelu keeps its embeddings."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "models"))
import minilm  # noqa: E402


@pytest.fixture(scope="module")
def model():
    bert, tokenizer = minilm.load()
    return minilm.SentenceEmbedder(bert).eval(), tokenizer


def test_reference_matches_sentence_transformers(model):
    st = pytest.importorskip("sentence_transformers")
    reference, tokenizer = model
    # .float(): a float16 copy of the weights (tools/make_device_weights.py) loads as float16.
    expected = st.SentenceTransformer(str(minilm.model_dir()), device="cpu").float().encode(
        minilm.SENTENCES, convert_to_tensor=True)
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
