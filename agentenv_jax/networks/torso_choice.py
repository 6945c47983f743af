"""Which torso an experiment's `network.torso` names, decided without building it (nor importing
JAX: env ranks check it before they act, `runtime.roles`)."""

from __future__ import annotations

CNN_TORSOS = ("nature_cnn", "impala_cnn")


def resolve_torso(torso: str, image_obs: bool) -> str:
    """The torso an experiment uses: `auto` is `nature_cnn` for image observations and `mlp`
    otherwise; a CNN on non-image observations is a `ValueError` naming the field."""
    if torso == "auto":
        return "nature_cnn" if image_obs else "mlp"
    if torso in CNN_TORSOS and not image_obs:
        raise ValueError(
            f"network.torso = {torso!r} needs image observations (a uint8 Box of shape (H, W) "
            "or (H, W, C)): use 'mlp' or 'auto'"
        )
    return torso
