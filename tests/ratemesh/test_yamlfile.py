"""ratemesh.yamlfile.load_yaml: the one way a config or scenario file is read. Every failure
is a ConfigError whose message names the file and says what is wrong; never a traceback."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ratemesh.errors import ConfigError, RatemeshError
from ratemesh.yamlfile import YAML_BYTES_MAX, YAML_DEPTH_MAX, YAML_NODES_MAX, load_yaml


class OtherConfigError(ConfigError):
    pass


def _refused(path: Path, *words: str) -> ConfigError:
    before = path.read_bytes() if path.is_file() else None
    with pytest.raises(ConfigError) as info:
        load_yaml(path)
    err = info.value
    assert err.field == "config" and str(path) in err.problem, err
    for w in words:
        assert w in err.problem, err
    assert "\n" not in str(err)  # one line at the operator boundary
    if before is not None:
        assert path.read_bytes() == before  # the file is only read
    return err


def test_reads_a_document(tmp_path: Path) -> None:
    p = tmp_path / "ok.yaml"
    p.write_text("listen: 127.0.0.1:7001\nmembers: [a, b]\n")
    assert load_yaml(p) == {"listen": "127.0.0.1:7001", "members": ["a", "b"]}
    p.write_text("")
    assert load_yaml(p) is None
    p.write_bytes(b"\xef\xbb\xbfa: 1\n")  # a UTF-8 byte-order mark is fine
    assert load_yaml(str(p)) == {"a": 1}


def test_missing_file_and_directory_say_which(tmp_path: Path) -> None:
    _refused(tmp_path / "nope.yaml", "cannot read", "no such file")
    _refused(tmp_path, "cannot read", "is a directory")


def test_unreadable_file_says_permission(tmp_path: Path) -> None:
    p = tmp_path / "secret.yaml"
    p.write_text("a: 1\n")
    p.chmod(0)
    try:
        if os.geteuid() != 0:
            _refused(p, "cannot read", "permission denied")
            return
        # Root reads any file: read it as `nobody` in a forked child instead.
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: drop to nobody, try, report the message, exit at once
            try:
                os.setresgid(65534, 65534, 65534)
                os.setresuid(65534, 65534, 65534)
                load_yaml(str(p))
                os.write(w, b"loaded")
            except BaseException as exc:  # noqa: BLE001 - reported to the parent
                os.write(w, f"{type(exc).__name__}: {exc}".encode()[:4000])
            finally:
                os._exit(0)
        os.close(w)
        os.waitpid(pid, 0)
        with os.fdopen(r, "rb") as f:
            said = f.read().decode()
        assert said.startswith("ConfigError:") and "cannot read" in said, said
        assert "permission denied" in said and str(p) in said, said
    finally:
        p.chmod(0o600)


def test_not_utf8_names_the_byte_offset(tmp_path: Path) -> None:
    p = tmp_path / "latin1.yaml"
    p.write_bytes("name: caf\xe9\n".encode("latin-1"))
    _refused(p, "not UTF-8", "0xe9", "offset 9")


def test_invalid_yaml_names_line_and_column(tmp_path: Path) -> None:
    p = tmp_path / "bad.yaml"
    p.write_text("a: 1\nb: [1, 2\nc: 3\n")
    _refused(p, "not valid YAML", "line 3, column 2")
    p.write_text("a: 1\n---\nb: 2\n")
    _refused(p, "not valid YAML", "line 2")
    p.write_text("a: !!python/object:os.system echo\n")
    _refused(p, "not valid YAML", "line 1")
    p.write_text("when: 2024-13-45\n")
    _refused(p, "not valid YAML", "month")


@pytest.mark.parametrize("depth", [YAML_DEPTH_MAX + 1, 5000, 200_000])
def test_deep_nesting_is_refused_without_recursion(tmp_path: Path, depth: int) -> None:
    p = tmp_path / "deep.yaml"
    p.write_text("[" * depth + "]" * depth)
    _refused(p, f"deeper than {YAML_DEPTH_MAX} levels")
    p.write_text("a:\n" + "".join(" " * i + "- \n" for i in range(1, min(depth, 2000))))
    _refused(p, f"deeper than {YAML_DEPTH_MAX} levels")


def test_depth_at_the_bound_is_fine(tmp_path: Path) -> None:
    p = tmp_path / "ok.yaml"
    p.write_text("[" * YAML_DEPTH_MAX + "]" * YAML_DEPTH_MAX)
    value = load_yaml(p)
    for _ in range(YAML_DEPTH_MAX - 1):
        (value,) = value
    assert value == []


def test_aliases_count_for_depth_and_may_not_recurse(tmp_path: Path) -> None:
    p = tmp_path / "alias.yaml"
    lines = ["l0: &a0 [1]"] + [f"l{i}: &a{i} [*a{i - 1}]" for i in range(1, YAML_DEPTH_MAX + 1)]
    p.write_text("\n".join(lines) + "\n")
    _refused(p, f"deeper than {YAML_DEPTH_MAX} levels")
    p.write_text("a: &x [*x]\n")
    _refused(p, f"deeper than {YAML_DEPTH_MAX} levels")


def _laughs(p: Path, levels: int) -> None:
    """10**levels leaves as written out, a few dozen nodes as stored."""
    lines = ["a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    names = "abcdefghijklmnop"[: levels + 1]
    for prev, cur in zip(names, names[1:], strict=False):
        lines.append(f"{cur}: &{cur} [" + ", ".join([f"*{prev}"] * 10) + "]")
    p.write_text("\n".join(lines) + "\n")


def test_billion_laughs_is_refused_without_expanding(tmp_path: Path) -> None:
    # 10**9 values to anything that walks the document (a validator, json.dumps)
    p = tmp_path / "laughs.yaml"
    _laughs(p, 8)
    _refused(p, f"more than {YAML_NODES_MAX} values", "aliases")


def test_shared_aliases_under_the_bound_load_shared(tmp_path: Path) -> None:
    p = tmp_path / "laughs.yaml"
    _laughs(p, 4)  # 10**5 leaves expanded
    data = load_yaml(p)
    assert data["e"][0] is data["d"]


def test_oversized_file_is_refused_before_parsing(tmp_path: Path) -> None:
    p = tmp_path / "big.yaml"
    p.write_bytes(b"# " + b"x" * YAML_BYTES_MAX + b"\n")
    _refused(p, "larger than", "4 MiB")


def test_field_and_family_are_the_callers(tmp_path: Path) -> None:
    p = tmp_path / "bad.yaml"
    p.write_bytes(b"\xff")
    with pytest.raises(OtherConfigError) as info:
        load_yaml(p, field="policies.file", error=OtherConfigError)
    assert info.value.field == "policies.file" and str(p) in info.value.problem
    assert isinstance(info.value, RatemeshError)
