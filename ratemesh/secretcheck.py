"""Refusing guessable shared secrets: fleet secrets, sidecar tokens and governord API keys.

A secret that is short, a placeholder copied from an example, or a pattern a person typed
can be guessed by whoever can reach the port, and then that caller is a member, a worker or
a tenant. The check is one function so the node and governord refuse the same values with
the same words. A key given only as its SHA-256 cannot be checked (its length is unknown).
"""

from __future__ import annotations

__all__ = ["PLACEHOLDER_WORDS", "SECRET_DISTINCT_MIN", "SECRET_MIN_BYTES", "weak_secret"]

# 128 bits: `openssl rand -hex 16` is 32 characters; 16 bytes of random text is the floor.
SECRET_MIN_BYTES = 16
# Random text of SECRET_MIN_BYTES has far more distinct characters than this.
SECRET_DISTINCT_MIN = 4
# Words of example values (deploy/k8s/secrets.example.yaml says CHANGE-ME-...): compared
# with the value lowercased, letters and digits only.
PLACEHOLDER_WORDS = (
    "changeme",
    "replaceme",
    "placeholder",
    "example",
    "yoursecret",
    "mysecret",
    "notasecret",
    "secretkey",
    "password",
    "passw0rd",
    "insecure",
    "dummy",
    "letmein",
)
# A run a person types: ascending digits and letters, or the keyboard's rows.
_RUNS = ("0123456789abcdefghijklmnopqrstuvwxyz0123456789", "qwertyuiopasdfghjklzxcvbnm")
_PERIOD_MAX = 8  # "secretsecretsecret", "abcabcabc..." repeat a unit at most this long


def weak_secret(value: str | bytes, *, minimum: int = SECRET_MIN_BYTES) -> str | None:
    """Why `value` is too weak to be a shared secret, or None when it is not."""
    raw = value.encode() if isinstance(value, str) else value
    if len(raw) < minimum:
        return f"is {len(raw)} bytes long; at least {minimum} are needed"
    text = raw.decode("utf-8", "replace")
    norm = "".join(c for c in text.lower() if c.isalnum())
    for word in PLACEHOLDER_WORDS:
        if word in norm:
            return f"is a placeholder (it contains {word!r})"
    if len(set(text)) < SECRET_DISTINCT_MIN:
        return f"has fewer than {SECRET_DISTINCT_MIN} distinct characters"
    for period in range(1, _PERIOD_MAX + 1):
        if len(norm) > period and norm == (norm[:period] * (len(norm) // period + 1))[: len(norm)]:
            return f"repeats a pattern of {period} character(s)"
    if len(norm) >= minimum // 2 and any(norm in run for run in _RUNS):
        return "is a run of consecutive characters"
    return None
