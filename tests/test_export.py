"""`agentenv export`: a run of a pretrained model (a tiny random Llama saved by transformers
with SmolLM2's tokenizer) written back as a Hugging Face folder that transformers loads. At
learning rate ~0 it is the source model (logits, tokenizer, chat template); after a few updates
its greedy tokens are our sampler's, and its weights are the trained ones, not the source's (a
LoRA run's adapters folded in). The folder holds at its top level only what a Hugging Face model
folder holds (the value head and critic are in `critic/`), readable as any file; with
`AGENTENV_VLLM_PYTHON` naming a vLLM environment's python, vLLM loads it as it is and its greedy
tokens are transformers'."""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import jax
import numpy as np
import pytest
from safetensors import safe_open

from agentenv_jax.config.errors import ConfigError
from agentenv_jax.config.loading import load_config
from agentenv_jax.networks.generation import generate
from agentenv_jax.networks.text_models import language_model_for, text_tokenizer
from agentenv_jax.workflow.export import VALUE_HEAD_FILE, export_run
from agentenv_jax.workflow.text_dialogues import trained_params

from conftest import REPO, agentenv_command, require_reference, run_command, settings

torch = require_reference("torch")
transformers = require_reference("transformers")

PROMPTS = ["3+4=", "0+2=", "4+4="]
# What `transformers`' `save_pretrained` writes for a model and its tokenizer, and the
# value head's subfolder: nothing else may lie at the top level.
MODEL_FOLDER = [
    "chat_template.jinja",
    "config.json",
    "critic",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
]
VLLM_PYTHON = os.environ.get("AGENTENV_VLLM_PYTHON")


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> str:
    """A tiny random Llama (grouped-query attention, untied head) with SmolLM2's tokenizer.
    Heads of 32 (wider than hidden / heads): the narrowest that vLLM's CPU attention takes."""
    from agentenv_jax.checkpoint.gguf_file import smollm2_path

    folder = tmp_path_factory.mktemp("source")
    path = smollm2_path()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    config = transformers.LlamaConfig(
        vocab_size=49152,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=128,
        initializer_range=0.2,  # sharp outputs: a wrong weight changes the greedy tokens
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def trained(source, tmp_path_factory) -> str:
    """A run trained with LoRA adapters on every projection (folded into the exported weights)
    and a critic of its own (the same base, other adapters: exported in `critic/`)."""
    return _train(
        tmp_path_factory.mktemp("runs"),
        "trained",
        source,
        3e-2,
        "network.language_model.lora.rank=4",
        "network.language_model.lora.targets=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]",
        "network.language_model.value_trunk=separate",
    )


def _train(run_dir, name: str, source: str, learning_rate: float, *extra: str) -> str:
    proc = run_command(
        agentenv_command(
            "train",
            "arithmetic_ppo",
            *settings(
                f"run.run_dir={run_dir}",
                f"run.name={name}",
                "run.progress=false",
                f"network.language_model.pretrained={source}",
                "env.kwargs.context_length=40",
                "env.kwargs.response_length=4",
                "env.global_num_envs=8",
                "algorithm.rollout_length=2",
                f"algorithm.learning_rate={learning_rate}",
                "run.total_env_steps=48",
                *extra,
            ),
        ),
        timeout=300,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return str(run_dir / name)


def _chat_ids(tokenizer) -> np.ndarray:
    rows = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True
        )["input_ids"]
        for p in PROMPTS
    ]
    assert len(set(map(len, rows))) == 1  # one length: no padding needed on either side
    return np.asarray(rows, np.int64)


def _logits(model, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(input_ids=torch.from_numpy(ids)).logits.numpy()


def _greedy(model, ids: np.ndarray, new_tokens: int) -> np.ndarray:
    """transformers' greedy continuation of `ids` `[B, T]`: `[B, new_tokens]`, EOS not ending it."""
    with torch.no_grad():
        out = model.generate(
            torch.from_numpy(ids),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
        )
    return out[:, ids.shape[1] :].numpy()


def _modes(folder: Path) -> dict[str, int]:
    """The permission bits of the folder and of everything under it, by relative path."""
    paths = [folder, *folder.rglob("*")]
    return {str(p.relative_to(folder)): stat.S_IMODE(p.stat().st_mode) for p in paths}


@contextlib.contextmanager
def _umask(mask: int) -> Iterator[None]:
    """The process's umask set to `mask` for the block, then restored."""
    previous = os.umask(mask)
    try:
        yield
    finally:
        os.umask(previous)


def _check_layout(out: Path, files: int, folders: int) -> None:
    """A Hugging Face model folder at the top level, the value head in `critic/`, and every file
    and folder with the permission bits `files` and `folders`."""
    assert sorted(p.name for p in out.iterdir()) == MODEL_FOLDER
    assert list(out.glob("*.safetensors")) == [out / "model.safetensors"]
    assert [p.relative_to(out) for p in (out / "critic").iterdir()] == [Path(VALUE_HEAD_FILE)]
    modes = _modes(out)
    assert modes == {path: folders if (out / path).is_dir() else files for path in modes}


@pytest.mark.slow
def test_an_exported_run_is_a_transformers_model(source, trained, run_dir, tmp_path):
    # Rates must be positive; at 1e-30 Adam moves no float32 weight of this size at all.
    still = _train(run_dir, "still", source, 1e-30)
    with _umask(0o022):  # the usual one: files 0644, folders 0755
        proc = run_command(
            agentenv_command("export", still, str(tmp_path / "still")), timeout=120, cwd=REPO
        )
    assert proc.returncode == 0, proc.stderr[-3000:]
    exported = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "still").eval()
    original = transformers.AutoModelForCausalLM.from_pretrained(source).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "still")
    ids = _chat_ids(tokenizer)
    np.testing.assert_array_equal(
        ids, _chat_ids(transformers.AutoTokenizer.from_pretrained(source))
    )
    want = _logits(original, ids)
    assert np.abs(want).max() > 1.0
    np.testing.assert_allclose(_logits(exported, ids), want, atol=1e-5, rtol=0)
    _check_layout(tmp_path / "still", files=0o644, folders=0o755)
    value = safe_open(tmp_path / "still" / VALUE_HEAD_FILE, "np")
    assert sorted(value.keys()) == ["value_head.bias", "value_head.kernel"]

    with _umask(0o022):
        out = export_run(trained, tmp_path / "trained")
    _check_layout(out, files=0o644, folders=0o755)
    critic = safe_open(out / VALUE_HEAD_FILE, "np")
    assert "critic.model.layers.0.self_attn.q_proj.weight" in critic.keys()
    assert critic.get_tensor("value_head.kernel").shape == (32, 1)
    exported = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert np.abs(_logits(exported, ids) - want).max() > 1e-2  # the trained weights
    theirs = _greedy(exported, ids, 4)
    config = load_config(f"{trained}/config.yaml")
    ours_tokenizer = text_tokenizer(config.network.language_model)
    text = ours_tokenizer.text_spec(ids.shape[1], 4)
    lm = language_model_for(config.network.language_model, text)
    # Near-zero temperature: our sampler's choice is the policy's most likely token (EOS too
    # gets no special treatment: `min_new_tokens` keeps transformers from stopping at it).
    ours = generate(
        lm,
        trained_params(trained),
        ids.astype(np.int32),
        jax.random.key(0),
        response_length=4,
        pad_id=text.pad_id,
        eos_id=-1,
        temperature=1e-6,
    )
    np.testing.assert_array_equal(np.asarray(ours.tokens), theirs)

    # Under a stricter umask the export is as private as any other file written then.
    with _umask(0o027):
        private = export_run(trained, tmp_path / "private")
    _check_layout(private, files=0o640, folders=0o750)


# Run by the vLLM environment's python: the folder loaded as it is (tokenizer and chat
# template too), its greedy tokens after each prompt and its tokenizer's chat ids, as JSON.
# vLLM's CPU engine starts its workers by spawning, so the work waits for `__main__`.
_VLLM_GREEDY = """
import json, sys


def main():
    from vllm import LLM, SamplingParams

    folder, prompts, new_tokens = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
    # On CPU the engine reserves this fraction of the machine's memory for its KV cache.
    llm = LLM(model=folder, dtype="float32", max_model_len=128, enforce_eager=True,
              gpu_memory_utilization=0.05, seed=0)
    chat = []
    for prompt in prompts:
        ids = llm.get_tokenizer().apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
        )
        chat.append([int(i) for i in (ids["input_ids"] if hasattr(ids, "keys") else ids)])
    greedy = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True, logprobs=5)
    requests = [{"prompt_token_ids": ids} for ids in chat]
    outputs = [out.outputs[0] for out in llm.generate(requests, greedy)]
    result = {
        "chat_ids": chat,
        "tokens": [list(out.token_ids) for out in outputs],
        # Per prompt and step: the five likeliest tokens' log-probabilities (the model's own).
        "logprobs": [
            [{str(t): float(p.logprob) for t, p in step.items()} for step in out.logprobs]
            for out in outputs
        ],
    }
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
"""


@pytest.mark.slow
@pytest.mark.skipif(
    not VLLM_PYTHON, reason="AGENTENV_VLLM_PYTHON names no vLLM environment (docs/text.md)"
)
def test_vllm_loads_an_export_as_it_is_and_its_greedy_tokens_are_transformers(trained, tmp_path):
    """docs/text.md: vLLM serves the export. Its CPU build, in an environment of its own, loads
    the trained LoRA-and-critic run's folder; its tokenizer writes our chat ids, its greedy
    tokens are transformers', and so are the log-probabilities it gives along them."""
    out = export_run(trained, tmp_path / "export")
    script = tmp_path / "vllm_greedy.py"
    script.write_text(_VLLM_GREEDY)
    proc = run_command(
        [VLLM_PYTHON, str(script), str(out), json.dumps(PROMPTS), "4"],
        timeout=540,
        cwd=tmp_path,
        extra_env={"HF_HUB_OFFLINE": "1"},
    )
    # vLLM's tracebacks run long: the lines naming an error say what stopped it.
    errors = [line for line in proc.stderr.splitlines() if "Error" in line]
    assert proc.returncode == 0, "\n".join(errors[-12:]) or proc.stderr[-4000:]
    (line,) = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    result = json.loads(line.removeprefix("RESULT "))
    ids = _chat_ids(transformers.AutoTokenizer.from_pretrained(out))
    assert result["chat_ids"] == ids.tolist()
    exported = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    tokens = _greedy(exported, ids, 4)
    np.testing.assert_array_equal(np.asarray(result["tokens"]), tokens)
    full = np.concatenate([ids, tokens], axis=1)
    logits = _logits(exported, full)[:, ids.shape[1] - 1 : -1]  # [B, 4, V], before each token
    theirs = torch.log_softmax(torch.from_numpy(logits), -1).numpy()
    for row, steps in enumerate(result["logprobs"]):
        for step, top in enumerate(steps):
            assert len(top) >= 5
            for token, logprob in top.items():
                assert logprob == pytest.approx(theirs[row, step, int(token)], abs=1e-3)


def test_export_refuses_a_run_of_our_own_network_and_a_folder_with_files(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(
        (REPO / "agentenv_jax/experiments/arithmetic_ppo.yaml").read_text()
    )
    with pytest.raises(ConfigError, match="export writes pretrained language models"):
        export_run(run, tmp_path / "out")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    with pytest.raises(ConfigError, match="is not an empty folder"):
        export_run(run, tmp_path / "full")
