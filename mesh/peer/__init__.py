"""The only package that imports grpc: the peer service, its clients, the coordinator API.

`Transport` is what the node sees; `GrpcTransport` and `MemoryTransport` implement it.
Messages are the mesh's msgpack codec (`mesh.core.messages`); grpc carries opaque bytes through
generic handlers, and grpc errors become `mesh.errors.PeerError`s here, at the adapter.
"""

from mesh.peer._coordinator import COORDINATOR_SERVICE, CoordinatorClient, PutResult
from mesh.peer._fleet import FLEET_MEMBERS_MAX, FLEET_PARALLEL_MAX, fetch_fleet
from mesh.peer._forget import StillAMember, forget_fleet, forget_member
from mesh.peer._grpc import GrpcTransport
from mesh.peer._link import PeerLink
from mesh.peer._server import PeerHandler, PeerServer
from mesh.peer._status import fetch_status
from mesh.peer._tls import bind_port, server_credentials
from mesh.peer._transport import Deliver, MemoryNetwork, MemoryTransport, Transport
from mesh.peer._wire import EPOCH_MD, EXCHANGE, MEMBER_MD, SCHEMA_MD, STATUS

__all__ = [
    "COORDINATOR_SERVICE",
    "CoordinatorClient",
    "Deliver",
    "EPOCH_MD",
    "EXCHANGE",
    "FLEET_MEMBERS_MAX",
    "FLEET_PARALLEL_MAX",
    "GrpcTransport",
    "MEMBER_MD",
    "MemoryNetwork",
    "MemoryTransport",
    "PeerHandler",
    "PeerLink",
    "PeerServer",
    "PutResult",
    "SCHEMA_MD",
    "STATUS",
    "Transport",
    "StillAMember",
    "fetch_fleet",
    "forget_fleet",
    "forget_member",
    "fetch_status",
    "bind_port",
    "server_credentials",
]
