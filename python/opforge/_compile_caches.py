"""torch.compile's on-disk caches keyed by the declarations of the loaded op libraries.

A cached graph calls an op by its schema's argument positions, and the backward graph calls an
op's backward op as the adapter's Autograd kernel traced it; neither is part of what the FX graph
and AOTAutograd caches hash, so an op library rebuilt with another schema or backward op would
be given graphs compiled against the old one. Both keys include
``torch.compiler.config.cache_key_tag``, so opforge keeps a digest of every loaded library's
description at its end: ``<the caller's tag>+opforge-<digest>``.

The tag is set when a library loads and set again when each compilation starts (dynamo's
``on_compile_start``), so a tag the caller assigns after loading (which replaces opforge's) gets
the digest back before any cache key is computed, whatever the order. dynamo is imported only
when something compiles (importing it takes seconds), so the callback is registered once
``torch._dynamo.callback`` is imported, by a post-import hook on ``sys.meta_path``.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.util
import sys
import threading

import torch

_lock = threading.Lock()
#: Per loaded library, a digest of its declarations (its description JSON).
_fingerprints: dict[str, str] = {}
#: The tag as opforge last set it, and the caller's own tag that it extends.
_tag_set: str | None = None
_tag_base = ""
_hooked = False


def add_library(key: str, description: str) -> None:
    """Records the description of a newly loaded library and tags the caches with it."""
    global _hooked
    with _lock:
        _fingerprints[key] = hashlib.sha256(description.encode()).hexdigest()
        if not _hooked:
            _hooked = True
            _after_import("torch._dynamo.callback", lambda module: module.on_compile_start(lambda _: tag()))
    tag()


def tag() -> str:
    """Puts the digest of the loaded libraries at the end of the cache key tag (keeping the
    caller's tag in front) and returns the tag."""
    global _tag_set, _tag_base
    with _lock:
        current = torch.compiler.config.cache_key_tag
        if current != _tag_set:  # not ours: the caller's own (or none)
            _tag_base = current
        digest = hashlib.sha256(",".join(sorted(_fingerprints.values())).encode()).hexdigest()[:16]
        _tag_set = f"{_tag_base}{'+' if _tag_base else ''}opforge-{digest}"
        torch.compiler.config.cache_key_tag = _tag_set
        return _tag_set


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``hook(module)`` once module ``name`` has been executed by its own loader."""

    def __init__(self, name: str, hook) -> None:
        self.name, self.hook = name, hook

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # the other finders find it
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            self.hook(module)

        spec.loader.exec_module = exec_module
        return spec


def _after_import(name: str, hook) -> None:
    module = sys.modules.get(name)
    if module is not None:
        hook(module)
    else:
        sys.meta_path.insert(0, _AfterImport(name, hook))
