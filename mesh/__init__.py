"""ratemesh's data plane: local admission, eventually consistent global limits.

The public API is re-exported here; everything else is private to its package.
"""

from mesh.admission import Admission
from mesh.admission.aio import Ticker, admit
from mesh.config import CoreConfig
from mesh.errors import ConfigError, ConfigTypeError, MeshError, MessageError, MessageTypeError
from mesh.gcra import Gcra
from mesh.messages import RateSnapshot, ReportBatch, SnapshotBatch, UsageReport
from mesh.owner import Owner
from mesh.policy import Metric, Mode, PolicyCache, RateKey, TenantRatePolicy, Unit
from mesh.reporter import Reporter
from mesh.ring import Ring
from mesh.verdict import Reason, Suspension, Verdict

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
    "RateSnapshot",
    "Reason",
    "ReportBatch",
    "Reporter",
    "Ring",
    "SnapshotBatch",
    "Suspension",
    "TenantRatePolicy",
    "Ticker",
    "Unit",
    "UsageReport",
    "Verdict",
    "admit",
]
