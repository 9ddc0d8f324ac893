"""The patch formats of the Kubernetes API: JSON patch, JSON merge patch, strategic merge.

Strategic merge is approximated: ``$``-directives are honoured or dropped, and lists of
objects that all carry a ``name`` (containers, env, volumes, ports) merge by that key;
other lists are replaced, as a merge patch does. Kopf uses merge and JSON patches;
kubectl uses strategic merge only when re-applying built-in kinds.
"""

from __future__ import annotations

import copy
from typing import Any


class PatchError(ValueError):
    """The patch does not apply. ``test_failed`` marks a failed JSON-patch ``test`` op."""

    def __init__(self, message: str, test_failed: bool = False) -> None:
        super().__init__(message)
        self.test_failed = test_failed


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, ``null`` deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """Merge patch plus the ``name``-keyed list merge and directives kubectl emits."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if not k.startswith("$")}
    if patch.get("$patch") == "delete":
        return None
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$"):
            continue  # $setElementOrder/..., $retainKeys, $deleteFromPrimitiveList/...
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list) and _named(value) and _named(result.get(key)):
            merged = {item["name"]: item for item in copy.deepcopy(result[key])}
            for item in value:
                if item.get("$patch") == "delete":
                    merged.pop(item["name"], None)
                else:
                    merged[item["name"]] = strategic_merge_patch(merged.get(item["name"]), item)
            result[key] = list(merged.values())
        else:
            result[key] = strategic_merge_patch(result.get(key), value)
    return result


def _named(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(item, dict) and "name" in item for item in value)
    )


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _parent(doc: Any, parts: list[str], path: str) -> tuple[Any, str]:
    cur = doc
    for part in parts[:-1]:
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        elif isinstance(cur, list) and part.isdigit() and int(part) < len(cur):
            cur = cur[int(part)]
        else:
            raise PatchError(f"path {path!r} does not exist")
    return cur, parts[-1]


def _get(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    if not parts:
        return doc
    parent, last = _parent(doc, parts, path)
    if isinstance(parent, dict) and last in parent:
        return parent[last]
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return parent[int(last)]
    raise PatchError(f"path {path!r} does not exist")


def _add(doc: Any, path: str, value: Any) -> Any:
    parts = _pointer(path)
    if not parts:
        return value
    parent, last = _parent(doc, parts, path)
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        if last == "-":
            parent.append(value)
        elif last.isdigit() and int(last) <= len(parent):
            parent.insert(int(last), value)
        else:
            raise PatchError(f"index out of range in {path!r}")
    else:
        raise PatchError(f"path {path!r} does not exist")
    return doc


def _remove(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    parent, last = _parent(doc, parts, path)
    if isinstance(parent, dict) and last in parent:
        return parent.pop(last)
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return parent.pop(int(last))
    raise PatchError(f"unable to remove nonexistent key {path!r}")


def json_patch(target: Any, ops: Any) -> Any:
    """RFC 6902 (add, remove, replace, move, copy, test) on a copy of ``target``."""
    if not isinstance(ops, list):
        raise PatchError("a JSON patch must be a list of operations")
    doc = copy.deepcopy(target)
    for op in ops:
        kind, path = op.get("op"), op.get("path", "")
        if kind == "add":
            doc = _add(doc, path, copy.deepcopy(op.get("value")))
        elif kind == "remove":
            _remove(doc, path)
        elif kind == "replace":
            _get(doc, path)  # must exist
            if _pointer(path):
                _remove(doc, path)
            doc = _add(doc, path, copy.deepcopy(op.get("value")))
        elif kind == "move":
            value = _remove(doc, op["from"])
            doc = _add(doc, path, value)
        elif kind == "copy":
            doc = _add(doc, path, copy.deepcopy(_get(doc, op["from"])))
        elif kind == "test":
            try:
                got = _get(doc, path)
            except PatchError:
                got = None
            if got != op.get("value"):
                raise PatchError(
                    f"testing value {path} failed: test operation does not apply: "
                    f"is {got!r}, expected {op.get('value')!r}",
                    test_failed=True,
                )
        else:
            raise PatchError(f"unexpected JSON patch op {kind!r}")
    return doc
