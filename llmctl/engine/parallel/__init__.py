"""Tensor, pipeline and data parallelism: ranks and groups, worker processes, the step messages."""
