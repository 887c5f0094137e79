"""ratemesh's data plane: local admission, eventually consistent global limits.

The public API is re-exported here; everything else is private to its package.
"""

from mesh.aio import Ticker, admit
from mesh.callsite import Lease, Limited, limited
from mesh.core.admission import Admission
from mesh.core.config import CoreConfig
from mesh.core.gcra import Gcra
from mesh.core.messages import RateSnapshot, ReportBatch, SnapshotBatch, UsageReport
from mesh.core.owner import Owner
from mesh.core.policy import Metric, Mode, PolicyCache, RateKey, TenantRatePolicy, Unit
from mesh.core.reporter import Reporter
from mesh.core.ring import Ring
from mesh.core.verdict import Reason, Step, Suspension, Verdict
from mesh.errors import (
    ConfigError,
    ConfigTypeError,
    MeshError,
    MessageError,
    MessageTypeError,
    RateLimited,
)
from ratemesh.policy import descriptor_tenant

Policy = TenantRatePolicy


def __getattr__(name: str) -> object:
    """`mesh.Mesh` (the networked node) loads on first use, so importing the cores does not
    pull in grpc."""
    if name == "Mesh":
        from mesh.node import Mesh

        return Mesh
    raise AttributeError(f"module 'mesh' has no attribute {name!r}")


__all__ = [
    "Admission",
    "ConfigError",
    "ConfigTypeError",
    "CoreConfig",
    "Gcra",
    "Lease",
    "Limited",
    "Mesh",
    "MeshError",
    "MessageError",
    "MessageTypeError",
    "Metric",
    "Mode",
    "Owner",
    "Policy",
    "PolicyCache",
    "RateKey",
    "RateLimited",
    "RateSnapshot",
    "Reason",
    "ReportBatch",
    "Reporter",
    "Ring",
    "SnapshotBatch",
    "Step",
    "Suspension",
    "TenantRatePolicy",
    "Ticker",
    "Unit",
    "UsageReport",
    "Verdict",
    "admit",
    "descriptor_tenant",
    "limited",
]
