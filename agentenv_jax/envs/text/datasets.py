"""Rows of a user's dataset read from files: JSONL, Parquet, CSV, or a folder written by Hugging
Face `datasets` (`save_to_disk`).

A `RowSource` gives row `i` as a dict on demand. A JSONL file is never loaded whole: one pass
records where each line starts and ends (16 bytes a row), and a row is read from disk when it
is drawn, so a file larger than memory trains. Parquet files are memory-mapped and read one
row group at a time; a `save_to_disk` folder's Arrow files are memory-mapped; a CSV file (whose
quoted fields may hold newlines, so lines are not rows) is read whole. pyarrow reads Parquet
and Arrow (`pip install 'agentenv_jax[text]'`); JSONL and CSV need only the standard library.

Every reading error is an `EnvError` naming the file and what is wrong: a malformed JSONL line
(its line number), a Parquet file that is not one, an empty file, an unknown format.
"""

from __future__ import annotations

import array
import csv
import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from agentenv_jax.envs.spaces import EnvError

DATASET_FORMATS = ("jsonl", "parquet", "csv", "arrow")
_SUFFIX_FORMATS = {".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet", ".csv": "csv"}
# Bytes read per chunk while indexing a JSONL file's lines.
_INDEX_CHUNK = 1 << 24


class RowSource(Protocol):
    """A dataset's rows, read on demand."""

    path: Path
    columns: list[str]  # the top-level column names

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> dict[str, Any]: ...


def _import_pyarrow(path: Path, what: str) -> Any:
    try:
        import pyarrow
    except ImportError as err:
        raise EnvError(
            f"{path}: reading {what} needs pyarrow ({err}): pip install 'agentenv_jax[text]'"
        ) from None
    return pyarrow


class JsonlRows:
    """A JSONL file's rows (one JSON object a line; blank lines skipped), indexed by line
    offsets and read from disk one at a time."""

    def __init__(self, path: Path):
        self.path = path
        # 16 bytes a row while indexing too (array, not lists of Python ints).
        starts, ends = array.array("q"), array.array("q")
        with open(path, "rb") as f:
            offset, carry = 0, b""
            while chunk := f.read(_INDEX_CHUNK):
                data = carry + chunk
                begin = 0
                while (newline := data.find(b"\n", begin)) >= 0:
                    if data[begin:newline].strip():
                        starts.append(offset + begin)
                        ends.append(offset + newline)
                    begin = newline + 1
                offset += begin
                carry = data[begin:]
            if carry.strip():
                starts.append(offset)
                ends.append(offset + len(carry))
        if not starts:
            raise EnvError(f"{path}: the file holds no rows (an empty JSONL file)")
        self._starts = np.frombuffer(starts, np.int64)
        self._ends = np.frombuffer(ends, np.int64)
        self.columns = list(self[0])

    def __len__(self) -> int:
        return len(self._starts)

    def _line_number(self, offset: int) -> int:
        """The 1-based line number of the line starting at byte `offset` (read for errors)."""
        with open(self.path, "rb") as f:
            return f.read(offset).count(b"\n") + 1

    def __getitem__(self, index: int) -> dict[str, Any]:
        start, end = int(self._starts[index]), int(self._ends[index])
        with open(self.path, "rb") as f:
            f.seek(start)
            line = f.read(end - start)
        try:
            row = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise EnvError(
                f"{self.path}: line {self._line_number(start)} is not valid JSON: {err}"
            ) from None
        if not isinstance(row, dict):
            raise EnvError(
                f"{self.path}: line {self._line_number(start)} is a JSON {type(row).__name__}, "
                "expected an object (one row of named columns a line)"
            )
        return row


class CsvRows:
    """A CSV file's rows (a header line of column names), read whole."""

    def __init__(self, path: Path):
        self.path = path
        with open(path, newline="", encoding="utf-8") as f:
            try:
                reader = csv.DictReader(f)
                self._rows = list(reader)
            except (csv.Error, UnicodeDecodeError) as err:
                raise EnvError(f"{path}: not a readable CSV file: {err}") from None
            self.columns = list(reader.fieldnames or [])
        if not self._rows:
            raise EnvError(f"{path}: the file holds no rows (an empty CSV file, or a header only)")

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return dict(self._rows[index])


class ArrowRows:
    """Rows of Arrow tables: the row groups of Parquet files or the record batches of a
    `save_to_disk` folder's Arrow files, each converted to Python when a row is drawn."""

    def __init__(self, path: Path, parts: list[tuple[int, Callable[[], Any]]], columns: list[str]):
        self.path = path
        self.columns = columns
        self._read_part = [read for _, read in parts]
        self._part_ends = np.cumsum([rows for rows, _ in parts])
        if not len(self._part_ends) or self._part_ends[-1] == 0:
            raise EnvError(f"{path}: the dataset holds no rows")

    def __len__(self) -> int:
        return int(self._part_ends[-1])

    def __getitem__(self, index: int) -> dict[str, Any]:
        part = int(np.searchsorted(self._part_ends, index, side="right"))
        first = 0 if part == 0 else int(self._part_ends[part - 1])
        return self._part(part).slice(index - first, 1).to_pylist()[0]

    @functools.lru_cache(maxsize=4)  # noqa: B019 - a few parts decoded at a time, per source
    def _part(self, part: int) -> Any:
        return self._read_part[part]()


def _parquet_rows(path: Path) -> ArrowRows:
    pyarrow = _import_pyarrow(path, "Parquet")
    import pyarrow.parquet as parquet

    try:
        file = parquet.ParquetFile(path, memory_map=True)
    except (pyarrow.ArrowInvalid, OSError) as err:
        raise EnvError(f"{path}: not a Parquet file: {err}") from None
    parts = [
        (file.metadata.row_group(g).num_rows, functools.partial(file.read_row_group, g))
        for g in range(file.num_row_groups)
    ]
    return ArrowRows(path, parts, file.schema_arrow.names)


def _arrow_folder_rows(path: Path) -> ArrowRows:
    """A folder written by `Dataset.save_to_disk` (`state.json` names its Arrow files, each an
    Arrow IPC stream)."""
    pyarrow = _import_pyarrow(path, "a datasets folder")
    import pyarrow.ipc as ipc

    if (path / "dataset_dict.json").exists():
        splits = json.loads((path / "dataset_dict.json").read_text()).get("splits", [])
        raise EnvError(
            f"{path}: a DatasetDict folder (splits {', '.join(splits)}); name one split's "
            f"folder, e.g. {path / (splits[0] if splits else 'train')}"
        )
    state = path / "state.json"
    if not state.exists():
        raise EnvError(
            f"{path}: a folder without state.json, not one written by datasets' save_to_disk"
        )
    files = [path / entry["filename"] for entry in json.loads(state.read_text())["_data_files"]]
    parts, columns = [], []
    for file in files:
        try:
            table = ipc.open_stream(pyarrow.memory_map(str(file))).read_all()
        except (pyarrow.ArrowInvalid, OSError) as err:
            raise EnvError(f"{file}: not an Arrow stream written by save_to_disk: {err}") from None
        columns = table.column_names
        for batch in table.to_batches():
            parts.append((batch.num_rows, functools.partial(lambda b: b, batch)))
    return ArrowRows(path, parts, columns)


def dataset_format(path: Path) -> str:
    """The format of `path`: `arrow` for a folder, else by its suffix; `EnvError` otherwise."""
    if path.is_dir():
        return "arrow"
    fmt = _SUFFIX_FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise EnvError(
            f"{path}: unknown dataset format {path.suffix!r}; allowed: .jsonl (or .json, one "
            "object a line), .parquet, .csv, or a folder written by datasets' save_to_disk"
        )
    return fmt


def open_rows(path: str | Path, field: str = "env.kwargs.path") -> RowSource:
    """The rows of the dataset at `path` (`field` names the setting in errors)."""
    path = Path(path).expanduser()
    if not path.exists():
        raise EnvError(f"{field} = {str(path)!r}: no such file or folder")
    fmt = dataset_format(path)
    if fmt == "jsonl":
        return JsonlRows(path)
    if fmt == "csv":
        return CsvRows(path)
    if fmt == "parquet":
        return _parquet_rows(path)
    return _arrow_folder_rows(path)


def column_value(row: dict[str, Any], column: str) -> Any:
    """`row`'s value at `column`, a dotted path into nested objects (verl's
    `reward_model.ground_truth`); KeyError when absent."""
    value: Any = row
    for part in column.split("."):
        if not isinstance(value, dict) or part not in value:
            raise KeyError(column)
        value = value[part]
    return value


def has_column(row: dict[str, Any], column: str) -> bool:
    try:
        column_value(row, column)
    except KeyError:
        return False
    return True
