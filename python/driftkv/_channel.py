"""Channels of the sync and asyncio clients: plaintext, TLS, mTLS, and a
bearer token (docs/security.md). A token is never sent without TLS."""
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import grpc

from driftkv._errors import invalid


@dataclass(frozen=True)
class Security:
    """tls_ca: PEM file of the CA that signed the server's certificate
    (set: TLS). tls_cert/tls_key: PEM client certificate and key (mTLS).
    tls_server_name: the name expected in the server's certificate
    (default: the target's host). token: the bearer token; needs TLS."""
    tls_ca: Optional[str] = None
    tls_cert: Optional[str] = None
    tls_key: Optional[str] = None
    tls_server_name: Optional[str] = None
    token: Optional[str] = None

    def credentials(self) -> Optional[grpc.ChannelCredentials]:
        """None for plaintext; raises DriftkvError(INVALID_ARGUMENT) for a
        token or certificate without TLS or an unreadable file."""
        if not self.tls_ca:
            if self.token or self.tls_cert:
                raise invalid("a token or a client certificate needs TLS: pass tls_ca "
                              "(the CA of the server's certificate)")
            return None
        if bool(self.tls_cert) != bool(self.tls_key):
            raise invalid("tls_cert and tls_key: pass both or neither")
        creds = grpc.ssl_channel_credentials(
            root_certificates=_read(self.tls_ca, "tls_ca"),
            private_key=_read(self.tls_key, "tls_key") if self.tls_key else None,
            certificate_chain=_read(self.tls_cert, "tls_cert") if self.tls_cert else None)
        if self.token:
            creds = grpc.composite_channel_credentials(creds, grpc.access_token_call_credentials(self.token))
        return creds

    def options(self) -> List[Tuple[str, object]]:
        return [("grpc.ssl_target_name_override", self.tls_server_name)] if self.tls_server_name else []


def _read(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise invalid(f"{what} {path!r} cannot be read: {e.strerror}") from None
    if not data:
        raise invalid(f"{what} {path!r} is empty")
    return data


def open_channel(target: str, options: Sequence[Tuple[str, object]], security: Security, aio: bool = False):
    creds = security.credentials()
    opts = list(options) + security.options()
    mod = grpc.aio if aio else grpc
    return mod.insecure_channel(target, options=opts) if creds is None else mod.secure_channel(target, creds, opts)
