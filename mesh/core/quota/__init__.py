"""Spend quotas that converge through per-worker cells (docs/quotas.md).

Private modules, each importing only those above it:
    _period   UTC day/month period indexes from the driver's epoch-ms clock
    _fold     QuotaFolds: the owner folds members' cells (max per member, retention)
    _tier     CellTier: the shared cell store's Protocol, and its in-memory form
    _ledger   QuotaLedger: a worker's own burn, remote, the admission check, publishes
    _desk     QuotaDesk: a member's ledger and folds on the driver's wall clock; QuotaGate
"""

from mesh.core.quota._desk import EXPIRE_EVERY_MS, QuotaDesk, QuotaGate
from mesh.core.quota._fold import (
    CELL_RETENTION_MS,
    CELLS_PER_KEY_MAX,
    PERIOD_SKEW_MAX,
    QUOTA_KEYS_MAX,
    QuotaFolds,
)
from mesh.core.quota._ledger import QUOTA_PUBLISH_MS, QUOTA_REFRESH_MS, QuotaLedger
from mesh.core.quota._period import DAY_MS, period_end_ms, period_index
from mesh.core.quota._tier import CellTier, MemoryCellTier

__all__ = [
    "CELL_RETENTION_MS",
    "CELLS_PER_KEY_MAX",
    "DAY_MS",
    "EXPIRE_EVERY_MS",
    "PERIOD_SKEW_MAX",
    "QUOTA_KEYS_MAX",
    "QUOTA_PUBLISH_MS",
    "QUOTA_REFRESH_MS",
    "CellTier",
    "MemoryCellTier",
    "QuotaDesk",
    "QuotaFolds",
    "QuotaGate",
    "QuotaLedger",
    "period_end_ms",
    "period_index",
]
