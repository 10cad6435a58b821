"""run_options.py, the plugin every test runs under: a failing test's report gives its random
seed, ``--seed`` (or ``$OPFORGE_TEST_SEED``) runs it again with that seed, ``--group K/N`` deals
the tests out into N groups that take every test once, files with slow tests run first, and
nothing retries a failing test."""

from __future__ import annotations

import random
import re
from pathlib import Path

import numpy as np
import pytest
import torch

HERE = Path(__file__).resolve().parent

DRAWS = """
import random


def test_draws(seed):
    assert False, f"drew {random.random()!r} with seed {seed}"


def test_draws_too():
    assert False, f"drew {random.random()!r}"


def test_passes():
    assert random.random() < 1.0
"""


def pytest_run(pytester: pytest.Pytester, *args: str, env: dict[str, str] | None = None) -> pytest.RunResult:
    """``pytest -p run_options *args`` in pytester's folder, run_options.py alone (no conftest, no
    plugin of an installed package), in this process (pytester's in-process run: torch, which the
    seed fixture seeds, is imported once for every such run), with ``$OPFORGE_TEST_SEED`` unset
    unless ``env`` sets it."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
        patch.delenv("OPFORGE_TEST_SEED", raising=False)
        for name, value in (env or {}).items():
            patch.setenv(name, value)
        return pytester.runpytest_inprocess("-p", "run_options", "-p", "no:cacheprovider", *args)


def output(run: pytest.RunResult) -> str:
    """What the run wrote to standard output, as one string."""
    return run.stdout.str() + "\n"


def seed_sections(text: str) -> dict[str, str]:
    """{test name: the seed its "random seed" report section gives} of pytest's output."""
    found = re.findall(r"^-+ random seed -+\n(\d+); again with this seed: python -m pytest '[^:]+::(\w+)'", text, re.M)
    return {name: seed for seed, name in found}


@pytest.mark.slow
def test_a_failure_reports_its_seed_and_the_seed_reproduces_it(pytester):
    pytester.makepyfile(test_draws=DRAWS)
    fresh = pytest_run(pytester, "test_draws.py")
    text = output(fresh)
    assert fresh.ret == 1, text
    assert (
        "random seed: a fresh one per test, in the report of a failure (--seed N or OPFORGE_TEST_SEED=N fixes it)"
        in text
    )
    seeds = seed_sections(text)
    assert sorted(seeds) == ["test_draws", "test_draws_too"]  # a passing test gets no section
    assert seeds["test_draws"] != seeds["test_draws_too"]  # each test draws its own
    assert f"with seed {seeds['test_draws']}" in text  # the fixture hands the test its seed
    section = f"{seeds['test_draws']}; again with this seed: python -m pytest 'test_draws.py::test_draws' --seed "
    assert f"\n{section}{seeds['test_draws']}\n" in text
    first = re.search(r"drew (\S+) with seed", text).group(1)

    again = pytest_run(pytester, "test_draws.py::test_draws", "--seed", seeds["test_draws"])
    assert f"random seed: {seeds['test_draws']} for every test" in output(again)
    assert re.search(r"drew (\S+) with seed", output(again)).group(1) == first
    assert seed_sections(output(again)) == {"test_draws": seeds["test_draws"]}
    by_env = pytest_run(pytester, "test_draws.py::test_draws", env={"OPFORGE_TEST_SEED": seeds["test_draws"]})
    assert re.search(r"drew (\S+) with seed", output(by_env)).group(1) == first


def test_a_seed_that_is_not_an_integer_is_refused(pytester):
    pytester.makepyfile(test_draws=DRAWS)
    run = pytest_run(pytester, "test_draws.py", env={"OPFORGE_TEST_SEED": "lucky"})
    assert run.ret == 4  # pytest's usage error
    assert "ERROR: OPFORGE_TEST_SEED: expected an integer seed, got 'lucky'" in run.stderr.str()


def test_groups_take_every_test_once_and_each_about_an_nth_of_every_file(pytester):
    for name in ("a", "b"):
        tests = "".join(f"def test_{name}{i}():\n    pass\n\n\n" for i in range(5))
        pytester.makepyfile(**{f"test_{name}": tests})
    groups = []
    for k in (1, 2, 3):
        run = pytest_run(pytester, "--collect-only", "--group", f"{k}/3")
        assert run.ret == 0, output(run)
        assert f"test group: {k} of 3 (tests number {k}, {k + 3}, {k + 6}, ... in collection order)" in output(run)
        groups.append(re.findall(r"<Function (\w+)>", output(run)))
    assert groups == [
        ["test_a0", "test_a3", "test_b1", "test_b4"],
        ["test_a1", "test_a4", "test_b2"],
        ["test_a2", "test_b0", "test_b3"],
    ]


def test_files_with_slow_tests_run_first_the_most_first_and_stay_whole(pytester):
    def write(name: str, body: str) -> None:
        pytester.makepyfile(**{f"test_{name}": f"import pytest\n\n\n{body}"})

    slow, plain = "@pytest.mark.slow\ndef test_{}():\n    pass\n\n\n", "def test_{}():\n    pass\n\n\n"
    write("a", plain.format("a0") + plain.format("a1"))
    # One slow function of three cases counts once: test_d, with two slow functions, comes first.
    write("b", "@pytest.mark.slow\n@pytest.mark.parametrize('i', [0, 1, 2])\ndef test_b(i):\n    pass\n")
    write("c", plain.format("c0"))
    write("d", slow.format("d0") + plain.format("d1") + slow.format("d2"))
    run = pytest_run(pytester, "--collect-only", "-o", "markers=slow: a slow test")
    assert run.ret == 0, output(run)
    assert re.findall(r"<Function ([\w\[\]]+)>", output(run)) == [
        *("test_d0", "test_d1", "test_d2"),
        *("test_b[0]", "test_b[1]", "test_b[2]"),
        *("test_a0", "test_a1"),
        "test_c0",
    ]


def test_a_group_that_is_not_k_of_n_is_refused(pytester):
    pytester.makepyfile(test_draws=DRAWS)
    for value in ("4/3", "two"):
        run = pytest_run(pytester, "--group", value)
        assert run.ret == 4
        assert (
            f"ERROR: --group: expected K/N with 1 <= K <= N (the K-th of N groups), got '{value}'" in run.stderr.str()
        )


def test_the_seed_seeds_torch_numpy_and_random(seed):
    drawn = (torch.rand(3), np.random.rand(3), random.random())
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)
    assert torch.equal(torch.rand(3), drawn[0])
    assert np.array_equal(np.random.rand(3), drawn[1]) and random.random() == drawn[2]


def test_nothing_runs_a_failing_test_again(pytestconfig):
    """A seed-dependent failure is a bug to fix, never retried away: no rerun plugin is loaded,
    and pytest's options name none."""
    plugins = {name for name, _ in pytestconfig.pluginmanager.list_name_plugin() if name}
    assert not {p for p in plugins if re.search(r"rerun|retry|flaky", p)}, plugins
    ini = (HERE.parents[1] / "pytest.ini").read_text()
    assert not re.search(r"rerun|retry|flaky", ini)
