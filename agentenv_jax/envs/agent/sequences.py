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
from collections.abc import Callable, Sequence


@dataclasses.dataclass(frozen=True)
class ModelCall:
    """One request as the model saw it."""

    prompt_ids: tuple[int, ...]  # the rendered prompt's token ids, as fed to the model
    completion_ids: tuple[int, ...]  # the ids it sampled (a stop token included if sampled)
    # Each sampled id's log-prob under the behaviour policy, where the recorder has them: the
    # agent env sees ids only, and the actor stores the log-probs with the call's step.
    logprobs: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.logprobs is not None and len(self.logprobs) != len(self.completion_ids):
            raise ValueError(
                f"{len(self.completion_ids)} completion ids but {len(self.logprobs)} log-probs"
            )


@dataclasses.dataclass(frozen=True)
class TrainingSequence:
    """Calls joined into one token sequence: `tokens` `[T]`, `trainable` `[T]` (True where the
    model sampled the token) and `logprobs` `[T]` (the behaviour log-prob where trainable,
    0.0 elsewhere; None where a call was recorded without them). `prompt_length` tokens of
    context come before the first completion."""

    tokens: tuple[int, ...]
    trainable: tuple[bool, ...]
    logprobs: tuple[float, ...] | None
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

    scored = all(call.logprobs is not None for call in calls)

    def close() -> None:
        if joined:
            sequences.append(
                TrainingSequence(
                    tuple(tokens),
                    tuple(trainable),
                    tuple(logprobs) if scored else None,
                    prompt_length,
                    joined,
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
        logprobs += call.logprobs or [0.0] * len(call.completion_ids)
        joined += 1
    close()
    return sequences


@dataclasses.dataclass(frozen=True)
class AnsweredCall:
    """A call as the endpoint rendered and answered it, kept for the run's next call."""

    prompt_text: str  # the rendered prompt
    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]  # the end-of-turn id last where the model sampled it
    completion_text: str  # its text as returned, without the end-of-turn token


def prompt_ids_after(
    previous: AnsweredCall | None,
    rendered: str,
    encode: Callable[[str], Sequence[int]],
    eos_token: str,
    eos_id: int,
) -> list[int]:
    """The ids of the prompt `rendered` (a chat template's text): where it extends the previous
    call's prompt and completion as text, those calls' ids exactly as they were fed and
    sampled, then the new text's; else the text's own ids. Re-encoding the whole text would
    re-tokenize the model's completion, which need not give back the ids it sampled."""
    if previous is not None:
        head = previous.prompt_text + previous.completion_text
        ended = bool(previous.completion_ids) and previous.completion_ids[-1] == eos_id
        if ended:
            head += eos_token
        if rendered.startswith(head):
            return [
                *previous.prompt_ids,
                *previous.completion_ids,
                *encode(rendered[len(head) :]),
            ]
    return list(encode(rendered))
