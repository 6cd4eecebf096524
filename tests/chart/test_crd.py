"""The ParallelConsumer CRD: API validity, the contract of docs/architecture.md, descriptions, defaults,
bounds and CEL rules, and the example custom resources in examples/."""

from __future__ import annotations

import copy
import re
from typing import Any

import jsonschema  # type: ignore[import-untyped]  # no stubs in the dev extra
import kubernetes_validate
import pytest

from .conftest import (
    CRD_FILE,
    KUBE_VERSION,
    Manifest,
    apply_defaults,
    iter_schema_nodes,
    load_examples,
    to_json_schema,
)

EXAMPLES = load_examples()

# Field names fixed by docs/architecture.md ("ParallelConsumer custom resource"), plus
# spec.scaling.replicas, the scale subresource's spec path.
CONTRACT_SPEC_FIELDS = {
    "kafka": {"bootstrapServers", "topics", "consumerGroup", "config", "credentialsSecretRef"},
    "workload": {
        "image",
        "imagePullPolicy",
        "processor",
        "ordering",
        "maxInFlightRecords",
        "maxInFlightBytes",
        "maxRetries",
        "leaseDurationSeconds",
        "deadLetterTopic",
        "env",
        "resources",
    },
    "scaling": {
        "replicas",
        "minReplicas",
        "maxReplicas",
        "minFactor",
        "maxFactor",
        "targetCatchUpSeconds",
        "maxLag",
        "targetUtilisation",
        "scaleDownDelaySeconds",
        "stabilisationSeconds",
        "maxPartitionsMovedAtOnce",
        "maxLanesPerReplica",
        "intervalSeconds",
        "metrics",
    },
    "state": {
        "enabled",
        "acceptableRecoveryLag",
        "learnerTimeoutSeconds",
        "changelogConfig",
        "storage",
        "pvcRetention",
        "snapshot",
    },
    "podTemplate": {
        "labels",
        "annotations",
        "imagePullSecrets",
        "nodeSelector",
        "tolerations",
        "affinity",
        "topologySpreadConstraints",
        "priorityClassName",
        "securityContext",
        "volumes",
        "volumeMounts",
    },
}
CONTRACT_STATUS_FIELDS = {
    "observedGeneration",
    "conditions",
    "replicas",
    "factor",
    "lag",
    "inputRate",
    "processingRate",
    "labelSelector",
    "lastDecision",
    "assignment",
    "rollout",
    "policy",
}


def minimal_cr() -> Manifest:
    return copy.deepcopy(EXAMPLES["parallelconsumer-minimal.yaml"])


_VALIDATORS: dict[int, jsonschema.protocols.Validator] = {}


def validator(openapi_schema: Manifest) -> jsonschema.protocols.Validator:
    """A (cached) strict JSON Schema validator of the CRD's openAPIV3Schema."""
    key = id(openapi_schema)
    if key not in _VALIDATORS:
        schema = to_json_schema(openapi_schema)
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        cls.check_schema(schema)
        _VALIDATORS[key] = cls(schema, format_checker=cls.FORMAT_CHECKER)
    return _VALIDATORS[key]


# --- the CRD object itself ---------------------------------------------------------------------------


def test_crd_is_a_valid_kubernetes_object(crd: Manifest) -> None:
    kubernetes_validate.validate(crd, KUBE_VERSION, strict=True)


def test_crd_names_scope_and_subresources(crd: Manifest, crd_version: Manifest) -> None:
    spec = crd["spec"]
    assert crd["metadata"]["name"] == "parallelconsumers.multilane.dev"
    assert spec["group"] == "multilane.dev"
    assert spec["scope"] == "Namespaced"
    assert spec["names"]["kind"] == "ParallelConsumer"
    assert spec["names"]["plural"] == "parallelconsumers"
    assert spec["names"]["shortNames"] == ["pcon"]
    assert set(spec["names"]["categories"]) == {"multilane", "all"}
    assert crd_version["name"] == "v1alpha1"
    assert crd_version["served"] and crd_version["storage"]
    subresources = crd_version["subresources"]
    assert subresources["status"] == {}
    assert subresources["scale"] == {
        "specReplicasPath": ".spec.scaling.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.labelSelector",
    }


def test_scale_subresource_paths_exist_in_schema(crd_version: Manifest, openapi_schema: Manifest) -> None:
    """Every path of the scale subresource names an integer/string field of the schema."""
    scale = crd_version["subresources"]["scale"]
    expected_types = {
        "specReplicasPath": "integer",
        "statusReplicasPath": "integer",
        "labelSelectorPath": "string",
    }
    for key, json_path in scale.items():
        node = openapi_schema
        for part in json_path.strip(".").split("."):
            node = node["properties"][part]
        assert node["type"] == expected_types[key], key
    # spec.scaling.replicas has no default: unset means "autoscale".
    replicas = openapi_schema["properties"]["spec"]["properties"]["scaling"]["properties"]["replicas"]
    assert "default" not in replicas


def test_printer_columns(crd_version: Manifest) -> None:
    columns = {c["name"]: c for c in crd_version["additionalPrinterColumns"]}
    main = [c["name"] for c in crd_version["additionalPrinterColumns"] if c.get("priority", 0) == 0]
    assert main == ["Ready", "Replicas", "Factor", "Lag", "Age"]
    assert columns["Ready"]["jsonPath"] == '.status.conditions[?(@.type=="Ready")].status'
    assert columns["Replicas"]["jsonPath"] == ".status.replicas"
    assert columns["Factor"]["jsonPath"] == ".status.factor"
    assert columns["Lag"]["jsonPath"] == ".status.lag"
    assert columns["Age"] == {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}


def test_schema_carries_the_contract_fields(openapi_schema: Manifest) -> None:
    spec = openapi_schema["properties"]["spec"]
    assert set(spec["properties"]) == set(CONTRACT_SPEC_FIELDS)
    for section, fields in CONTRACT_SPEC_FIELDS.items():
        assert set(spec["properties"][section]["properties"]) == fields, section
    assert set(spec["required"]) == {"kafka", "workload"}
    assert set(spec["properties"]["kafka"]["required"]) == {"bootstrapServers", "topics", "consumerGroup"}
    assert set(spec["properties"]["workload"]["required"]) == {"image", "processor"}
    metrics = spec["properties"]["scaling"]["properties"]["metrics"]["properties"]
    assert set(metrics) == {"source", "prometheus"}
    assert set(metrics["prometheus"]["properties"]) == {"url", "lagQuery", "rateQuery"}
    state = spec["properties"]["state"]["properties"]
    assert set(state["storage"]["properties"]) == {"size", "storageClassName"}
    assert set(state["snapshot"]["properties"]) == {"uri", "schedule", "retention"}
    assert set(state["pvcRetention"]["properties"]) == {"whenDeleted", "whenScaled"}
    security = spec["properties"]["podTemplate"]["properties"]["securityContext"]["properties"]
    assert set(security) == {
        "platformAssignsIds", "runAsUser", "runAsGroup", "fsGroup",
        "fsGroupChangePolicy", "supplementalGroups",
    }  # fmt: skip
    status = openapi_schema["properties"]["status"]
    assert set(status["properties"]) == CONTRACT_STATUS_FIELDS
    condition = status["properties"]["conditions"]["items"]["properties"]
    assert set(condition) == {
        "type",
        "status",
        "reason",
        "message",
        "lastTransitionTime",
        "observedGeneration",
    }
    assert status["properties"]["conditions"]["x-kubernetes-list-map-keys"] == ["type"]
    # credentials only by reference: a Secret name, nothing else.
    ref = spec["properties"]["kafka"]["properties"]["credentialsSecretRef"]
    assert set(ref["properties"]) == {"name"}


def test_every_field_has_a_description_for_kubectl_explain(openapi_schema: Manifest) -> None:
    """Prints what `kubectl explain parallelconsumer --recursive` would describe, field by field."""
    missing: list[str] = []
    lines: list[str] = []
    for path, node in iter_schema_nodes(openapi_schema):
        if path == ".metadata":
            continue  # may not carry a description (see test_schema_is_structural)
        description = str(node.get("description", "")).strip()
        if not description:
            missing.append(path or "<root>")
        lines.append(f"{path or '<root>'}: {description[:100]}")
    print("\n".join(lines))
    assert len(lines) > 100
    assert missing == []


def test_schema_is_structural(openapi_schema: Manifest) -> None:
    """The API server's structural-schema rules that kubernetes-validate does not check."""
    # the root metadata may restrict only name/generateName: no description, no other key
    assert openapi_schema["properties"]["metadata"] == {"type": "object"}
    for path, node in iter_schema_nodes(openapi_schema):
        # metadata only at the root; never properties and additionalProperties together
        assert path == "" or "metadata" not in node.get("properties", {}), path
        assert not ("properties" in node and "additionalProperties" in node), path
        # anyOf only as the int-or-string pattern (other junctors may not carry types)
        if "anyOf" in node:
            assert node.get("x-kubernetes-int-or-string") is True, path
            assert node["anyOf"] == [{"type": "integer"}, {"type": "string"}], path
        # list-map keys must be required in the items
        if node.get("x-kubernetes-list-type") == "map":
            assert set(node["x-kubernetes-list-map-keys"]) <= set(node["items"].get("required", [])), path
        if node.get("x-kubernetes-list-type") == "set":
            assert node["items"]["type"] in {"string", "integer", "number", "boolean"}, path
    # every node has a type (or is int-or-string / preserves unknown fields)
    untyped = [
        path
        for path, node in iter_schema_nodes(openapi_schema)
        if "type" not in node
        and not node.get("x-kubernetes-int-or-string")
        and not node.get("x-kubernetes-preserve-unknown-fields")
    ]
    assert untyped == []


def test_defaults_satisfy_their_own_schema(openapi_schema: Manifest) -> None:
    checked = 0
    for _path, node in iter_schema_nodes(openapi_schema):
        if "default" in node:
            node_schema = to_json_schema({k: v for k, v in node.items() if k != "default"})
            jsonschema.validate(node["default"], node_schema)
            checked += 1
    assert checked >= 25


def test_defaulting_fills_the_documented_defaults(openapi_schema: Manifest) -> None:
    spec = apply_defaults(openapi_schema, minimal_cr())["spec"]
    assert spec["workload"]["ordering"] == "key"
    assert spec["workload"]["imagePullPolicy"] == "IfNotPresent"
    assert spec["workload"]["maxInFlightRecords"] == 10000
    assert spec["workload"]["maxInFlightBytes"] == 67108864
    assert spec["workload"]["maxRetries"] == 3
    scaling = spec["scaling"]
    assert (scaling["minReplicas"], scaling["maxReplicas"], scaling["minFactor"], scaling["maxFactor"]) == (
        1,
        10,
        1,
        64,
    )
    assert scaling["targetCatchUpSeconds"] == 300
    assert scaling["targetUtilisation"] == 0.7
    assert (scaling["scaleDownDelaySeconds"], scaling["stabilisationSeconds"]) == (300, 60)
    assert (scaling["maxPartitionsMovedAtOnce"], scaling["intervalSeconds"]) == (4, 5)
    assert scaling["metrics"]["source"] == "kafka"
    assert "replicas" not in scaling and "maxLag" not in scaling
    state = spec["state"]
    assert state["enabled"] is False
    assert (state["acceptableRecoveryLag"], state["learnerTimeoutSeconds"]) == (10000, 600)
    assert state["storage"] == {"size": "10Gi", "storageClassName": ""}
    assert state["snapshot"] == {"uri": "", "schedule": "", "retention": 3}


# --- example custom resources ----------------------------------------------------------------------


def test_the_four_examples_exist() -> None:
    assert set(EXAMPLES) >= {
        "parallelconsumer-minimal.yaml",
        "parallelconsumer-full.yaml",
        "parallelconsumer-prometheus.yaml",
        "parallelconsumer-stateful.yaml",
    }


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_is_valid(name: str, openapi_schema: Manifest) -> None:
    cr = EXAMPLES[name]
    assert cr["apiVersion"] == "multilane.dev/v1alpha1"
    assert cr["kind"] == "ParallelConsumer"
    validator(openapi_schema).validate(cr)
    validator(openapi_schema).validate(apply_defaults(openapi_schema, cr))


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_passes_the_cel_rules(name: str, openapi_schema: Manifest) -> None:
    assert cel_violations(openapi_schema, apply_defaults(openapi_schema, EXAMPLES[name])) == []


def test_full_example_sets_every_spec_field(openapi_schema: Manifest) -> None:
    full = EXAMPLES["parallelconsumer-full.yaml"]
    unset: list[str] = []

    def walk(schema: Manifest, value: Any, path: str) -> None:
        for name, sub in schema.get("properties", {}).items():
            if not isinstance(value, dict) or name not in value:
                unset.append(f"{path}.{name}")
            elif sub.get("type") == "object" and "properties" in sub and not path.endswith("valueFrom"):
                walk(sub, value[name], f"{path}.{name}")

    walk(openapi_schema["properties"]["spec"], full["spec"], ".spec")
    # env items and resources are core/v1 types; the example sets the common ones.
    unset = [p for p in unset if not p.startswith(".spec.workload.env")]
    assert unset == []


def _mutated(mutation: Any) -> Manifest:
    cr = minimal_cr()
    mutation(cr)
    return cr


BAD_BY_SCHEMA: dict[str, tuple[Any, str]] = {
    "missing topics": (lambda cr: cr["spec"]["kafka"].pop("topics"), "'topics' is a required property"),
    "empty topics": (lambda cr: cr["spec"]["kafka"].update(topics=[]), "should be non-empty"),
    "bad topic name": (lambda cr: cr["spec"]["kafka"].update(topics=["no spaces"]), "does not match"),
    "processor without function": (
        lambda cr: cr["spec"]["workload"].update(processor="orders_app.handlers"),
        "does not match",
    ),
    "unknown ordering": (lambda cr: cr["spec"]["workload"].update(ordering="random"), "is not one of"),
    "factor above bound": (
        lambda cr: cr.setdefault("spec", {}).update(scaling={"maxFactor": 100000}),
        "maximum",
    ),
    "utilisation above 1": (
        lambda cr: cr["spec"].update(scaling={"targetUtilisation": 1.5}),
        "is greater than the maximum of 1",
    ),
    "replicas as string": (
        lambda cr: cr["spec"].update(scaling={"minReplicas": "2"}),
        "is not of type 'integer'",
    ),
    "unknown field (typo)": (
        lambda cr: cr["spec"]["kafka"].update(bootstrapServer="x:9092"),
        "Additional properties",
    ),
    "inline secret in credentialsSecretRef": (
        lambda cr: cr["spec"]["kafka"].update(credentialsSecretRef={"name": "s", "password": "hunter2"}),
        "Additional properties",
    ),
    "unknown metrics source": (
        lambda cr: cr["spec"].update(scaling={"metrics": {"source": "datadog"}}),
        "is not one of",
    ),
    "bad storage size": (lambda cr: cr["spec"].update(state={"storage": {"size": "ten gigs"}}), "ten gigs"),
    "worker uid 0": (
        lambda cr: cr["spec"].update(podTemplate={"securityContext": {"runAsUser": 0}}),
        "less than the minimum of 1",
    ),
    "worker runAsNonRoot not settable": (
        lambda cr: cr["spec"].update(podTemplate={"securityContext": {"runAsNonRoot": False}}),
        "Additional properties",
    ),
    "unknown fsGroupChangePolicy": (
        lambda cr: cr["spec"].update(podTemplate={"securityContext": {"fsGroupChangePolicy": "Never"}}),
        "is not one of",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_BY_SCHEMA))
def test_bad_cr_is_rejected_by_schema(case: str, openapi_schema: Manifest) -> None:
    mutation, expected = BAD_BY_SCHEMA[case]
    cr = _mutated(mutation)
    errors = sorted(validator(openapi_schema).iter_errors(apply_defaults(openapi_schema, cr)), key=str)
    assert errors, f"{case}: accepted"
    assert any(expected in e.message for e in errors), [e.message for e in errors]


# --- CEL rules (x-kubernetes-validations) -----------------------------------------------------------


def _rules(openapi_schema: Manifest) -> list[tuple[str, str, str]]:
    return [
        (path, rule["rule"], rule["message"])
        for path, node in iter_schema_nodes(openapi_schema)
        for rule in node.get("x-kubernetes-validations", [])
    ]


def _value_at(obj: Any, path: str) -> Any:
    value = obj
    for part in path.strip(".").split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


_CEL_PROGRAMS: dict[str, Any] = {}


def cel_violations(openapi_schema: Manifest, obj: Manifest) -> list[str]:
    """Messages of the CEL rules that ``obj`` breaks (rules on absent fields do not run)."""
    celpy = pytest.importorskip("celpy", reason="cel-python is not installed")
    broken: list[str] = []
    for path, rule, message in _rules(openapi_schema):
        assert "[]" not in path and "{}" not in path, "rules inside lists/maps are not evaluated here"
        value = _value_at(obj, path)
        if value is None:
            continue
        if rule not in _CEL_PROGRAMS:
            env = celpy.Environment()
            _CEL_PROGRAMS[rule] = env.program(env.compile(rule))
        program = _CEL_PROGRAMS[rule]
        result = program.evaluate({"self": celpy.json_to_cel(value)})
        if isinstance(result, Exception) or not bool(result):
            broken.append(message)
    return broken


def test_cel_rules_are_cheap_to_estimate(openapi_schema: Manifest) -> None:
    """Rules over lists/maps need maxItems/maxProperties (and bounded strings) for the API server's
    cost estimate; unbounded ones are rejected when the CRD is created."""
    for path, node in iter_schema_nodes(openapi_schema):
        if not node.get("x-kubernetes-validations"):
            continue
        if node.get("type") == "array":
            assert "maxItems" in node, path
            assert "maxLength" in node["items"]["properties"]["name"], path
        if node.get("type") == "object" and "additionalProperties" in node:
            assert "maxProperties" in node, path
    assert len(_rules(openapi_schema)) >= 7


BAD_BY_CEL: dict[str, tuple[Any, str]] = {
    "minReplicas > maxReplicas": (
        lambda cr: cr["spec"].update(scaling={"minReplicas": 5, "maxReplicas": 2}),
        "minReplicas must not exceed maxReplicas",
    ),
    "minFactor > maxFactor": (
        lambda cr: cr["spec"].update(scaling={"minFactor": 128}),
        "minFactor must not exceed maxFactor",
    ),
    "pinned replicas above maxReplicas": (
        lambda cr: cr["spec"].update(scaling={"replicas": 11}),
        "replicas must lie within [minReplicas, maxReplicas]",
    ),
    "prometheus without url": (
        lambda cr: cr["spec"].update(scaling={"metrics": {"source": "prometheus"}}),
        "metrics.prometheus.url is required",
    ),
    "password in config": (
        lambda cr: cr["spec"]["kafka"].update(config={"sasl.password": "hunter2"}),
        "credentials belong in a Secret",
    ),
    "group.id in config": (
        lambda cr: cr["spec"]["kafka"].update(config={"group.id": "other"}),
        "are set by multilane",
    ),
    "reserved env var prefix": (
        lambda cr: cr["spec"]["workload"].update(
            env=[{"name": "MULTILANE_KAFKA_SASL_PASSWORD", "value": "x"}]
        ),
        "are set by the operator",
    ),
    "reserved env var": (
        lambda cr: cr["spec"]["workload"].update(
            env=[{"name": "A", "value": "1"}, {"name": "MULTILANE_POD_NAME", "value": "x"}]
        ),
        "are set by the operator",
    ),
    "podTemplate label of the operator": (
        lambda cr: cr["spec"].update(podTemplate={"labels": {"multilane.dev/consumer": "other"}}),
        "labels are set by the operator",
    ),
    "podTemplate volume named like the operator's": (
        lambda cr: cr["spec"].update(podTemplate={"volumes": [{"name": "tmp", "emptyDir": {}}]}),
        "are used by the operator",
    ),
    "podTemplate mount over the token": (
        lambda cr: cr["spec"].update(
            podTemplate={
                "volumes": [{"name": "x", "emptyDir": {}}],
                "volumeMounts": [{"name": "x", "mountPath": "/var/run/multilane"}],
            }
        ),
        "are mounted by the operator",
    ),
    "podTemplate mount of no volume": (
        lambda cr: cr["spec"].update(podTemplate={"volumeMounts": [{"name": "x", "mountPath": "/data"}]}),
        "must name a volume of podTemplate.volumes",
    ),
    "platform-assigned ids with a uid": (
        lambda cr: cr["spec"].update(
            podTemplate={"securityContext": {"platformAssignsIds": True, "runAsUser": 1000}}
        ),
        "set none of them with it",
    ),
    "platform-assigned ids with an fsGroup": (
        lambda cr: cr["spec"].update(
            podTemplate={"securityContext": {"platformAssignsIds": True, "fsGroup": 0}}
        ),
        "set none of them with it",
    ),
    "snapshot schedule without uri": (
        lambda cr: cr["spec"].update(state={"snapshot": {"schedule": "0 * * * *"}}),
        "state.snapshot.uri is required",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_BY_CEL))
def test_bad_cr_is_rejected_by_cel(case: str, openapi_schema: Manifest) -> None:
    mutation, expected = BAD_BY_CEL[case]
    cr = apply_defaults(openapi_schema, _mutated(mutation))
    assert list(validator(openapi_schema).iter_errors(cr)) == [], "the schema alone accepts it"
    assert any(expected in m for m in cel_violations(openapi_schema, cr))


def test_cel_accepts_platform_assigned_ids(openapi_schema: Manifest) -> None:
    """OpenShift: no ids, the platform assigns them; or ids set with platformAssignsIds false."""
    for context in (
        {"platformAssignsIds": True, "fsGroupChangePolicy": "OnRootMismatch"},
        {"platformAssignsIds": False, "runAsUser": 1000, "fsGroup": 0},
    ):
        cr = apply_defaults(openapi_schema, _mutated(lambda cr, c=context: cr["spec"].update(
            podTemplate={"securityContext": c})))  # fmt: skip
        assert list(validator(openapi_schema).iter_errors(cr)) == []
        assert cel_violations(openapi_schema, cr) == []


def test_cel_accepts_pinned_replicas_within_bounds(openapi_schema: Manifest) -> None:
    cr = _mutated(lambda cr: cr["spec"].update(scaling={"replicas": 3, "minReplicas": 2, "maxReplicas": 4}))
    # other MULTILANE_* variables (the test processors' knobs) stay allowed
    cr["spec"]["workload"]["env"] = [{"name": "MULTILANE_TEST_SLEEP_MS", "value": "5"}]
    assert cel_violations(openapi_schema, apply_defaults(openapi_schema, cr)) == []


def test_crd_file_has_no_template_braces() -> None:
    """The chart embeds the file verbatim in a template: '{{' would become a template action."""
    assert "{{" not in CRD_FILE.read_text(encoding="utf-8")
    assert re.search(r"\t", CRD_FILE.read_text(encoding="utf-8")) is None


# --- the status the controller writes survives the schema -------------------------------------------


def pruned_paths(schema: Manifest, value: Any, path: str = "") -> list[str]:
    """Fields the API server would silently drop (pruning of unknown fields)."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    if isinstance(value, dict) and schema.get("type") == "object":
        out: list[str] = []
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        for key, sub in value.items():
            if key in props:
                out += pruned_paths(props[key], sub, f"{path}.{key}")
            elif isinstance(extra, dict):
                out += pruned_paths(extra, sub, f"{path}.{key}")
            else:
                out.append(f"{path}.{key}")
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [
            p for i, item in enumerate(value) for p in pruned_paths(schema["items"], item, f"{path}[{i}]")
        ]
    return []


def test_controller_status_is_neither_pruned_nor_rejected(openapi_schema: Manifest) -> None:
    """Builds status.assignment and conditions with the controller's own code (pure modules), as it
    patches them, and checks the API server would keep every field (kmock does not prune, a real
    cluster does) and accept the values."""
    from multilane.operator.rollout.assignment import AssignmentState, PendingChange
    from multilane.operator.spec.conditions import set_condition

    pending = PendingChange(
        generation=8,
        target={"orders-0": ("orders/0",), "orders-1": ("orders/1",)},
        released={"orders/1": 1234, "orders/2": None},
        granted=["orders-0"],
    )
    assignment = AssignmentState(
        generation=7, members={"orders-0": ("orders/0", "orders/1")}, pending=pending
    )
    conditions = set_condition(
        None, "Ready", True, "AllPartitionsAssigned", "2 partitions", observed_generation=3
    )
    conditions = set_condition(conditions, "Degraded", None, "MetricsUnavailable", "no rates yet")
    cr = minimal_cr()
    cr["status"] = {
        "observedGeneration": 3,
        "labelSelector": "multilane.dev/consumer=orders",
        "conditions": conditions,
        "replicas": 2,
        "factor": 8,
        "lag": -3,
        "inputRate": 1000.5,
        "processingRate": 900.25,
        "lastDecision": {
            "time": "2026-01-01T00:00:00Z",
            "replicas": 2,
            "factor": 8,
            "reason": "lag clears within target",
            "inputs": {"aliveWorkers": 2, "totalLag": 12345, "catchUpRate": 41.5},
            "warnings": ["maxReplicas capped by partitions"],
        },
        "assignment": assignment.to_status(),
        "rollout": None,
    }
    status_schema = openapi_schema["properties"]["status"]
    assert pruned_paths(status_schema, cr["status"], ".status") == []
    validator(openapi_schema).validate(apply_defaults(openapi_schema, cr))
    # and the check can fail: an unknown field is reported
    assert pruned_paths(status_schema, {"assignment": {"surprise": 1}}, ".status") == [
        ".status.assignment.surprise"
    ]
