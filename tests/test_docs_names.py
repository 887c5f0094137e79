"""The docs name only what exists: every `mesh`, `governord` and `gov` command line (its
subcommands and flags, checked against the real argparse parsers), every UPPER_CASE constant
(a module or class attribute in mesh, governor or ratemesh, or in the simulator, benchmarks
and tests the docs describe, with the value the docs give it where they give one; a dotted
`module.NAME` in that module), every environment variable (read somewhere in the code or the
deploy files) and every repository path or link in README.md and docs/*.md.

A name that moved or went away leaves a doc that misleads the operator who trusts it; this
test turns that into a failure naming the doc and the claim.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import re
from collections.abc import Iterator
from pathlib import Path

import grpc

import governor.cli
import governor.gov_cli
import mesh.cli

HERE = Path(__file__).resolve()  # its planted names are not the repository's
ROOT = HERE.parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Where a constant the docs name must live: the packages, and the simulator, benchmarks and
# tests the docs describe too.
CODE = ("mesh", "governor", "ratemesh", "sim", "bench", "tests")
PARSERS = {
    "mesh": mesh.cli._parser,
    "governord": governor.cli._parser,
    "gov": governor.gov_cli._parser,
}
SHELL_BLOCKS = {"", "sh", "bash", "shell", "console"}
# Words in UPPER_CASE that are not ours: other systems' vocabulary the docs quote.
EXTERNAL = {
    # Redis commands and errors (docs/redis.md)
    "EVALSHA",
    "HSET",
    "PEXPIRE",
    "NOSCRIPT",
    "WRONGTYPE",
    "TIME",
    "OOM",
    # HTTP methods, POSIX, Docker, logging levels
    "GET",
    "POST",
    "DELETE",
    "SIGHUP",
    "SIGTERM",
    "SIGKILL",
    "O_NOFOLLOW",
    "HEALTHCHECK",
    "INFO",
    "DEBUG",
    "WARNING",
    # Redis's LATENCY command, SQL
    "LATENCY",
    "SELECT",
    # a placeholder in a command line
    "NAME",
} | {code.name for code in grpc.StatusCode}
# Environment variables: set by the operator, read by the code (or the deploy files).
ENV_PREFIXES = ("RATEMESH_", "GOVERNOR_", "GOV_", "PYTHON", "PG", "XDG_", "GRPC_SSL_")
PATH_SUFFIXES = (".md", ".py", ".yaml", ".yml", ".json", ".toml", ".proto", ".sh", ".pyi")
CONSTANT = re.compile(r"[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+|[A-Z]{3,}[0-9]*")


# -- what the repository holds ----------------------------------------------------------


@functools.cache
def attributes() -> dict[str, set[int | None]]:
    """Every UPPER_CASE name assigned at module or class level in the code, with the int
    values it evaluates to (None where it is not arithmetic on literals and earlier names of
    its module). A line scan, not a parse: it keeps the test fast."""
    found: dict[str, set[int | None]] = {}
    for package in CODE:
        for path in (ROOT / package).rglob("*.py"):
            if path == HERE:
                continue
            known: dict[str, object] = {}
            for indent, name, expr in ASSIGNMENT.findall(path.read_text()):
                value = _value(expr, known) if not indent else None
                if value is not None:
                    known[name] = value
                found.setdefault(name, set()).add(value)
    return found


ASSIGNMENT = re.compile(r"^( {0,4})([A-Z][A-Z0-9_]*)\s*(?::[^=\n]+)?=(?!=)\s*([^\n]*)$", re.M)


def _value(expr: str, known: dict[str, object]) -> int | None:
    """The int an expression gives, if it is arithmetic on literals and `known` names."""
    expr = expr.split("#")[0].strip()
    if not re.fullmatch(r"[A-Z0-9_\s+\-*/()]+", expr):
        return None
    try:
        value = eval(expr, {"__builtins__": {}}, dict(known))
    except Exception:  # noqa: BLE001 - a name from another module: not checked
        return None
    return value if isinstance(value, int) else None


@functools.cache
def repository_words() -> frozenset[str]:
    """UPPER_CASE words in the code, tests, scripts and deploy files: where an environment
    variable is read or set."""
    words: set[str] = set()
    for folder in (*CODE, "scripts", "deploy"):
        for path in (ROOT / folder).rglob("*"):
            if path.is_file() and path.suffix not in (".png", ".pyc", ".md") and path != HERE:
                words.update(re.findall(r"[A-Z][A-Z0-9_]+", path.read_text(errors="replace")))
    return frozenset(words)


# -- what a doc claims ------------------------------------------------------------------


def spans(text: str) -> Iterator[tuple[str, str]]:
    """(kind, text): "block" lines of shell code blocks, "span" inline code, "link"
    targets of markdown links."""
    prose = []
    for i, part in enumerate(re.split(r"^```", text, flags=re.M)):
        if i % 2 == 0:
            prose.append(part)
            continue
        lang, _, body = part.partition("\n")
        if lang.strip() in SHELL_BLOCKS:
            for line in body.replace("\\\n", " ").splitlines():
                yield "block", line
    for part in prose:
        for m in re.finditer(r"``?([^`\n]+?)``?", part):
            yield "span", m.group(1)
        for m in re.finditer(r"\]\(([^)\s]+)\)", part):
            yield "link", m.group(1)


def commands(line: str) -> Iterator[tuple[str, list[str]]]:
    """The command lines of `mesh`, `governord` and `gov` in a shell line."""
    for segment in re.split(r"&&|\|\||;|(?<!\\)\|(?=\s)|\$\(", line):
        words = segment.strip().lstrip("$").split()
        while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=\S*", words[0]):
            words = words[1:]  # environment assignments before the command
        if len(words) >= 3 and words[0].endswith("python") and words[1:3] == ["-m", "mesh.cli"]:
            words = ["mesh", *words[3:]]
        if words and words[0].rpartition("/")[2] in PARSERS:
            if len(words) > 1 and not re.match(r"[a-z-]|[<\[]|[A-Z]+$", words[1]):
                continue  # `mesh = Mesh(...)`, a table row: not a command line
            yield words[0].rpartition("/")[2], words[1:]


@functools.cache
def parser_of(program: str) -> argparse.ArgumentParser:
    return PARSERS[program]()


def _placeholder(word: str) -> bool:
    return bool(re.search(r"[<{…]|\.\.\.", word)) or word.isupper()


def command_problems(program: str, words: list[str]) -> list[str]:
    parser = parser_of(program)
    path, problems, takes_value = [program], [], False
    for raw in words:
        if takes_value:
            takes_value = False
            continue
        word = raw.strip("[]()`,.:")
        if raw in ("--", "|") or word.startswith((">", "#")):
            break  # the command's own arguments, a redirection or a comment follow
        if not word:
            continue
        if word.startswith("-") and not re.fullmatch(r"-\d.*", word):
            for flag in word.split("|"):
                name, eq, _ = flag.strip("[]").partition("=")
                action = parser._option_string_actions.get(name)
                if action is None:
                    problems.append(f"`{' '.join(path)}` has no flag {name}")
                elif not eq and action.nargs != 0:
                    takes_value = True
            continue
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            continue  # a positional value
        if _placeholder(word):
            break  # `mesh bench NAME`: which one is not said
        choices: dict[str, argparse.ArgumentParser] = subs[0].choices  # type: ignore[assignment]
        names = word.replace("\\|", "|").split("|")
        missing = [n for n in names if n not in choices]
        for n in missing:
            problems.append(f"`{' '.join(path)}` has no subcommand {n!r}")
        if missing or len(names) > 1:
            break
        parser, path = choices[word], [*path, word]
    return problems


def constant_problems(span: str) -> list[str]:
    span = span.strip().lstrip("$")
    dotted = re.fullmatch(r"((?:[a-z_][a-z0-9_]*\.)+)([A-Z][A-Z0-9_]+)", span)
    if dotted:
        module, name = dotted.group(1).rstrip("."), dotted.group(2)
        if module.split(".")[0] not in CODE:
            return []
        try:
            found = hasattr(importlib.import_module(module), name)
        except ImportError:
            found = False
        return [] if found else [f"`{span}`: {module} has no {name}"]
    head = re.match(r"[A-Z][A-Z0-9_]*", span)
    if head is None or not CONSTANT.fullmatch(head.group()):
        return []
    rest = span[head.end() :]
    if rest and not re.match(r"(=|\s|/|$)", rest):
        return []  # `PEP8style` or prose, not one name
    name = head.group()
    if name in attributes() or name in EXTERNAL:
        return []
    if "=" in rest or name.startswith(ENV_PREFIXES):
        if name in repository_words():
            return []
        return [f"`{name}`: an environment variable nothing reads"]
    return [f"`{name}`: no such constant in {', '.join(CODE)}"]


def value_problems(text: str) -> list[str]:
    """`NAME` (N) and `NAME = N`: the value the docs give a constant is its value."""
    problems = []
    pattern = r"`([A-Z][A-Z0-9_]+)`\s*\(([\d,_]+)\)|`([A-Z][A-Z0-9_]+)\s*=\s*([\d,_]+)`"
    for m in re.finditer(pattern, text):
        name, said = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
        values = {v for v in attributes().get(name, set()) if v is not None}
        number = int(said.replace(",", "").replace("_", ""))
        if values and number not in values:
            problems.append(f"`{name}` ({said}): it is {sorted(values)}")
    return problems


def path_problems(target: str, doc: Path, *, link: bool) -> list[str]:
    target = target.split("#")[0].split("?")[0]
    if not target or re.match(r"[a-z]+:", target) or target.startswith(("/", "~", "$")):
        return []  # a URL, an anchor, an absolute or a home path: not the repository's
    if re.search(r"[*<>{}\s\"'=(),]", target):
        return []
    target = re.sub(r":\d+(-\d+)?$", "", target)  # file.py:120
    if not link:
        top = target.split("/")[0]
        if "/" not in target or not (ROOT / top).is_dir() or top.startswith("."):
            if not (top in (".ci",) and "/" in target):
                return []
    bases = [doc.parent, ROOT] if link else [ROOT, doc.parent]
    if any((b / target).exists() or (b / (target + ".py")).exists() for b in bases):
        return []
    return [f"{'link' if link else 'path'} {target}: no such file or folder"]


def problems(text: str, doc: Path) -> list[str]:
    """Every claim in `text` (a doc at `doc`) that names something that does not exist."""
    found: list[str] = []
    for kind, span in spans(text):
        if kind == "link":
            found += path_problems(span, doc, link=True)
            continue
        for program, words in commands(span):
            found += command_problems(program, words)
        if kind == "block":  # `NAME=value mesh ...`: an environment variable it reads
            for m in re.finditer(r"(?:^|\s)\$?([A-Z][A-Z0-9_]+)=", span):
                found += constant_problems(m.group(1) + "=")
        if kind == "span":
            found += constant_problems(span)
            if re.fullmatch(r"\S+", span) and ("/" in span or span.endswith(PATH_SUFFIXES)):
                found += path_problems(span, doc, link=False)
    found += value_problems(text)
    return found


# -- the tests --------------------------------------------------------------------------


def test_the_docs_name_only_what_exists() -> None:
    stale = [
        f"{doc.relative_to(ROOT)}: {p}" for doc in DOCS for p in problems(doc.read_text(), doc)
    ]
    assert not stale, "stale claims in the docs:\n" + "\n".join(stale)


PLANTED = """
Run `mesh sim run --scenario churn --made-up-flag` and `governord validate --nope 1`, or:

```sh
RATEMESH_NOT_READ=1 .venv/bin/mesh bench nosuchbench --json
gov run --slots 2 -- make && mesh node --coordinator x
```

The bound is `RETIRED_SCOPES_MAX` (50), reads `RATEMESH_NOBODY_READS`, and
`TOP_K` (51) tenants have series; `mesh.core.messages.NO_SUCH_MAX` does not exist.
The code is in `mesh/core/no_such_module.py`, see [the guide](no-such-guide.md).
Existing ones pass: `mesh sim run --scenario x --seed 1 --json`, `TOP_K` (50),
`mesh/core/gcra.py`, [api](api.md), `SIGHUP`, `UNAVAILABLE`.
"""


def test_a_planted_stale_claim_is_reported_each() -> None:
    found = problems(PLANTED, ROOT / "docs" / "planted.md")
    expected = [
        "`mesh sim run` has no flag --made-up-flag",
        "`governord validate` has no flag --nope",
        "`RATEMESH_NOT_READ`: an environment variable nothing reads",
        "`mesh bench` has no subcommand 'nosuchbench'",
        "`gov run` has no flag --slots",
        "`mesh node` has no flag --coordinator",
        "`RETIRED_SCOPES_MAX`: no such constant in mesh, governor, ratemesh, sim, bench, tests",
        "`RATEMESH_NOBODY_READS`: an environment variable nothing reads",
        "`mesh.core.messages.NO_SUCH_MAX`: mesh.core.messages has no NO_SUCH_MAX",
        "path mesh/core/no_such_module.py: no such file or folder",
        "link no-such-guide.md: no such file or folder",
        "`TOP_K` (51): it is [50]",
    ]
    assert sorted(found) == sorted(expected), found
