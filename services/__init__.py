"""Turnout's gRPC services: engine, tokenizer and router."""
