"""governord's server: the gRPC service over the Authority, auth and scopes, TLS, metrics."""

from ._daemon import CertReloader, run, serve
from ._metrics import Metrics
from ._reconcile import apply_config
from ._service import GovernorService
from ._status import Fail

__all__ = ["CertReloader", "Fail", "GovernorService", "Metrics", "apply_config", "run", "serve"]
