"""TLS 1.3 when a certificate is configured, certificate reload on SIGHUP, the refusal to serve
plaintext off loopback, Prometheus metrics, and the CLI's validate / default start."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from governor.client import Client
from tests.governor._daemon import KEYS, ROOT, Daemon, free_port
from tests.governor._stores import make_target

pytestmark = pytest.mark.slow  # every test runs governord

A = KEYS["KEY_A"]


def _cert(where: Path, name: str) -> tuple[str, str]:
    cert, key = where / f"{name}.crt", where / f"{name}.key"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj",
            f"/CN={name}", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return str(cert), str(key)


def _handshake(port: int, ca: str, *, tls12_only: bool = False) -> str:
    ctx = ssl.create_default_context(cafile=ca)
    ctx.set_alpn_protocols(["h2"])
    if tls12_only:
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        with ctx.wrap_socket(sock, server_hostname="localhost") as tls:
            version = tls.version()
            assert version is not None
            return version


async def _roundtrip(addr: str, ca: str) -> int:
    async with Client(addr, A, tls=True, ca_file=ca, server_name="localhost") as client:
        async with client.task("tls-job", quotas={"http": 1}) as task:
            await client.consume_at(task.node_id, "http")
            return task.node_id


def test_tls13_and_reload_on_sighup(tmp_path: Path) -> None:
    cert1, key1 = _cert(tmp_path, "first")
    cert2, key2 = _cert(tmp_path, "second")
    live_cert, live_key = tmp_path / "live.crt", tmp_path / "live.key"
    live_cert.write_bytes(Path(cert1).read_bytes())
    live_key.write_bytes(Path(key1).read_bytes())
    for store in make_target("sqlite", tmp_path):
        d = Daemon(tmp_path, store, tls={"cert": str(live_cert), "key": str(live_key)})
        d.start()
        try:
            assert _handshake(d.port, cert1) == "TLSv1.3"
            with pytest.raises(ssl.SSLError):  # a client that offers only TLS 1.2 is refused
                _handshake(d.port, cert1, tls12_only=True)
            assert asyncio.run(_roundtrip(d.addr, cert1)) > 0
            with pytest.raises(ssl.SSLError):  # the second certificate is not served yet
                _handshake(d.port, cert2)
            live_cert.write_bytes(Path(cert2).read_bytes())
            live_key.write_bytes(Path(key2).read_bytes())
            d.signal(signal.SIGHUP)
            deadline = time.monotonic() + 10
            while True:  # new connections get the new certificate, no restart
                try:
                    assert _handshake(d.port, cert2) == "TLSv1.3"
                    break
                except ssl.SSLError:
                    assert time.monotonic() < deadline, d.stderr()
                    time.sleep(0.05)
            assert asyncio.run(_roundtrip(d.addr, cert2)) > 0
            assert d.starts == 1 and "certificate reloaded" in d.stderr()
        finally:
            d.close()


def _governord(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "governor.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
    )


def test_plaintext_off_loopback_is_refused(tmp_path: Path) -> None:
    cfg = tmp_path / "open.yaml"
    cfg.write_text(yaml.safe_dump({"listen": f"0.0.0.0:{free_port()}"}))
    out = _governord("validate", "--config", str(cfg))
    assert out.returncode == 2 and "listen[0]" in out.stderr and "allow_plaintext" in out.stderr
    out = _governord("--config", str(cfg))
    assert out.returncode != 0 and "not loopback" in out.stderr
    cfg.write_text(
        yaml.safe_dump(
            {"listen": f"0.0.0.0:{free_port()}", "allow_plaintext": True,
             "store": f"sqlite:{tmp_path / 'x.db'}"}
        )
    )  # fmt: skip
    assert _governord("validate", "--config", str(cfg)).returncode == 0


@pytest.mark.parametrize(
    "doc, key",
    [
        ({"tenants": {"a": {"api_key_env": "NOPE_NOT_SET"}}}, "tenants.a.api_key_env"),
        ({"tenants": {"a": {"api_key_sha256": "xyz"}}}, "tenants.a.api_key_sha256"),
        ({"tenants": {"a": {"api_key_env": "KEY_A", "weight": 0}}}, "tenants.a.weight"),
        ({"root": {"limits": {"db": -1}}}, "root.limits.db"),
        ({"store": "mysql://x"}, "store"),
        ({"listen": "nohost"}, "listen[0]"),
        ({"adaptive": {"db": {"initial_limit": 5}}}, "adaptive.db.min_limit"),
        ({"surprise": 1}, "surprise"),
        ({"tls": {"cert": "/nonexistent.crt", "key": "/nonexistent.key"}}, "tls.cert"),
    ],
)
def test_validate_names_the_key(tmp_path: Path, doc: dict[str, object], key: str) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(yaml.safe_dump(doc))
    out = _governord("validate", "--config", str(cfg), env=KEYS)
    assert out.returncode == 2 and f": {key}:" in out.stderr, out.stderr


def test_no_config_starts_on_loopback_with_sqlite_and_says_so(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "governor.cli"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "GOVERNOR_API_KEY": "k"},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("LISTENING 127.0.0.1:7443"), line
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        err = proc.stderr.read() if proc.stderr else ""
        assert "no --config given" in err and "SQLite" in err
        assert (tmp_path / "governor.db").exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for f in (proc.stdout, proc.stderr):
            if f is not None:
                f.close()


def test_metrics(tmp_path: Path) -> None:
    port = free_port()
    for store in make_target("sqlite", tmp_path):
        d = Daemon(tmp_path, store, metrics=f"127.0.0.1:{port}")
        d.start()
        try:

            async def work(d: Daemon = d) -> None:
                async with Client(d.addr, A) as client:
                    async with client.task("m", quotas={"http": 1}) as task:
                        await client.consume_at(task.node_id, "http")
                        async with client.acquire("db"):
                            pass

            asyncio.run(work())
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                text = r.read().decode()
        finally:
            d.close()
    for needle in (
        'governor_calls_total{code="OK",method="Consume"} 1.0',
        'governor_events_total{kind="Charged"} 1.0',
        "governor_call_seconds_bucket",
        "governor_commit_seconds_count",
        "governor_commit_batch_events_bucket",
        "governor_queue_depth",
        'governor_pool_limit{cls="db"} 4.0',
        'governor_tenant_spend{resource="http",tenant="a"} 1.0',
        "governor_nodes",
        "governor_sessions",
    ):
        assert needle in text, needle
    assert "node_id" not in text and 'm"' not in text  # no task labels
