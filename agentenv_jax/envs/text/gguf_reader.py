"""One parse of a GGUF file per process while it is read at start-up.

A run reads a GGUF model three times as it starts (the tokenizer from its vocabulary, the
model's spec from its metadata, then its weights), and the `gguf` package parses every
metadata value in Python each time: ~4 s for SmolLM2-135M's 49 k tokens and merges. The
parsed reader is kept until the weights have been read (`forget_gguf`), keyed by the file's
path, size and modification time, so a file rewritten in between is parsed again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# (resolved path, size, mtime_ns) -> gguf.GGUFReader: one entry, the file being read.
_parsed: dict[tuple[str, int, int], Any] = {}


def _key(path: Path) -> tuple[str, int, int]:
    stat = path.stat()
    return str(path.resolve()), stat.st_size, stat.st_mtime_ns


def open_gguf(path: str | Path) -> Any:
    """The `gguf.GGUFReader` of `path`, parsed once while the file is unchanged; gguf's own
    errors (ValueError, KeyError, OSError) propagate for the caller to name the file."""
    import gguf

    path = Path(path)
    key = _key(path)
    if key not in _parsed:
        reader = gguf.GGUFReader(path)  # raises before anything is kept
        _parsed.clear()
        _parsed[key] = reader
    return _parsed[key]


def forget_gguf() -> None:
    """Drop the parsed reader (its memory map goes with the last array that views it)."""
    _parsed.clear()
