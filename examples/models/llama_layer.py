"""A Llama-style decoder layer made of the serving ops that write their inputs in place.

    x, residual [tokens, hidden], positions [tokens], key_cache, value_cache [blocks, block_size,
    heads, head_dim], slot_mapping [tokens]
      -> examples::fused_add_rms_norm(x, residual)    residual += x; x = rms_norm(residual), in place
      -> qkv = x @ W_qkv                                 one fused projection
      -> examples::rotary_embedding(positions, q, k)     in place on q, k: head-split views of qkv
      -> examples::kv_cache_write(k, v, caches, slots)   the paged KV cache, in place
      -> examples::attention(q, k, v, causal)            over the tokens (prefill)
      -> o @ W_o, examples::fused_add_rms_norm(o, residual)
      -> examples::silu_and_mul(h @ W_gate_up) @ W_down  the gated MLP
      -> [tokens, hidden]; residual and the caches hold what the layer wrote

The same layer's decode step (:class:`LlamaDecodeStep`: one new token per sequence of a batch)
writes the new token's key and value with ``examples::kv_cache_write`` into the slot its block
table gives and attends with ``examples::paged_decode_attention`` over the sequence's cached
tokens and itself. With ``fp8=True`` its caches hold float8_e4m3fn, as vLLM's
``kv_cache_dtype="fp8"``: ``examples::reshape_and_cache_flash`` writes sat(x / scale) with the
layer's per-tensor key and value scales, and the decode op reads x * scale.

``python examples/models/llama_layer.py [--device cpu|cuda] [--out DIR]`` exports the layer with a
dynamic token count, AOTInductor-compiles it, runs the package in the C++ runner for 5, 2 and 17
tokens, and compares the output and every input it writes (residual, both caches, and x, which
holds the normed input) with the same layer in plain torch, float32, in eager on the CPU
(``model_check.main``). Then it exports the decode step with a dynamic batch and runs a
generation loop of DECODE_STEPS steps (:func:`check_decode`), each step one run of the package in
the C++ runner, against the plain torch step run alongside; then the same with the float8 cache.
Exits 1 on a mismatch.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F

import opforge
from opforge import aoti

sys.path.insert(0, str(Path(__file__).resolve().parent))
import model_check  # noqa: E402

HIDDEN, HEADS, HEAD_DIM, INTERMEDIATE, ROT_DIM = 256, 4, 64, 512, 32
BLOCKS, BLOCK_SIZE, MAX_POSITION = 8, 16, 256
DTYPE = torch.bfloat16


def cos_sin_cache(positions: int, rot_dim: int, base: float = 10000.0) -> torch.Tensor:
    """[positions, rot_dim]: cos then sin of position p times the inverse frequencies
    base^(-2i / rot_dim), i < rot_dim / 2 (RoFormer's angles, as Llama uses them)."""
    inv_freq = base ** (-torch.arange(0, rot_dim, 2, dtype=torch.float64) / rot_dim)
    angles = torch.arange(positions, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return torch.cat([angles.cos(), angles.sin()], dim=-1)


class LlamaLayer(torch.nn.Module):
    """One decoder layer over ``tokens`` of one sequence (prefill). Inputs: ``x``, ``residual``
    [tokens, hidden], ``positions`` int64 [tokens], ``key_cache``, ``value_cache`` [blocks,
    block_size, heads, head_dim], ``slot_mapping`` int64 [tokens] (distinct slots, -1 to skip).
    Returns the layer's output [tokens, hidden]; writes x (the normed input), residual (the
    residual stream after attention) and the caches. ``plain=True`` computes with plain torch
    in float32 (its inputs are converted and written back)."""

    def __init__(self, plain: bool = False):
        super().__init__()
        self.plain = plain
        dtype = torch.float32 if plain else DTYPE
        qkv, hd = 3 * HEADS * HEAD_DIM, HEADS * HEAD_DIM

        def weight(*shape, scale=1.0):
            return torch.nn.Parameter((torch.randn(*shape) * scale).to(dtype))

        self.input_norm = torch.nn.Parameter((1 + 0.1 * torch.randn(HIDDEN)).to(dtype))
        self.post_norm = torch.nn.Parameter((1 + 0.1 * torch.randn(HIDDEN)).to(dtype))
        self.w_qkv = weight(qkv, HIDDEN, scale=HIDDEN**-0.5)
        self.w_o = weight(HIDDEN, hd, scale=hd**-0.5)
        self.w_gate_up = weight(2 * INTERMEDIATE, HIDDEN, scale=HIDDEN**-0.5)
        self.w_down = weight(HIDDEN, INTERMEDIATE, scale=INTERMEDIATE**-0.5)
        self.register_buffer("cos_sin_cache", cos_sin_cache(MAX_POSITION, ROT_DIM).to(dtype))

    def forward(self, x, residual, positions, key_cache, value_cache, slot_mapping):
        if self.plain:  # the same layer in float32, written back into the caller's tensors
            work = [t.float() for t in (x, residual, key_cache, value_cache)]
            out = self.layer(model_check.TorchOps, work[0], work[1], positions, work[2], work[3], slot_mapping)
            for t, w in zip((x, residual, key_cache, value_cache), work):
                t.copy_(w)
            return out.to(x.dtype)
        return self.layer(torch.ops.examples, x, residual, positions, key_cache, value_cache, slot_mapping)

    def layer(self, ops, x, residual, positions, key_cache, value_cache, slot_mapping, attend=None, write=None):
        """The layer's body; ``attend(q, k, v) -> [tokens, heads, head_dim]`` (q, k, v [tokens,
        heads, head_dim], after the cache write) is its attention, by default causal over the
        tokens themselves (prefill); ``write(k, v, key_cache, value_cache, slot_mapping)`` its
        cache write, by default ``kv_cache_write``."""
        tokens, hd = x.shape[0], HEADS * HEAD_DIM
        ops.fused_add_rms_norm(x, residual, self.input_norm, 1e-6)
        qkv = F.linear(x, self.w_qkv)
        q = qkv[:, :hd].view(tokens, HEADS, HEAD_DIM)
        k = qkv[:, hd : 2 * hd].view(tokens, HEADS, HEAD_DIM)
        v = qkv[:, 2 * hd :].view(tokens, HEADS, HEAD_DIM)
        ops.rotary_embedding(positions, q, self.cos_sin_cache, k, True)
        (write or ops.kv_cache_write)(k, v, key_cache, value_cache, slot_mapping)
        o = (attend or (lambda *qkv: prefill_attention(ops, *qkv)))(q, k, v)
        h = F.linear(o.reshape(tokens, hd), self.w_o)
        ops.fused_add_rms_norm(h, residual, self.post_norm, 1e-6)
        return F.linear(ops.silu_and_mul(F.linear(h, self.w_gate_up)), self.w_down)


def prefill_attention(ops, q, k, v):
    """Causal attention of ``tokens`` of one sequence over themselves: q, k, v [tokens, heads,
    head_dim] -> [tokens, heads, head_dim] (``examples::attention`` on [1, heads, tokens,
    head_dim] views)."""
    heads = [t.unsqueeze(0).transpose(1, 2) for t in (q, k, v)]
    o, _ = ops.attention(*heads, HEAD_DIM, None, True, 0.0)
    return o[0].transpose(0, 1)


def quantise(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float8_e4m3fn) -> torch.Tensor:
    """``x`` as vLLM's cache write stores it under kv_cache_dtype "fp8": x / scale in float32,
    saturated to ``dtype``'s largest finite value (NaN kept), rounded to ``dtype``."""
    big = torch.finfo(dtype).max
    return (x.float() / scale).clamp(-big, big).to(dtype)


class PlainOps(model_check.TorchOps):
    """model_check.TorchOps, ``examples::paged_decode_attention`` and
    ``examples::reshape_and_cache_flash`` in plain torch."""

    @staticmethod
    def reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale):
        """vLLM's cache write into float8 caches: each token's rows quantised (:func:`quantise`) into
        its slot, in place; a negative slot is skipped."""
        keep = slot_mapping >= 0
        for x, cache, scale in ((key, key_cache, k_scale), (value, value_cache, v_scale)):
            rows = quantise(x[keep], scale, cache.dtype).view(torch.uint8)  # float8 as bytes: any indexing works
            cache.view(torch.uint8).view(-1, *x.shape[1:])[slot_mapping[keep]] = rows

    @staticmethod
    def paged_decode_attention(
        query,
        key_cache,
        value_cache,
        block_tables,
        seq_lens,
        scale=0.0,
        kv_cache_dtype="auto",
        k_scale=None,
        v_scale=None,
    ):
        """softmax(query . key * scale) value over each sequence's first seq_lens tokens (no GQA:
        as many kv heads as query heads), float8 caches read as x * scale. query [seqs, heads, d]
        -> [seqs, heads, d]."""
        if kv_cache_dtype != "auto":
            key_cache, value_cache = key_cache.float() * k_scale, value_cache.float() * v_scale
        block_size = key_cache.shape[1]
        t = torch.arange(block_tables.shape[1] * block_size, device=query.device)
        keys, values = (c[block_tables[:, t // block_size].long(), t % block_size] for c in (key_cache, value_cache))
        scores = torch.einsum("shd,sthd->sht", query, keys) * (scale or query.shape[-1] ** -0.5)
        scores = scores.masked_fill((t[None] >= seq_lens[:, None])[:, None], float("-inf"))
        return torch.einsum("sht,sthd->shd", scores.softmax(-1), values)


#: The per-tensor scales of the float8 caches (0-dim float32 buffers of the decode step, as vLLM's
#: attention layers hold them): the caches' random values and the layer's keys and values stay
#: within about 6 in magnitude, so x / scale stays under float8_e4m3fn's largest value, 448.
K_SCALE, V_SCALE = 0.02, 0.015


class LlamaDecodeStep(LlamaLayer):
    """The layer's decode step: one new token for each of ``seqs`` sequences. Inputs: ``x``,
    ``residual`` [seqs, hidden] (the new tokens), ``key_cache``, ``value_cache`` [blocks,
    block_size, heads, head_dim], ``block_tables`` int32 [seqs, pages] (each sequence's cache
    blocks), ``seq_lens`` int32 [seqs] (tokens cached before this step: the new token's position).
    Writes the new tokens' keys and values at their positions, attends over every cached token of
    the sequence (``examples::paged_decode_attention``), and returns ``(out [seqs, hidden],
    seq_lens + 1)``; writes x, residual and the caches as the layer does. ``plain=True``: plain
    torch in float32, as for the layer. ``fp8=True``: float8_e4m3fn caches with the scales
    K_SCALE and V_SCALE (buffers ``k_scale``, ``v_scale``), written by
    ``examples::reshape_and_cache_flash`` and read by the decode op with kv_cache_dtype "fp8"; the
    plain step quantises and reads them as vLLM does (:func:`quantise`, x * scale)."""

    def __init__(self, plain: bool = False, fp8: bool = False):
        super().__init__(plain)
        self.fp8 = fp8
        self.register_buffer("k_scale", torch.tensor(K_SCALE, dtype=torch.float32))
        self.register_buffer("v_scale", torch.tensor(V_SCALE, dtype=torch.float32))

    def forward(self, x, residual, key_cache, value_cache, block_tables, seq_lens):
        if self.plain:  # float8 caches are written as they are, others through float32 copies
            work = [t.float() for t in (x, residual)] + [c if self.fp8 else c.float() for c in (key_cache, value_cache)]
            out, lens = self.step(PlainOps, work[0], work[1], work[2], work[3], block_tables, seq_lens)
            for t, w in zip((x, residual, key_cache, value_cache), work):
                t.copy_(w)
            return out.to(x.dtype), lens
        return self.step(torch.ops.examples, x, residual, key_cache, value_cache, block_tables, seq_lens)

    def step(self, ops, x, residual, key_cache, value_cache, block_tables, seq_lens):
        positions = seq_lens.long()
        page = block_tables.gather(1, (positions // BLOCK_SIZE)[:, None])[:, 0]
        slots = page.long() * BLOCK_SIZE + positions % BLOCK_SIZE
        lens = seq_lens + 1

        if not self.fp8:

            def attend(q, k, v):
                return ops.paged_decode_attention(q, key_cache, value_cache, block_tables, lens, 0.0)

            return self.layer(ops, x, residual, positions, key_cache, value_cache, slots, attend), lens

        def attend_fp8(q, k, v):
            return ops.paged_decode_attention(
                q, key_cache, value_cache, block_tables, lens, 0.0, "fp8", self.k_scale, self.v_scale
            )

        def write_fp8(k, v, key_cache, value_cache, slots):
            ops.reshape_and_cache_flash(k, v, key_cache, value_cache, slots, "fp8", self.k_scale, self.v_scale)

        return self.layer(ops, x, residual, positions, key_cache, value_cache, slots, attend_fp8, write_fp8), lens


def make_model(plain: bool = False, seed: int = 0, kind: type[LlamaLayer] = LlamaLayer, **options) -> LlamaLayer:
    """The layer (or its decode step, ``kind``, with its ``options``) in eval mode, its weights
    drawn from ``seed`` (the same for either ``plain`` and either kind)."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return kind(plain=plain, **options).eval()


def example_inputs(tokens: int) -> list[torch.Tensor]:
    """``[x, residual, positions, key_cache, value_cache, slot_mapping]`` for ``tokens`` tokens
    at positions 7.. of a sequence, in distinct cache slots (the second token's is -1: padding),
    drawn from a seed made of ``tokens``."""
    gen = torch.Generator().manual_seed(2000 + tokens)
    x = torch.randn(tokens, HIDDEN, generator=gen).to(DTYPE)
    residual = torch.randn(tokens, HIDDEN, generator=gen).to(DTYPE)
    positions = torch.arange(7, 7 + tokens, dtype=torch.int64)
    caches = [torch.randn(BLOCKS, BLOCK_SIZE, HEADS, HEAD_DIM, generator=gen).to(DTYPE) for _ in range(2)]
    slots = torch.randperm(BLOCKS * BLOCK_SIZE, generator=gen)[:tokens]
    if tokens > 1:
        slots[1] = -1
    return [x, residual, positions, *caches, slots]


_tokens = torch.export.Dim("tokens", min=2, max=MAX_POSITION - 8)
SPEC = model_check.ModelSpec(
    "llama_layer",
    make_model,
    example_inputs,
    dynamic_shapes=({0: _tokens}, {0: _tokens}, {0: _tokens}, None, None, {0: _tokens}),
    batches=(5, 2, 17),
    atol=3e-2,
    min_cosine=0.999,
    ops=("fused_add_rms_norm", "rotary_embedding", "kv_cache_write", "attention", "silu_and_mul"),
)


#: The decode loop: sequences of these many cached tokens (a prefill's keys and values: random
#: here), each with DECODE_PAGES cache blocks, for DECODE_STEPS steps.
DECODE_CONTEXTS, DECODE_PAGES, DECODE_STEPS = (9, 20, 33), 4, 4
#: What each step's output and the caches after the loop must meet: torch.allclose with atol = rtol
#: = DECODE_TOLERANCE, and a cosine similarity of at least DECODE_MIN_COSINE.
DECODE_TOLERANCE, DECODE_MIN_COSINE = 3e-2, 0.999
#: The rtol of float8_e4m3fn caches, compared as the values they stand for (x * scale) with atol
#: DECODE_TOLERANCE: the step computes the keys and values in bfloat16 and plain torch in float32
#: (a difference within DECODE_TOLERANCE, as for the other tensors), so an element near a rounding
#: boundary of float8 lands on the neighbouring float8 value in one of them: one float8 step
#: apart, at most 2^-3 of the value (3 mantissa bits).
FP8_CACHE_RTOL = 2.0**-3


def decode_inputs(contexts: Sequence[int] = DECODE_CONTEXTS, fp8: bool = False) -> list[torch.Tensor]:
    """``[x, residual, key_cache, value_cache, block_tables, seq_lens]`` for the first decode step
    of ``len(contexts)`` sequences, bf16 and int32 CPU tensors from a fixed seed: each sequence
    owns DECODE_PAGES distinct cache blocks in random order (one spare block in the cache).
    ``fp8``: the caches' random values quantised by K_SCALE and V_SCALE to float8_e4m3fn."""
    gen = torch.Generator().manual_seed(3000 + len(contexts))
    seqs = len(contexts)
    x, residual = (torch.randn(seqs, HIDDEN, generator=gen).to(DTYPE) for _ in range(2))
    blocks = seqs * DECODE_PAGES + 1
    caches = [torch.randn(blocks, BLOCK_SIZE, HEADS, HEAD_DIM, generator=gen).to(DTYPE) for _ in range(2)]
    if fp8:
        caches = [quantise(c, torch.tensor(s)) for c, s in zip(caches, (K_SCALE, V_SCALE))]
    tables = torch.randperm(blocks, generator=gen)[: seqs * DECODE_PAGES].view(seqs, DECODE_PAGES).int()
    return [x, residual, *caches, tables, torch.tensor(contexts, dtype=torch.int32)]


def next_inputs(inputs: list[torch.Tensor], outputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The next step's inputs from a step's inputs (after it: residual and caches written) and
    outputs: the step's output as the new tokens' hidden state, seq_lens one longer."""
    x, residual, key_cache, value_cache, tables, _ = inputs
    return [outputs[0], residual, key_cache, value_cache, tables, outputs[1]]


def compare(got: torch.Tensor, want: torch.Tensor, rtol: float = DECODE_TOLERANCE) -> tuple[float, float, bool]:
    """(max abs error, cosine similarity, whether both meet torch.allclose with atol
    DECODE_TOLERANCE and ``rtol``, and DECODE_MIN_COSINE) of ``got`` against ``want``, in float64."""
    g, w = got.double().flatten(), want.double().flatten()
    cos = F.cosine_similarity(g, w, dim=0).item()
    ok = torch.allclose(g, w, atol=DECODE_TOLERANCE, rtol=rtol) and cos >= DECODE_MIN_COSINE
    return (g - w).abs().max().item(), cos, ok


def compare_cache(got: torch.Tensor, want: torch.Tensor, scale: float) -> tuple[float, float, bool]:
    """:func:`compare` of two caches; float8 ones as the values they stand for, x * ``scale``, with
    rtol FP8_CACHE_RTOL."""
    if got.dtype != torch.float8_e4m3fn:
        return compare(got, want)
    return compare(got.double() * scale, want.double() * scale, FP8_CACHE_RTOL)


#: The decode loops ``main()`` runs: (folder under --out, float8 caches).
DECODE_RUNS = (("decode", False), ("decode_fp8", True))


def decode_label(fp8: bool) -> str:
    """The name the decode loop's lines start with: ``llama_layer decode``, ``llama_layer decode
    (fp8 cache)``."""
    return "llama_layer decode" + (" (fp8 cache)" if fp8 else "")


def check_decode(
    device: str, out: Path, steps: int = DECODE_STEPS, log: Callable[[str], None] = print, fp8: bool = False
) -> dict:
    """Exports :class:`LlamaDecodeStep` (with float8 caches if ``fp8``) with a dynamic batch,
    AOTInductor-compiles it into ``out`` and runs a generation loop of ``steps`` steps: each step
    one run of the package in the C++ runner on ``device`` (``opforge.aoti.run``), its written
    caches and residual and its outputs the next step's inputs (:func:`next_inputs`); the plain
    torch step (float32, eager, CPU) runs the same loop on its own copies. Compares each step's
    output and seq_lens, and the caches after the last step (:func:`compare`); logs one line each.
    Returns ``{"passed", "fp8", "steps": [...], "caches": [...]}`` (max abs error and cosine of
    each), also written to ``out/results.json``."""
    model = make_model(kind=LlamaDecodeStep, fp8=fp8)
    plain = make_model(plain=True, kind=LlamaDecodeStep, fp8=fp8)
    batch = torch.export.Dim("seqs", min=2, max=64)
    example = decode_inputs(fp8=fp8)
    label = decode_label(fp8)
    with torch.no_grad():
        program = torch.export.export(
            model.to(device),
            tuple(t.to(device) for t in example),
            dynamic_shapes=({0: batch}, {0: batch}, None, None, {0: batch}, {0: batch}),
        )
    package = aoti.package(program, out)
    mine, theirs = decode_inputs(fp8=fp8), decode_inputs(fp8=fp8)
    passed, step_results = True, []
    for step in range(steps):
        run = aoti.run(package, mine, device=device, warmup=0, iters=1)
        with torch.inference_mode():
            want = plain(*theirs)
        err, cos, ok = compare(run.outputs[0], want[0])
        ok &= torch.equal(run.outputs[1], want[1])
        passed &= ok
        step_results.append(
            {"step": step, "max_abs_error": err, "cosine": cos, "seq_lens": run.outputs[1].tolist(), "passed": ok}
        )
        log(
            f"{label} on {run.device}, step {step}: output {list(run.outputs[0].shape)}: max abs error "
            f"{err:.2e}, cosine {cos:.7f}, seq_lens {run.outputs[1].tolist()}: {'pass' if ok else 'FAIL'}"
        )
        mine, theirs = next_inputs(run.inputs_after, run.outputs), next_inputs(theirs, want)
    cache_results = []
    for name, got, want, scale in zip(("key_cache", "value_cache"), mine[2:4], theirs[2:4], (K_SCALE, V_SCALE)):
        err, cos, ok = compare_cache(got, want, scale)
        passed &= ok
        cache_results.append({"name": name, "max_abs_error": err, "cosine": cos, "passed": ok})
        log(
            f"{label}, {name} after {steps} steps: max abs error {err:.2e}, cosine {cos:.7f}: "
            f"{'pass' if ok else 'FAIL'}"
        )
    log(f"{label}: {'OK' if passed else 'FAILED'}: {steps} steps in opforge-runner against plain torch")
    results = {"passed": passed, "device": device, "fp8": fp8, "steps": step_results, "caches": cache_results}
    (Path(out) / "results.json").write_text(json.dumps(results, indent=2))
    return results


def main(argv: Sequence[str] | None = None) -> int:
    """Checks the layer, then its decode loop, in the C++ runner (see the module docstring);
    returns the exit status."""
    code = model_check.main(SPEC, argv)
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, default=Path("out/models") / SPEC.name)
    args = parser.parse_args(argv)
    opforge.load_library(opforge.example_library("paged_decode_attention"))
    decoded = [check_decode(args.device, args.out / folder, fp8=fp8) for folder, fp8 in DECODE_RUNS]
    return code or (0 if all(d["passed"] for d in decoded) else 1)


if __name__ == "__main__":
    sys.exit(main())
