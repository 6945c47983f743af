"""A GGUF model is parsed once as a run starts: its tokenizer, spec and weights read one parse
of the file, and a file rewritten in between is parsed again (envs/text/gguf_reader.py)."""

from __future__ import annotations

import gguf
import pytest

from agentenv_jax.checkpoint.gguf_file import load_gguf, read_gguf_spec
from agentenv_jax.envs.text.gguf_reader import forget_gguf
from agentenv_jax.envs.text.pretrained_tokenizer import load_tokenizer

from gguf_files import TOKENS, write_tiny_llama


@pytest.fixture
def parses(monkeypatch):
    """The paths gguf.GGUFReader parsed during the test, in order."""
    forget_gguf()
    parsed = []
    original = gguf.GGUFReader

    def counting(path, *args, **kwargs):
        parsed.append(str(path))
        return original(path, *args, **kwargs)

    monkeypatch.setattr(gguf, "GGUFReader", counting)
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
