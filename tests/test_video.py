"""`agentenv eval --video`: one MP4 per episode through Gymnasium's RecordVideo, and a clear
error for an env that renders no frames."""

from __future__ import annotations

import imageio.v2 as imageio
import pytest

from agentenv_jax.config import load_config
from agentenv_jax.envs import EnvError
from agentenv_jax.runtime.launch import train
from agentenv_jax.workflow.evaluation import evaluate, evaluation_env

from conftest import EXPERIMENTS, agentenv_command, run_command, settings


def decoded(path) -> tuple[int, tuple[int, int]]:
    """Frames in an MP4 and their (width, height), read back by ffmpeg."""
    reader = imageio.get_reader(path)
    try:
        return sum(1 for _ in reader), tuple(reader.get_meta_data()["size"])
    finally:
        reader.close()


@pytest.mark.slow
def test_catch_episodes_are_recorded_frame_by_frame(run_dir, tmp_path):
    config = load_config(
        EXPERIMENTS / "catch_ppo.yaml",
        [f"run.run_dir={run_dir}", "run.name=c", "run.total_env_steps=1", "run.progress=false"],
    )
    result = train(config)
    videos = tmp_path / "videos"
    evaluation = evaluate(result.run_dir, episodes=3, video_dir=videos)
    assert evaluation.videos == tuple(
        videos / f"eval-update{result.updates}-episode-{i}.mp4" for i in range(3)
    )
    assert sorted(videos.iterdir()) == list(evaluation.videos)
    for path, length in zip(evaluation.videos, evaluation.lengths, strict=True):
        frames, size = decoded(path)
        assert size == (5 * 16, 10 * 16)  # 10 x 5 cells of 16 pixels
        assert frames in (length, length + 1)  # the first frame, then one per step
    # Without --video, nothing is recorded.
    assert evaluate(result.run_dir, episodes=1).videos == ()


def test_an_env_without_rgb_array_frames_is_a_clear_error():
    config = load_config(None, ["env.id=envs_for_tests:counter_env"])
    with pytest.raises(EnvError, match=r"--video: env.id = 'envs_for_tests:counter_env' "):
        evaluation_env(config, EXPERIMENTS, "eval")


@pytest.mark.slow
def test_cli_video_of_cartpole(run_dir, tmp_path):
    """The CLI flag, on CartPole's pygame renderer: 600x400 frames, one MP4 per episode."""
    made = run_command(
        [
            *agentenv_command("train", "cartpole_ppo"),
            *settings(f"run.run_dir={run_dir}", "run.name=cp", "run.total_env_steps=256"),
        ],
        timeout=120,
        cwd=tmp_path,
    )
    assert made.returncode == 0, made.stderr[-3000:]
    proc = run_command(
        agentenv_command("eval", str(run_dir / "cp"), "--episodes", "2", "--video", "clips"),
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "videos     2 in clips" in proc.stdout
    clips = sorted((tmp_path / "clips").iterdir())
    assert [c.name for c in clips] == ["eval-update1-episode-0.mp4", "eval-update1-episode-1.mp4"]
    assert all(decoded(c)[1] == (600, 400) for c in clips)
    assert "XDG_RUNTIME_DIR" not in proc.stderr  # no display is looked for
