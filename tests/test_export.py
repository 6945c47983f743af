"""`agentenv export`: a run of a pretrained model (a tiny random Llama saved by transformers
with SmolLM2's tokenizer) written back as a Hugging Face folder that transformers loads. At
learning rate ~0 it is the source model (logits, tokenizer, chat template); after a few updates
its greedy tokens are our sampler's, and its weights are the trained ones, not the source's (a
LoRA run's adapters folded in)."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from safetensors import safe_open

from agentenv_jax.config.errors import ConfigError
from agentenv_jax.config.loading import load_config
from agentenv_jax.networks.generation import generate
from agentenv_jax.networks.text_models import language_model_for, text_tokenizer
from agentenv_jax.workflow.export import export_run
from agentenv_jax.workflow.text_dialogues import trained_params

from conftest import REPO, agentenv_command, require_reference, run_command, settings

torch = require_reference("torch")
transformers = require_reference("transformers")

PROMPTS = ["3+4=", "0+2=", "4+4="]


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> str:
    """A tiny random Llama (grouped-query attention, untied head) with SmolLM2's tokenizer."""
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
        max_position_embeddings=128,
        initializer_range=0.2,  # sharp outputs: a wrong weight changes the greedy tokens
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


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


@pytest.mark.slow
def test_an_exported_run_is_a_transformers_model(source, run_dir, tmp_path):
    # Rates must be positive; at 1e-30 Adam moves no float32 weight of this size at all.
    still = _train(run_dir, "still", source, 1e-30)
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
    assert (tmp_path / "still" / "value_head.safetensors").is_file()

    # Trained with LoRA adapters on every projection (folded into the exported weights) and a
    # critic of its own (the same base, other adapters: exported beside the model).
    trained = _train(
        run_dir,
        "trained",
        source,
        3e-2,
        "network.language_model.lora.rank=4",
        "network.language_model.lora.targets=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]",
        "network.language_model.value_trunk=separate",
    )
    out = export_run(trained, tmp_path / "trained")
    critic = safe_open(out / "value_head.safetensors", "np")
    assert "critic.model.layers.0.self_attn.q_proj.weight" in critic.keys()
    exported = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert np.abs(_logits(exported, ids) - want).max() > 1e-2  # the trained weights
    with torch.no_grad():
        theirs = exported.generate(
            torch.from_numpy(ids), max_new_tokens=4, do_sample=False, min_new_tokens=4
        )[:, ids.shape[1] :].numpy()
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
