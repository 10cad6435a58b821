"""The example op files stay as short as the description promises."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "ops"
MAX_LINES = 30
#: Ops whose original signature needs more: vLLM's paged attention with float8 caches (inputs whose
#: dtype follows kv_cache_dtype, optional scales, a torch equivalent that dequantises and gathers).
LONGER = {"paged_decode_attention": 48}


def description_lines(op_file: Path) -> list[str]:
    """Lines of an op file that are neither kernel, nor reference, nor grid function (part of the
    kernel's launch), nor a helper of those (a static or template function defined in the file),
    nor comment, nor blank."""
    text = re.sub(r"/\*.*?\*/", "", op_file.read_text(), flags=re.S)
    lines = [line.split("//")[0].rstrip() for line in text.splitlines()]
    references = "|".join(re.findall(r"\.reference\((\w+)\)", text))
    grids = "|".join(re.findall(r"\.launch_grid\((\w+)\)", text)) or references
    skipped = rf"(static )?(void ({references})|opforge::LaunchConfig ({grids}))\(|template <|static [^;]*$"
    out, skipping = [], False
    for line in lines:
        if re.match(skipped, line):
            skipping = True
        if not skipping and line.strip():
            out.append(line)
        if skipping and line == "}":
            skipping = False
    return out


@pytest.mark.parametrize("op_dir", sorted(p for p in EXAMPLES.iterdir() if p.is_dir()), ids=lambda p: p.name)
def test_op_file_is_short(op_dir):
    """At most MAX_LINES of description per op (softshrink's file also declares its backward op)."""
    (op_file,) = [p for p in op_dir.glob("*.cpp")]
    lines = description_lines(op_file)
    ops = op_file.read_text().count("OPFORGE_OP(")
    assert 0 < len(lines) <= LONGER.get(op_dir.name, MAX_LINES * ops), "\n".join(lines)
