"""Who opened a stream: the member id its metadata claims, proved by a certificate or a MAC.

Two proofs, each required when configured (docs/architecture.md, "Peer identity"):

* **mTLS** (`tls.require_client_cert`): the claimed id must equal one of the client
  certificate's subject alternative names of type DNS, URI or IP (an IP for DNS membership,
  where members are named by address), or else its subject CN. Exact, case-sensitive match.
The Status call behind `mesh status` needs the same proofs (any certificate of the fleet's
CA; a fleet-secret proof over `STATUS_EPOCH`, its target this member's id, so that it is
good at this member only); a member with neither configured (a dev mesh) answers anyone, as
its streams do.

* **Fleet secret** (`fleet_secret_file` / `fleet_secret_env`): metadata `ratemesh-auth` is
  `v1:<unix seconds>:<nonce hex>:<hmac-sha256 hex>` under any of the fleet's current
  secrets (one signs; more are accepted during a rotation) over the claimed id, worker_epoch,
  schema, the member dialled, the time and the nonce. The time must be within
  `AUTH_SKEW_S` of ours, and a (time, nonce) seen before is refused, so a captured header
  cannot be replayed to another member, nor later than the window, nor twice while we
  remember it (`NONCES_MAX`). The secret is not a substitute for TLS on a network others can
  read: it proves membership, it does not hide or sign the messages.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from collections import OrderedDict
from collections.abc import Mapping, Sequence

__all__ = [
    "AUTH_MD",
    "AUTH_SKEW_S",
    "NONCES_MAX",
    "REASONS",
    "STATUS_EPOCH",
    "FORGET_EPOCH",
    "RefusalLog",
    "NonceMemory",
    "certificate_names",
    "check_certificate",
    "check_mac",
    "sign",
]

AUTH_MD = "ratemesh-auth"  # the fleet-secret proof, fixed for the stream
AUTH_SKEW_S = 60  # a proof's time may differ from ours by this much (clock skew + replay)
# A Status call's proof (`mesh status`) is made over this in place of a worker_epoch: a
# stream's epoch is digits, so neither proof opens the other's call. Its target is the
# member's id (a caller that knows only the address learns it: `_status.fetch_status`).
STATUS_EPOCH = "status"
# A ForgetMember call's proof (`mesh fleet forget-member`): its own word, so that a proof
# captured for a Status call cannot purge a member's cells.
FORGET_EPOCH = "forget-member"
NONCES_MAX = 4096  # proofs remembered against replay; past it the oldest are forgotten
_NONCE_BYTES = 12
_VERSION = "v1"
# Why a stream is refused, the label values of ratemesh_peer_refused_total: a fixed set.
# `call_limit` and `slow_request` are the call guard's (`ratemesh.callguard`).
REASONS = (
    "not_member",
    "bad_certificate",
    "bad_secret",
    "stream_limit",
    "bad_message",
    "call_limit",
    "slow_request",
)


def _mac(
    secret: bytes, member: str, epoch: str, schema: str, target: str, ts: str, nonce: str
) -> str:
    text = "\n".join(("ratemesh-peer", _VERSION, member, epoch, schema, target, ts, nonce))
    return hmac.new(secret, text.encode(), hashlib.sha256).hexdigest()


def sign(secret: bytes, *, member: str, epoch: str, schema: str, target: str, now_s: int) -> str:
    """The `ratemesh-auth` value a member sends when it opens a stream to `target`."""
    nonce = secrets.token_hex(_NONCE_BYTES)
    ts = str(now_s)
    return f"{_VERSION}:{ts}:{nonce}:{_mac(secret, member, epoch, schema, target, ts, nonce)}"


class NonceMemory:
    """(time, nonce) pairs of accepted proofs, oldest first, at most `NONCES_MAX`."""

    def __init__(self, limit: int = NONCES_MAX) -> None:
        self.limit = limit
        self._seen: OrderedDict[tuple[int, str], None] = OrderedDict()

    def add(self, ts: int, nonce: str, now_s: int) -> bool:
        """Remember a proof; False if it was seen already (a replay)."""
        if (ts, nonce) in self._seen:
            return False
        while self._seen:
            oldest = next(iter(self._seen))
            if oldest[0] >= now_s - AUTH_SKEW_S and len(self._seen) < self.limit:
                break
            self._seen.popitem(last=False)  # out of the window (its time refuses it), or full
        self._seen[(ts, nonce)] = None
        return True

    def __len__(self) -> int:
        return len(self._seen)


def check_mac(
    secrets_: Sequence[bytes],
    proof: str | None,
    *,
    member: str,
    epoch: str,
    schema: str,
    target: str,
    now_s: int,
    seen: NonceMemory,
) -> str | None:
    """None if `proof` is good; else why not, for the refusal's details."""
    if not proof:
        return f"{AUTH_MD}: metadata is required (this mesh has a fleet secret)"
    parts = proof.split(":")
    if len(parts) != 4 or parts[0] != _VERSION or not parts[1].isdigit():
        return f"{AUTH_MD}: not a {_VERSION}:<unix seconds>:<nonce>:<hmac> proof"
    _, ts, nonce, mac = parts
    if len(ts) > 12 or len(nonce) != 2 * _NONCE_BYTES or len(mac) != 64:
        return f"{AUTH_MD}: not a {_VERSION}:<unix seconds>:<nonce>:<hmac> proof"
    wants = [_mac(s, member, epoch, schema, target, ts, nonce).encode() for s in secrets_]
    if not any([hmac.compare_digest(want, mac.encode()) for want in wants]):  # all compared
        return f"{AUTH_MD}: wrong fleet secret for member {member!r}"
    skew = int(ts) - now_s
    if abs(skew) > AUTH_SKEW_S:
        return (
            f"{AUTH_MD}: the proof's time is {skew:+d} s from this member's clock "
            f"(accepted: +-{AUTH_SKEW_S} s)"
        )
    if not seen.add(int(ts), nonce, now_s):
        return f"{AUTH_MD}: this proof was already used (a replayed stream header)"
    return None


AuthContext = Mapping[str, Sequence[bytes]]


def certificate_names(auth: AuthContext) -> tuple[list[str], str | None]:
    """The client certificate's DNS, URI and IP SANs, and its CN (None without one)."""
    keys = ("peer_dns", "peer_uri", "peer_ip")
    if any(k in auth for k in keys):
        raw = [v for k in keys for v in auth.get(k, ())]
    else:  # an older grpc: every SAN in one property
        raw = list(auth.get("x509_subject_alternative_name", ()))
    sans = [v.decode("utf-8", "replace") for v in raw]
    cns = auth.get("x509_common_name", ())
    return sans, cns[0].decode("utf-8", "replace") if cns else None


def check_certificate(auth: AuthContext, member: str) -> str | None:
    """None if the client certificate names `member` (a SAN, else the CN); else why not."""
    sans, cn = certificate_names(auth)
    if not sans and cn is None:
        return f"{member!r} presented no client certificate"
    if member in sans or member == cn:
        return None
    said = ", ".join([*(f"SAN {s!r}" for s in sans[:8]), *([f"CN {cn!r}"] if cn else [])])
    return f"claims member {member!r} but its certificate says {said}"


class RefusalLog:
    """One warning per `every_s` for refused streams, the rest at debug: a flood of bad
    streams must not become a flood of log lines."""

    def __init__(self, log: logging.Logger, every_s: float = 1.0) -> None:
        self.log = log
        self.every_s = every_s
        self._next_s = 0.0
        self.suppressed = 0

    def refused(self, now_s: float, reason: str, peer: str, member: str, details: str) -> None:
        if now_s >= self._next_s:
            more = f" ({self.suppressed} more at debug since the last)" if self.suppressed else ""
            self.log.warning(
                "stream from %s claiming %r refused (%s): %s%s", peer, member, reason, details, more
            )
            self._next_s = now_s + self.every_s
            self.suppressed = 0
        else:
            self.suppressed += 1
            self.log.debug(
                "stream from %s claiming %r refused (%s): %s", peer, member, reason, details
            )
