"""Text environments: dialogue tasks as Gymnasium vector envs of token ids (`TextVectorEnv`)."""

from agentenv_jax.envs.text.reasoning_gym_tasks import REASONING_GYM_TASKS, ReasoningGymTask
from agentenv_jax.envs.text.registry import (
    REASONING_GYM_PREFIX,
    TEXT_ENV_IDS,
    close_text_env_id,
    is_text_env,
    make_text_vector_env,
)
from agentenv_jax.envs.text.tasks import ArithmeticTask, GuessNumberTask, TaskReply, TextTask
from agentenv_jax.envs.text.tokenizer import BYTE_TOKENIZER, ByteTokenizer, Tokenizer
from agentenv_jax.envs.text.vector_env import TextVectorEnv

__all__ = [
    "BYTE_TOKENIZER",
    "REASONING_GYM_PREFIX",
    "REASONING_GYM_TASKS",
    "TEXT_ENV_IDS",
    "ArithmeticTask",
    "ByteTokenizer",
    "GuessNumberTask",
    "ReasoningGymTask",
    "TaskReply",
    "TextTask",
    "TextVectorEnv",
    "Tokenizer",
    "close_text_env_id",
    "is_text_env",
    "make_text_vector_env",
]
