"""Generated protobuf and gRPC modules of the `turnout.v1` contract.

The `*_pb2*.py` files here are produced from `proto/turnout/v1/*.proto` by the
build (`turnout.protogen`); they are not kept in git and never edited by hand.
"""
