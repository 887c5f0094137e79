"""The `certs` fixture (tests/mesh/peer/_certs.py) for the mutual-TLS sidecar tests."""

from tests.mesh.peer._certs import certs

__all__ = ["certs"]
