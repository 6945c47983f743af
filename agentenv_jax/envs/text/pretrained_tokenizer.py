"""A pretrained model's own tokenizer and chat template: read from a Hugging Face folder
(`tokenizer.json` through the `tokenizers` library, `tokenizer_config.json` or
`chat_template.jinja` for the template) or from the vocabulary inside a GGUF file; dialogues
rendered with the template as `transformers`' `apply_chat_template` renders them (the same
sandboxed jinja environment, filters, `generation` tag and special-token variables).

Token in, token out: a text env keeps the ids the policy generated and appends, after each
message, only the tokens of what the template writes after that message's end-of-turn token
(`PretrainedTokenizer.after_message`), so no generated message is ever decoded and re-encoded.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from agentenv_jax.envs.spaces import EnvError, TextSpec
from agentenv_jax.envs.text.gguf_reader import open_gguf
from agentenv_jax.envs.text.tasks import Prompt, prompt_messages

Message = Mapping[str, Any]

# How a GGUF file's byte-level vocabulary splits text before its merges, by `tokenizer.ggml.pre`
# (the split regexes these vocabularies were trained with); any other pre-tokenizer name gets
# GPT-2's split, as transformers' GGUF reader does.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GGUF_SPLITS = {
    "llama3": _LLAMA3_SPLIT,
    "llama-v3": _LLAMA3_SPLIT,
    "llama-bpe": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT,
}
_GGUF_CONTROL = 3  # llama.cpp's token type of control tokens (special: never split)


@functools.cache
def _generation_block() -> type:
    """transformers' `{% generation %}...{% endgeneration %}` tag, a jinja extension: its
    assistant-token mask (`return_assistant_tokens_mask`) marks what the block renders, and the
    text is the body's, rendered unchanged. Parsed as transformers parses it, into a call block,
    so that the body is a scope of its own here too (a plain `set` inside it stays there)."""
    import jinja2.ext
    import jinja2.nodes

    class GenerationBlock(jinja2.ext.Extension):
        tags = {"generation"}

        def parse(self, parser: Any) -> jinja2.nodes.Node:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            call = self.call_method("_body")
            return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

        def _body(self, caller: Callable[[], str]) -> str:
            return caller()

    return GenerationBlock


class ChatTemplate:
    """A checkpoint's jinja chat template, compiled in a sandbox as transformers compiles it
    (with its `generation` tag)."""

    def __init__(self, source: str, special_tokens: Mapping[str, str | None]):
        import jinja2
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise jinja2.exceptions.TemplateError(message)

        def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            # Jinja's own tojson escapes HTML characters; templates expect plain JSON.
            return json.dumps(
                x,
                ensure_ascii=ensure_ascii,
                indent=indent,
                separators=separators,
                sort_keys=sort_keys,
            )

        env = ImmutableSandboxedEnvironment(
            trim_blocks=True,
            lstrip_blocks=True,
            extensions=[_generation_block(), jinja2.ext.loopcontrols],
        )
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        self.source = source
        self._template = env.from_string(source)
        self._special = {name: token for name, token in special_tokens.items() if token}

    def render(
        self,
        messages: Sequence[Message],
        add_generation_prompt: bool = False,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> str:
        """The text of `messages` (dicts with `role` and `content`; keys whose value is None are
        dropped, as transformers drops them)."""
        plain = [{k: v for k, v in m.items() if v is not None} for m in messages]
        return self._template.render(
            messages=plain,
            tools=list(tools) if tools else None,
            documents=None,
            add_generation_prompt=add_generation_prompt,
            **self._special,
        )


class PretrainedTokenizer:
    """A text env's tokenizer (`envs.text.tokenizer.Tokenizer`) from a pretrained checkpoint.

    `vocab_size` is the model's embedding rows (at least the tokenizer's own vocabulary:
    checkpoints pad their embeddings to a round number). `pad_id` marks padding in contexts and
    is never generated, so it must not be the end-of-turn token `eos_id` (which stays in the
    dialogue after each message): the checkpoint's pad token if it is another, else its first
    special token that is neither BOS nor EOS nor written by the chat template.
    """

    def __init__(
        self,
        backend: Any,  # a `tokenizers.Tokenizer`
        *,
        source: str,
        vocab_size: int,
        eos_token: str,
        bos_token: str | None,
        pad_token: str | None,
        chat_template: str | None,
        special_tokens: Sequence[str],
    ):
        self.backend = backend
        self.source = source
        self.vocab_size = vocab_size
        self.eos_token = eos_token
        self.eos_id = self._id(eos_token, "eos_token")
        self.bos_token = bos_token
        self.special_tokens = tuple(special_tokens)
        tokens = {"bos_token": bos_token, "eos_token": eos_token, "pad_token": pad_token}
        self.chat = None if chat_template is None else ChatTemplate(chat_template, tokens)
        self.pad_token = self._choose_pad(pad_token, chat_template or "")
        self.pad_id = self._id(self.pad_token, "pad_token")
        self.bos_id = self.pad_id if bos_token is None else self._id(bos_token, "bos_token")

    def _id(self, token: str, what: str) -> int:
        token_id = self.backend.token_to_id(token)
        if token_id is None:
            raise EnvError(f"{self.source}: its {what} {token!r} is not in its vocabulary")
        return int(token_id)

    def _choose_pad(self, pad_token: str | None, template: str) -> str:
        if pad_token and pad_token != self.eos_token:
            return pad_token
        for token in self.special_tokens:
            if token not in (self.eos_token, self.bos_token) and token not in template:
                return token
        raise EnvError(
            f"{self.source}: no special token can pad contexts: its pad token is its end-of-turn "
            f"token {self.eos_token!r}, and every other special token is used by its chat template"
        )

    @property
    def tokenizer_vocab_size(self) -> int:
        return int(self.backend.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str) -> np.ndarray:
        """`text` as token ids; special tokens written in it (as a chat template writes them)
        are read as those tokens."""
        return np.asarray(self.backend.encode(text, add_special_tokens=False).ids, np.int32)

    def decode(self, ids: np.ndarray) -> str:
        """The text of `ids` up to the first `eos_id`, special tokens skipped; ids past the
        tokenizer's own vocabulary (embedding padding) decode as nothing."""
        ids = np.asarray(ids).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise EnvError(
                f"token ids must lie in 0..{self.vocab_size - 1} ({self.source}), got values "
                f"from {int(ids.min())} to {int(ids.max())}"
            )
        eos = np.flatnonzero(ids == self.eos_id)
        if eos.size:
            ids = ids[: eos[0]]
        ids = ids[ids < self.tokenizer_vocab_size]
        return self.backend.decode(ids.tolist(), skip_special_tokens=True)

    def text_spec(self, context_length: int, response_length: int) -> TextSpec:
        return TextSpec(
            vocab_size=self.vocab_size,
            context_length=context_length,
            response_length=response_length,
            pad_id=self.pad_id,
            bos_id=self.bos_id,
            eos_id=self.eos_id,
        )

    def encode_chat(
        self,
        messages: Sequence[Message],
        add_generation_prompt: bool,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> np.ndarray:
        """The ids of `messages` rendered by the chat template (`apply_chat_template(...,
        tokenize=True)`'s), with the JSON schemas of `tools` if the template shows them."""
        return self.encode(self._require_chat().render(messages, add_generation_prompt, tools))

    def dialogue_start(self, prompt: Prompt) -> np.ndarray:
        """The first context of a dialogue: the prompt as a user turn (or its chat messages,
        a system turn among them) and the assistant's header (the template's own system turn,
        if it adds one)."""
        return self.encode_chat(prompt_messages(prompt), True)

    def after_message(
        self, messages: Sequence[Message], reply: str, role: str = "user"
    ) -> np.ndarray:
        """The ids that follow an assistant message's end-of-turn token when the env answers
        `reply` as the next `role` turn (user, or tool: a tool's result, as the template
        renders tool turns): what the template writes after that token, through the next
        assistant header. `messages` is the dialogue up to and including that message."""
        chat = self._require_chat()
        before = chat.render(messages, add_generation_prompt=False)
        after = chat.render([*messages, {"role": role, "content": reply}], True)
        cut = before.rfind(self.eos_token)
        if cut < 0 or after[: cut + len(self.eos_token)] != before[: cut + len(self.eos_token)]:
            raise EnvError(
                f"{self.source}: its chat template does not end an assistant message with its "
                f"end-of-turn token {self.eos_token!r} and keep the dialogue before a new turn "
                "unchanged, which a multi-turn env needs"
            )
        return self.encode(after[cut + len(self.eos_token) :])

    def save(self, folder: str | Path) -> None:
        """Write `tokenizer.json`, `tokenizer_config.json` (its special tokens and chat
        template) and `chat_template.jinja` to `folder`, as transformers' `save_pretrained`
        does, so that `AutoTokenizer.from_pretrained(folder)` reads this tokenizer."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.backend.save(str(folder / "tokenizer.json"))
        config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "pad_token": self.pad_token,
            "clean_up_tokenization_spaces": False,
        }
        if self.chat is not None:
            config["chat_template"] = self.chat.source
            (folder / "chat_template.jinja").write_text(self.chat.source)
        (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2))

    def _require_chat(self) -> ChatTemplate:
        if self.chat is None:
            raise EnvError(f"{self.source}: no chat template (tokenizer_config.json or GGUF)")
        return self.chat


def _bytes_to_unicode() -> dict[int, str]:
    """Byte-level BPE's spelling of bytes as printable characters (GPT-2's table)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    codes, extra = list(printable), 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            codes.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, codes), strict=True))


def _token_content(token: Any) -> str | None:
    if isinstance(token, Mapping):
        return token.get("content")
    return token


def _folder_tokenizer(folder: Path, vocab_size: int) -> PretrainedTokenizer:
    from tokenizers import Tokenizer

    path = folder / "tokenizer.json"
    if not path.is_file():
        raise EnvError(f"{folder}: no tokenizer.json (the tokenizer of a Hugging Face folder)")
    backend = Tokenizer.from_file(str(path))
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: the default one
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    if (folder / "chat_template.jinja").is_file():
        template = (folder / "chat_template.jinja").read_text()
    eos = _token_content(config.get("eos_token"))
    if eos is None:
        raise EnvError(f"{config_path}: no eos_token (the end of an assistant message)")
    specials = [t.content for t in backend.get_added_tokens_decoder().values() if t.special]
    return PretrainedTokenizer(
        backend,
        source=str(folder),
        vocab_size=vocab_size,
        eos_token=eos,
        bos_token=_token_content(config.get("bos_token")),
        pad_token=_token_content(config.get("pad_token")),
        chat_template=template,
        special_tokens=specials,
    )


def _gguf_tokenizer(path: Path, vocab_size: int) -> PretrainedTokenizer:
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    reader = open_gguf(path)

    def value(key: str, default: Any = None) -> Any:
        field = reader.fields.get(key)
        return default if field is None else field.contents()

    kind = value("tokenizer.ggml.model")
    if kind != "gpt2":
        raise EnvError(
            f"{path}: tokenizer.ggml.model {kind!r} is not supported; supported: gpt2 "
            "(byte-level BPE, as Llama 3, SmolLM2 and Qwen use)"
        )
    tokens = value("tokenizer.ggml.tokens")
    if not tokens:
        raise EnvError(f"{path}: no tokenizer.ggml.tokens (the vocabulary)")
    types = value("tokenizer.ggml.token_type") or [1] * len(tokens)
    spelling = _bytes_to_unicode()
    alphabet = set(spelling.values())
    vocab = {
        token if set(token) <= alphabet else "".join(spelling[b] for b in token.encode()): i
        for i, token in enumerate(tokens)
    }
    merges = [tuple(merge.split(" ", 1)) for merge in value("tokenizer.ggml.merges") or []]
    backend = Tokenizer(models.BPE(vocab, merges, fuse_unk=False))
    split = _GGUF_SPLITS.get(value("tokenizer.ggml.pre"))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=split is None)
    backend.pre_tokenizer = (
        byte_level
        if split is None
        else pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(split), behavior="isolated"), byte_level]
        )
    )
    backend.decoder = decoders.ByteLevel()
    specials = [
        token
        for token, kind in zip(tokens, types, strict=True)
        if kind == _GGUF_CONTROL and set(token) <= alphabet
    ]
    backend.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in specials])

    def token_of(key: str) -> str | None:
        token_id = value(f"tokenizer.ggml.{key}")
        return None if token_id is None else tokens[int(token_id)]

    eos = token_of("eos_token_id")
    if eos is None:
        raise EnvError(f"{path}: no tokenizer.ggml.eos_token_id (the end of an assistant message)")
    return PretrainedTokenizer(
        backend,
        source=str(path),
        vocab_size=vocab_size,
        eos_token=eos,
        bos_token=token_of("bos_token_id"),
        pad_token=token_of("padding_token_id"),
        chat_template=value("tokenizer.chat_template"),
        special_tokens=specials,
    )


@functools.lru_cache(maxsize=4)
def load_tokenizer(source: str | Path, vocab_size: int) -> PretrainedTokenizer:
    """The tokenizer of a Hugging Face folder or GGUF file `source`, for a model whose
    embedding has `vocab_size` rows; `EnvError` if it has more tokens than that."""
    path = Path(source)
    if path.is_dir():
        tokenizer = _folder_tokenizer(path, vocab_size)
    elif path.is_file():
        tokenizer = _gguf_tokenizer(path, vocab_size)
    else:
        raise EnvError(f"{source}: no such model folder or GGUF file")
    if tokenizer.tokenizer_vocab_size > vocab_size:
        raise EnvError(
            f"{source}: its tokenizer has {tokenizer.tokenizer_vocab_size} tokens, more than the "
            f"{vocab_size} rows of the model's embedding (vocab_size)"
        )
    return tokenizer
