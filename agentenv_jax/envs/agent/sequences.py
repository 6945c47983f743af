"""From an agent run's recorded model calls to training sequences, tokens in and tokens out.

An agent program talks to the policy through chat requests; the endpoint records, for every
call, the exact prompt ids it fed the model, the ids the model sampled and their log-probs
under the behaviour policy. Re-tokenizing the transcript afterwards would not give those ids
back (a tokenizer merges differently across message boundaries), so training uses the records
alone.

Most agents send each call the whole history: the next prompt is the previous prompt, the
previous completion, and the new tool or user turns. Such calls make one sequence: the model's
completions are trained on, everything between them (the tool results, the template's role
markers) is context, masked out. An agent that edits or truncates its history breaks that
chain; the next call then starts a new sequence, and every sequence of the run is trained on
the run's reward.

Pure functions of lists of ints and floats.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence


@dataclasses.dataclass(frozen=True)
class ModelCall:
    """One request as the model saw it."""

    prompt_ids: tuple[int, ...]  # the rendered prompt's token ids, as fed to the model
    completion_ids: tuple[int, ...]  # the ids it sampled (a stop token included if sampled)
    logprobs: tuple[float, ...]  # each sampled id's log-prob under the behaviour policy

    def __post_init__(self) -> None:
        if len(self.logprobs) != len(self.completion_ids):
            raise ValueError(
                f"{len(self.completion_ids)} completion ids but {len(self.logprobs)} log-probs"
            )


@dataclasses.dataclass(frozen=True)
class TrainingSequence:
    """Calls joined into one token sequence: `tokens` `[T]`, `trainable` `[T]` (True where the
    model sampled the token) and `logprobs` `[T]` (the behaviour log-prob where trainable,
    0.0 elsewhere). `prompt_length` tokens of context come before the first completion."""

    tokens: tuple[int, ...]
    trainable: tuple[bool, ...]
    logprobs: tuple[float, ...]
    prompt_length: int
    calls: int  # how many calls it joins


def _extends(prefix: Sequence[int], prompt: Sequence[int]) -> bool:
    return len(prompt) >= len(prefix) and tuple(prompt[: len(prefix)]) == tuple(prefix)


def join_calls(calls: Sequence[ModelCall]) -> list[TrainingSequence]:
    """The run's calls as training sequences: a call whose prompt starts with the sequence so
    far (the previous prompt and completion) extends it, its new prompt tokens as context;
    any other call starts a new sequence (see the module)."""
    sequences: list[TrainingSequence] = []
    tokens: list[int] = []
    trainable: list[bool] = []
    logprobs: list[float] = []
    prompt_length = 0
    joined = 0

    def close() -> None:
        if joined:
            sequences.append(
                TrainingSequence(
                    tuple(tokens), tuple(trainable), tuple(logprobs), prompt_length, joined
                )
            )

    for call in calls:
        if joined and _extends(tokens, call.prompt_ids):
            context = call.prompt_ids[len(tokens) :]
        else:
            close()
            tokens, trainable, logprobs, joined = [], [], [], 0
            context = call.prompt_ids
            prompt_length = len(context)
        tokens += context
        trainable += [False] * len(context)
        logprobs += [0.0] * len(context)
        tokens += call.completion_ids
        trainable += [True] * len(call.completion_ids)
        logprobs += call.logprobs
        joined += 1
    close()
    return sequences
