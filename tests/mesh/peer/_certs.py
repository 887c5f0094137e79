"""Test certificates made by openssl: one CA, a certificate per member id (CN and DNS SAN
the id, plus localhost and 127.0.0.1 so members can dial each other on loopback), and a
self-signed stranger."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

MEMBERS = ("a", "b", "c")


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _request(name: str, d: Path) -> None:
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
        "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=d,
    )  # fmt: skip


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed to make test certificates")
    d = tmp_path_factory.mktemp("certs")
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        "-subj", "/CN=ratemesh-test-ca", "-keyout", "ca.key", "-out", "ca.pem", cwd=d,
    )  # fmt: skip
    for name in MEMBERS:
        _request(name, d)
        (d / f"{name}.cnf").write_text(f"subjectAltName=DNS:{name},DNS:localhost,IP:127.0.0.1\n")
        _openssl(
            "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "2", "-extfile", f"{name}.cnf",
            "-out", f"{name}.pem", cwd=d,
        )  # fmt: skip
    _request("stranger", d)  # self-signed: not from our CA
    _openssl(
        "x509", "-req", "-in", "stranger.csr", "-signkey", "stranger.key", "-days", "2",
        "-out", "stranger.pem", cwd=d,
    )  # fmt: skip
    return d


def tls_for(certs: Path, name: str) -> dict[str, object]:
    """A node config's `tls:` for member `name`, mutual TLS against the test CA."""
    return {
        "cert": str(certs / f"{name}.pem"),
        "key": str(certs / f"{name}.key"),
        "ca": str(certs / "ca.pem"),
        "require_client_cert": True,
    }
