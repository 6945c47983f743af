"""Single-turn text tasks from reasoning-gym's procedural datasets (`reasoning_gym/<dataset>`).

reasoning-gym (`pip install 'agentenv_jax[text]'`) generates each question from a seed, and the
few data files it needs (word lists) ship in the wheel: nothing is downloaded. Its import is
lazy, so this module loads without it. The datasets below are the ones tested here; their
difficulty is set through dataset kwargs, which pass to the dataset's config as they are:

* `basic_arithmetic`: `min_terms`/`max_terms`, `min_digits`/`max_digits`, `operators`
  (of `+-*/`), `allow_parentheses`, `allow_negation`;
* `chain_sum`: `min_terms`/`max_terms`, `min_digits`/`max_digits`, `allow_negation`;
* `leg_counting`: `min_animals`/`max_animals`, `min_instances`/`max_instances`;
* `number_sorting`: `min_numbers`/`max_numbers`, `min_decimals`/`max_decimals`,
  `min_value`/`max_value`;
* `spell_backward`: `min_word_len`/`max_word_len`;
* `puzzle24`: `min_value`/`max_value` (within 1..10), `operators`;
* `mini_sudoku`: `min_empty`/`max_empty` (within 0..12);
* `gsm_symbolic`: grade-school math word problems (`difficulty`), integer answers;
* `countdown`: reach a target from given numbers (`min_numbers`/`max_numbers`,
  `min_value`/`max_value`, `min_target`/`max_target`), an expression as the answer.

The adapter's own kwargs: `seed_offset`; `split` (`train` or `test`, `test` held out for
`agentenv eval --split test`) and `test_fraction` (default 0.5): a question belongs to one side
by a hash of its text (`question_split`), so no question text is ever on both sides, however
small the problem space; `answer_format` (`dataset`:
the dataset's scorer reads the whole message; `last_number` or `boxed`: the answer is cut out
first, the last number or the last `\\boxed{}`, and checked numerically against a numeric gold
answer, with math-verify where installed, else by the dataset's scorer); `instruction`, appended
to every question (e.g. "Put the final answer in \\boxed{}.").

Any other registered reasoning-gym dataset passes through too, untested. Questions are long
(60-450 bytes at the defaults) and some answers too (`number_sorting`: up to ~90 bytes,
`mini_sudoku`: 31), so size `context_length` and `response_length` to the dataset.
"""

from __future__ import annotations

import dataclasses
import difflib
from types import ModuleType
from typing import Any

import numpy as np

from agentenv_jax.envs.spaces import EnvError
from agentenv_jax.envs.text.tasks import (
    TASK_SPLITS,
    TaskReply,
    answer_text,
    parse_number,
    question_split,
    require_int,
    require_split,
)
from agentenv_jax.envs.text.verification import numbers_match

# Dataset name -> what it asks (and how long its answers run at the default difficulty).
REASONING_GYM_TASKS: dict[str, str] = {
    "basic_arithmetic": "evaluate an integer expression of + - * / (answers 1-16 bytes)",
    "chain_sum": "add and subtract a chain of integers (answers 1-6 bytes)",
    "leg_counting": "count the legs of a list of animals (answers 2-3 bytes)",
    "number_sorting": "sort numbers ascending or descending, as a list (answers 24-92 bytes)",
    "spell_backward": "spell an English word backwards (answers 3-10 bytes)",
    "puzzle24": "make 24 from four numbers 1-10 with + - * / (answers ~7-15 bytes)",
    "mini_sudoku": "solve a 4x4 sudoku, rows on lines (answers 31 bytes)",
    "gsm_symbolic": "solve a grade-school math word problem (integer answers)",
    "countdown": "reach a target from 3-4 numbers with + - * / (an expression)",
}
# Entries are drawn by index from one dataset of this size; reasoning-gym generates entry `i` of
# a dataset seeded `s` from `Random(s + i)` on demand, so the size costs nothing. Splitting the
# indices would not hold questions out: on a small problem space (chain_sum of two one-digit
# numbers has 200 questions) different seeds generate the same question, so the split is by
# the question's text instead, and a draw from the other side is drawn again.
_INDEX_RANGE = 2**31
# Datasets that hold per-entry state for their whole size (gsm_symbolic: which of its 100
# templates each entry uses, 8 bytes an entry) are made with this many entries instead.
_MATERIALIZED_RANGE = 2**20
_MATERIALIZING = ("gsm_symbolic", "list_functions", "acre")
_ANSWER_FORMATS = ("dataset", "last_number", "boxed")
# Set by the adapter, not the user: the seed comes from the episode's rng.
_RESERVED = ("seed", "size")
_ADAPTER_KWARGS = ["seed_offset", "split", "test_fraction", "answer_format", "instruction"]
# Draws of the other side's questions before a split is taken to be empty: with a test
# fraction f, the chance that 1,000 draws miss a side holding a share s of the questions is
# (1 - s)^1000, nil for any share a split is meant to have.
_MAX_DRAWS = 1000


def import_reasoning_gym() -> ModuleType:
    """The `reasoning_gym` module; `EnvError` saying how to install it when missing."""
    try:
        import reasoning_gym
    except ImportError as err:
        raise EnvError(
            f"reasoning_gym/<dataset> envs need reasoning-gym ({err}): "
            "pip install 'agentenv_jax[text]'"
        ) from None
    return reasoning_gym


def reasoning_gym_datasets() -> list[str]:
    """The names of every dataset the installed reasoning-gym registers (sorted)."""
    import_reasoning_gym()
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


def _config_class(dataset_name: str) -> type:
    """The config dataclass of `dataset_name`; `EnvError` with a did-you-mean when unknown."""
    import_reasoning_gym()
    from reasoning_gym.factory import DATASETS

    if not isinstance(dataset_name, str) or dataset_name not in DATASETS:
        names = sorted(DATASETS)
        close = difflib.get_close_matches(str(dataset_name), names, n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        others = [name for name in names if name not in REASONING_GYM_TASKS]
        raise EnvError(
            f"env.id = 'reasoning_gym/{dataset_name}': no reasoning-gym dataset "
            f"{dataset_name!r}{hint}; tested: {', '.join(REASONING_GYM_TASKS)}; "
            f"also registered: {', '.join(others)}"
        )
    return DATASETS[dataset_name][1]


def reasoning_gym_kwargs(dataset_name: str) -> list[str]:
    """The kwargs a `ReasoningGymTask` of `dataset_name` takes: the adapter's own and the
    dataset's config fields but `seed` and `size` (`EnvError` for an unknown dataset)."""
    fields = [field.name for field in dataclasses.fields(_config_class(dataset_name))]
    return _ADAPTER_KWARGS + [name for name in fields if name not in _RESERVED]


class ReasoningGymTask:
    """One reasoning-gym dataset as a single-turn task: the prompt is an entry's question (and
    `instruction`), the reward the dataset's own `score_answer` of the message (whitespace
    stripped) or, with `answer_format` `last_number` or `boxed`, of the answer cut out of it
    (a numeric gold answer is compared as a number: `verification.numbers_match`); success a
    score of 1.0.

    Entries are drawn by index from the dataset seeded `seed_offset`, keeping the first whose
    question belongs to `split` (`question_split`: a `test_fraction` of the questions, by a
    hash of their text, are held out), so the episode's rng decides the question; another
    `seed_offset` gives other questions for the same rng. `dataset_kwargs` set the difficulty
    (see the module docstring). Unknown datasets, unknown kwargs and configs the dataset
    rejects are `EnvError`s, raised here rather than mid-run.
    """

    max_turns = 1

    def __init__(
        self,
        dataset_name: str,
        seed_offset: int = 0,
        split: str = "train",
        test_fraction: float = 0.5,
        answer_format: str = "dataset",
        instruction: str = "",
        **dataset_kwargs: Any,
    ):
        reasoning_gym = import_reasoning_gym()
        allowed = reasoning_gym_kwargs(dataset_name)
        for name in dataset_kwargs:
            if name in _RESERVED:
                raise EnvError(
                    f"env.kwargs.{name} is set by the env for reasoning-gym datasets (entries "
                    "follow reset's seed); use env.kwargs.seed_offset for other questions"
                )
            if name not in allowed:
                close = difflib.get_close_matches(name, allowed, n=1, cutoff=0.6)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise EnvError(
                    f"env.kwargs.{name} is not a kwarg of reasoning-gym dataset "
                    f"{dataset_name!r}{hint}; allowed: {', '.join(allowed)}"
                )
        seed_offset = require_int("env.kwargs.seed_offset", seed_offset, 0)
        test_fraction = require_split(split, test_fraction)
        if answer_format not in _ANSWER_FORMATS:
            raise EnvError(
                f"env.kwargs.answer_format = {answer_format!r} is not allowed: expected one of "
                f"{', '.join(_ANSWER_FORMATS)}"
            )
        if not isinstance(instruction, str):
            raise EnvError(f"env.kwargs.instruction = {instruction!r}: expected a string")
        self.dataset_name = dataset_name
        self.split = split
        self.test_fraction = test_fraction
        self._size = _MATERIALIZED_RANGE if dataset_name in _MATERIALIZING else _INDEX_RANGE
        self._answer_format = answer_format
        self._instruction = instruction
        try:
            self._dataset = reasoning_gym.create_dataset(
                dataset_name, seed=seed_offset, size=self._size, **dataset_kwargs
            )
            # Generate one entry now: some configs fail only when an entry is generated.
            self._dataset[0]
        except Exception as err:
            # reasoning-gym checks configs with `assert` (AssertionError), others fail with
            # TypeError or ValueError: report any of them as the kwargs' fault.
            raise EnvError(
                f"env.kwargs = {dataset_kwargs!r} do not fit reasoning-gym dataset "
                f"{dataset_name!r}: {type(err).__name__}: {err}"
            ) from err
        self.entry: dict[str, Any] | None = None  # the current episode's question and answer

    def distinct_questions(self, entries: int) -> dict[str, int]:
        """How many distinct questions each split holds among the dataset's first `entries`
        entries (every question of a small problem space, given enough entries): the sizes
        that say how much a held-out score is worth."""
        questions = {str(self._dataset[index]["question"]) for index in range(entries)}
        sides = [question_split(question, self.test_fraction) for question in questions]
        return {split: sides.count(split) for split in TASK_SPLITS}

    def reset(self, rng: np.random.Generator) -> str:
        for _ in range(_MAX_DRAWS):
            entry = self._dataset[int(rng.integers(self._size))]
            if question_split(str(entry["question"]), self.test_fraction) == self.split:
                break
        else:
            raise EnvError(
                f"env.kwargs.split = {self.split!r}: {_MAX_DRAWS} draws of reasoning-gym "
                f"dataset {self.dataset_name!r} found no question of this split "
                f"(test_fraction {self.test_fraction}); the problem space is too small to split"
            )
        self.entry = entry
        question = str(self.entry["question"])
        return f"{question}\n{self._instruction}" if self._instruction else question

    def reply(self, message: str) -> TaskReply:
        if self.entry is None:
            raise RuntimeError("ReasoningGymTask.reply before reset")
        score = self.score(message)
        return TaskReply(text=None, reward=score, done=True, success=score >= 1.0)

    def score(self, message: str) -> float:
        """The reward of `message` answering the current entry."""
        answer = message.strip()
        if self._answer_format != "dataset":
            answer = answer_text(message, self._answer_format)
            if answer is None:
                return 0.0
            gold = str(self.entry["answer"])
            if parse_number(gold) is not None:
                return 1.0 if numbers_match(gold, answer) else 0.0
        try:
            return float(self._dataset.score_answer(answer=answer, entry=self.entry))
        except Exception:
            # Scorers parse free text and some raise on text they cannot parse (e.g.
            # prime_factorization's int()): such an answer is simply wrong.
            return 0.0
