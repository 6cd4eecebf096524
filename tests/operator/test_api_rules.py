"""The API-server double refuses what kube-apiserver refuses (multilane/testing/kube_api.py and
kube_rules.py). Each test names the Kubernetes documentation it follows; every answer is checked for
kube-apiserver's shape: a ``Status`` object with ``code``, ``reason`` and, for 422, ``details.causes``
(https://kubernetes.io/docs/reference/kubernetes-api/common-definitions/status/)."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from multilane.operator.k8s.kube import api_path
from multilane.testing.kube_api import ApiServerEmulator
from multilane.testing.kube_rules import RefusalError, revision_hash_label
from tests.operator.conftest import CR_COLLECTION, NS, consumer_body, cr_path

pytestmark = pytest.mark.asyncio(loop_scope="function")

Api = tuple[ApiServerEmulator, str]


async def call(
    api: Api,
    method: str,
    path: str,
    body: Any = None,
    *,
    merge: bool = True,
    params: dict[str, str] | None = None,
) -> tuple[int, Any]:
    """One raw request: (HTTP status, decoded JSON answer)."""
    headers = {
        "Content-Type": "application/merge-patch+json" if merge and method == "PATCH" else "application/json"
    }
    async with (
        aiohttp.ClientSession() as session,
        session.request(
            method,
            api[1] + path,
            data=None if body is None else json.dumps(body),
            headers=headers,
            params=params,
        ) as resp,
    ):
        text = await resp.text()
        return resp.status, (json.loads(text.splitlines()[0]) if text.strip() else None)


def assert_status(answer: Any, code: int, reason: str) -> dict[str, Any]:
    assert answer["kind"] == "Status" and answer["status"] == "Failure", answer
    assert (answer["code"], answer["reason"]) == (code, reason), answer
    return dict(answer.get("details") or {})


def sts_body(name: str, **spec: Any) -> dict[str, Any]:
    labels = {"app": name[:63]}
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name},
        "spec": {
            "serviceName": f"{name}-workers",
            "replicas": 1,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "w", "image": "i:1"}]},
            },
            **spec,
        },
    }


STS = api_path("apps/v1", "statefulsets", NS)
SERVICES = api_path("v1", "services", NS)
PODS = api_path("v1", "pods", NS)


# ---- names and labels ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["9lives-workers", "a.b-workers", "x" * 64])
async def test_service_names_follow_dns_1035(api: Api, name: str) -> None:
    """https://kubernetes.io/docs/concepts/overview/working-with-objects/names/#rfc-1035-label-names :
    a Service name starts with a letter, has no dot, and is at most 63 characters."""
    status, answer = await call(
        api, "POST", SERVICES, {"metadata": {"name": name}, "spec": {"clusterIP": "None"}}
    )
    assert status == 422
    causes = assert_status(answer, 422, "Invalid")["causes"]
    assert causes and all(c["field"] == "metadata.name" for c in causes)
    status, _ = await call(
        api, "POST", SERVICES, {"metadata": {"name": "ok-workers"}, "spec": {"clusterIP": "None"}}
    )
    assert status == 201


async def test_object_names_follow_dns_1123_subdomain(api: Api) -> None:
    """https://kubernetes.io/docs/concepts/overview/working-with-objects/names/#dns-subdomain-names"""
    status, answer = await call(
        api, "POST", api_path("v1", "secrets", NS), {"metadata": {"name": "Upper_case"}}
    )
    assert status == 422 and assert_status(answer, 422, "Invalid")["causes"][0]["field"] == "metadata.name"


async def test_cronjob_name_at_most_52_characters(api: Api) -> None:
    """https://kubernetes.io/docs/concepts/workloads/controllers/cron-jobs/#writing-a-cronjob-spec : a
    CronJob name is at most 52 characters (its Jobs append 11)."""
    body: dict[str, Any] = {
        "spec": {
            "schedule": "*/5 * * * *",
            "jobTemplate": {
                "spec": {
                    "template": {
                        "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "i"}]}
                    }
                }
            },
        },
    }
    path = api_path("batch/v1", "cronjobs", NS)
    status, answer = await call(api, "POST", path, {**body, "metadata": {"name": "c" * 53}})
    assert status == 422 and "52" in assert_status(answer, 422, "Invalid")["causes"][0]["message"]
    status, created = await call(api, "POST", path, {**body, "metadata": {"name": "c" * 52}})
    assert status == 201 and created["kind"] == "CronJob"


async def test_label_values_at_most_63_characters(api: Api) -> None:
    """https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#syntax-and-character-set"""
    status, answer = await call(api, "POST", PODS, {"metadata": {"name": "p", "labels": {"a": "v" * 64}}})
    assert status == 422 and assert_status(answer, 422, "Invalid")["causes"][0]["field"] == "metadata.labels"


async def test_statefulset_named_over_52_characters_gets_no_pods(api: Api) -> None:
    """https://kubernetes.io/docs/reference/labels-annotations-taints/#controller-revision-hash : the
    StatefulSet controller labels each pod ``controller-revision-hash: NAME-<hash>``; a label value is at
    most 63 characters, so a pod of a StatefulSet named over 52 characters is refused."""
    for name, expected in (("s" * 52, 201), ("s" * 53, 422)):
        status, sts = await call(api, "POST", STS, sts_body(name, serviceName="svc"))
        assert status == 201  # the StatefulSet itself is accepted (its name is a subdomain) ...
        labels = {**sts["spec"]["template"]["metadata"]["labels"], **revision_hash_label(sts)}
        pod = {
            "metadata": {"name": f"{name}-0", "labels": labels},
            "spec": {"containers": [{"name": "w", "image": "i"}]},
        }
        status, answer = await call(api, "POST", PODS, pod)
        assert status == expected, answer  # ... its pods are not, over 52


# ---- the OpenAPI schema of built-in kinds ----------------------------------------------------------


async def test_builtin_kinds_are_validated_against_the_openapi_schema(api: Api) -> None:
    """https://kubernetes.io/docs/reference/using-api/api-concepts/#field-validation : with
    ``fieldValidation=Strict`` (kubectl's default) an unknown field is a 400 "strict decoding error";
    without it (the server's default ``Warn``, what the operator sends) the field is dropped and the
    write succeeds (met on kube-apiserver v1.34.4: tests/cluster/test_conformance.py); a wrong type
    cannot be decoded (400); a missing required spec field is 422 Invalid."""
    strict = {"fieldValidation": "Strict"}
    status, answer = await call(api, "POST", STS, sts_body("typo", replica=3), params=strict)
    assert status == 400 and 'unknown field "spec.replica"' in answer["message"]
    assert_status(answer, 400, "BadRequest")
    status, answer = await call(api, "POST", STS, sts_body("typo", replica=3))
    assert status == 201 and "replica" not in answer["spec"], answer
    status, answer = await call(api, "POST", STS, sts_body("wrongtype", replicas="three"))
    assert status == 400 and "spec.replicas" in answer["message"]
    body = sts_body("noselector")
    del body["spec"]["selector"]
    status, answer = await call(api, "POST", STS, body)
    causes = assert_status(answer, 422, "Invalid")["causes"]
    assert status == 422 and causes[0] == {
        "reason": "FieldValueRequired",
        "message": "Required value",
        "field": "spec.selector",
    }


# ---- immutable fields ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "allowed"),
    [
        ({"replicas": 3}, True),
        (
            {
                "template": {
                    "metadata": {"labels": {"app": "imm"}},
                    "spec": {"containers": [{"name": "w", "image": "i:2"}]},
                }
            },
            True,
        ),
        ({"updateStrategy": {"type": "OnDelete", "rollingUpdate": None}}, True),  # rollingUpdate: defaulted
        ({"persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Delete", "whenScaled": "Retain"}}, True),
        ({"serviceName": "other"}, False),
        ({"podManagementPolicy": "OrderedReady"}, False),
        ({"selector": {"matchLabels": {"app": "imm", "x": "y"}}}, False),
        (
            {
                "volumeClaimTemplates": [
                    {"metadata": {"name": "state"}, "spec": {"accessModes": ["ReadWriteOnce"]}}
                ]
            },
            False,
        ),
    ],
)
async def test_statefulset_immutable_fields(api: Api, change: dict[str, Any], allowed: bool) -> None:
    """https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/stateful-set-v1/ and
    https://kubernetes.io/docs/concepts/workloads/controllers/statefulset/#limitations : an update may
    change only replicas, template, updateStrategy, persistentVolumeClaimRetentionPolicy,
    minReadySeconds, ordinals and revisionHistoryLimit ("spec: Forbidden: updates to statefulset spec
    for fields other than ...")."""
    assert (await call(api, "POST", STS, sts_body("imm")))[0] == 201
    status, answer = await call(api, "PATCH", f"{STS}/imm", {"spec": change})
    if allowed:
        assert status == 200, answer
        return
    assert status == 422
    causes = assert_status(answer, 422, "Invalid")["causes"]
    assert causes[0]["field"] == "spec" and causes[0]["reason"] == "FieldValueForbidden"
    assert "updates to statefulset spec for fields other than" in answer["message"]
    assert next(iter(change)) in causes[0]["message"]  # the changed field is named


async def test_service_cluster_ip_is_immutable(api: Api) -> None:
    """https://kubernetes.io/docs/reference/kubernetes-api/service-resources/service-v1/#ServiceSpec :
    clusterIP "may not be changed through updates unless the type field is also changed to
    ExternalName"."""
    await call(api, "POST", SERVICES, {"metadata": {"name": "svc"}, "spec": {"clusterIP": "10.0.0.7"}})
    status, answer = await call(api, "PATCH", f"{SERVICES}/svc", {"spec": {"clusterIP": "None"}})
    assert status == 422 and assert_status(answer, 422, "Invalid")["causes"][0]["field"] == "spec.clusterIP"
    status, _ = await call(api, "PATCH", f"{SERVICES}/svc", {"spec": {"publishNotReadyAddresses": True}})
    assert status == 200


async def test_pvc_spec_is_immutable_but_its_storage_request(api: Api) -> None:
    """https://kubernetes.io/docs/concepts/storage/persistent-volumes/#expanding-persistent-volumes-claims :
    a claim's spec is immutable after creation except the storage request (expansion)."""
    pvcs = api_path("v1", "persistentvolumeclaims", NS)
    spec = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "1Gi"}},
        "volumeName": "pv-1",
    }
    assert (await call(api, "POST", pvcs, {"metadata": {"name": "c"}, "spec": spec}))[0] == 201
    status, answer = await call(api, "PATCH", f"{pvcs}/c", {"spec": {"storageClassName": "fast"}})
    assert status == 422 and assert_status(answer, 422, "Invalid")["causes"][0]["field"] == "spec"
    status, _ = await call(
        api, "PATCH", f"{pvcs}/c", {"spec": {"resources": {"requests": {"storage": "2Gi"}}}}
    )
    assert status == 200


async def test_job_template_is_immutable(api: Api) -> None:
    """https://kubernetes.io/docs/concepts/workloads/controllers/job/#mutable-scheduling-directives :
    a Job's pod template is immutable (but for scheduling directives of a suspended Job)."""
    jobs = api_path("batch/v1", "jobs", NS)
    template = {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "i:1"}]}}
    status, job = await call(api, "POST", jobs, {"metadata": {"name": "j"}, "spec": {"template": template}})
    assert status == 201 and job["kind"] == "Job"
    changed = {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "i:2"}]}}
    status, answer = await call(api, "PATCH", f"{jobs}/j", {"spec": {"template": changed}})
    assert status == 422 and assert_status(answer, 422, "Invalid")["causes"][0]["field"] == "spec.template"


async def test_role_binding_role_ref_is_immutable(api: Api) -> None:
    """https://kubernetes.io/docs/reference/access-authn-authz/rbac/#clusterrolebinding-example : "After
    you create a binding, you cannot change the Role or ClusterRole that it refers to"."""
    bindings = api_path("rbac.authorization.k8s.io/v1", "rolebindings", NS)
    ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "a"}
    subjects = [{"kind": "ServiceAccount", "name": "w", "namespace": NS}]
    assert (
        await call(api, "POST", bindings, {"metadata": {"name": "b"}, "roleRef": ref, "subjects": subjects})
    )[0] == 201
    status, answer = await call(api, "PATCH", f"{bindings}/b", {"roleRef": {**ref, "name": "other"}})
    assert status == 422 and assert_status(answer, 422, "Invalid")["causes"][0]["field"] == "roleRef"
    assert (await call(api, "PATCH", f"{bindings}/b", {"subjects": subjects * 1}))[0] == 200


# ---- CEL rules of the CRD ------------------------------------------------------------------------


async def test_crd_cel_rules_are_evaluated(api: Api) -> None:
    """A CR breaking an ``x-kubernetes-validations`` rule is refused with the rule's message:
    https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/#validation-rules
    """
    body = consumer_body("celcheck", "k:9092", "orders", minReplicas=5, maxReplicas=2)
    status, answer = await call(api, "POST", CR_COLLECTION, body)
    causes = assert_status(answer, 422, "Invalid")["causes"]
    assert status == 422 and causes[0]["field"] == "spec.scaling"
    assert "minReplicas must not exceed maxReplicas" in causes[0]["message"]
    body = consumer_body("celcheck", "k:9092", "orders")
    body["spec"]["kafka"]["config"] = {"sasl.password": "x"}
    status, answer = await call(api, "POST", CR_COLLECTION, body)
    assert status == 422 and "credentials belong in a Secret" in answer["message"]
    status, _ = await call(api, "POST", CR_COLLECTION, consumer_body("celcheck", "k:9092", "orders"))
    assert status == 201


@pytest.mark.parametrize("name", ["n" * 53, "9lives", "dotted.name"])
async def test_crd_cel_rule_bounds_the_consumer_name(api: Api, name: str) -> None:
    """https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/#validation-rules
    (rules at the root see ``metadata.name``): the ParallelConsumer name is at most 52 characters (its
    pods' controller-revision-hash label fits 63) and a DNS-1035 label (its ``NAME-workers`` Service
    name is valid)."""
    status, answer = await call(api, "POST", CR_COLLECTION, consumer_body(name, "k:9092", "orders"))
    assert status == 422 and "metadata.name" in answer["message"], answer
    status, _ = await call(api, "POST", CR_COLLECTION, consumer_body("n" * 52, "k:9092", "orders"))
    assert status == 201


# ---- optimistic concurrency, existence, watches --------------------------------------------------


async def test_stale_resource_version_is_a_conflict_on_every_write(api: Api) -> None:
    """https://github.com/kubernetes/community/blob/master/contributors/devel/sig-architecture/api-conventions.md#concurrency-control-and-consistency
    and DeleteOptions.preconditions
    (https://kubernetes.io/docs/reference/kubernetes-api/common-parameters/common-parameters/#DeleteOptions):
    a write that carries a resourceVersion other than the stored one is 409 Conflict."""
    status, sts = await call(api, "POST", STS, sts_body("occ"))
    stale = sts["metadata"]["resourceVersion"]
    assert (await call(api, "PATCH", f"{STS}/occ", {"spec": {"replicas": 2}}))[0] == 200
    writes: list[tuple[str, str, Any, bool]] = [
        ("PATCH", f"{STS}/occ", {"metadata": {"resourceVersion": stale}, "spec": {"replicas": 3}}, True),
        (
            "PATCH",
            f"{STS}/occ/status",
            {"metadata": {"resourceVersion": stale}, "status": {"replicas": 1}},
            True,
        ),
        ("PUT", f"{STS}/occ", {**sts, "metadata": {**sts["metadata"], "resourceVersion": stale}}, False),
        ("DELETE", f"{STS}/occ", {"preconditions": {"resourceVersion": stale}}, False),
    ]
    for method, path, body, merge in writes:
        status, answer = await call(api, method, path, body, merge=merge)
        assert status == 409, (method, path, answer)
        assert "the object has been modified" in answer["message"]
        assert_status(answer, 409, "Conflict")
    # A JSON patch "testing" a stale resourceVersion fails as a patch: 422 Invalid, no causes. That is
    # kube-apiserver's answer: jsonPatcher.applyJSPatch in
    # staging/src/k8s.io/apiserver/pkg/endpoints/handlers/patch.go (kubernetes/kubernetes at 00f75347)
    # turns any error of the patch's Apply into NewGenericServerResponse(422, ..., isUnexpectedResponse
    # false); kopf expects it and retries the patch on its next cycle.
    async with (
        aiohttp.ClientSession() as session,
        session.patch(
            f"{api[1]}{STS}/occ",
            data=json.dumps([{"op": "test", "path": "/metadata/resourceVersion", "value": stale}]),
            headers={"Content-Type": "application/json-patch+json"},
        ) as resp,
    ):
        assert resp.status == 422
        answer = await resp.json()
        assert_status(answer, 422, "Invalid")
        assert answer["message"] == "the server rejected our request due to an error in our request"
        assert not (answer.get("details") or {}).get("causes")


async def test_create_of_an_existing_name_is_already_exists(api: Api) -> None:
    """https://kubernetes.io/docs/reference/kubernetes-api/common-definitions/status/ (reason
    AlreadyExists, code 409)."""
    await call(api, "POST", SERVICES, {"metadata": {"name": "twice"}, "spec": {"clusterIP": "None"}})
    status, answer = await call(
        api, "POST", SERVICES, {"metadata": {"name": "twice"}, "spec": {"clusterIP": "None"}}
    )
    assert status == 409 and assert_status(answer, 409, "AlreadyExists")["name"] == "twice"


async def test_watch_from_a_compacted_resource_version_is_gone(api: Api) -> None:
    """https://kubernetes.io/docs/reference/using-api/api-concepts/#efficient-detection-of-changes :
    a watch from a resourceVersion the server no longer holds gets 410 Gone (an ERROR event carrying a
    Status with code 410, reason Expired); the client lists again."""
    status, listed = await call(api, "GET", SERVICES)
    since = listed["metadata"]["resourceVersion"]
    await call(api, "POST", SERVICES, {"metadata": {"name": "later"}, "spec": {"clusterIP": "None"}})
    emu = api[0]
    emu.compact()
    status, event = await call(api, "GET", SERVICES, params={"watch": "true", "resourceVersion": since})
    assert status == 200 and event["type"] == "ERROR"
    assert_status(event["object"], 410, "Expired")


async def test_cronjobs_jobs_and_leases_are_served(api: Api) -> None:
    """https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/cron-job-v1/,
    .../job-v1/ and https://kubernetes.io/docs/reference/kubernetes-api/cluster-resources/lease-v1/"""
    leases = api_path("coordination.k8s.io/v1", "leases", NS)
    status, lease = await call(
        api, "POST", leases, {"metadata": {"name": "l"}, "spec": {"holderIdentity": "x"}}
    )
    assert status == 201 and lease["kind"] == "Lease"
    for path in (api_path("batch/v1", "cronjobs", NS), api_path("batch/v1", "jobs", NS), leases):
        status, listed = await call(api, "GET", path)
        assert status == 200 and listed["kind"].endswith("List")


async def test_orphan_deletion_keeps_the_dependents(api: Api) -> None:
    """Deleting an owner with ``propagationPolicy: Orphan`` leaves its dependents, without the reference:
    https://kubernetes.io/docs/tasks/administer-cluster/use-cascading-deletion/#set-orphan-deletion-policy
    """
    _, sts = await call(api, "POST", STS, sts_body("own"))
    ref = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "name": "own",
        "uid": sts["metadata"]["uid"],
        "controller": True,
    }
    pod = {"metadata": {"name": "own-0", "labels": {"app": "own"}, "ownerReferences": [ref]}}
    assert (await call(api, "POST", PODS, pod))[0] == 201
    status, _ = await call(api, "DELETE", f"{STS}/own", {"propagationPolicy": "Orphan"})
    assert status == 200
    status, kept = await call(api, "GET", f"{PODS}/own-0")
    assert status == 200 and not kept["metadata"].get("ownerReferences")
    # Without Orphan, the dependents go with their owner (background cascading deletion).
    _, sts = await call(api, "POST", STS, sts_body("own"))
    ref["uid"] = sts["metadata"]["uid"]
    await call(api, "PATCH", f"{PODS}/own-0", {"metadata": {"ownerReferences": [ref]}})
    await call(api, "DELETE", f"{STS}/own")
    assert (await call(api, "GET", f"{PODS}/own-0"))[0] == 404


async def test_authorizer_hook_runs_first(api: Api) -> None:
    """The hook the RBAC double plugs into: a refusal there changes nothing
    (https://kubernetes.io/docs/reference/access-authn-authz/authorization/ : 403 Forbidden)."""
    emu = api[0]

    class DenySecrets:
        def check(self, emulator: Any, request: Any) -> str:
            if request.resource is not None and request.resource.plural == "secrets":
                raise RefusalError(
                    403, "Forbidden", 'secrets is forbidden: User "test" cannot create resource "secrets"'
                )
            return "test"

    emu.authorizer = DenySecrets()
    status, answer = await call(api, "POST", api_path("v1", "secrets", NS), {"metadata": {"name": "s"}})
    assert status == 403 and assert_status(answer, 403, "Forbidden") == {}
    emu.authorizer = None
    assert (await call(api, "GET", f"{api_path('v1', 'secrets', NS)}/s"))[0] == 404
    assert (await call(api, "GET", cr_path("nothing")))[0] == 404
