"""A GGUF model is parsed once as a run starts: its tokenizer, spec and weights read one parse
of the file, and a file rewritten in between is parsed again (envs/text/gguf_reader.py)."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from agentenv_jax.checkpoint.gguf_file import load_gguf, read_gguf_spec
from agentenv_jax.envs.text.gguf_reader import forget_gguf
from agentenv_jax.envs.text.pretrained_tokenizer import load_tokenizer

TOKENS = [chr(c) for c in range(ord("!"), ord("~") + 1)] + ["<pad>", "<s>", "</s>"]


def _write_tiny_llama(path, d: int = 8, inner: int = 16) -> None:
    """A one-layer llama of float32 tensors with a byte-level vocabulary and a chat template."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_context_length(64)
    writer.add_embedding_length(d)
    writer.add_feed_forward_length(inner)
    writer.add_head_count(2)
    writer.add_head_count_kv(2)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(TOKENS)
    writer.add_token_types([1] * (len(TOKENS) - 3) + [3, 3, 3])
    writer.add_token_merges([])
    writer.add_pad_token_id(len(TOKENS) - 3)
    writer.add_bos_token_id(len(TOKENS) - 2)
    writer.add_eos_token_id(len(TOKENS) - 1)
    writer.add_chat_template("{% for m in messages %}{{ m['content'] }}</s>{% endfor %}")
    rng = np.random.default_rng(0)
    shapes = {"token_embd.weight": (len(TOKENS), d), "output_norm.weight": (d,)}
    for name, shape in {
        "attn_norm.weight": (d,),
        "ffn_norm.weight": (d,),
        "attn_q.weight": (d, d),
        "attn_k.weight": (d, d),
        "attn_v.weight": (d, d),
        "attn_output.weight": (d, d),
        "ffn_gate.weight": (inner, d),
        "ffn_up.weight": (inner, d),
        "ffn_down.weight": (d, inner),
    }.items():
        shapes[f"blk.0.{name}"] = shape
    for name, shape in shapes.items():
        writer.add_tensor(name, rng.standard_normal(shape).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


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
    _write_tiny_llama(path)
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
    _write_tiny_llama(path)
    assert read_gguf_spec(path).intermediate_size == 16
    path.unlink()
    _write_tiny_llama(path, inner=32)  # another size: another key, whatever the clock says
    assert read_gguf_spec(path).intermediate_size == 32
    assert parses == [str(path)] * 2
