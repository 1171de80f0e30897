"""gRPC in the agent: grpclib, the asyncio-native implementation, and what its servers and clients share.

The agent serves gRPC (its API, grpc.health.v1, the device plugin) and calls the kubelet (PodResources,
device plugin registration). It does so on grpclib rather than grpcio: grpcio's core runs its own thread
pool, whose workers wake hundreds of times a minute on an agent that has nothing to do (about 60 ms of CPU a
minute, more than half of an idle agent's, and 3-5 ms of each NodeResourceTopology refresh; bench/README.md,
issue #14). grpclib runs on the agent's event loop and wakes only for a call. The wire is the same gRPC over
HTTP/2, so the operator (grpcio), the kubelet (grpc-go) and grpcurl talk to it unchanged.

Services are plain classes with a `__mapping__()` of method paths to handlers, written with `unary_unary`
and `unary_stream` below; there is no generated grpclib code.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from grpclib.const import Cardinality, Handler, Status
from grpclib.encoding.proto import ProtoCodec
from grpclib.exceptions import GRPCError, ProtocolError, StreamTerminatedError
from grpclib.server import Stream

__all__ = ["TRANSPORT_ERRORS", "RawCodec", "Service", "request_of", "unary_stream", "unary_unary"]

# What a grpclib call raises when no gRPC answer came (besides TimeoutError at its deadline): no socket or a
# refused connection (OSError), a connection lost mid-call, a peer breaking HTTP/2.
TRANSPORT_ERRORS = (OSError, StreamTerminatedError, ProtocolError)

StreamHandler = Callable[[Stream[Any, Any]], Awaitable[None]]


class Service(Protocol):
    """What grpclib's Server serves: method paths (`/package.Service/Method`) to handlers."""

    def __mapping__(self) -> dict[str, Handler]: ...


class RawCodec(ProtoCodec):
    """Protobuf, except that a message type of `bytes` passes the payload through undecoded: a client can
    compare an answer with the last one before parsing it (kubelet/podresources.py)."""

    def encode(self, message: Any, message_type: Any) -> bytes:
        if message_type is bytes:
            return bytes(message)
        return super().encode(message, message_type)

    def decode(self, data: bytes, message_type: Any) -> Any:
        if message_type is bytes:
            return data
        return super().decode(data, message_type)


def unary_unary(func: StreamHandler, request_type: type, reply_type: type) -> Handler:
    return Handler(func, Cardinality.UNARY_UNARY, request_type, reply_type)


def unary_stream(func: StreamHandler, request_type: type, reply_type: type) -> Handler:
    return Handler(func, Cardinality.UNARY_STREAM, request_type, reply_type)


async def request_of(stream: Stream[Any, Any]) -> Any:
    """The request message of a call with a unary request."""
    message = await stream.recv_message()
    if message is None:
        raise GRPCError(Status.INVALID_ARGUMENT, "the call carried no request message")
    return message
