"""grpc credentials from the certificate files named in the node config, and binding a
grpc server's port with them (the peer port and the sidecar's)."""

from __future__ import annotations

from pathlib import Path

import grpc

from mesh.config import TlsConfig
from mesh.errors import ConfigError
from ratemesh.operator import probe_bind

__all__ = ["bind_port", "server_credentials", "channel_credentials"]


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


async def bind_port(
    server: grpc.aio.Server, listen: str, tls: TlsConfig | None, *, field: str
) -> int:
    """Bind `server` to `listen` (TLS when `tls` is set) and return the port, or stop the
    server and raise ConfigError naming `field`: a taken port is one clear line, whether
    the probe saw it or grpc lost the race to bind it."""
    try:
        probe_bind(listen, field=field, error=ConfigError)
        if tls is not None:
            port = server.add_secure_port(listen, server_credentials(tls))
        else:
            port = server.add_insecure_port(listen)
    except ConfigError:
        await server.stop(None)
        raise
    except RuntimeError as exc:  # grpc's "Failed to bind to address ..."
        await server.stop(None)
        raise ConfigError(
            field, f"cannot serve on {listen}: the port is in use or the address is not this host's"
        ) from exc
    return int(port)
