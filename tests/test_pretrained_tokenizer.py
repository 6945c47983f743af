"""A pretrained model's tokenizer and chat template against transformers: SmolLM2's, read from
the vocabulary inside its GGUF file, and a Hugging Face folder's (`tokenizer.json` with a chat
template of system, user, assistant and tool turns and tool schemas, and one with
`{% generation %}` blocks) give the ids of `apply_chat_template`; a text env keeps the generated
ids of each message (token in, token out) and appends only the template's turn after it."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from agentenv_jax.checkpoint.gguf_file import smollm2_path
from agentenv_jax.envs.spaces import EnvError
from agentenv_jax.envs.text.pretrained_tokenizer import load_tokenizer
from agentenv_jax.envs.text.tasks import GuessNumberTask
from agentenv_jax.envs.text.vector_env import TextVectorEnv

from conftest import require_reference

transformers = require_reference("transformers")

SMOLLM2_VOCAB = 49152
DIALOGUE = [
    {"role": "system", "content": "You answer in one line."},
    {"role": "user", "content": "What is 17 + 25?"},
    {"role": "assistant", "content": "17 + 25 = 42"},
    {"role": "tool", "content": '{"result": 42}'},
    {"role": "user", "content": "naïve café — 東京 🙂, and  two  spaces\n\nthen lines"},
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            },
        },
    }
]
# A template of the Llama 3 kind: a system turn with the tools' JSON schemas, tool turns under
# their own header, and BOS written by the template.
TOOL_TEMPLATE = (
    "{{ bos_token }}{% if tools %}<|im_start|>system\nTools:\n{% for tool in tools %}"
    "{{ tool | tojson }}\n{% endfor %}<|im_end|>\n{% endif %}"
    "{% for message in messages %}{% if message['role'] == 'tool' %}"
    "<|im_start|>ipython\n{{ message['content'] | trim }}<|im_end|>\n"
    "{% else %}<|im_start|>{{ message['role'] }}\n{{ message['content'] | trim }}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# transformers' `{% generation %}` block (what `return_assistant_tokens_mask` marks) around each
# assistant message, with a `set` inside it: the block is a scope of its own.
GENERATION_TEMPLATE = (
    "{% set turns = namespace(assistant=0) %}{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}<|im_start|>assistant\n"
    "{% generation %}{% set turns.assistant = turns.assistant + 1 %}{% set inner = 'x' %}"
    "{{ message['content'] | trim }}<|im_end|>{% endgeneration %}\n"
    "{% else %}<|im_start|>{{ message['role'] }}\n{{ message['content'] | trim }}<|im_end|>\n"
    "{% endif %}{% endfor %}{{ turns.assistant }} {{ inner is defined }}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def smollm2():
    path = smollm2_path()
    theirs = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return load_tokenizer(str(path), SMOLLM2_VOCAB), theirs


def _their_ids(tokenizer, messages, tools=None) -> list[int]:
    out = tokenizer.apply_chat_template(
        messages, tools=tools, add_generation_prompt=True, tokenize=True
    )
    return list(out["input_ids"])


def test_gguf_vocabulary_encodes_and_renders_as_transformers(smollm2) -> None:
    ours, theirs = smollm2
    for text in [m["content"] for m in DIALOGUE] + ["<|im_start|>user\nhi<|im_end|>", " x"]:
        ids = ours.encode(text)
        assert ids.tolist() == theirs.encode(text, add_special_tokens=False)
        assert ours.decode(ids) == theirs.decode(ids.tolist(), skip_special_tokens=True)
    for turns in (DIALOGUE[1:2], DIALOGUE[1:3], DIALOGUE):
        assert ours.encode_chat(turns, True).tolist() == _their_ids(theirs, turns)
    # Contexts are padded with a special token the template never writes, not with EOS.
    assert (ours.eos_id, ours.bos_id, ours.pad_id) == (2, 1, 0)


def test_folder_tokenizer_renders_tool_turns_as_transformers(smollm2, tmp_path) -> None:
    theirs = copy.deepcopy(smollm2[1])
    theirs.chat_template = TOOL_TEMPLATE
    theirs.save_pretrained(tmp_path)
    reloaded = transformers.AutoTokenizer.from_pretrained(tmp_path)
    ours = load_tokenizer(str(tmp_path), SMOLLM2_VOCAB)
    ids = ours.encode_chat(DIALOGUE, True, TOOLS).tolist()
    assert ids == _their_ids(reloaded, DIALOGUE, TOOLS)
    text = ours.chat.render(DIALOGUE, True, TOOLS)
    assert "<|im_start|>ipython\n" in text and '"name": "add"' in text  # not a trivial case
    with pytest.raises(EnvError, match="13 rows of the model's embedding"):
        load_tokenizer(str(tmp_path), 13)


def test_a_template_with_generation_blocks_renders_as_transformers(smollm2, tmp_path) -> None:
    theirs = copy.deepcopy(smollm2[1])
    theirs.chat_template = GENERATION_TEMPLATE
    theirs.save_pretrained(tmp_path)
    reloaded = transformers.AutoTokenizer.from_pretrained(tmp_path)
    ours = load_tokenizer(str(tmp_path), SMOLLM2_VOCAB)
    dialogue = DIALOGUE[1:3] + [{"role": "user", "content": "Again?"}]
    for turns, prompt in ((dialogue, True), (dialogue[:2], False)):
        text = reloaded.apply_chat_template(turns, add_generation_prompt=prompt, tokenize=False)
        assert ours.chat.render(turns, prompt) == text
        assert ours.encode_chat(turns, prompt).tolist() == list(
            reloaded.apply_chat_template(turns, add_generation_prompt=prompt)["input_ids"]
        )
    # Not a trivial case: the body is written, a namespace set inside it counts, a plain one stays.
    assert ours.chat.render(dialogue, True).endswith(
        "17 + 25 = 42<|im_end|><|im_start|>user\nAgain?<|im_end|>\n1 False<|im_start|>assistant\n"
    )
    # transformers reads the block as the assistant's tokens: the template exercises it.
    marked = reloaded.apply_chat_template(
        dialogue, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    ids = np.asarray(marked["input_ids"])[np.asarray(marked["assistant_masks"], bool)]
    assert reloaded.decode(ids.tolist()) == "17 + 25 = 42<|im_end|>"


def test_a_text_env_keeps_the_generated_ids_and_appends_the_templates_turn(smollm2) -> None:
    ours, theirs = smollm2
    env = TextVectorEnv(
        lambda: GuessNumberTask(max_number=8, max_turns=3),
        num_envs=1,
        context_length=96,
        response_length=6,
        tokenizer=ours,
    )
    obs, _ = env.reset(seed=0)
    prompt = "Guess my number (1-8):"
    first = _their_ids(theirs, [{"role": "user", "content": prompt}])
    assert obs[0][obs[0] != ours.pad_id].tolist() == first
    # "h" then "ello": not how the tokenizer writes "hello" (one token), so a re-encoded
    # message would differ from the generated one.
    head, tail = ours.encode("h").tolist(), ours.encode("ello").tolist()
    assert ours.encode("hello").tolist() != head + tail
    message = np.full((1, 6), ours.pad_id, np.int32)
    message[0, :3] = [*head, *tail, ours.eos_id]
    obs, reward, terminated, truncated, info = env.step(message)
    assert not terminated[0] and reward[0] == 0.0
    reply = "a number from 1 to 8"  # not a guess
    expected = (
        first
        + [*head, *tail, ours.eos_id]
        + ours.encode(f"\n<|im_start|>user\n{reply}<|im_end|>\n<|im_start|>assistant\n").tolist()
    )
    assert obs[0][obs[0] != ours.pad_id].tolist() == expected
    # The same as transformers renders the dialogue, but for the message's own tokens.
    rendered = _their_ids(
        theirs,
        [
            {"role": "user", "content": prompt},
            {"role": "assistant", "content": "hello"},
            {"role": "user", "content": reply},
        ],
    )
    assert rendered == first + ours.encode("hello").tolist() + expected[len(first) + 2 :]
