"""A user's dataset as a text env (`agentenv_jax/Dataset-v0`): the same rows read from JSONL,
Parquet, CSV and a `datasets` save_to_disk folder, TRL's and verl's row layouts as those tools
write them, the held-out split by distinct prompt, a JSONL file read without loading it whole,
and every bad file named with what is wrong."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from agentenv_jax.config import load_config
from agentenv_jax.envs.spaces import EnvError
from agentenv_jax.envs.text import BYTE_TOKENIZER, make_text_vector_env
from agentenv_jax.envs.text.dataset_tasks import DatasetTask
from agentenv_jax.envs.text.datasets import open_rows
from agentenv_jax.envs.text.tasks import question_split
from agentenv_jax.workflow.evaluation import with_split

from conftest import require_reference

ROWS = [
    {"prompt": f"What is {a} + {b}?", "answer": str(a + b), "level": a % 3}
    for a in range(12)
    for b in range(10)
]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def write_all_formats(folder: Path, rows: list[dict]) -> dict[str, Path]:
    """`rows` as JSONL (by hand), Parquet and CSV (by pandas) and a save_to_disk folder (by
    Hugging Face `datasets`, as its users write one)."""
    pandas = require_reference("pandas")
    datasets = require_reference("datasets")
    frame = pandas.DataFrame(rows)
    paths = {
        "jsonl": write_jsonl(folder / "rows.jsonl", rows),
        "parquet": folder / "rows.parquet",
        "csv": folder / "rows.csv",
        "arrow": folder / "rows_dataset",
    }
    frame.to_parquet(paths["parquet"], row_group_size=37)  # several row groups
    frame.to_csv(paths["csv"], index=False)
    datasets.Dataset.from_list(rows).save_to_disk(str(paths["arrow"]), max_shard_size="2KB")
    return paths


def test_every_format_gives_the_same_prompts_and_answers(tmp_path):
    paths = write_all_formats(tmp_path, ROWS)
    assert len(list((paths["arrow"]).glob("*.arrow"))) > 1  # several shards read in order
    for fmt, path in paths.items():
        rows = open_rows(path)
        assert len(rows) == len(ROWS), fmt
        for index in (0, 1, 36, 37, 59, len(ROWS) - 1):
            row = rows[index]
            # CSV has no types: every value is text.
            assert str(row["prompt"]) == ROWS[index]["prompt"], (fmt, index)
            assert str(row["answer"]) == ROWS[index]["answer"], (fmt, index)
    # And the same episodes: the same prompts drawn from the same seed.
    transcripts = {}
    for fmt, path in paths.items():
        env = make_text_vector_env(
            "agentenv_jax/Dataset-v0", 4, {"path": str(path), "context_length": 64}
        )
        env.reset(seed=3)
        transcripts[fmt] = [env.transcript(i) for i in range(4)]
    assert len({tuple(t) for t in transcripts.values()}) == 1, transcripts


def test_a_verl_parquet_row_and_a_trl_conversational_row_load_as_written(tmp_path):
    pandas = require_reference("pandas")
    # verl's examples/data_preprocess/gsm8k.py writes these rows (verl 0.9.1).
    verl_rows = [
        {
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": f"Natalia has {n} clips. How many?"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(2 * n)},
            "extra_info": {"split": "train", "index": n, "answer": "...", "question": "..."},
        }
        for n in range(20)
    ]
    pandas.DataFrame(verl_rows).to_parquet(tmp_path / "train.parquet")
    task = DatasetTask(str(tmp_path / "train.parquet"), test_fraction=0.0)
    assert task.answer_column == "reward_model.ground_truth"
    prompt = task.reset(np.random.default_rng(0))
    assert prompt == [{"role": "user", "content": prompt[0]["content"]}]
    n = int(prompt[0]["content"].split()[2])
    assert task.reply(f"She has {2 * n} clips").reward == 1.0
    assert task.reply(f"She has {2 * n + 1} clips").reward == 0.0

    # TRL's conversational prompt-only format (docs: dataset_formats), a system prompt set.
    trl_rows = [
        {"prompt": [{"role": "user", "content": f"Spell {w} backwards."}], "solution": w[::-1]}
        for w in ("cat", "dog", "bird", "fish")
    ]
    write_jsonl(tmp_path / "trl.jsonl", trl_rows)
    task = DatasetTask(
        str(tmp_path / "trl.jsonl"),
        test_fraction=0.0,
        system_prompt="Answer with the word only.",
        rewards=[{"function": "accuracy", "kwargs": {"answer_format": "exact"}}],
    )
    assert task.answer_column == "solution"
    prompt = task.reset(np.random.default_rng(1))
    assert prompt[0] == {"role": "system", "content": "Answer with the word only."}
    word = prompt[1]["content"].split()[1]
    assert task.reply(word[::-1]).reward == 1.0


def test_the_held_out_split_shares_no_prompt_text_with_training(tmp_path):
    # Every prompt three times over: a split by row would put copies on both sides.
    path = write_jsonl(tmp_path / "rows.jsonl", ROWS * 3)
    sides = {}
    for split in ("train", "test"):
        env = make_text_vector_env(
            "agentenv_jax/Dataset-v0",
            8,
            {"path": str(path), "split": split, "test_fraction": 0.25, "context_length": 64},
        )
        env.reset(seed=0)
        seen = set()
        for _ in range(60):
            seen.update(env.transcript(i) for i in range(8))
            env.step(np.full((8, 128), BYTE_TOKENIZER.eos_id, np.int32))
        sides[split] = seen
    assert sides["train"] and sides["test"]
    assert not sides["train"] & sides["test"]
    assert all(question_split(p, 0.25) == "test" for p in sides["test"])
    counts = DatasetTask(str(path), test_fraction=0.25).data.distinct_prompts()
    assert sum(counts.values()) == len(ROWS)  # distinct prompts, not rows
    assert counts["test"] == sum(question_split(r["prompt"], 0.25) == "test" for r in ROWS)
    assert 0.15 * len(ROWS) < counts["test"] < 0.35 * len(ROWS)
    # A test file instead of a fraction: test episodes come from it alone.
    test_file = write_jsonl(tmp_path / "test.jsonl", [{"prompt": "Held out?", "answer": "1"}])
    task = DatasetTask(str(path), test_path=str(test_file), split="test")
    assert task.reset(np.random.default_rng(0)) == "Held out?"
    assert DatasetTask(str(path), test_path=str(test_file)).reset(np.random.default_rng(0)) in {
        r["prompt"] for r in ROWS
    }


@pytest.mark.slow
def test_eval_split_test_draws_the_held_out_prompts_only(tmp_path):
    path = write_jsonl(tmp_path / "rows.jsonl", ROWS)
    config = load_config(
        None,
        [
            "env.id=agentenv_jax/Dataset-v0",
            f"env.kwargs={{path: {path}, test_fraction: 0.25, context_length: 64}}",
        ],
    )
    held_out = with_split(config, "test")
    assert held_out.env.kwargs["split"] == "test"
    env = make_text_vector_env(held_out.env.id, 8, held_out.env.kwargs)
    env.reset(seed=0)
    prompts = {env.transcript(i) for i in range(8)}
    assert all(question_split(p, 0.25) == "test" for p in prompts)


@pytest.mark.slow
def test_a_jsonl_file_larger_than_memory_is_read_row_by_row(tmp_path):
    """A 1 GB JSONL trains without being loaded whole: a child process limited to 512 MB of
    address space beyond its start opens it and draws episodes."""
    path = tmp_path / "big.jsonl"
    row = {"prompt": "x" * 1000, "answer": "1"}
    line = (json.dumps(row) + "\n").encode()
    block = line * 4096
    with open(path, "wb") as f:
        while f.tell() < 2**30:
            f.write(block)
    rows = path.stat().st_size // len(line)
    script = f"""
import resource, sys
import numpy as np
from agentenv_jax.envs.text.dataset_tasks import DatasetTask
start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
task = DatasetTask({str(path)!r}, test_fraction=0.0)
rng = np.random.default_rng(0)
for _ in range(1000):
    task.reset(rng)
grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - start
print(len(task.data.rows), grown)
"""
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=600, check=True
    )
    count, grown_kb = map(int, out.stdout.split())
    assert count == rows
    # The line index is 16 bytes a row (~16 MB here); the file is 1 GB.
    assert grown_kb < 100 * 1024, f"resident memory grew {grown_kb / 1024:.0f} MB"


@pytest.mark.parametrize(
    ("content", "kwargs", "message"),
    [
        ("", {}, r"rows\.jsonl: the file holds no rows \(an empty JSONL file\)"),
        ('{"prompt": "a", "answer": "1"}\n{"prompt": "b", "answer": \n', {}, "line 2 is not valid"),
        ('["a", "1"]\n', {}, "line 1 is a JSON list, expected an object"),
        (
            '{"question": "a", "answer": "1"}\n',
            {},
            "env.kwargs.prompt_column = 'prompt': .* has no such column; its columns: question, "
            "answer",
        ),
        (
            '{"prompt": "a", "label": "1"}\n',
            {},
            "'accuracy' needs the rows' answers.*set env.kwargs.answer_column",
        ),
        (
            '{"prompt": "a", "answer": "1"}\n',
            {"answer_column": "gold"},
            "env.kwargs.answer_column = 'gold': .* has no such column",
        ),
        ('{"prompt": "a", "answer": "1"}\n', {"test_fraction": 1.5}, "test_fraction = 1.5"),
        ('{"prompt": 7, "answer": "1"}\n', {}, "row 0's 'prompt' is 7; expected a string"),
    ],
)
def test_bad_dataset_files_are_named_with_what_is_wrong(tmp_path, content, kwargs, message):
    path = tmp_path / "rows.jsonl"
    path.write_text(content)
    with pytest.raises(EnvError, match=message):
        task = DatasetTask(str(path), **({"test_fraction": 0.0} | kwargs))
        task.reset(np.random.default_rng(0))
        task.reset(np.random.default_rng(1))


def test_bad_paths_and_formats_are_named(tmp_path):
    require_reference("pyarrow")
    (tmp_path / "fake.parquet").write_text("not parquet at all")
    with pytest.raises(EnvError, match=r"fake\.parquet: not a Parquet file"):
        open_rows(tmp_path / "fake.parquet")
    with pytest.raises(EnvError, match=r"env\.kwargs\.path = .*missing\.jsonl.*no such file"):
        open_rows(tmp_path / "missing.jsonl")
    (tmp_path / "rows.txt").write_text("a\n")
    with pytest.raises(EnvError, match=r"unknown dataset format '\.txt'; allowed: \.jsonl"):
        open_rows(tmp_path / "rows.txt")
    (tmp_path / "empty.csv").write_text("prompt,answer\n")
    with pytest.raises(EnvError, match="holds no rows"):
        open_rows(tmp_path / "empty.csv")
    datasets = require_reference("datasets")
    dict_folder = tmp_path / "dict"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS[:4])}).save_to_disk(
        str(dict_folder)
    )
    with pytest.raises(EnvError, match=r"a DatasetDict folder \(splits train\); name one"):
        open_rows(dict_folder)
    assert len(open_rows(dict_folder / "train")) == 4
