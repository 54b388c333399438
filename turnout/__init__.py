"""Turnout: an LLM serving stack of four gRPC services behind an OpenAI-compatible gateway.

This package holds what every service shares: the generated wire contract
(`turnout.v1`), the CLI, logging, errors and the gRPC server runner.
"""

__version__ = "0.1.0"
