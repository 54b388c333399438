"""Attention backends: the only code that reads or writes the paged KV cache."""
