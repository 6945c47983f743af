"""Network shapes and the MultiDiscrete distribution: CNN torsos on small and Atari-size images,
the MLP parameter tree kept as it was, and the product of categoricals against numpy."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentenv_jax.networks import action_distribution, init_params, make_actor_critic
from agentenv_jax.networks.initializers import init_on_host
from agentenv_jax.networks.torso_choice import resolve_torso
from agentenv_jax.networks.torsos import ImpalaCNN, NatureCNN, strided_conv_as_matmul


def _shapes(params) -> dict:
    return jax.tree.map(lambda x: tuple(x.shape), params)


@pytest.mark.slow
@pytest.mark.parametrize(
    "torso, image, features, torso_output",
    [
        # Atari frames: the paper's VALID convolutions, 7x7x64 = 3136 features into dense 512.
        (NatureCNN(), (84, 84, 4), 512, ("Dense_0", "kernel", (3136, 512))),
        # MinAtar- and Catch-size frames: SAME padding, each stride divides the sides (rounding
        # up): 10x10 -> 3x3 -> 2x2 -> 2x2, and 10x5 -> 3x2 -> 2x1 -> 2x1.
        (NatureCNN(), (10, 10, 4), 512, ("Dense_0", "kernel", (2 * 2 * 64, 512))),
        (NatureCNN(), (10, 5, 1), 512, ("Dense_0", "kernel", (2 * 1 * 64, 512))),
        # Each IMPALA stage halves the sides (rounding up): Procgen's 64 -> 32 -> 16 -> 8, and
        # 10 -> 5 -> 3 -> 2.
        (ImpalaCNN(), (64, 64, 3), 256, ("Dense_0", "kernel", (8 * 8 * 32, 256))),
        (ImpalaCNN(), (10, 5, 1), 256, ("Dense_0", "kernel", (2 * 1 * 32, 256))),
    ],
)
def test_cnn_torsos_embed_small_and_atari_size_images(torso, image, features, torso_output):
    x = jnp.zeros((2, *image), jnp.float32)
    params = init_on_host(torso, jax.random.key(0), [jax.ShapeDtypeStruct(x.shape, x.dtype)])
    assert jax.eval_shape(torso.apply, {"params": params}, x).shape == (2, features)
    layer, leaf, shape = torso_output
    assert params[layer][leaf].shape == shape


@pytest.mark.parametrize(
    "image, kernel, stride, padding",
    [
        ((84, 84, 4), (8, 8, 4, 32), (4, 4), "VALID"),  # the Nature CNN's layers on Atari frames
        ((20, 20, 32), (4, 4, 32, 64), (2, 2), "VALID"),
        ((11, 13, 3), (3, 2, 3, 5), (2, 3), ((0, 0), (0, 0))),  # uneven sides and strides
        ((9, 9, 4), (3, 3, 4, 8), (1, 1), "VALID"),  # stride 1: passed to XLA's convolution
        ((9, 9, 4), (3, 3, 4, 8), (2, 2), "SAME"),  # padded: passed on too
    ],
)
def test_strided_convolutions_as_products_of_patches_are_xlas_convolutions(
    image, kernel, stride, padding
):
    """Outputs and both gradients, against `lax.conv_general_dilated` itself."""
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.random((3, *image), np.float32))
    w = jnp.asarray(rng.standard_normal(kernel, np.float32))
    numbers = ("NHWC", "HWIO", "NHWC")

    def xla(x, w):
        return jax.lax.conv_general_dilated(x, w, stride, padding, dimension_numbers=numbers)

    def ours(x, w):
        dims = jax.lax.conv_dimension_numbers(x.shape, w.shape, numbers)
        return strided_conv_as_matmul(x, w, stride, padding, dimension_numbers=dims)

    np.testing.assert_allclose(ours(x, w), xla(x, w), rtol=1e-4, atol=1e-4)
    for expected, got in zip(
        jax.grad(lambda x, w: jnp.sum(jnp.sin(xla(x, w))), (0, 1))(x, w),
        jax.grad(lambda x, w: jnp.sum(jnp.sin(ours(x, w))), (0, 1))(x, w),
        strict=True,
    ):
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_the_nature_cnn_computes_what_xlas_convolutions_do_with_the_same_parameters():
    """On the CPU its strided layers are products of patches: the parameter tree is flax's
    `nn.Conv`'s and the embedding of Atari frames the one XLA's convolutions give."""
    import flax.linen as nn

    class XLANatureCNN(nn.Module):
        @nn.compact
        def __call__(self, x):
            for features, kernel, stride in ((32, 8, 4), (64, 4, 2), (64, 3, 1)):
                x = nn.relu(nn.Conv(features, (kernel, kernel), (stride, stride), "VALID")(x))
            return nn.relu(nn.Dense(512)(x.reshape(x.shape[0], -1)))

    x = jnp.asarray(np.random.default_rng(1).random((2, 84, 84, 4), np.float32))
    params = init_on_host(NatureCNN(), jax.random.key(0), [jax.ShapeDtypeStruct(x.shape, x.dtype)])
    assert _shapes(params) == _shapes(XLANatureCNN().init(jax.random.key(0), x)["params"])
    np.testing.assert_allclose(
        NatureCNN().apply({"params": params}, x),
        XLANatureCNN().apply({"params": params}, x),
        rtol=1e-4,
        atol=1e-5,
    )


@pytest.mark.slow
def test_actor_critic_with_a_cnn_shares_the_torso_and_keeps_batch_axes():
    module, apply_fn = make_actor_critic(
        "multi_discrete", 7, 3, (64,), (64,), "tanh", 0.0, torso="impala_cnn", image_obs=True
    )
    params = init_params(module, (10, 5, 2), jax.random.key(0))
    assert set(params) == {"torso", "Dense_0", "Dense_1"}  # one torso, two linear heads
    assert params["Dense_0"]["kernel"].shape == (256, 7)
    frames = np.random.default_rng(0).integers(0, 256, (4, 3, 10, 5, 2), dtype=np.uint8)
    head, value = apply_fn(params, frames)  # [T, B, H, W, C] as the IMPALA loss passes it
    assert head.shape == (4, 3, 7) and value.shape == (4, 3)
    # Pixels are scaled inside: uint8 frames and the same values as float32 act alike.
    head_f, value_f = apply_fn(params, frames.astype(np.float32))
    np.testing.assert_allclose(head, head_f, rtol=1e-6)
    np.testing.assert_allclose(value, value_f, rtol=1e-6)


def test_two_dimensional_images_get_a_channel_axis():
    module, apply_fn = make_actor_critic(
        "discrete", 3, 2, (), (), "tanh", 0.0, torso="nature_cnn", image_obs=True
    )
    params = init_params(module, (10, 5), jax.random.key(1))
    assert params["torso"]["Conv_0"]["kernel"].shape == (8, 8, 1, 32)
    assert apply_fn(params, jnp.zeros((6, 10, 5), jnp.uint8))[0].shape == (6, 3)


def test_mlp_parameter_tree_is_unchanged():
    """Checkpoints of MLP runs stay loadable: the tree is what it always was."""
    module, _ = make_actor_critic("continuous", 2, 1, (16, 8), (16,), "tanh", 0.0)
    assert _shapes(init_params(module, (4,), jax.random.key(0))) == {
        "actor_torso": {
            "Dense_0": {"kernel": (4, 16), "bias": (16,)},
            "Dense_1": {"kernel": (16, 8), "bias": (8,)},
        },
        "Dense_0": {"kernel": (8, 2), "bias": (2,)},
        "log_std": (2,),
        "critic_torso": {"Dense_0": {"kernel": (4, 16), "bias": (16,)}},
        "Dense_1": {"kernel": (16, 1), "bias": (1,)},
    }


def test_mlp_on_images_scales_pixels():
    module, apply_fn = make_actor_critic("discrete", 2, 3, (8,), (8,), "tanh", 0.0)
    scaled_module, scaled_fn = make_actor_critic(
        "discrete", 2, 3, (8,), (8,), "tanh", 0.0, image_obs=True
    )
    params = init_params(module, (4, 4, 1), jax.random.key(2))
    frames = np.full((1, 4, 4, 1), 255, np.uint8)
    np.testing.assert_allclose(
        scaled_fn(params, frames)[1], apply_fn(params, frames / 255.0)[1], rtol=1e-6
    )


def test_auto_torso_is_a_cnn_for_images_only_and_a_cnn_needs_images():
    assert resolve_torso("auto", image_obs=True) == "nature_cnn"
    assert resolve_torso("auto", image_obs=False) == "mlp"
    assert resolve_torso("mlp", image_obs=True) == "mlp"
    with pytest.raises(ValueError, match="network.torso = 'impala_cnn' needs image observations"):
        resolve_torso("impala_cnn", image_obs=False)


def _numpy_log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def test_multi_discrete_log_prob_and_entropy_match_a_numpy_reference():
    nvec = (3, 4, 2)
    rng = np.random.default_rng(11)
    logits = rng.normal(size=(5, sum(nvec))).astype(np.float32)
    actions = np.stack([rng.integers(0, n, 5) for n in nvec], axis=-1).astype(np.int32)
    dist = action_distribution("multi_discrete", nvec)
    expected_log_prob, expected_entropy = np.zeros(5), np.zeros(5)
    start = 0
    for i, n in enumerate(nvec):
        log_p = _numpy_log_softmax(logits[:, start : start + n].astype(np.float64))
        expected_log_prob += log_p[np.arange(5), actions[:, i]]
        expected_entropy += -(np.exp(log_p) * log_p).sum(axis=-1)
        start += n
    np.testing.assert_allclose(dist.log_prob(logits, actions), expected_log_prob, rtol=1e-5)
    np.testing.assert_allclose(dist.entropy(logits), expected_entropy, rtol=1e-5)
    assert dist.mode(logits).shape == (5, 3) and dist.mode(logits).dtype == jnp.int32


def test_multi_discrete_samples_follow_each_sub_distribution():
    nvec = (2, 3)
    probs = [np.array([0.2, 0.8]), np.array([0.5, 0.3, 0.2])]
    logits = np.log(np.concatenate(probs)).astype(np.float32)
    noise = np.random.default_rng(4).gumbel(size=(40000, 5)).astype(np.float32)
    dist = action_distribution("multi_discrete", nvec)
    samples = np.asarray(dist.sample(jnp.broadcast_to(logits, (40000, 5)), noise))
    assert samples.shape == (40000, 2) and samples.dtype == np.int32
    for i, p in enumerate(probs):
        frequencies = np.bincount(samples[:, i], minlength=len(p)) / len(samples)
        np.testing.assert_allclose(frequencies, p, atol=0.01)


def test_multi_discrete_needs_its_sub_action_counts():
    with pytest.raises(ValueError, match="needs nvec"):
        action_distribution("multi_discrete")
