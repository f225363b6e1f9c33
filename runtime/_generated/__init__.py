"""Generated protobuf and gRPC stubs (scripts/gen_protos.py). Do not edit."""
