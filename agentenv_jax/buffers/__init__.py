"""Experience buffer partitions held by env ranks."""

from agentenv_jax.buffers.segment_queue import SegmentQueue, on_policy_segment_spec

__all__ = ["SegmentQueue", "on_policy_segment_spec"]
