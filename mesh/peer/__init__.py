"""The only package that imports grpc: msgpack codec over grpcio aio, service, clients.

Reserved: the networked peer service lands with the mesh node issue. The sans-I/O cores
are forbidden to import it (see the import-linter contract in pyproject.toml).
"""

__all__: list[str] = []
