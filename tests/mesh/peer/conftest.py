"""The `certs` fixture (tests/mesh/peer/_certs.py) for every test here."""

from tests.mesh.peer._certs import certs

__all__ = ["certs"]
