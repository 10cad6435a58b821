"""How a test run is chosen and reproduced: the random seed of each test, and the group of tests
a run takes (a pytest plugin; conftest.py imports its hooks and fixture, ``-p run_options``
loads it alone).

Seeds: every test runs with a seed, a fresh one by default (fresh random inputs each run), or
the one given with ``--seed N`` (or ``$OPFORGE_TEST_SEED``), which every test then takes. The
``seed`` fixture seeds torch (CPU and CUDA), NumPy and Python's ``random`` with it before the
test and hands it to tests that seed something else (``jax.random.key(seed)``, verify's cases).
A failing test's report has a section "random seed" with the seed and the command that runs it
again with that seed. A test that fails for some seed has a bug, in opforge or in the test:
nothing here retries a test or runs it again.

Groups: ``--group K/N`` runs the K-th of N groups of the collected tests (1 <= K <= N): the
tests in collection order (files by name, tests in file order) dealt out in turn, the first to
group 1, the second to group 2, ..., so the groups of a run take every test exactly once and
each takes about an N-th of every file. ``tools/device_check.sh tests K/N`` runs one group in one
call on the GPU machine.

Order: files that hold tests marked ``slow`` (ten seconds or more on a 2-core machine without a
GPU) run first, the file with the most such test functions first (a parametrized one counts
once); the others keep their order, and tests keep their order within each file. Under
pytest-xdist with ``--dist loadfile --no-loadscope-reorder`` (``make test``), workers take files
in this order, so the long files start early and the short ones fill the end: the workers finish
together.
"""

from __future__ import annotations

import os
import random
import re
from collections import Counter

import pytest

#: The environment variable that fixes every test's seed, as ``--seed`` does.
SEED_ENV = "OPFORGE_TEST_SEED"
_SEED = pytest.StashKey[int]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("opforge")
    group.addoption(
        "--seed",
        type=int,
        default=None,
        help=f"the random seed of every test (default: ${SEED_ENV}, else a fresh one per test, "
        "shown in the report of a test that fails)",
    )
    group.addoption(
        "--group",
        default=None,
        metavar="K/N",
        help="run the K-th of N groups of the collected tests (the tests in collection order, dealt out in turn)",
    )


def fixed_seed(config: pytest.Config) -> int | None:
    """The seed every test takes (``--seed``, else ``$OPFORGE_TEST_SEED``), or None for a fresh
    one per test.

    Raises:
        pytest.UsageError: ``$OPFORGE_TEST_SEED`` is not an integer.
    """
    seed = config.getoption("--seed")
    if seed is None and os.environ.get(SEED_ENV):
        try:
            seed = int(os.environ[SEED_ENV])
        except ValueError:
            raise pytest.UsageError(f"{SEED_ENV}: expected an integer seed, got {os.environ[SEED_ENV]!r}") from None
    return seed


def _group(config: pytest.Config) -> tuple[int, int] | None:
    """(K, N) of ``--group K/N``, or None without it.

    Raises:
        pytest.UsageError: the value is not K/N with 1 <= K <= N.
    """
    value = config.getoption("--group")
    if value is None:
        return None
    match = re.fullmatch(r"(\d+)/(\d+)", value)
    if match is None or not 1 <= int(match[1]) <= int(match[2]):
        raise pytest.UsageError(f"--group: expected K/N with 1 <= K <= N (the K-th of N groups), got {value!r}")
    return int(match[1]), int(match[2])


def pytest_report_header(config: pytest.Config) -> list[str]:
    seed = fixed_seed(config)
    if seed is not None:
        lines = [f"random seed: {seed} for every test"]
    else:
        lines = [f"random seed: a fresh one per test, in the report of a failure (--seed N or {SEED_ENV}=N fixes it)"]
    if (group := _group(config)) is not None:
        k, n = group
        lines.append(f"test group: {k} of {n} (tests number {k}, {k + n}, {k + 2 * n}, ... in collection order)")
    return lines


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    group = _group(config)
    if group is not None:
        k, n = group
        config.hook.pytest_deselected(items=[item for i, item in enumerate(items) if i % n != k - 1])
        items[:] = items[k - 1 :: n]
    functions = {(item.path, item.originalname) for item in items if item.get_closest_marker("slow") is not None}
    slow = Counter(path for path, _ in functions)
    items.sort(key=lambda item: -slow[item.path])  # stable: the files stay whole and in order otherwise


@pytest.fixture(autouse=True)
def seed(request: pytest.FixtureRequest) -> int:
    """This test's random seed (see the module's docstring), with torch, NumPy and Python's
    ``random`` seeded from it (a fresh one is an int in [0, 2**32))."""
    fixed = fixed_seed(request.config)
    value = fixed if fixed is not None else int.from_bytes(os.urandom(4), "little")
    request.node.stash[_SEED] = value
    request.node.user_properties.append(("seed", value))
    # imported here, so that collecting and refusing options stay quick where no test has run yet
    import numpy as np
    import torch

    torch.manual_seed(value)
    np.random.seed(value % 2**32)
    random.seed(value)
    return value


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    if report.failed and _SEED in item.stash:
        value = item.stash[_SEED]
        report.sections.append(
            ("random seed", f"{value}; again with this seed: python -m pytest '{item.nodeid}' --seed {value}")
        )
    return report
