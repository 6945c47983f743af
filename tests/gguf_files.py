"""Tiny GGUF files of a one-layer llama, written with the gguf package's own writer, for the
tests of reading GGUF models (test_gguf_reader.py, test_pretrained_errors.py)."""

from __future__ import annotations

import gguf
import numpy as np

# A byte-level vocabulary of the printable ASCII characters and three special tokens.
TOKENS = [chr(c) for c in range(ord("!"), ord("~") + 1)] + ["<pad>", "<s>", "</s>"]


def write_tiny_llama(path, d: int = 8, inner: int = 16, q8_1_down: bool = False) -> None:
    """A one-layer llama of float32 tensors with a byte-level vocabulary and a chat template;
    with `q8_1_down` its down projection is stored as Q8_1, a type the gguf package has no
    dequantizer for."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_context_length(128)
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
        if q8_1_down and name == "blk.0.ffn_down.weight":
            block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q8_1]
            raw = np.zeros(d * inner // block * size, np.uint8)
            writer.add_tensor(
                name,
                raw,
                raw_shape=(d, inner // block * size),
                raw_dtype=gguf.GGMLQuantizationType.Q8_1,
            )
            continue
        values = rng.standard_normal(shape).astype(np.float32)
        writer.add_tensor(name, np.ones(shape, np.float32) if len(shape) == 1 else values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
