"""Write a GSM-style dataset as JSONL files, train and test, for `agentenv_jax/Dataset-v0`:
reasoning-gym's `gsm_symbolic` word problems (generated offline from its templates), one row a
distinct question, `{"prompt": question, "answer": integer}` (TRL's prompt-only layout with an
answer column), split by a hash of the question text (`tasks.question_split`), so no question
is on both sides.

    python tools/gsm_symbolic_jsonl.py                       # data/gsm_symbolic/{train,test}.jsonl
    python tools/gsm_symbolic_jsonl.py --out DIR --rows 4000 --test-fraction 0.1 --seed 0

It prints how many distinct questions each file holds. `experiments/gsm_symbolic_smollm2.yaml`
trains on them.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import reasoning_gym

from agentenv_jax.envs.text.tasks import question_split


def write(out: Path, rows: int, test_fraction: float, seed: int) -> dict[str, int]:
    """Draw entries until `rows` distinct questions are found; write each to its side's file.
    Returns the number of questions in each file."""
    dataset = reasoning_gym.create_dataset("gsm_symbolic", seed=seed, size=rows * 4)
    seen: set[str] = set()
    sides: dict[str, list[dict[str, str]]] = {"train": [], "test": []}
    for index in range(len(dataset)):
        entry = dataset[index]
        question = str(entry["question"])
        if question in seen:
            continue
        seen.add(question)
        row = {"prompt": question, "answer": str(entry["answer"])}
        sides[question_split(question, test_fraction)].append(row)
        if len(seen) == rows:
            break
    out.mkdir(parents=True, exist_ok=True)
    for side, side_rows in sides.items():
        with open(out / f"{side}.jsonl", "w") as f:
            f.writelines(json.dumps(row) + "\n" for row in side_rows)
    return {side: len(side_rows) for side, side_rows in sides.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("data/gsm_symbolic"))
    parser.add_argument("--rows", type=int, default=4000, help="distinct questions in all")
    parser.add_argument("--test-fraction", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    counts = write(args.out, args.rows, args.test_fraction, args.seed)
    for side, count in counts.items():
        print(f"{args.out / f'{side}.jsonl'}: {count} distinct questions")


if __name__ == "__main__":
    main()
