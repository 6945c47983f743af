"""CNN torsos for image observations, and which torso an experiment uses (`network.torso`).

Both CNNs map uint8-valued images `[N, H, W, C]` (already scaled to [0, 1] by the caller) to an
embedding `[N, F]` that the actor and critic heads share, as in pixel PPO and IMPALA agents.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from agentenv_jax.networks.initializers import orthogonal, zeros

# Smallest side on which the Nature CNN's VALID convolutions leave at least one position:
# 8x8/4 -> 4x4/2 -> 3x3/1 needs 36 pixels. Smaller images (MinAtar's 10x10, Catch) use SAME.
NATURE_VALID_MIN_SIZE = 36

_RELU_GAIN = float(np.sqrt(2))


def strided_conv_as_matmul(
    lhs: jax.Array,
    rhs: jax.Array,
    window_strides,
    padding,
    lhs_dilation=None,
    rhs_dilation=None,
    dimension_numbers=None,
    feature_group_count: int = 1,
    precision=None,
) -> jax.Array:
    """`lax.conv_general_dilated` for flax's `nn.Conv` (`conv_general_dilated=`), computing a
    VALID convolution of stride > 1 as one matrix product of its patches: `lhs [N, H, W, C]`,
    `rhs [kh, kw, C, F]` -> `[N, OH, OW, F]`, with patches laid out `(i, j, c)` as `rhs` is.

    XLA's CPU backend runs such convolutions' gradients ~1.6x slower than the product (the
    Nature CNN's 8x8/4 and 4x4/2 layers on 256 Atari frames: 229 against 141 ms, measured
    here); any other convolution is passed to `lax.conv_general_dilated` as it is."""
    strides = tuple(window_strides)
    dilated = any(d != 1 for d in (*(lhs_dilation or ()), *(rhs_dilation or ())))
    valid = padding == "VALID" or all(tuple(p) == (0, 0) for p in padding)
    if max(strides) == 1 or dilated or feature_group_count != 1 or not valid or lhs.ndim != 4:
        return jax.lax.conv_general_dilated(
            lhs,
            rhs,
            strides,
            padding,
            lhs_dilation=lhs_dilation,
            rhs_dilation=rhs_dilation,
            dimension_numbers=dimension_numbers,
            feature_group_count=feature_group_count,
            precision=precision,
        )
    kh, kw, channels, features = rhs.shape
    (sh, sw), (_, height, width, _) = strides, lhs.shape
    oh, ow = (height - kh) // sh + 1, (width - kw) // sw + 1
    patches = jnp.concatenate(
        [
            lhs[:, i : i + sh * (oh - 1) + 1 : sh, j : j + sw * (ow - 1) + 1 : sw, :]
            for i in range(kh)
            for j in range(kw)
        ],
        axis=-1,
    )
    return jnp.dot(patches, rhs.reshape(kh * kw * channels, features), precision=precision)


def _conv(features: int, kernel: int, stride: int, padding: str) -> nn.Conv:
    # On the CPU, strided VALID convolutions (the Nature CNN's on Atari frames) are products of
    # their patches: the same parameters and outputs, a faster gradient there.
    on_cpu = jax.default_backend() == "cpu"
    return nn.Conv(
        features,
        (kernel, kernel),
        (stride, stride),
        padding=padding,
        kernel_init=orthogonal(_RELU_GAIN),
        bias_init=zeros,
        conv_general_dilated=strided_conv_as_matmul if on_cpu else None,
    )


def _dense(width: int) -> nn.Dense:
    return nn.Dense(
        width,
        kernel_init=orthogonal(_RELU_GAIN),
        bias_init=zeros,
    )


class NatureCNN(nn.Module):
    """Mnih et al. (2015): conv 32 8x8/4, 64 4x4/2, 64 3x3/1, dense 512, relu throughout.

    Padding is VALID as in the paper when both image sides are at least
    `NATURE_VALID_MIN_SIZE` (84x84 Atari frames give the paper's 7x7x64 features), SAME below.
    """

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        """`x [N, H, W, C]` float32 -> `[N, 512]`."""
        padding = "VALID" if min(x.shape[1:3]) >= NATURE_VALID_MIN_SIZE else "SAME"
        for features, kernel, stride in ((32, 8, 4), (64, 4, 2), (64, 3, 1)):
            x = nn.relu(_conv(features, kernel, stride, padding)(x))
        return nn.relu(_dense(512)(x.reshape(x.shape[0], -1)))


class _ResidualBlock(nn.Module):
    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        channels = x.shape[-1]
        y = _conv(channels, 3, 1, "SAME")(nn.relu(x))
        y = _conv(channels, 3, 1, "SAME")(nn.relu(y))
        return x + y


class ImpalaCNN(nn.Module):
    """Espeholt et al. (2018), the deep (ResNet) torso: for each of 16, 32, 32 channels a 3x3
    conv, a 3x3 max-pool of stride 2 and two residual blocks; then relu, dense 256, relu.
    SAME padding throughout, so any image size works (each stage halves it, rounding up)."""

    channels: tuple[int, ...] = (16, 32, 32)

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        """`x [N, H, W, C]` float32 -> `[N, 256]`."""
        for channels in self.channels:
            x = _conv(channels, 3, 1, "SAME")(x)
            x = nn.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")
            x = _ResidualBlock()(x)
            x = _ResidualBlock()(x)
        x = nn.relu(x).reshape(x.shape[0], -1)
        return nn.relu(_dense(256)(x))


def image_batch(obs: jax.Array, obs_ndim: int) -> tuple[jax.Array, tuple[int, ...]]:
    """Images `[..., H, W(, C)]` of pixel values 0..255 (any dtype) as `[N, H, W, C]` float32 in
    [0, 1], with the leading batch shape `[...]` to restore on the output."""
    batch_shape = obs.shape[: obs.ndim - obs_ndim]
    x = obs.reshape((-1, *obs.shape[obs.ndim - obs_ndim :])).astype(jnp.float32) / 255.0
    if obs_ndim == 2:
        x = x[..., None]
    return x, batch_shape


def cnn_torso(name: str) -> nn.Module:
    """The CNN module called `name` (one of `CNN_TORSOS`), named "torso" in the params tree."""
    return {"nature_cnn": NatureCNN, "impala_cnn": ImpalaCNN}[name](name="torso")
