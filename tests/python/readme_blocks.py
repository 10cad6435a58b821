"""The code blocks of the README, for the tests that run them (test_readme.py, test_models.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"

_FENCE = re.compile(r"^( *)```(\w*)\s*$")


@dataclass(frozen=True)
class Block:
    """A fenced block: its language tag ("" when it has none), first line number (1-based, of
    the opening fence) and text (indentation of the fence removed)."""

    lang: str
    line: int
    text: str

    @property
    def lines(self) -> list[str]:
        return self.text.splitlines()


def blocks(text: str | None = None) -> list[Block]:
    """The fenced blocks of ``text`` (default: the README), in order.

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
            found.append(Block(lang, start, "\n".join(b[indent:] for b in body) + "\n"))
            open_fence = None
        elif open_fence is not None:
            body.append(line)
    if open_fence is not None:
        raise ValueError(f"README.md:{open_fence[2]}: the block is not closed")
    return found


def command(prefix: str) -> str:
    """The one README command line of an ``sh`` block that starts with ``prefix``.

    Raises:
        LookupError: none or several lines start with it.
    """
    lines = [line for b in blocks() if b.lang == "sh" for line in b.lines if line.startswith(prefix)]
    if len(lines) != 1:
        raise LookupError(f"README.md: {len(lines)} sh lines start with {prefix!r}, expected 1")
    return lines[0]
