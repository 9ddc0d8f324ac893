"""The PChannel CRD as a user meets it: the real kubectl against the real kube-apiserver.

These are the promises of crds/pchannels.streamwal.io.yaml: valid resources apply with
defaults filled in, invalid ones are rejected with a message naming the field, and
``kubectl get`` / ``kubectl explain`` show what an operator of the system needs.
"""

from __future__ import annotations

import json
import re

import pytest
import yaml

from streamwal import units
from tests.kube.conftest import CHART, CRD_FILE, Kubectl


def pchannel(name: str, **spec: object) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "streamwal.io/v1alpha1",
            "kind": "PChannel",
            "metadata": {"name": name},
            "spec": spec,
        }
    )


@pytest.fixture
def crd(kubectl: Kubectl, pchannel_crd: None) -> Kubectl:
    # Installed once per session; applying the file again is what a user's upgrade does.
    out = kubectl("apply", "-f", str(CRD_FILE))
    assert "customresourcedefinition.apiextensions.k8s.io/pchannels.streamwal.io" in out.stdout
    return kubectl


def test_valid_pchannel_applies_with_defaults(crd: Kubectl) -> None:
    out = crd("apply", "-f", "-", stdin=pchannel("ch-0", replicas=3))
    assert "pchannel.streamwal.io/ch-0 created" in out.stdout
    obj = json.loads(crd("get", "pch", "ch-0", "-o", "json").stdout)
    assert obj["spec"]["replicas"] == 3
    assert obj["spec"]["retention"] == {"age": "168h"}
    assert obj["spec"]["placement"] == {
        "antiAffinity": "Required",
        "topologyKey": "kubernetes.io/hostname",
    }
    assert obj["metadata"]["generation"] == 1
    # Re-applying the same manifest is a no-op, as users expect from declarative config.
    assert "unchanged" in crd("apply", "-f", "-", stdin=pchannel("ch-0", replicas=3)).stdout


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"replicas": 2}, "spec.replicas: Invalid value: 2: replicas must be odd"),
        ({"replicas": 0}, "spec.replicas in body should be greater than or equal to 1"),
        ({"replicas": 11}, "spec.replicas in body should be less than or equal to 9"),
        ({"retention": {"age": "7 days"}}, "spec.retention.age in body should match"),
        ({"retention": {"size": "10 parsecs"}}, "spec.retention.size in body should match"),
        (
            {"placement": {"antiAffinity": "Sometimes"}},
            'spec.placement.antiAffinity: Unsupported value: "Sometimes"',
        ),
        (
            {"replicas": 1, "replication": 3},
            'strict decoding error: unknown field "spec.replication"',
        ),
    ],
)
def test_invalid_pchannel_is_rejected_with_the_field_named(
    crd: Kubectl, spec: dict[str, object], expected: str
) -> None:
    out = crd("apply", "-f", "-", stdin=pchannel("bad", **spec), check=False)
    assert out.returncode != 0
    assert expected in out.stderr
    assert "NotFound" in crd("get", "pch", "bad", check=False).stderr


def test_get_shows_node_term_state_replicas(crd: Kubectl) -> None:
    crd("apply", "-f", "-", stdin=pchannel("ch-1", replicas=1))
    # The operator writes status through the subresource; kubectl can do the same.
    status = {
        "status": {
            "state": "Assigned",
            "term": 4,
            "observedGeneration": 1,
            "node": {"id": 2, "address": "127.0.0.3:19530"},
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "Assigned",
                    "message": "served by node 2",
                }
            ],
        }
    }
    crd("patch", "pch", "ch-1", "--subresource=status", "--type=merge", "-p", json.dumps(status))
    lines = crd("get", "pch").stdout.splitlines()
    assert lines[0].split() == ["NAME", "NODE", "TERM", "STATE", "REPLICAS", "AGE"]
    assert lines[1].split()[:5] == ["ch-1", "2", "4", "Assigned", "1"]
    wide = crd("get", "pch", "-o", "wide").stdout.splitlines()
    assert wide[0].split()[5:7] == ["READY", "ADDRESS"]
    assert wide[1].split()[5:7] == ["True", "127.0.0.3:19530"]


def test_explain_describes_every_field(crd: Kubectl) -> None:
    out = crd("explain", "pch.spec.replicas").stdout
    assert "FIELD: replicas <integer>" in out
    assert "Must be odd" in out
    for path in (
        "pch.spec.retention.age",
        "pch.spec.placement.antiAffinity",
        "pch.status.term",
        "pch.status.node.address",
        "pch.status.replicas.ackedOffset",
        "pch.status.conditions.reason",
        "pch.status.observedGeneration",
    ):
        text = crd("explain", path).stdout
        description = text.split("DESCRIPTION:", 1)[1].strip()
        assert len(description) > 10, (path, text)


def test_every_schema_field_has_a_description() -> None:
    crd = yaml.safe_load(CRD_FILE.read_text())
    missing = []

    def walk(schema: dict[str, object], path: str) -> None:
        if path and not schema.get("description"):
            missing.append(path)
        for key, sub in (schema.get("properties") or {}).items():  # type: ignore[union-attr]
            walk(sub, f"{path}.{key}")
        if isinstance(schema.get("items"), dict):
            walk(schema["items"], path + "[]")  # type: ignore[arg-type]

    walk(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"], "")
    # Items of a list are described by the list itself, as kubectl explain shows them.
    assert [m for m in missing if not m.endswith("[]")] == []


def test_the_crd_and_the_chart_speak_the_clis_grammar_of_sizes_and_durations() -> None:
    """One grammar (streamwal.units): what the node's flags take, the CRD and the chart's
    schema take, and nothing else."""
    spec = yaml.safe_load(CRD_FILE.read_text())["spec"]["versions"][0]["schema"]
    retention = spec["openAPIV3Schema"]["properties"]["spec"]["properties"]["retention"]
    assert retention["properties"]["age"]["pattern"] == units.DURATION_PATTERN
    assert retention["properties"]["size"]["pattern"] == units.SIZE_PATTERN
    schema = json.loads((CHART / "values.schema.json").read_text())
    node = schema["properties"]["node"]["properties"]["retention"]["properties"]
    assert (node["age"]["pattern"], node["size"]["pattern"]) == (
        units.DURATION_PATTERN,
        units.SIZE_PATTERN,
    )
    for size in ("10GB", "512Mi", "1.5GiB", "unlimited", "0"):
        assert re.match(units.SIZE_PATTERN, size) and units.parse_size(size) >= 0
    for age in ("7d", "168h", "200ms", "forever", "0", "30"):
        assert re.match(units.DURATION_PATTERN, age) and units.parse_duration_ms(age) >= 0
    assert units.parse_size("unlimited") == 0 and units.parse_duration_ms("forever") == 0
