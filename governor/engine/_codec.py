"""One codec from frozen dataclasses to JSON-able values and back, driven by type hints.

Events, results and configuration values go through it, so what is stored is exactly what the
types say; decoding validates shape and refuses anything it does not know.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Callable
from typing import Any

__all__ = ["decode_value", "encode_value"]

_Conv = Callable[[Any], Any]
_encoders: dict[Any, _Conv] = {}
_decoders: dict[Any, _Conv] = {}


def encode_value(tp: Any, value: Any) -> Any:
    """Encode ``value`` of declared type ``tp`` into JSON-able data."""
    conv = _encoders.get(tp)
    if conv is None:
        conv = _encoders[tp] = _build(tp, encode=True)
    return conv(value)


def decode_value(tp: Any, data: Any) -> Any:
    """Decode data produced by :func:`encode_value`; raises ``ValueError`` on a wrong shape."""
    conv = _decoders.get(tp)
    if conv is None:
        conv = _decoders[tp] = _build(tp, encode=False)
    return conv(data)


def _check(kind: type | tuple[type, ...], value: Any) -> Any:
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise ValueError(f"expected {kind}, got {value!r}")
    return value


def _build(tp: Any, *, encode: bool) -> _Conv:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is int:
        return lambda v: _check(int, v)
    if tp is bool:
        return lambda v: _check(bool, v)
    if tp is str:
        return lambda v: _check(str, v)
    if tp is type(None):
        return lambda v: _none(v)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        if len(inner) != 1:
            raise TypeError(f"unsupported union {tp}")
        sub = _build(inner[0], encode=encode)
        return lambda v: None if v is None else sub(v)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        if encode:
            return lambda v: _check(tp, v).value
        return lambda v: tp(v)
    if origin is dict:
        kc, vc = _build(args[0], encode=encode), _build(args[1], encode=encode)
        return lambda v: {kc(k): vc(x) for k, x in sorted(_check(dict, v).items())}
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            item = _build(args[0], encode=encode)
            out: Callable[[Any], Any] = list if encode else tuple
            return lambda v: out(item(x) for x in _check((list, tuple), v))
        items = [_build(a, encode=encode) for a in args]
        out = list if encode else tuple
        return lambda v: out(c(x) for c, x in zip(items, _fixed(v, len(items)), strict=True))
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _dataclass(tp, encode=encode)
    raise TypeError(f"unsupported type {tp!r}")


def _none(v: Any) -> None:
    if v is not None:
        raise ValueError(f"expected None, got {v!r}")
    return None


def _fixed(v: Any, n: int) -> Any:
    if not isinstance(v, (list, tuple)) or len(v) != n:
        raise ValueError(f"expected {n} items, got {v!r}")
    return v


def _dataclass(cls: type, *, encode: bool) -> _Conv:
    hints = typing.get_type_hints(cls)
    fields = [(f.name, hints[f.name]) for f in dataclasses.fields(cls)]
    convs: list[tuple[str, _Conv]] = []

    def lazy(tp: Any) -> _Conv:  # allows recursive types such as Defaults.children
        cache: list[_Conv] = []

        def conv(v: Any) -> Any:
            if not cache:
                cache.append(_lookup(tp, encode))
            return cache[0](v)

        return conv

    for name, tp in fields:
        convs.append((name, lazy(tp)))
    names = {n for n, _ in fields}
    if encode:

        def enc(v: Any) -> Any:
            _check(cls, v)
            return {n: c(getattr(v, n)) for n, c in convs}

        return enc

    def dec(d: Any) -> Any:
        _check(dict, d)
        extra = set(d) - names
        if extra:
            raise ValueError(f"{cls.__name__}: unknown fields {sorted(extra)}")
        kwargs = {n: c(d[n]) for n, c in convs if n in d}
        return cls(**kwargs)

    return dec


def _lookup(tp: Any, encode: bool) -> _Conv:
    table = _encoders if encode else _decoders
    conv = table.get(tp)
    if conv is None:
        conv = table[tp] = _build(tp, encode=encode)
    return conv
