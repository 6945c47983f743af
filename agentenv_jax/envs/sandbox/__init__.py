"""Programs run in isolation under real limits: the sandbox that code tools and code tasks use."""

from agentenv_jax.envs.sandbox.pool import (
    SandboxContents,
    SandboxError,
    SandboxPool,
    SandboxResult,
    SandboxSettings,
    SandboxWorker,
    close_shared_pools,
    shared_pool,
)

__all__ = [
    "SandboxContents",
    "SandboxError",
    "SandboxPool",
    "SandboxResult",
    "SandboxSettings",
    "SandboxWorker",
    "close_shared_pools",
    "shared_pool",
]
