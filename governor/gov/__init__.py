"""`gov`: a slot for any command or block of Python, machine-local or fleet-wide (seed 003).

    gov run --max 2 -- curl ...          # shell: take a slot, run, give it back
    with slot("model", max=2): ...       # Python (governor.client.slot; governor.slot
                                         # runs the block even when that cannot load)

Without governord, a slot is a file in `$GOV_DIR` claimed by an atomic hard link: no OS lock
is held across the command, so a holder that dies cannot wedge anyone, and slots whose
holder is dead (or silent past its TTL) are reaped by the next caller. After the wait window
for its priority a caller fails open: it runs anyway, and says so on stderr and in
`$GOV_DIR/gov.log`. A 429 seen in a command's output trips a machine-wide cooldown that
later callers wait out (bounded by their window). docs/gov.md has the whole contract.
"""

from ._cooldown import COOLDOWN_DEFAULT_S, Cooldown
from ._failopen import FailOpen
from ._paths import GovDir, check_name, gov_dir
from ._semaphore import Claim, Holder, LocalSemaphore
from ._slots import PRIORITIES, Acquired, acquire_slot, release_slot

__all__ = [
    "COOLDOWN_DEFAULT_S",
    "PRIORITIES",
    "Acquired",
    "Claim",
    "Cooldown",
    "FailOpen",
    "GovDir",
    "Holder",
    "LocalSemaphore",
    "acquire_slot",
    "check_name",
    "gov_dir",
    "release_slot",
]
