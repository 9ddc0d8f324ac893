"""OpenAPI documents of the emulated API server.

kubectl reads ``/openapi/v3`` for two things we need: whether a kind supports the
``fieldValidation`` query parameter (then it leaves validation to the server instead of
fetching the protobuf OpenAPI v2 document for client-side validation), and the schemas
that ``kubectl explain`` prints. Only that much is published here.
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

from .builtin import ResourceType

META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"

OBJECT_META: dict[str, Any] = {
    "description": "ObjectMeta is metadata that all persisted resources must have.",
    "type": "object",
    "properties": {
        "name": {"type": "string", "description": "Name must be unique within a namespace."},
        "generateName": {
            "type": "string",
            "description": "Prefix the server uses to generate a unique name.",
        },
        "namespace": {"type": "string", "description": "The namespace of the object."},
        "labels": {
            "type": "object",
            "additionalProperties": {"type": "string"},
            "description": "Map of string keys and values for selecting objects.",
        },
        "annotations": {
            "type": "object",
            "additionalProperties": {"type": "string"},
            "description": "Unstructured key value map set by tools.",
        },
        "finalizers": {
            "type": "array",
            "items": {"type": "string"},
            "description": "Must be empty before the object is deleted.",
        },
        "resourceVersion": {
            "type": "string",
            "description": "Opaque version for optimistic concurrency.",
        },
        "generation": {
            "type": "integer",
            "format": "int64",
            "description": "Sequence number of a specific generation of the spec.",
        },
        "uid": {"type": "string", "description": "Unique in time and space for this object."},
        "creationTimestamp": {
            "type": "string",
            "format": "date-time",
            "description": "When this object was created.",
        },
        "deletionTimestamp": {
            "type": "string",
            "format": "date-time",
            "description": "When this object will be deleted.",
        },
        "ownerReferences": {
            "type": "array",
            "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            "description": "Objects this object depends on.",
        },
    },
}

_PARAM = {"in": "query", "schema": {"type": "string", "uniqueItems": True}}
_WRITE_PARAMS = [
    dict(_PARAM, name=n, description=n) for n in ("dryRun", "fieldManager", "fieldValidation")
]


def _op(rt: ResourceType, action: str, writes: bool = False) -> dict[str, Any]:
    op: dict[str, Any] = {
        "operationId": f"{action}{rt.kind}",
        "responses": {"200": {"description": "OK"}},
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": rt.gvk,
    }
    if writes:
        op["parameters"] = copy.deepcopy(_WRITE_PARAMS)
    return op


def _object_schema(rt: ResourceType) -> dict[str, Any]:
    """The published schema of a kind: the CRD schema plus apiVersion, kind and metadata."""
    base = (
        copy.deepcopy(rt.schema)
        if rt.schema
        else {
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": True,
            "description": f"{rt.kind} is a built-in kind (served generically by the emulator).",
        }
    )
    props = base.setdefault("properties", {})
    props["apiVersion"] = {
        "type": "string",
        "description": "APIVersion defines the versioned schema of this representation "
        "of an object.",
    }
    props["kind"] = {
        "type": "string",
        "description": "Kind is a string value representing the REST resource this object "
        "represents.",
    }
    props["metadata"] = {
        "allOf": [{"$ref": f"#/components/schemas/{META}"}],
        "description": "Standard object's metadata.",
    }
    base["x-kubernetes-group-version-kind"] = [rt.gvk]
    return base


def group_version_doc(types: list[ResourceType]) -> dict[str, Any]:
    """The OpenAPI v3 document of one group/version."""
    paths: dict[str, Any] = {}
    schemas: dict[str, Any] = {META: OBJECT_META}
    for rt in types:
        ns = "/namespaces/{namespace}" if rt.namespaced else ""
        collection = f"{rt.prefix}{ns}/{rt.plural}"
        paths[collection] = {
            "get": _op(rt, "list"),
            "post": _op(rt, "post", writes=True),
            "delete": _op(rt, "deletecollection"),
        }
        item = {
            "get": _op(rt, "get"),
            "put": _op(rt, "put", writes=True),
            "patch": _op(rt, "patch", writes=True),
            "delete": _op(rt, "delete"),
        }
        paths[f"{collection}/{{name}}"] = item
        if rt.status:
            paths[f"{collection}/{{name}}/status"] = {
                "get": _op(rt, "get"),
                "put": _op(rt, "put", writes=True),
                "patch": _op(rt, "patch", writes=True),
            }
        schemas[rt.schema_name] = _object_schema(rt)
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.33.0"},
        "paths": paths,
        "components": {"schemas": schemas},
    }


def _gv_path(rt: ResourceType) -> str:
    return f"apis/{rt.group}/{rt.version}" if rt.group else f"api/{rt.version}"


def v3_documents(types: list[ResourceType]) -> dict[str, dict[str, Any]]:
    """All group/version documents, keyed by ``api/v1`` / ``apis/<group>/<version>``."""
    by_gv: dict[str, list[ResourceType]] = {}
    for rt in types:
        by_gv.setdefault(_gv_path(rt), []).append(rt)
    return {gv: group_version_doc(rts) for gv, rts in by_gv.items()}


def v3_root(docs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``/openapi/v3``: where each group/version document is, with a content hash."""
    paths = {}
    for gv, doc in docs.items():
        digest = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:32]
        paths[gv] = {"serverRelativeURL": f"/openapi/v3/{gv}?hash={digest.upper()}"}
    return {"paths": paths}


def v2_document(types: list[ResourceType]) -> dict[str, Any]:
    """A JSON Swagger 2.0 document (definitions only), for clients that ask for JSON."""
    definitions: dict[str, Any] = {META: OBJECT_META}
    for rt in types:
        text = json.dumps(_object_schema(rt)).replace("#/components/schemas/", "#/definitions/")
        definitions[rt.schema_name] = json.loads(text)
    return {
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": "v1.33.0"},
        "paths": {},
        "definitions": definitions,
    }
