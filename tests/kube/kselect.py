"""Label selectors, field selectors and the JSONPath subset of printer columns.

Kubernetes semantics, pure functions: an operator that filters its pods by
``app.kubernetes.io/component=streaming-node`` must see exactly those pods here too.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

Predicate = Callable[[dict[str, Any]], bool]


class SelectorError(ValueError):
    """A selector that does not parse (the API server answers 400)."""


def _split_top(text: str) -> list[str]:
    """Split on commas that are not inside ``in (a, b)`` parentheses."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


_SET = re.compile(r"^([\w./-]+)\s+(in|notin)\s+\(([^)]*)\)$")
_EQ = re.compile(r"^([\w./-]+)\s*(==|=|!=)\s*([\w./-]*)$")
_EXISTS = re.compile(r"^(!?)\s*([\w./-]+)$")


def label_selector(text: str | None) -> Predicate:
    """Compile ``a=b,c!=d,e in (x,y),f notin (z),g,!h`` into a predicate on an object."""
    if not text:
        return lambda obj: True
    tests: list[Callable[[dict[str, str]], bool]] = []
    for part in _split_top(text):
        if m := _SET.match(part):
            key, op, values = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",")}
            if op == "in":
                tests.append(lambda lb, k=key, vs=values: lb.get(k) in vs)
            else:
                tests.append(lambda lb, k=key, vs=values: lb.get(k) not in vs)
        elif m := _EQ.match(part):
            key, op, value = m.groups()
            if op == "!=":
                tests.append(lambda lb, k=key, v=value: lb.get(k) != v)
            else:
                tests.append(lambda lb, k=key, v=value: lb.get(k) == v)
        elif m := _EXISTS.match(part):
            neg, key = m.groups()
            tests.append((lambda lb, k=key: k not in lb) if neg else (lambda lb, k=key: k in lb))
        else:
            raise SelectorError(f"unable to parse requirement: {part!r}")

    def match(obj: dict[str, Any]) -> bool:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return all(t(labels) for t in tests)

    return match


def _dotted(obj: Any, path: str) -> Any:
    for key in path.split("."):
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def field_selector(text: str | None) -> Predicate:
    """Compile ``metadata.name=x,status.phase!=Running`` (equality on dotted paths).

    A real server supports a per-type list of fields; any dotted path is accepted here.
    Absent fields compare as the empty string, as the real server's field sets do.
    """
    if not text:
        return lambda obj: True
    tests: list[tuple[str, bool, str]] = []
    for part in _split_top(text):
        m = re.match(r"^([\w.]+)\s*(==|=|!=)\s*(.*)$", part)
        if not m:
            raise SelectorError(f"invalid field selector: {part!r}")
        tests.append((m.group(1), m.group(2) != "!=", m.group(3)))

    def match(obj: dict[str, Any]) -> bool:
        for path, equal, value in tests:
            got = _dotted(obj, path)
            got_s = "" if got is None else str(got).lower() if isinstance(got, bool) else str(got)
            if (got_s == value) != equal:
                return False
        return True

    return match


_TOKEN = re.compile(r"\.([\w-]+)|\[(\d+)\]|\[\?\(@\.([\w.-]+)\s*==\s*[\"']([^\"']*)[\"']\)\]")


def jsonpath(obj: Any, expr: str) -> Any:
    """Evaluate a printer-column JSONPath: ``.a.b``, ``[0]`` and ``[?(@.type=="Ready")]``.

    Returns the first match, or None when the path leads nowhere.
    """
    expr = expr.strip()
    if expr.startswith("{") and expr.endswith("}"):
        expr = expr[1:-1]
    pos, cur = 0, obj
    while pos < len(expr) and cur is not None:
        m = _TOKEN.match(expr, pos)
        if not m:
            raise SelectorError(f"unsupported JSONPath {expr!r} at {pos}")
        pos = m.end()
        name, index, fkey, fval = m.groups()
        if name is not None:
            cur = cur.get(name) if isinstance(cur, dict) else None
        elif index is not None:
            i = int(index)
            cur = cur[i] if isinstance(cur, list) and i < len(cur) else None
        else:
            cur = (
                next((item for item in cur if str(_dotted(item, fkey)) == fval), None)
                if isinstance(cur, list)
                else None
            )
    return cur
