"""The HTTP gateway: OpenAI-compatible and SGLang-native JSON APIs in front of the router.

It owns only the HTTP contract (request validation, response shapes, SSE
framing, error bodies) and turns every request into calls of the router's
public gRPC `turnout.v1.Inference` service.
"""
