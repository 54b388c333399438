"""The engine service: token ids in, token ids out, streamed as they are sampled."""
