"""The HTTP connection gate's eviction order (ratemesh.conngate)."""

from __future__ import annotations

from ratemesh.conngate import Admit, ConnGate


def test_a_socket_that_never_spoke_goes_before_a_keep_alive_connection() -> None:
    """At the bound, a new connection evicts the oldest one that has not completed a request;
    a keep-alive connection between requests only when there is none (its client may be
    sending its next request as it is closed), oldest first."""
    g: ConnGate[str] = ConnGate(connections_max=3, peer_max=10, reserve=1)
    for c in ("kept1", "kept2", "silent"):
        assert g.opened(c, "p").admit is Admit.SERVE
    for c in ("kept1", "kept2"):
        g.busy(c)
        g.idle(c)  # served one request, open for the next
    assert g.opened("new1", "p").evicted == "silent"
    g.busy("new1")  # speaking: not evictable while served
    assert g.opened("new2", "p").evicted == "kept1"
    assert g.counts()["waiting"] == 2  # kept2 and new2
    g.closed("kept2")
    assert g.opened("new3", "p").evicted is None  # a slot was free
    assert g.counts() == {
        "open": 3,
        "waiting": 2,
        "evicted": 2,
        "reserved": 0,
        "refused_full": 0,
        "refused_peer": 0,
    }
