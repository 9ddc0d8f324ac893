"""Structural-schema semantics of CustomResourceDefinitions, as kube-apiserver applies them.

The emulator uses this to do to a custom resource what a real API server does on every
write: prune (or, under ``fieldValidation=Strict``, reject) unknown fields, fill defaults,
and validate types, bounds, patterns, enums and ``x-kubernetes-validations`` CEL rules.
Error texts follow apimachinery's ``field.Error`` rendering, so a test (and a user) reads
the same message kubectl would print against a real cluster.

Pure functions over JSON-like values; no I/O.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from typing import Any

try:  # CEL is optional: without it, x-kubernetes-validations rules are not checked.
    import cel as _cel
except ImportError:  # pragma: no cover - the test extra installs it
    _cel = None

Schema = dict[str, Any]
ROOT_FIELDS = ("apiVersion", "kind", "metadata")


@dataclass(frozen=True)
class FieldError:
    """One invalid field, rendered like apimachinery's field.Error."""

    path: str
    reason: str  # a metav1.CauseType: FieldValueInvalid, FieldValueRequired, ...
    detail: str

    def __str__(self) -> str:
        return f"{self.path}: {self.detail}"


def _go_value(value: Any) -> str:
    """How Go's %#v shows a JSON value in an error (strings quoted, numbers bare)."""
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"))
    return json.dumps(value)


def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return "null"


def _type_ok(schema: Schema, value: Any) -> bool:
    if schema.get("x-kubernetes-int-or-string"):
        return isinstance(value, (int, str)) and not isinstance(value, bool)
    want = schema.get("type")
    if want is None:
        return True
    if want == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and value.is_integer()
        )
    if want == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return _type_name(value) == want


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


# ---------------------------------------------------------------------------------- pruning


def prune(schema: Schema, obj: Any, path: str = "", root: bool = True) -> list[str]:
    """Remove fields the schema does not know; return their paths (for Strict rejection)."""
    unknown: list[str] = []
    if not isinstance(obj, dict) or schema.get("x-kubernetes-preserve-unknown-fields"):
        if isinstance(obj, list) and "items" in schema:
            for i, item in enumerate(obj):
                unknown += prune(schema["items"], item, f"{path}[{i}]", root=False)
        return unknown
    props: dict[str, Schema] = schema.get("properties", {})
    extra = schema.get("additionalProperties")
    for key in list(obj):
        if root and key in ROOT_FIELDS:
            continue
        if key in props:
            unknown += prune(props[key], obj[key], _join(path, key), root=False)
        elif isinstance(extra, dict):
            unknown += prune(extra, obj[key], _join(path, key), root=False)
        elif extra is True:
            continue
        else:
            unknown.append(_join(path, key))
            del obj[key]
    return unknown


# -------------------------------------------------------------------------------- defaulting


def apply_defaults(schema: Schema, obj: Any) -> None:
    """Fill absent properties from ``default`` (top-down, so ``default: {}`` nests)."""
    if isinstance(obj, dict):
        for key, sub in schema.get("properties", {}).items():
            if obj.get(key) is None and key in obj and not sub.get("nullable"):
                del obj[key]  # a null where null is not allowed is pruned, then defaulted
            if key not in obj and "default" in sub:
                obj[key] = copy.deepcopy(sub["default"])
            if key in obj:
                apply_defaults(sub, obj[key])
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key, value in obj.items():
                if key not in schema.get("properties", {}):
                    apply_defaults(extra, value)
    elif isinstance(obj, list) and "items" in schema:
        for item in obj:
            apply_defaults(schema["items"], item)


# -------------------------------------------------------------------------------- validation


def validate(schema: Schema, obj: Any, old: Any = None, path: str = "") -> list[FieldError]:
    """Every way ``obj`` breaks ``schema`` (empty list: valid). ``old`` feeds oldSelf rules."""
    errors: list[FieldError] = []
    _validate(schema, obj, old, path, errors, root=True)
    return errors


def _validate(
    schema: Schema, value: Any, old: Any, path: str, errors: list[FieldError], root: bool = False
) -> None:
    if value is None:
        if not schema.get("nullable") and not root:
            errors.append(FieldError(path, "FieldValueRequired", "Required value"))
        return
    if not _type_ok(schema, value):
        want = schema.get("type", "integer or string")
        errors.append(
            FieldError(
                path,
                "FieldValueTypeInvalid",
                f"Invalid value: {_go_value(_type_name(value))}: "
                f"{path} in body must be of type {want}: {_go_value(_type_name(value))}",
            )
        )
        return
    before = len(errors)
    _check_scalar(schema, value, path, errors)
    if isinstance(value, dict):
        props: dict[str, Schema] = schema.get("properties", {})
        for key in schema.get("required", []):
            if key not in value:
                errors.append(FieldError(_join(path, key), "FieldValueRequired", "Required value"))
        for key, sub_value in value.items():
            if root and key in ROOT_FIELDS:
                continue
            sub = props.get(key)
            if sub is None and isinstance(schema.get("additionalProperties"), dict):
                sub = schema["additionalProperties"]
            if sub is not None:
                sub_old = old.get(key) if isinstance(old, dict) else None
                _validate(sub, sub_value, sub_old, _join(path, key), errors)
        _check_count(schema, len(value), "properties", path, value, errors)
    elif isinstance(value, list):
        items = schema.get("items")
        if items is not None:
            for i, item in enumerate(value):
                _validate(items, item, None, f"{path}[{i}]", errors)
        _check_count(schema, len(value), "items", path, value, errors)
        if schema.get("x-kubernetes-list-type") == "map":
            keys = schema.get("x-kubernetes-list-map-keys", [])
            seen: set[tuple[Any, ...]] = set()
            for i, item in enumerate(value):
                k = tuple(item.get(key) for key in keys) if isinstance(item, dict) else (item,)
                if k in seen:
                    errors.append(
                        FieldError(
                            f"{path}[{i}]",
                            "FieldValueDuplicate",
                            f"Duplicate value: {_go_value(dict(zip(keys, k, strict=True)))}",
                        )
                    )
                seen.add(k)
    if len(errors) == before:  # CEL rules run only on values that passed the schema
        _check_rules(schema, value, old, path, errors)


def _check_scalar(schema: Schema, value: Any, path: str, errors: list[FieldError]) -> None:
    shown = _go_value(value)
    if "enum" in schema and value not in schema["enum"]:
        supported = ", ".join(_go_value(v) for v in schema["enum"])
        errors.append(
            FieldError(
                path,
                "FieldValueNotSupported",
                f"Unsupported value: {shown}: supported values: {supported}",
            )
        )
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema:
            low = schema["minimum"]
            if value < low or (schema.get("exclusiveMinimum") and value == low):
                word = (
                    "greater than" if schema.get("exclusiveMinimum") else "greater than or equal to"
                )
                errors.append(
                    FieldError(
                        path,
                        "FieldValueInvalid",
                        f"Invalid value: {shown}: {path} in body should be {word} {low}",
                    )
                )
        if "maximum" in schema:
            high = schema["maximum"]
            if value > high or (schema.get("exclusiveMaximum") and value == high):
                word = "less than" if schema.get("exclusiveMaximum") else "less than or equal to"
                errors.append(
                    FieldError(
                        path,
                        "FieldValueInvalid",
                        f"Invalid value: {shown}: {path} in body should be {word} {high}",
                    )
                )
        if "multipleOf" in schema and value % schema["multipleOf"]:
            errors.append(
                FieldError(
                    path,
                    "FieldValueInvalid",
                    f"Invalid value: {shown}: {path} in body should be a "
                    f"multiple of {schema['multipleOf']}",
                )
            )
    if isinstance(value, str):
        if "pattern" in schema and not re.search(schema["pattern"], value):
            errors.append(
                FieldError(
                    path,
                    "FieldValueInvalid",
                    f"Invalid value: {shown}: {path} in body should match '{schema['pattern']}'",
                )
            )
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            errors.append(
                FieldError(
                    path,
                    "FieldValueTooLong",
                    f"Too long: may not be longer than {schema['maxLength']}",
                )
            )
        if "minLength" in schema and len(value) < schema["minLength"]:
            errors.append(
                FieldError(
                    path,
                    "FieldValueInvalid",
                    f"Invalid value: {shown}: {path} in body should be at "
                    f"least {schema['minLength']} chars long",
                )
            )


def _check_count(
    schema: Schema, n: int, what: str, path: str, value: Any, errors: list[FieldError]
) -> None:
    if f"max{what.capitalize()}" in schema and n > schema[f"max{what.capitalize()}"]:
        errors.append(
            FieldError(
                path,
                "FieldValueTooMany",
                f"Too many: {n}: must have at most {schema[f'max{what.capitalize()}']} {what}",
            )
        )
    if f"min{what.capitalize()}" in schema and n < schema[f"min{what.capitalize()}"]:
        errors.append(
            FieldError(
                path,
                "FieldValueInvalid",
                f"Invalid value: {n}: {path} in body should have at least "
                f"{schema[f'min{what.capitalize()}']} {what}",
            )
        )


def _check_rules(schema: Schema, value: Any, old: Any, path: str, errors: list[FieldError]) -> None:
    rules = schema.get("x-kubernetes-validations") or []
    if not rules or _cel is None:
        return
    for rule in rules:
        expr: str = rule["rule"]
        uses_old = "oldSelf" in expr
        if uses_old and old is None:
            continue  # a transition rule only runs on updates that keep the field
        context = {"self": value, **({"oldSelf": old} if uses_old else {})}
        try:
            ok = _cel.evaluate(expr, context)
        except Exception as exc:  # a rule that cannot evaluate is an invalid value too
            ok, message = False, f"rule evaluation failed: {exc}"
        else:
            message = rule.get("message") or f"failed rule: {expr}"
        if ok is not True:
            where = path
            if rule.get("fieldPath"):
                where = path + rule["fieldPath"]
            errors.append(
                FieldError(
                    where,
                    rule.get("reason", "FieldValueInvalid"),
                    f"Invalid value: {_go_value(_type_name(value))}: {message}",
                )
            )


def render_invalid(kind: str, group: str, name: str, errors: list[FieldError]) -> str:
    """The Status message of a 422, e.g. ``PChannel.streamwal.io "x" is invalid: ...``."""
    qualified = f"{kind}.{group}" if group else kind
    body = str(errors[0]) if len(errors) == 1 else "[" + ", ".join(map(str, errors)) + "]"
    return f'{qualified} "{name}" is invalid: {body}'
