"""The code blocks of the README and of the pages under docs/ it leads to, for the tests that run
them (test_readme.py, test_models.py, test_onnx.py, ...)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
#: The pages whose blocks the tests run: the README, then docs/*.md by name.
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^( *)```(\w*)\s*$")


@dataclass(frozen=True)
class Block:
    """A fenced block: its language tag ("" when it has none), first line number (1-based, of
    the opening fence) and text (indentation of the fence removed)."""

    lang: str
    line: int
    text: str
    page: str = "README.md"

    @property
    def lines(self) -> list[str]:
        return self.text.splitlines()


def blocks(text: str | None = None, page: str = "README.md") -> list[Block]:
    """The fenced blocks of ``text`` (default: the README), in order; ``page`` names it in the
    blocks and in errors.

    Raises:
        ValueError: a fence is not closed.
    """
    text = README.read_text() if text is None else text
    found, open_fence = [], None
    for number, line in enumerate(text.splitlines(), 1):
        m = _FENCE.match(line)
        if open_fence is None and m:
            open_fence, body = (len(m.group(1)), m.group(2), number), []
        elif open_fence is not None and line.strip() == "```":
            indent, lang, start = open_fence
            found.append(Block(lang, start, "\n".join(b[indent:] for b in body) + "\n", page))
            open_fence = None
        elif open_fence is not None:
            body.append(line)
    if open_fence is not None:
        raise ValueError(f"{page}:{open_fence[2]}: the block is not closed")
    return found


def all_blocks() -> list[Block]:
    """The blocks of every page of ``PAGES``, page by page."""
    return [b for page in PAGES for b in blocks(page.read_text(), str(page.relative_to(ROOT)))]


def command(prefix: str) -> str:
    """The one command line of an ``sh`` block of the README or a docs page that starts with ``prefix``.

    Raises:
        LookupError: none or several lines start with it.
    """
    lines = [line for b in all_blocks() if b.lang == "sh" for line in b.lines if line.startswith(prefix)]
    if len(lines) != 1:
        raise LookupError(f"README.md and docs/: {len(lines)} sh lines start with {prefix!r}, expected 1")
    return lines[0]
