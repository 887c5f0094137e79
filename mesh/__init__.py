"""ratemesh's data plane: local admission, eventually consistent global limits.

This is the embedding API (docs/api.md): the node (`Mesh`), the sans-I/O admission core
(`Admission`, `admit`), the call-site helpers, verdicts and their vocabulary, the policy
types an application constructs, and the errors it may catch. The parts inside (the owner,
reporter, ring, meter, wire messages) are reachable by their own modules (`mesh.core.owner`,
`mesh.core.messages`, ...), but are not promised here.
"""

from mesh.aio import admit
from mesh.callsite import Charge, Limited, limited
from mesh.core.admission import Admission
from mesh.core.config import CoreConfig
from mesh.core.policy import Metric, Mode, PolicyCache, TenantRatePolicy, Unit
from mesh.core.verdict import Reason, Step, Suspension, Verdict
from mesh.errors import ConfigError, ConfigTypeError, MeshError, RateLimited
from ratemesh.policy import descriptor_tenant


def __getattr__(name: str) -> object:
    """`mesh.Mesh` (the networked node) loads on first use, so importing the cores does not
    pull in grpc."""
    if name == "Mesh":
        from mesh.node import Mesh

        return Mesh
    raise AttributeError(f"module 'mesh' has no attribute {name!r}")


__all__ = [
    "Admission",
    "Charge",
    "ConfigError",
    "ConfigTypeError",
    "CoreConfig",
    "Limited",
    "Mesh",
    "MeshError",
    "Metric",
    "Mode",
    "PolicyCache",
    "RateLimited",
    "Reason",
    "Step",
    "Suspension",
    "TenantRatePolicy",
    "Unit",
    "Verdict",
    "admit",
    "descriptor_tenant",
    "limited",
]
