"""One call protocol for every adapter (Note [The call protocol] in src/core/call.h): the same bad
call through the torch adapter and the JAX adapter is refused by the same core step with the same
words, whether the refusal comes at trace time (the checks) or when the call runs (value
domains read on the host)."""

from __future__ import annotations

import re

import pytest
import torch

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import opforge  # noqa: E402
import opforge.jax as ojax  # noqa: E402
import serving  # noqa: E402

jax.config.update("jax_enable_x64", True)


@pytest.fixture(scope="module", autouse=True)
def libraries():
    serving.load()
    for name in ("softshrink", *serving.SERVING_OPS):
        ojax.load_library(opforge.example_library(name))


def on_cpu(t: torch.Tensor) -> jax.Array:
    return jax.device_put(jnp.asarray(t.numpy()), jax.devices("cpu")[0])


def torch_message(call) -> str:
    with pytest.raises(ValueError) as err:
        call()
    return str(err.value)


def jax_message(call) -> str:
    """The call's error through JAX: raised at trace time as ValueError, or when it runs as
    XlaRuntimeError with the status code in front, which is not opforge's text."""
    with pytest.raises((ValueError, jax.errors.JaxRuntimeError)) as err:
        jax.block_until_ready(call())
    return re.sub(r"^INVALID_ARGUMENT: ", "", str(err.value))


def test_a_checked_argument_is_refused_with_the_same_words():
    x = torch.randn(4, 3, dtype=torch.float64)
    want = torch_message(lambda: torch.ops.examples.softshrink(x, -1.0))
    assert jax_message(lambda: ojax.ops.examples.softshrink(on_cpu(x), lambd=-1.0)) == want
    assert want.endswith("\n  lambd: expected a value >= 0, got -1")


def test_a_value_outside_its_domain_is_refused_with_the_same_words():
    positions, q, cache, k, _ = serving.rotary(3, 4, 64, 32, torch.float32, "cpu")
    positions[1] = cache.shape[0]
    q, k = q.contiguous(), k.contiguous()
    want = torch_message(lambda: torch.ops.examples.rotary_embedding(positions, q.clone(), cache, k.clone()))
    got = jax_message(
        lambda: ojax.ops.examples.rotary_embedding(on_cpu(positions), on_cpu(q), on_cpu(cache), on_cpu(k))
    )
    assert got == want
    assert want.endswith(
        f"\n  positions: expected values in [0, cos_sin_cache.size(0)) = [0, {cache.shape[0]}), got "
        f"{cache.shape[0]} at [1]"
    )


def test_distinct_values_are_refused_with_the_same_words():
    key, value, key_cache, value_cache, _ = serving.kv_cache(6, 2, 16, 4, 4, torch.float32, "cpu")
    slots = torch.tensor([0, -1, 2, -1, 3, 3])
    want = torch_message(
        lambda: torch.ops.examples.kv_cache_write(key, value, key_cache.clone(), value_cache.clone(), slots)
    )
    args = (key, value, key_cache, value_cache, slots)
    got = jax_message(lambda: ojax.ops.examples.kv_cache_write(*[on_cpu(a) for a in args]))
    assert got == want
    assert want.endswith("\n  slot_mapping: expected distinct values (but -1), got 3 at [4] and [5]")
