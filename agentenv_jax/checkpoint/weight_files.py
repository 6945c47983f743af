"""Checks of a pretrained model's weight files before a library reads them: a git-LFS pointer
left where the weights should be (a clone without `git lfs`), and a safetensors file shorter
than its own header says (an interrupted download or copy). Each is a `ConfigError` naming the
file, what is wrong with it and what to do, instead of the reading library's message about
headers, which names no file.

A safetensors file is an 8-byte little-endian header length N, N bytes of JSON header giving
each tensor's `data_offsets` `[begin, end)` into the data after it, then the data: the file
must hold at least `8 + N + max(end)` bytes.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from agentenv_jax.config.errors import ConfigError

# What a git-LFS pointer file starts with, and its most bytes (git-lfs's docs/spec.md).
LFS_POINTER_START = b"version https://git-lfs.github.com/spec/"
_LFS_POINTER_MAX_BYTES = 1024
_HEADER_LENGTH_BYTES = 8
_MAX_HEADER_BYTES = 100_000_000  # the safetensors library refuses longer headers


def lfs_pointer_problem(start: bytes) -> str | None:
    """What is wrong with a weight file that begins with `start` (its first bytes, up to 1 KiB)
    if it is a git-LFS pointer, else None."""
    if not start.startswith(LFS_POINTER_START):
        return None
    size = re.search(rb"\nsize (\d+)", start)
    real = f" to {int(size.group(1)):,} bytes of weights" if size else ""
    return (
        f"a git-LFS pointer{real}, not the weights themselves: run `git lfs pull` in the "
        "model's git checkout (or download the file itself)"
    )


def require_not_lfs_pointer(path: Path) -> None:
    """`ConfigError` if the weight file `path` is a git-LFS pointer."""
    with path.open("rb") as file:
        problem = lfs_pointer_problem(file.read(_LFS_POINTER_MAX_BYTES))
    if problem is not None:
        raise ConfigError(f"{path}: {problem}")


def safetensors_data_end(header: dict[str, Any]) -> int:
    """The end of the last tensor's bytes after the header, from a safetensors header (its
    `__metadata__` entry aside); 0 for a file of no tensors."""
    ends = [
        int(entry["data_offsets"][1]) for name, entry in header.items() if name != "__metadata__"
    ]
    return max(ends, default=0)


def require_whole_safetensors(path: Path) -> None:
    """`ConfigError` naming `path` if it is a git-LFS pointer, not a safetensors file, or
    shorter than its header says."""
    require_not_lfs_pointer(path)
    size = path.stat().st_size
    with path.open("rb") as file:
        prefix = file.read(_HEADER_LENGTH_BYTES)
        if len(prefix) < _HEADER_LENGTH_BYTES:
            raise ConfigError(
                f"{path}: truncated: {size} bytes, less than the 8-byte header length a "
                "safetensors file starts with; download it again"
            )
        header_length = int.from_bytes(prefix, "little")
        if header_length > _MAX_HEADER_BYTES:
            raise ConfigError(
                f"{path}: not a safetensors file (its first 8 bytes give a header length of "
                f"{header_length:,} bytes)"
            )
        if _HEADER_LENGTH_BYTES + header_length > size:
            raise ConfigError(
                f"{path}: truncated: {size:,} bytes, but its header alone needs "
                f"{_HEADER_LENGTH_BYTES + header_length:,}; download it again"
            )
        try:
            header = json.loads(file.read(header_length))
            end = safetensors_data_end(header)
        except (ValueError, TypeError, KeyError, IndexError, AttributeError) as err:
            raise ConfigError(
                f"{path}: not a safetensors file (its header is not a table of tensors: {err})"
            ) from None
    expected = _HEADER_LENGTH_BYTES + header_length + end
    if size < expected:
        raise ConfigError(
            f"{path}: truncated: {size:,} bytes, but its header lists tensors up to byte "
            f"{expected:,} (an interrupted download or copy?); download it again"
        )
