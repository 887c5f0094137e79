"""Where members come from (I/O): a static list, etcd, or DNS; it feeds the pure `mesh.core.ring`.

Every source implements `MembershipSource`; the node builds the ring from the views it
publishes. An unreachable source keeps its last view, marked stale (share limits disclose
it; N decays to 1).
"""

from mesh.membership._dns import DnsMembership
from mesh.membership._etcd import EtcdMembership
from mesh.membership._etcd_client import EtcdClient
from mesh.membership._source import MembershipSource, MembershipView, Publish
from mesh.membership._static import StaticMembership

__all__ = [
    "DnsMembership",
    "EtcdClient",
    "EtcdMembership",
    "MembershipSource",
    "MembershipView",
    "Publish",
    "StaticMembership",
]
