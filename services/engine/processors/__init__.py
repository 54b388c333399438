"""Logits processors: SGLang-style custom ones (serialized by clients) and the built-ins chosen
by name (thinking_budget, deterministic_token, disallowed_tokens). See catalog.py."""
