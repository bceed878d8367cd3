"""Tensor parallelism: the group, rank 0's runner and the worker processes."""
