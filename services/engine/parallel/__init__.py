"""Tensor parallelism: one engine as N ranks under torch.distributed (see group.py)."""
