"""The committed protobuf module is what admission.proto generates, and every field of a
Verdict reaches the wire through the one function that converts it (`verdict_fields`)."""

from __future__ import annotations

import dataclasses
import importlib
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mesh.core.policy import Mode
from mesh.core.verdict import (
    _INTERNED,
    Numbers,
    QuotaLag,
    Reason,
    Step,
    Suspension,
    Verdict,
    verdict,
)
from mesh.sidecar import admission_pb2 as pb
from mesh.sidecar import encode_outcomes, verdict_fields
from mesh.sidecar._grpc import LIMIT_FIELDS

ROOT = Path(__file__).resolve().parents[3]
# Each committed protobuf module and its .proto: the sidecar's own, Envoy's rate limit
# service (mesh/sidecar/rls) and the standard services every gRPC port serves.
PROTOS = (
    "mesh/sidecar/admission",
    "mesh/sidecar/concurrency",
    "mesh/sidecar/rls/base",
    "mesh/sidecar/rls/ratelimit",
    "mesh/sidecar/rls/rls",
    "ratemesh/grpcstd/health",
    "ratemesh/grpcstd/reflection_v1alpha",
    "ratemesh/grpcstd/reflection_v1",
)
_VERSION = re.compile(r"^# Protobuf Python Version: (.*)$", re.M)


@pytest.mark.parametrize("stem", PROTOS)
def test_the_committed_module_is_what_the_proto_generates(tmp_path: Path, stem: str) -> None:
    pytest.importorskip("grpc_tools")
    subprocess.run(
        [
            sys.executable, "-m", "grpc_tools.protoc", f"-I{ROOT}",
            f"--python_out={tmp_path}", f"--pyi_out={tmp_path}",
            str(ROOT / f"{stem}.proto"),
        ],
        check=True, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    generated = (f"{stem}_pb2.py", f"{stem}_pb2.pyi")
    fresh = (tmp_path / generated[0]).read_text()
    committed = (ROOT / generated[0]).read_text()
    module = importlib.import_module(f"{stem.replace('/', '.')}_pb2")
    # The message definitions: the serialized descriptor protoc embeds, byte for byte.
    assert _descriptor(fresh) == _descriptor(committed) == module.DESCRIPTOR.serialized_pb
    # The text too, where this grpcio-tools is the one that generated the committed files
    # (another version writes its own version line and runtime check).
    if _VERSION.findall(fresh) == _VERSION.findall(committed):
        for name in generated:
            assert (tmp_path / name).read_text() == (ROOT / name).read_text(), (
                f"{name} is stale: regenerate it (docs/sidecar.md, 'Regenerating')"
            )


def _descriptor(source: str) -> bytes:
    ns: dict[str, Any] = {}
    start = source.index("AddSerializedFile(") + len("AddSerializedFile(")
    end = source.index(")\n", start)
    exec(f"blob = {source[start:end]}", ns)  # a bytes literal protoc wrote
    blob = ns["blob"]
    assert isinstance(blob, bytes)
    return blob


def test_verdict_fields_carries_every_field_a_verdict_has() -> None:
    v = verdict(True, Reason.ADMITTED, Mode.LOCAL, "fleet<=N*limit")
    assert verdict_fields(v) == {
        "allowed": True,
        "reason": "admitted",
        "mode": "local",
        "bound": "fleet<=N*limit",
    }
    rich = Verdict(
        False,
        Reason.RATE_LIMITED,
        Mode.GLOBAL,
        "excess<=N*b+R*d",
        Suspension.SNAPSHOT_STALE,
        limit=100,
        step=Step.MESH,
        remaining=0,
        retry_after_ms=250,
        reset_after_ms=1000,
    )
    assert verdict_fields(rich) == {
        "allowed": False,
        "reason": "rate_limited",
        "mode": "global",
        "bound": "excess<=N*b+R*d",
        "suspended": "snapshot_stale",
        "limit": 100,
        "step": "mesh",
        "remaining": 0,
        "retry_after_ms": 250,
        "reset_after_ms": 1000,
    }
    # every key is a field of the wire message, and the encoded response decodes to them
    resp = pb.AdmitResponse.FromString(
        encode_outcomes([(rich, None), (v, None), "tenant: required"])
    )
    first, second, third = resp.verdicts
    assert first.remaining == 0 and first.HasField("remaining") and first.step == "mesh"
    assert not second.HasField("remaining") and not second.HasField("suspended")
    assert third.error == "tenant: required" and not third.allowed
    # and every Verdict field has its place on the wire (none is dropped silently)
    # (besides `error`, and the policy's exact limit, `limit_fields`, that a verdict lacks)
    wire = {f.name for f in pb.Verdict.DESCRIPTOR.fields} - {"error", *LIMIT_FIELDS}
    assert wire == {f.name for f in dataclasses.fields(Verdict)}


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from([v for v in _INTERNED.values()] or [verdict(True, Reason.ADMITTED, None, "b")]),
    st.one_of(st.none(), st.integers(-(1 << 63), (1 << 63) - 1)),
    st.one_of(st.none(), st.integers(0, (1 << 63) - 1)),
    st.one_of(st.none(), st.integers(-(1 << 63), (1 << 63) - 1)),
)
def test_the_hand_encoded_numbers_are_what_protobuf_encodes(
    v: Verdict, remaining: int | None, retry: int | None, reset: int | None
) -> None:
    """`_verdict_bytes` appends the numbers to a memoised shared part by hand: pinned to the
    generated encoder of the whole message."""
    n = Numbers(remaining, retry, reset)
    want = pb.Verdict(**verdict_fields(v, n)).SerializeToString()
    got = pb.AdmitResponse.FromString(encode_outcomes([(v, n)])).verdicts[0]
    assert got.SerializeToString() == want
    assert (
        encode_outcomes([(v, n)])
        == pb.AdmitResponse(verdicts=[pb.Verdict.FromString(want)]).SerializeToString()
    )


def test_policy_unknown_has_no_mode() -> None:
    v = verdict(False, Reason.POLICY_UNKNOWN, None, "none", Suspension.POLICY_UNKNOWN)
    assert verdict_fields(v)["mode"] == ""


@settings(max_examples=500, deadline=None)
@given(st.integers(0, (1 << 64) - 1))
def test_the_varint_tables_encode_as_protobuf_does(n: int) -> None:
    from mesh.sidecar._grpc import _varint, _varint_of

    assert _varint(n) == _varint_of(n)
    assert pb.Verdict(limit=n if n < 1 << 63 else n - (1 << 64)).SerializeToString() == (
        b"\x30" + _varint(n)
    )


def test_a_quota_verdict_carries_its_lag_on_the_wire() -> None:
    v = dataclasses.replace(
        verdict(False, Reason.QUOTA_EXHAUSTED, Mode.GLOBAL, "quota<=cap+peer_burn_since_last_fold"),
        remaining=0,
        quota=QuotaLag(100, 40, 60, None, 3),
    )
    fields = verdict_fields(v)
    assert fields["quota"] == {"cap": 100, "own": 40, "remote": 60, "unpublished": 3}
    got = pb.AdmitResponse.FromString(encode_outcomes([(v, None)])).verdicts[0]
    assert got.SerializeToString() == pb.Verdict(**fields).SerializeToString()
    assert got.quota.remote == 60 and not got.quota.HasField("lag_ms")
