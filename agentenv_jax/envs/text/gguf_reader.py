"""GGUF files as a run reads them at start-up: the metadata decoded fast, once per process.

A run reads a GGUF model three times as it starts (the tokenizer from its vocabulary, the
model's spec from its metadata, then its weights). The `gguf` package's `GGUFReader` makes a
numpy view of every metadata value, strings one by one: 2.3 s for SmolLM2-135M's 49 k tokens
and 49 k merges, paid again by every rank and every evaluation. `GGUFFile` decodes the same
metadata with `struct` from the memory-mapped file (~0.1 s) and views each tensor's data as
`GGUFReader` does (the dtype and shape `gguf.quants.dequantize` takes); `gguf` still names the
tensor types and dequantizes.

The parsed file is kept until the weights have been read (`forget_gguf`), keyed by the file's
path, size and modification time, so a file rewritten in between is parsed again. A file that
is not GGUF, of an unknown version, truncated or inconsistent raises `ValueError`, for the
caller to name the file.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

# GGUF's metadata value types (gguf.GGUFValueType): struct codes of the scalars.
_STRING, _ARRAY = 8, 9
_SCALAR_CODES = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q"}
_SCALAR_CODES |= {11: "q", 12: "d"}
_UINT32 = 4
_MAGIC = b"GGUF"
_VERSIONS = (2, 3)
_DEFAULT_ALIGNMENT = 32
# The tensor types stored as plain elements, by `gguf.GGMLQuantizationType` name.
_ELEMENT_TYPES = {
    "F16": np.float16,
    "F32": np.float32,
    "F64": np.float64,
    "I8": np.int8,
    "I16": np.int16,
    "I32": np.int32,
    "I64": np.int64,
}


class GGUFField(NamedTuple):
    """A metadata entry: its key, its `gguf.GGUFValueType` (ARRAY for arrays) and its value
    (a Python int, float, bool or str, or a list of them)."""

    name: str
    value_type: int
    value: Any

    def contents(self) -> Any:
        """The value, as `gguf.ReaderField.contents()` gives it."""
        return self.value


class GGUFTensor(NamedTuple):
    """A tensor's entry: its name, `gguf.GGMLQuantizationType`, dims in GGUF's order
    (innermost first) and its data in the memory map: the elements in their numpy dtype for
    float and integer types, shaped as the dims reversed; the raw bytes (`uint8`) in
    `gguf.quants.quant_shape_to_byte_shape` for quantized types."""

    name: str
    tensor_type: Any
    shape: tuple[int, ...]
    data: np.ndarray


class _Cursor:
    """Reads GGUF's little- (or big-) endian values from `buffer` at a moving offset."""

    def __init__(self, buffer: np.ndarray, order: str):
        self.buffer = buffer
        self.view = memoryview(buffer)
        self.order = order
        self.offset = 0

    def _ends_by(self, end: int) -> None:
        if end > len(self.buffer):
            raise ValueError(f"the file ends at byte {len(self.buffer)}, inside its header")

    def scalar(self, code: str) -> Any:
        layout = struct.Struct(self.order + code)
        self._ends_by(self.offset + layout.size)
        (value,) = layout.unpack_from(self.view, self.offset)
        self.offset += layout.size
        return value

    def string(self) -> str:
        length = self.scalar("Q")  # read first: it moves the offset
        end = self.offset + length
        self._ends_by(end)
        text = str(self.view[self.offset : end], "utf-8")
        self.offset = end
        return text

    def value(self, value_type: int) -> Any:
        if value_type == _STRING:
            return self.string()
        if value_type == _ARRAY:
            item_type, count = self.scalar("I"), self.scalar("Q")
            if item_type in (_STRING, _ARRAY):
                return [self.value(item_type) for _ in range(count)]
            code = _SCALAR_CODES.get(item_type)
            if code is None:
                raise ValueError(f"unknown GGUF array item type {item_type}")
            dtype = np.dtype(code if code != "?" else bool).newbyteorder(self.order)
            end = self.offset + count * dtype.itemsize
            self._ends_by(end)
            items = np.frombuffer(self.view[self.offset : end], dtype).tolist()
            self.offset = end
            return items
        code = _SCALAR_CODES.get(value_type)
        if code is None:
            raise ValueError(f"unknown GGUF value type {value_type}")
        return self.scalar(code)


class GGUFFile:
    """A GGUF file's metadata (`fields`, by key) and tensors (`tensors`, in file order), its
    data memory-mapped (read-only)."""

    def __init__(self, path: str | Path):
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
        from gguf.quants import quant_shape_to_byte_shape

        buffer = np.memmap(path, mode="r")
        if bytes(buffer[:4]) != _MAGIC:
            raise ValueError("GGUF magic invalid")
        # A version of 0 in the low half is a file of the other byte order.
        order = "<" if struct.unpack_from("<I", buffer, 4)[0] & 0xFFFF else ">"
        cursor = _Cursor(buffer, order)
        cursor.offset = 4
        version = cursor.scalar("I")
        if version not in _VERSIONS:
            raise ValueError(f"GGUF version {version}; readable: {_VERSIONS}")
        tensor_count, field_count = cursor.scalar("Q"), cursor.scalar("Q")
        self.fields: dict[str, GGUFField] = {}
        for _ in range(field_count):
            name, value_type = cursor.string(), cursor.scalar("I")
            self.fields[name] = GGUFField(name, value_type, cursor.value(value_type))
        entries = []
        for _ in range(tensor_count):
            name = cursor.string()
            dims = tuple(cursor.scalar("Q") for _ in range(cursor.scalar("I")))
            entries.append((name, dims, cursor.scalar("I"), cursor.scalar("Q")))
        alignment = self.fields.get("general.alignment")
        align = _DEFAULT_ALIGNMENT if alignment is None else alignment.value
        if alignment is not None and alignment.value_type != _UINT32:
            raise ValueError("Bad type for general.alignment field")
        if align <= 0 or align & (align - 1):
            raise ValueError(f"general.alignment {align}: not a power of two")
        start = -(-cursor.offset // align) * align
        self.tensors: list[GGUFTensor] = []
        names: set[str] = set()
        for name, dims, raw_type, offset in entries:
            if name in names:
                raise ValueError(f"Found duplicated tensor with name {name}")
            names.add(name)
            tensor_type = GGMLQuantizationType(raw_type)
            elements = int(np.prod(dims, dtype=np.int64))
            block, block_bytes = GGML_QUANT_SIZES[tensor_type]
            shape = tuple(reversed(dims))
            dtype = _ELEMENT_TYPES.get(tensor_type.name)
            if dtype is None:  # quantized: its bytes
                dtype, shape = np.uint8, quant_shape_to_byte_shape(shape, tensor_type)
            begin = start + offset
            end = begin + elements * block_bytes // block
            if end > len(buffer):
                raise ValueError(
                    f"tensor {name!r} lies past the end of the file (byte {end} of "
                    f"{len(buffer)}): truncated"
                )
            data = buffer[begin:end].view(np.dtype(dtype).newbyteorder(order)).reshape(shape)
            self.tensors.append(GGUFTensor(name, tensor_type, dims, data))


# (resolved path, size, mtime_ns) -> GGUFFile: one entry, the file being read.
_parsed: dict[tuple[str, int, int], GGUFFile] = {}


def _key(path: Path) -> tuple[str, int, int]:
    stat = path.stat()
    return str(path.resolve()), stat.st_size, stat.st_mtime_ns


def open_gguf(path: str | Path) -> GGUFFile:
    """The `GGUFFile` of `path`, parsed once while the file is unchanged; `ValueError` (and
    `OSError`) propagate for the caller to name the file."""
    path = Path(path)
    key = _key(path)
    if key not in _parsed:
        parsed = GGUFFile(path)  # raises before anything is kept
        _parsed.clear()
        _parsed[key] = parsed
    return _parsed[key]


def forget_gguf() -> None:
    """Drop the parsed file (its memory map goes with the last array that views it)."""
    _parsed.clear()
