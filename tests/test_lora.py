"""LoRA adapters on a Llama-family policy: zero-initialised adapters leave the base model's
outputs as they are, adapted generation's KV cache agrees with the uncached pass, the adapters
folded into the weights compute what the adapted model does, and a token-level PPO update
trains the adapters (and the value head) alone: the base does not move, the optimizer holds
state for the trained leaves only, and the frozen base is the KL reference (no copy kept)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from test_llama_policy import CONFIG, EOS, PAD, padded_contexts, sharpened
from test_token_ppo import REWARD, TEXT, make_text_rollout, text_config

from agentenv_jax.checkpoint.hugging_face import save_folder
from agentenv_jax.checkpoint.store import CheckpointStore
from agentenv_jax.config.errors import ConfigError
from agentenv_jax.config.loading import load_config
from agentenv_jax.config.schema import LanguageModelConfig, LoRAConfig
from agentenv_jax.learner.on_policy_model import OnPolicyModel
from agentenv_jax.learner.text_training import language_model_training
from agentenv_jax.networks.generation import generate
from agentenv_jax.networks.llama import spec_from_config
from agentenv_jax.networks.llama_policy import LlamaPolicySpec, make_llama_policy, random_trunk
from agentenv_jax.networks.lora import (
    ADAPTERS,
    TARGETS,
    LoRASpec,
    merged_trunk,
    plain_trunks,
    without_adapters,
)

from conftest import EXPERIMENTS

EVERY_TARGET = LoRASpec(rank=4, alpha=8.0, targets=TARGETS)


def adapted_policy(critic: str = "shared", lora: LoRASpec = EVERY_TARGET):
    model = spec_from_config(CONFIG)
    return make_llama_policy(LlamaPolicySpec(model, max_length=32, critic=critic, lora=lora))


def with_moved_adapters(params: dict, seed: int) -> dict:
    """`params` whose adapters' `b` are drawn too (they start at zero), large enough that the
    adapted model's outputs differ from the base's."""
    rng = np.random.default_rng(seed)
    adapters = jax.tree.map(
        lambda x: np.asarray(x) + rng.normal(0.0, 0.3, np.shape(x)).astype(np.float32),
        params[ADAPTERS],
    )
    return params | {ADAPTERS: adapters}


@pytest.mark.parametrize("critic", ["shared", "separate"])
def test_zero_initialised_adapters_give_the_base_models_outputs(critic):
    lm = adapted_policy(critic)
    params = sharpened(lm, seed=1)
    # One frozen base, whatever the trunks: the separate critic is the base with its own
    # adapters, not a copy of it.
    assert set(params) == {"policy", "value_head", ADAPTERS}
    assert set(params[ADAPTERS]) == set(lm.spec.trunks)
    tokens = jnp.asarray(padded_contexts())
    mask = (tokens != PAD).astype(jnp.int32)
    logits, values = jax.jit(lm.apply)(params, tokens, mask)
    base_logits, base_values = jax.jit(lm.apply)(without_adapters(params), tokens, mask)
    assert float(jnp.abs(base_logits).max()) > 1.0
    np.testing.assert_allclose(logits, base_logits, atol=1e-6, rtol=0)
    np.testing.assert_allclose(values, base_values, atol=1e-6, rtol=0)
    moved = with_moved_adapters(params, seed=3)
    moved_logits, moved_values = jax.jit(lm.apply)(moved, tokens, mask)
    assert float(jnp.abs(moved_logits - base_logits).max()) > 0.1
    assert float(jnp.abs(moved_values - base_values).max()) > 1e-3


def test_adapted_generation_caches_what_the_uncached_pass_computes():
    lm = adapted_policy("separate")
    params = with_moved_adapters(sharpened(lm, seed=4), seed=6)
    runs = [
        jax.jit(
            generate, static_argnames=("lm", "response_length", "pad_id", "eos_id", "use_cache")
        )(
            lm,
            params,
            jnp.asarray(padded_contexts()),
            jax.random.key(7),
            response_length=8,
            pad_id=PAD,
            eos_id=EOS,
            use_cache=use_cache,
        )
        for use_cache in (True, False)
    ]
    np.testing.assert_array_equal(runs[0].tokens, runs[1].tokens)
    np.testing.assert_allclose(runs[0].log_probs, runs[1].log_probs, atol=1e-4)
    np.testing.assert_allclose(runs[0].values, runs[1].values, atol=1e-4)


def test_folded_adapters_compute_what_the_adapted_model_does():
    """`merged_trunk` (export's weights) against the adapted forward pass, per trunk."""
    lm = adapted_policy("separate")
    params = with_moved_adapters(sharpened(lm, seed=8), seed=10)
    plain = make_llama_policy(dataclasses.replace(lm.spec, lora=None))
    trunks = plain_trunks(params, lm.spec.lora)
    assert set(trunks) == {"policy", "critic"}
    tokens = jnp.asarray(padded_contexts())
    mask = (tokens != PAD).astype(jnp.int32)
    want = jax.jit(lm.apply)(params, tokens, mask)
    got = jax.jit(plain.apply)(trunks | {"value_head": params["value_head"]}, tokens, mask)
    np.testing.assert_allclose(got[0], want[0], atol=2e-4, rtol=1e-4)
    np.testing.assert_allclose(got[1], want[1], atol=2e-4, rtol=1e-4)
    # Zero adapters fold into the base unchanged.
    zero = jax.tree.map(np.zeros_like, params[ADAPTERS]["policy"])
    for a, b in zip(
        jax.tree.leaves(merged_trunk(params["policy"], zero, lm.spec.lora)),
        jax.tree.leaves(params["policy"]),
        strict=True,
    ):
        np.testing.assert_array_equal(a, b)


def test_lora_settings_are_checked():
    base = str(EXPERIMENTS / "arithmetic_ppo.yaml")
    with pytest.raises(ConfigError, match=r"lora\.rank.*pretrained"):
        load_config(base, ["network.language_model.lora.rank=4"])
    with pytest.raises(ConfigError, match=r"lora\.rank = -1"):
        load_config(base, ["network.language_model.lora.rank=-1"])
    with pytest.raises(ConfigError, match=r"lora\.alpha"):
        load_config(base, ["network.language_model.lora.alpha=0"])
    with pytest.raises(ConfigError, match=r"lora\.targets.*qkv"):
        load_config(base, ["network.language_model.lora.targets=[qkv]"])
    with pytest.raises(ConfigError, match=r"lora\.targets"):
        load_config(base, ["network.language_model.lora.targets=[q_proj, q_proj]"])


# -- the update ------------------------------------------------------------------------------


def _sizes(tree) -> int:
    return sum(int(np.size(leaf)) for leaf in jax.tree.leaves(tree))


@pytest.fixture(scope="module")
def lora_model(tmp_path_factory):
    """A random qwen2 checkpoint saved as a Hugging Face folder, and the token-PPO model that
    `lora.rank: 4` on its q and v projections builds over it."""
    model_spec = spec_from_config(CONFIG | {"vocab_size": TEXT.vocab_size})
    folder = tmp_path_factory.mktemp("qwen2")
    save_folder(folder, model_spec, random_trunk(model_spec, jax.random.key(0)))
    config = text_config(learning_rate=1e-2)
    language_model = LanguageModelConfig(
        pretrained=str(folder), lora=LoRAConfig(rank=4, alpha=8.0, targets=("q_proj", "v_proj"))
    )
    config = dataclasses.replace(
        config, network=dataclasses.replace(config.network, language_model=language_model)
    )
    config.validate()
    model = OnPolicyModel(*language_model_training(config, TEXT, 10, lambda x: x))
    return model, language_model


@pytest.mark.slow
def test_an_update_trains_the_adapters_alone_against_the_frozen_base(lora_model, tmp_path):
    from agentenv_jax.networks.text_models import language_model_for

    model, language_model = lora_model
    params = model.init_params(jax.random.key(1))
    state = jax.jit(model.train_state)(params, jax.random.key(2))
    assert state.ref_params is None  # no second copy of the model
    trained = {ADAPTERS: state.params[ADAPTERS], "value_head": state.params["value_head"]}
    assert set(state.params[ADAPTERS]["policy"]) == {"q_proj", "v_proj"}
    # Adam's moments (and its step count) are the only optimizer state: two of each trained
    # leaf, none of the base's.
    adam = [
        s
        for s in jax.tree.leaves(
            state.opt_state, is_leaf=lambda x: isinstance(x, optax.ScaleByAdamState)
        )
        if isinstance(s, optax.ScaleByAdamState)
    ]
    assert _sizes((adam[0].mu, adam[0].nu)) == 2 * _sizes(trained)
    assert _sizes(state.opt_state) - _sizes((adam[0].mu, adam[0].nu)) <= 2  # the counts
    assert _sizes(state.opt_state) < _sizes(state.params["policy"]) // 10

    lm = language_model_for(language_model, TEXT)
    rollout = make_text_rollout(lm, state.params, seed=0, reward=REWARD)
    update = jax.jit(model.update)
    before = jax.tree.map(np.array, state.params)
    state, metrics = update(state, rollout)
    assert abs(float(metrics["kl_to_reference"])) < 1e-5  # zero adapters: the base itself
    after = jax.tree.map(np.array, state.params)
    base = zip(jax.tree.leaves(after["policy"]), jax.tree.leaves(before["policy"]), strict=True)
    for got, want in base:
        np.testing.assert_array_equal(got, want)
    for name, group in (("adapters", ADAPTERS), ("value head", "value_head")):
        changed = jax.tree.map(lambda a, b: bool(np.any(a != b)), after[group], before[group])
        assert all(jax.tree.leaves(changed)), f"every {name} leaf is trained: {changed}"
    # The reference is the frozen base: the KL the update reports is the policy's to it.
    state, metrics = update(state, make_text_rollout(lm, state.params, seed=1))
    assert float(metrics["kl_to_reference"]) > 1e-4
    # A checkpoint holds no reference either, and restores as it was saved.
    store = CheckpointStore(tmp_path, keep=1)
    store.save(2, state, {"updates": 2})
    restored, _ = store.restore(state)
    store.close()
    assert restored.ref_params is None
    saved = (state.params, state.opt_state)
    for got, want in zip(
        jax.tree.leaves((restored.params, restored.opt_state)), jax.tree.leaves(saved), strict=True
    ):
        np.testing.assert_array_equal(got, want)
