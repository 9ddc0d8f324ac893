"""Resource types of the emulated API server: the built-in kinds, and CRD-defined ones.

Built-in kinds are generic (stored as given, no schema); what makes them realistic is
their discovery entry (scope, short names, status subresource), which is what kubectl,
the Python client and Kopf look at.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class ResourceType:
    """One served group/version/resource, as discovery and the REST paths present it."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    singular: str = ""
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    status: bool = False  # has a status subresource
    schema: dict[str, Any] | None = None  # openAPIV3Schema of a CRD version
    columns: list[dict[str, Any]] = field(default_factory=list)  # additionalPrinterColumns
    crd: str | None = None  # the CRD that defines this type

    @property
    def group_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def prefix(self) -> str:
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"

    @property
    def store_key(self) -> tuple[str, str]:
        """Objects are stored per group and resource, shared by the group's versions."""
        return (self.group, self.plural)

    @property
    def qualified(self) -> str:
        """``pchannels.streamwal.io``: how API errors name the resource."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def gvk(self) -> dict[str, str]:
        return {"group": self.group, "version": self.version, "kind": self.kind}

    @property
    def schema_name(self) -> str:
        """The OpenAPI definition name, e.g. ``io.streamwal.v1alpha1.PChannel``."""
        domain = ".".join(reversed(self.group.split("."))) if self.group else "io.k8s.api.core"
        return f"{domain}.{self.version}.{self.kind}"

    def discovery(self) -> list[dict[str, Any]]:
        """The APIResource entries (the resource and its status subresource)."""
        verbs = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
        entry: dict[str, Any] = {
            "name": self.plural,
            "singularName": self.singular or self.kind.lower(),
            "namespaced": self.namespaced,
            "kind": self.kind,
            "verbs": verbs,
        }
        if self.short_names:
            entry["shortNames"] = list(self.short_names)
        if self.categories:
            entry["categories"] = list(self.categories)
        entries = [entry]
        if self.status:
            entries.append(
                {
                    "name": f"{self.plural}/status",
                    "singularName": "",
                    "namespaced": self.namespaced,
                    "kind": self.kind,
                    "verbs": ["get", "patch", "update"],
                }
            )
        return entries


def _t(
    group: str,
    version: str,
    plural: str,
    kind: str,
    *,
    cluster: bool = False,
    short: tuple[str, ...] = (),
    status: bool = False,
) -> ResourceType:
    return ResourceType(
        group,
        version,
        plural,
        kind,
        namespaced=not cluster,
        short_names=short,
        status=status,
        categories=("all",) if plural in _ALL else (),
    )


_ALL = {"pods", "services", "deployments", "statefulsets", "replicasets", "daemonsets", "jobs"}

BUILTINS: list[ResourceType] = [
    _t("", "v1", "namespaces", "Namespace", cluster=True, short=("ns",), status=True),
    _t("", "v1", "nodes", "Node", cluster=True, short=("no",), status=True),
    _t("", "v1", "persistentvolumes", "PersistentVolume", cluster=True, short=("pv",), status=True),
    _t("", "v1", "pods", "Pod", short=("po",), status=True),
    _t("", "v1", "services", "Service", short=("svc",), status=True),
    _t("", "v1", "endpoints", "Endpoints", short=("ep",)),
    _t("", "v1", "events", "Event", short=("ev",)),
    _t("", "v1", "configmaps", "ConfigMap", short=("cm",)),
    _t("", "v1", "secrets", "Secret"),
    _t("", "v1", "serviceaccounts", "ServiceAccount", short=("sa",)),
    _t("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", short=("pvc",), status=True),
    _t("apps", "v1", "deployments", "Deployment", short=("deploy",), status=True),
    _t("apps", "v1", "statefulsets", "StatefulSet", short=("sts",), status=True),
    _t("apps", "v1", "replicasets", "ReplicaSet", short=("rs",), status=True),
    _t("apps", "v1", "daemonsets", "DaemonSet", short=("ds",), status=True),
    _t("batch", "v1", "jobs", "Job", status=True),
    _t("rbac.authorization.k8s.io", "v1", "roles", "Role"),
    _t("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding"),
    _t("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", cluster=True),
    _t(
        "rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", cluster=True
    ),
    _t("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", short=("pdb",), status=True),
    _t("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", short=("netpol",)),
    _t("networking.k8s.io", "v1", "ingresses", "Ingress", short=("ing",), status=True),
    _t("coordination.k8s.io", "v1", "leases", "Lease"),
    _t("events.k8s.io", "v1", "events", "Event", short=("ev",)),
    _t(
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        "CustomResourceDefinition",
        cluster=True,
        short=("crd", "crds"),
        status=True,
    ),
]


def types_from_crd(crd: dict[str, Any]) -> list[ResourceType]:
    """The served versions of a CustomResourceDefinition, as resource types."""
    spec = crd["spec"]
    names = spec["names"]
    out = []
    for ver in spec.get("versions", []):
        if not ver.get("served", True):
            continue
        out.append(
            ResourceType(
                group=spec["group"],
                version=ver["name"],
                plural=names["plural"],
                kind=names["kind"],
                namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                singular=names.get("singular", ""),
                short_names=tuple(names.get("shortNames", ())),
                categories=tuple(names.get("categories", ())),
                status="status" in (ver.get("subresources") or {}),
                schema=(ver.get("schema") or {}).get("openAPIV3Schema"),
                columns=list(ver.get("additionalPrinterColumns") or []),
                crd=crd["metadata"]["name"],
            )
        )
    return out


def check_crd(crd: dict[str, Any]) -> list[str]:
    """What a real server rejects in a CRD that this emulator relies on (422 causes)."""
    problems = []
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    for key in ("group",):
        if not spec.get(key):
            problems.append(f"spec.{key}: Required value")
    for key in ("plural", "kind"):
        if not names.get(key):
            problems.append(f"spec.names.{key}: Required value")
    want = f"{names.get('plural')}.{spec.get('group')}"
    if crd.get("metadata", {}).get("name") != want:
        problems.append(
            f'metadata.name: Invalid value: "{crd.get("metadata", {}).get("name")}":'
            f' must be spec.names.plural+"."+spec.group'
        )
    if spec.get("scope") not in ("Namespaced", "Cluster"):
        problems.append('spec.scope: Unsupported value: supported values: "Cluster", "Namespaced"')
    versions = spec.get("versions") or []
    if sum(1 for v in versions if v.get("storage")) != 1:
        problems.append(
            "spec.versions: Invalid value: must have exactly one version marked as storage version"
        )
    for i, ver in enumerate(versions):
        if not (ver.get("schema") or {}).get("openAPIV3Schema"):
            problems.append(
                f"spec.versions[{i}].schema.openAPIV3Schema: Required value: schemas are required"
            )
    return problems
