"""grpc credentials from the certificate files named in the node config."""

from __future__ import annotations

from pathlib import Path

import grpc

from mesh.config import TlsConfig

__all__ = ["server_credentials", "channel_credentials"]


def server_credentials(tls: TlsConfig) -> grpc.ServerCredentials:
    """TLS for the peer service; with `require_client_cert`, mutual TLS against `ca`."""
    key, cert = Path(tls.key).read_bytes(), Path(tls.cert).read_bytes()
    ca = Path(tls.ca).read_bytes() if tls.ca else None
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=ca, require_client_auth=tls.require_client_cert
    )


def channel_credentials(tls: TlsConfig) -> grpc.ChannelCredentials:
    """TLS to peers, verifying them against `ca`, presenting our certificate for mTLS."""
    ca = Path(tls.ca).read_bytes() if tls.ca else None
    return grpc.ssl_channel_credentials(
        root_certificates=ca,
        private_key=Path(tls.key).read_bytes(),
        certificate_chain=Path(tls.cert).read_bytes(),
    )
