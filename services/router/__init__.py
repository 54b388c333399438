"""The router: the public Inference gRPC service in front of engines and tokenizers."""
