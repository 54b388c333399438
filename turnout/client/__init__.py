"""A small typed Python client of the router's public `turnout.v1.Inference` gRPC service.

    from turnout.client import Client

    with Client("127.0.0.1:50051") as client:
        [done] = client.generate("The capital of France is", max_new_tokens=8, temperature=0.0)
        print(done.text, done.finish_reason)
        for event in client.generate_stream("Once upon a time", max_new_tokens=32):
            print(event.text, end="")

`AsyncClient` is the same over asyncio. Errors are `TurnoutError` carrying the gRPC status.
"""

from turnout.client.async_client import AsyncClient, AsyncGenerateStream
from turnout.client.results import Completion, Delta, ModelInfo, Tokenized, TurnoutError
from turnout.client.sync_client import Client, GenerateStream

__all__ = [
    "AsyncClient",
    "AsyncGenerateStream",
    "Client",
    "Completion",
    "Delta",
    "GenerateStream",
    "ModelInfo",
    "Tokenized",
    "TurnoutError",
]
