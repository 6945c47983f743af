"""Tokenizers of the text envs: the built-in byte-level one, and the protocol others follow."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from agentenv_jax.envs.spaces import EnvError, TextSpec
from agentenv_jax.envs.text.tasks import Prompt, prompt_text


class Tokenizer(Protocol):
    """What a text env needs of a tokenizer: its special ids, and text <-> token ids."""

    vocab_size: int
    pad_id: int
    bos_id: int
    eos_id: int

    def encode(self, text: str) -> np.ndarray:
        """`text` as token ids, `int32 [n]`, without special tokens."""
        ...

    def decode(self, ids: np.ndarray) -> str:
        """The text of `ids` (`int [n]`) up to the first `eos_id`, special tokens skipped."""
        ...

    def text_spec(self, context_length: int, response_length: int) -> TextSpec:
        """The layout of an env's observations `[context_length]` and actions
        `[response_length]` under this tokenizer."""
        ...

    def dialogue_start(self, prompt: Prompt) -> np.ndarray:
        """The ids of a dialogue's first context, before the policy's first message (`prompt`:
        its text, or chat messages)."""
        ...

    def after_message(
        self, messages: list[dict[str, str]], reply: str, role: str = "user"
    ) -> np.ndarray:
        """The ids appended after a message's EOS when the env answers `reply` as a `role`
        turn (user, or tool: a tool's result); `messages` is the dialogue so far as chat
        messages, that message last."""
        ...


class ByteTokenizer:
    """UTF-8 bytes as tokens: ids 0..255 are byte values, then PAD, BOS, EOS and one spare id.

    Nothing to download and every string has an encoding. The spare id 259 pads the vocabulary
    to 260, a multiple of 4, so embedding tables shard evenly over a 4-way model axis; it
    decodes as nothing.
    """

    PAD = 256
    BOS = 257
    EOS = 258
    SPARE = 259
    vocab_size = 260
    pad_id = PAD
    bos_id = BOS
    eos_id = EOS

    def encode(self, text: str) -> np.ndarray:
        """The UTF-8 bytes of `text` as `int32 [n]` ids in 0..255 (no special tokens)."""
        return np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.int32)

    def decode(self, ids: np.ndarray) -> str:
        """The text of `ids` (`int [n]`): the bytes before the first EOS, PAD/BOS/spare skipped,
        invalid UTF-8 replaced by U+FFFD. `EnvError` for ids outside `0..vocab_size - 1`."""
        ids = np.asarray(ids).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise EnvError(
                f"token ids must lie in 0..{self.vocab_size - 1} (ByteTokenizer), got "
                f"values from {int(ids.min())} to {int(ids.max())}"
            )
        eos = np.flatnonzero(ids == self.EOS)
        if eos.size:
            ids = ids[: eos[0]]
        data = ids[ids < 256].astype(np.uint8).tobytes()
        return data.decode("utf-8", errors="replace")

    def text_spec(self, context_length: int, response_length: int) -> TextSpec:
        """The token layout of an env with observations `[context_length]` and actions
        `[response_length]`."""
        return TextSpec(
            vocab_size=self.vocab_size,
            context_length=context_length,
            response_length=response_length,
            pad_id=self.PAD,
            bos_id=self.BOS,
            eos_id=self.EOS,
        )

    def dialogue_start(self, prompt: Prompt) -> np.ndarray:
        """BOS, then the prompt's bytes (a chat prompt's contents one after another)."""
        return np.concatenate([[self.BOS], self.encode(prompt_text(prompt))]).astype(np.int32)

    def after_message(
        self, messages: list[dict[str, str]], reply: str, role: str = "user"
    ) -> np.ndarray:
        """The reply's bytes (the message's EOS already separates them), a tool's result
        behind `tool: `."""
        return self.encode(f"tool: {reply}" if role == "tool" else reply)


BYTE_TOKENIZER = ByteTokenizer()
