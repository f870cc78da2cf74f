"""Kernel build variants as the tools take them on their command lines:
defines "MACRO=v[+MACRO=v]", and a named variant "name:MACRO=v[+MACRO=v]"
(an empty define list: the default build)."""
from __future__ import annotations

from typing import Sequence

Defines = tuple[tuple[str, str], ...]


def parse_defines(spec: str) -> Defines:
    """("MACRO", "v") pairs of "MACRO=v[+MACRO=v]"; ValueError for a part without "=value"."""
    out = []
    for part in (p for p in spec.split("+") if p):
        name, sep, value = part.partition("=")
        if not sep or not name:
            raise ValueError(f"{spec!r}: {part!r} is not MACRO=value")
        out.append((name, value))
    return tuple(out)


def parse_define_flags(specs: Sequence[str]) -> Defines:
    """The defines of a tool's repeated --define flags, each "MACRO=v[+MACRO=v]", in order."""
    return tuple(kv for spec in specs for kv in parse_defines(spec))


def parse_variant(spec: str) -> tuple[str, Defines]:
    """The name and defines of "name:MACRO=v[+MACRO=v]"."""
    name, _, defs = spec.partition(":")
    return name, parse_defines(defs)
