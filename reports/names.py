"""Kernel names a reader can scan: C++ kernel names shortened for tables, the full name kept.

Kineto spells kernels as the compiler demangled them, e.g. ``void at::native::(anonymous
namespace)::CatArrayBatchedCopy_vectorized<at::native::(anonymous namespace)::OpaqueType<2u>,
unsigned int, 3, 128, 1, 16, 8>(char*, ...)``: the signature and namespaces are noise in a
table, the template name and its first-level arguments are what tells kernels apart. Reports show
the short form and keep the full one (hover, expand, JSON).
"""

from __future__ import annotations

import re

SHORT = 80

_ANON = re.compile(r"\(anonymous namespace\)::")
_LAMBDA = re.compile(r"::\{lambda\([^{}]*\)#\d+\}|::operator\(\)\(\)(?: const)?|\{lambda\([^{}]*\)#\d+\}")
_PARAMS = re.compile(r"\([^()]*\)")
_NAMESPACE = re.compile(r"\b[A-Za-z_]\w*::(?!\w*\()")


def _depth0_paren(s: str) -> int:
    """Index of the first '(' outside template brackets (where the argument list starts), or -1."""
    depth = 0
    for i, ch in enumerate(s):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif ch == "(" and depth == 0 and i > 0:
            return i
    return -1


def _collapse_deep(s: str) -> str:
    """Template arguments nested two levels deep replaced by '…'."""
    out, depth = [], 0
    for ch in s:
        if ch == "<":
            depth += 1
            if depth == 2:
                out.append("<…")
                continue
        elif ch == ">":
            depth = max(0, depth - 1)
            if depth == 1:
                out.append(">")
                continue
        if depth < 2:
            out.append(ch)
    return "".join(out)


def short_name(name: str, width: int = SHORT) -> str:
    """``name`` without return type, argument list, namespaces and lambda noise; nested template
    arguments collapsed, then cut with '…', until it fits ``width``. Names that are no C++
    signature (``nvjet_sm90_...``, Triton kernels) come back as they are when they fit."""
    s = name.strip()
    if s.startswith("void "):
        s = s[5:]
    s = _ANON.sub("", s)
    cut = _depth0_paren(s)
    if cut > 0:
        s = s[:cut]
    s = _LAMBDA.sub("", s)
    while True:
        t = _PARAMS.sub("", s)
        if t == s:
            break
        s = t
    s = _NAMESPACE.sub("", s)
    s = re.sub(r"\s+", " ", s).replace("> >", ">>").strip() or name
    if len(s) > width:
        s = _collapse_deep(s)
    if len(s) > width:
        s = s[: width - 1] + "…"
    return s


def op_label(name: str, width: int = SHORT) -> str:
    """An operator's name for a table: as the trace spells it, namespace kept (``aten::detach``
    and the ``detach`` it calls are two ops, and two rows), cut with '…' past ``width``."""
    s = name.strip()
    return s if len(s) <= width else s[: max(1, width - 1)] + "…"
