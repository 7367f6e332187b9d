"""The one exception type of the package."""
from typing import Optional

import grpc


class DriftkvError(Exception):
    """A failed call: the server's (or gRPC's) status code and message.

    `code` is a grpc.StatusCode; `details` the message, which names the
    field and the value (docs/api.md, "Status codes"). Every failure of a
    client raises it. Arguments the client can reject itself (a list where
    an array goes, an array of the wrong rank or dtype, queries of a
    stacked batch that differ in shape, an unknown wire dtype) raise it
    with INVALID_ARGUMENT before anything is sent (driftkv._validate);
    a call on a closed client with FAILED_PRECONDITION. `replica` is the
    replica's name when a ShardedClient's call failed there (`details`
    then starts with "replica NAME: "), else None.
    """

    def __init__(self, code: grpc.StatusCode, details: str, *, replica: Optional[str] = None):
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details
        self.replica = replica

    @classmethod
    def from_rpc(cls, error: grpc.RpcError) -> "DriftkvError":
        code: Optional[grpc.StatusCode] = error.code() if hasattr(error, "code") else None
        details = error.details() if hasattr(error, "details") else str(error)
        return cls(code or grpc.StatusCode.UNKNOWN, details or "")


def invalid(details: str) -> DriftkvError:
    return DriftkvError(grpc.StatusCode.INVALID_ARGUMENT, details)


def closed_error(client, code: grpc.StatusCode = grpc.StatusCode.FAILED_PRECONDITION) -> DriftkvError:
    """The error of a call on a closed client: FAILED_PRECONDITION for a
    call made after close(), CANCELLED for one that close() cut short."""
    what = "was closed during the call" if code == grpc.StatusCode.CANCELLED else "is closed"
    return DriftkvError(code, f"{client!r} {what}; make a new client")
