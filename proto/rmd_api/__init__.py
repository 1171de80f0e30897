"""Shared contract between the RMD agent and operator: protobuf stubs and hand-written shared types."""
