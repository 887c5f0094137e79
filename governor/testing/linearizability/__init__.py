"""A linearizability checker for governord's client histories (docs/linearizability.md).

Record a history of acquire, release, consume, reserve_credit, return_credit and validate
calls (``Recorder`` around an SDK ``Client``, or ``History.add``), then ``check(history)``:
fencing ids over the whole history, and Wing & Gong / Lowe's search (WGL, as Porcupine and
Knossos) over a sequential model of governord, per independent partition. Run it on a saved
history with ``python -m governor.testing.linearizability history.json``.
"""

from ._check import Result, Violation, check, check_fencing, partitions
from ._engine import engine_call, tree_of
from ._history import (
    CALLS,
    FORMAT,
    HISTORY_OPS_MAX,
    History,
    HistoryError,
    HistoryFull,
    Op,
    Outcome,
    Tree,
    TreeNode,
)
from ._model import Model, State
from ._recorder import Recorder, outcome_of
from ._wgl import SEARCH_STATES_MAX, search

__all__ = [
    "CALLS",
    "FORMAT",
    "HISTORY_OPS_MAX",
    "SEARCH_STATES_MAX",
    "History",
    "HistoryError",
    "HistoryFull",
    "Model",
    "Op",
    "Outcome",
    "Recorder",
    "Result",
    "State",
    "Tree",
    "TreeNode",
    "Violation",
    "check",
    "check_fencing",
    "engine_call",
    "outcome_of",
    "partitions",
    "search",
    "tree_of",
]
