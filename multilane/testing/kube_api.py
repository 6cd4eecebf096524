"""``ApiServerEmulator``: a ``kmock.KubernetesEmulator`` with the API-server behaviours kopf and the
operator rely on. A test double for kube-apiserver, not a cluster.

Emulated here (kmock 0.8 lacks them; see FACTS.md in the shared reference folder):

- on create: ``metadata.namespace`` stamped from the URL (kmock's watch drops objects without it),
  ``uid``, ``resourceVersion`` (one global counter), ``generation: 1``, ``creationTimestamp``,
  ``generateName`` filled in; answer 201 instead of 200;
- on PATCH (merge or JSON patch) and PUT (kmock answers PUT with 404): optimistic concurrency (a
  ``metadata.resourceVersion`` in the body that differs from the stored one -> 409), a new
  ``resourceVersion``, ``generation`` + 1 when anything outside ``metadata``/``status`` changed;
  for resources with a status subresource, writes to the object ignore ``status`` and writes to
  ``/status`` only change ``status``; PATCH on ``/scale`` of a custom resource writes the CRD's
  ``specReplicasPath``;
- custom resources whose CRD was loaded (:meth:`ApiServerEmulator.load_crd`): structural defaulting
  (``default`` values, recursively), pruning of unknown fields (honouring
  ``x-kubernetes-preserve-unknown-fields``), dropping of nulls in non-nullable fields, and
  ``jsonschema`` validation of the result (``nullable`` honoured) -> 422 ``Invalid``. CEL rules
  (``x-kubernetes-validations``) are NOT evaluated;
- list answers carry ``kind``/``apiVersion`` and core discovery says ``groupVersion: v1`` (kubectl
  needs both);
- garbage collection by owner references: when an object is gone (deleted, finalizers cleared), every
  object whose ``ownerReferences`` name its uid is deleted too (background cascading, recursively).

The request log (``kmock.requests``) keeps only the requests in flight (see ``_handle``).

Not emulated: controllers (no pods appear for a StatefulSet; tests create them, or
:class:`~multilane.testing.pods.StatefulSetProcessDouble` runs them), label-selector filtering on the
server (the operator filters on its side too), watch ``resourceVersion`` bookmarks,
admission webhooks; authentication and RBAC only with an ``authorizer`` (``kube_rbac``).

:func:`emulated_api_server` serves it on loopback with the ParallelConsumer CRD and the builtin
resources the operator and the workers use (the operator tests' ``api`` fixture, the burst
benchmark's ``operator`` variant). Test support: needs the ``test`` extra (kmock, jsonschema).
"""

from __future__ import annotations

import contextlib
import copy
import datetime as dt
import itertools
import json
import uuid
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp.web
import attrs
import jsonpatch
import jsonschema
import kmock
import yaml
from kmock._internal import enums  # the action enum is not re-exported under this name

_rv = itertools.count(1000)

# (group/version, plural, kind, has a status subresource): the builtin resources the operator, its
# children and the workers' Leases use.
BUILTINS: tuple[tuple[str, str, str, bool], ...] = (
    ("v1", "pods", "Pod", True),
    ("v1", "secrets", "Secret", False),
    ("v1", "services", "Service", True),
    ("v1", "serviceaccounts", "ServiceAccount", False),
    ("v1", "events", "Event", False),
    ("apps/v1", "statefulsets", "StatefulSet", True),
    ("policy/v1", "poddisruptionbudgets", "PodDisruptionBudget", True),
    ("rbac.authorization.k8s.io/v1", "roles", "Role", False),
    ("rbac.authorization.k8s.io/v1", "rolebindings", "RoleBinding", False),
    ("coordination.k8s.io/v1", "leases", "Lease", False),
    ("networking.k8s.io/v1", "networkpolicies", "NetworkPolicy", False),
)


def _strip_x(schema: Any) -> Any:
    """The CRD schema as plain JSON Schema: drop x-kubernetes-* keys; OpenAPI's ``nullable: true``
    becomes ``type: [T, "null"]``."""
    if isinstance(schema, dict):
        out = {
            k: _strip_x(v) for k, v in schema.items() if not k.startswith("x-kubernetes-") and k != "nullable"
        }
        if schema.get("nullable") and isinstance(out.get("type"), str):
            out["type"] = [out["type"], "null"]
        return out
    if isinstance(schema, list):
        return [_strip_x(v) for v in schema]
    return schema


def default_and_prune(obj: Any, schema: Mapping[str, Any], *, root: bool = False) -> Any:
    """Structural defaulting + pruning of one value against its (CRD) schema."""
    if isinstance(obj, dict) and (schema.get("type") == "object" or "properties" in schema):
        props: Mapping[str, Any] = schema.get("properties") or {}
        for key, sub in props.items():
            if key not in obj and "default" in sub:
                obj[key] = copy.deepcopy(sub["default"])
        for key in list(obj):
            if root and key in ("apiVersion", "kind", "metadata"):
                continue
            if key in props:
                if obj[key] is None and not props[key].get("nullable"):
                    del obj[key]
                    continue
                obj[key] = default_and_prune(obj[key], props[key])
            elif isinstance(schema.get("additionalProperties"), dict):
                obj[key] = default_and_prune(obj[key], schema["additionalProperties"])
            elif not schema.get("x-kubernetes-preserve-unknown-fields") and not schema.get(
                "additionalProperties"
            ):
                del obj[key]
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        return [default_and_prune(item, schema["items"]) for item in obj]
    return obj


@attrs.define(kw_only=True)
class ApiServerEmulator(kmock.KubernetesEmulator):
    _schemas: dict[kmock.resource, dict[str, Any]] = attrs.field(factory=dict, init=False)
    _validators: dict[kmock.resource, Any] = attrs.field(factory=dict, init=False)
    _inflight: list[kmock.Request] = attrs.field(factory=list, init=False)
    _scale_paths: dict[kmock.resource, str] = attrs.field(factory=dict, init=False)
    _status_subresource: set[kmock.resource] = attrs.field(factory=set, init=False)
    # Authentication + RBAC (multilane.testing.kube_rbac.RbacAuthorizer); None: every request passes.
    authorizer: Any = attrs.field(default=None)

    # ---- setup -----------------------------------------------------------------------------------

    def load_crd(self, path: str | Path) -> dict[str, Any]:
        """Serve the CRD's resource (discovery, subresources) and enforce its schema."""
        crd = yaml.safe_load(Path(path).read_text())
        spec = crd["spec"]
        # kopf's resource observer waits for the CRD resource to exist (it watches CRDs for changes).
        crds = kmock.resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")
        self.resources[crds] = kmock.ResourceInfo(
            kind="CustomResourceDefinition",
            namespaced=False,
            verbs={"get", "list", "watch"},
        )
        self.objects[crds, None, crd["metadata"]["name"]] = crd
        for version in spec["versions"]:
            res = kmock.resource(spec["group"], version["name"], spec["names"]["plural"])
            subresources = set(version.get("subresources") or {})
            self.resources[res] = kmock.ResourceInfo(
                kind=spec["names"]["kind"],
                singular=spec["names"]["singular"],
                namespaced=spec["scope"] == "Namespaced",
                shortnames=set(spec["names"].get("shortNames") or []),
                verbs={"get", "list", "watch", "create", "update", "patch", "delete"},
                subresources=subresources,
            )
            self._schemas[res] = version["schema"]["openAPIV3Schema"]
            plain = _strip_x(self._schemas[res])
            plain.get("properties", {}).pop("metadata", None)
            self._validators[res] = jsonschema.Draft7Validator(plain)
            if "status" in subresources:
                self._status_subresource.add(res)
            scale = (version.get("subresources") or {}).get("scale")
            if scale:
                self._scale_paths[res] = scale["specReplicasPath"]
        return crd

    def add_builtin(
        self, group_version: str, plural: str, kind: str, *, status: bool = False, namespaced: bool = True
    ) -> None:
        group, _, version = group_version.rpartition("/")
        res = kmock.resource(group, version, plural)
        self.resources[res] = kmock.ResourceInfo(
            kind=kind,
            namespaced=namespaced,
            verbs={"get", "list", "watch", "create", "update", "patch", "delete"},
            subresources={"status"} if status else set(),
        )
        if status:
            self._status_subresource.add(res)

    # ---- helpers ---------------------------------------------------------------------------------

    def _stored(self, request: kmock.Request) -> dict[str, Any] | None:
        key: Any = (request.resource, request.namespace, request.name)  # kmock's key types are narrower
        if key not in self.objects or self.objects[key].deleted:
            return None
        return copy.deepcopy(dict(self.objects[key].raw))

    def _admit(self, res: kmock.resource, obj: dict[str, Any]) -> dict[str, Any]:
        schema = self._schemas.get(res)
        if schema is None:
            return obj
        obj = default_and_prune(obj, schema, root=True)
        errors = list(self._validators[res].iter_errors({k: v for k, v in obj.items() if k != "metadata"}))
        if errors:
            exc = errors[0]
            path = ".".join(str(p) for p in exc.absolute_path)
            raise kmock.KubernetesError(
                status=422, reason="Invalid", message=f"{path}: {exc.message}"
            ) from None
        return obj

    def _substitute(self, original: kmock.Request, **changes: Any) -> kmock.Request:
        """A changed copy of the request, put in the original's place in the request log (kmock's
        reaction filters find requests by identity there)."""
        evolved = attrs.evolve(original, **changes)
        self._inflight.append(evolved)  # removed with the original's handling (same request)
        for i in range(len(self._requests) - 1, -1, -1):
            if self._requests[i] is original:
                self._requests[i] = evolved
                break
        else:
            self._requests.append(evolved)
        return evolved

    @staticmethod
    def _merge_diff(old: Any, new: Any) -> Any:
        """A JSON merge patch turning ``old`` into ``new``."""
        if not isinstance(old, dict) or not isinstance(new, dict):
            return new
        out: dict[str, Any] = {k: None for k in old if k not in new}
        for k, v in new.items():
            if k not in old:
                out[k] = v
            elif old[k] != v:
                out[k] = ApiServerEmulator._merge_diff(old[k], v)
        return out

    # ---- request handling ------------------------------------------------------------------------

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        # kmock matches a request to its reactions by identity against the whole request log: keep
        # only the requests in flight, or every request costs O(requests so far).
        self._inflight.append(request)
        self._requests[:] = [r for r in self._requests if any(r is f for f in self._inflight)]
        try:
            return await self._dispatch(request)
        finally:
            done = [f for f in self._inflight if f is request or f._raw_request is request._raw_request]
            self._inflight[:] = [f for f in self._inflight if not any(f is d for d in done)]

    async def _dispatch(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        if self.authorizer is not None:
            self.authorizer.check(self, request)  # 401/403 as a Status (multilane.testing.kube_rbac)
        res = request.resource
        if res is not None and request.action == enums.action.CREATE and isinstance(request.data, dict):
            return await self._create(request)
        if (
            res is not None
            and request.name
            and (request.action == enums.action.UPDATE or request.method == enums.method.PUT)
        ):
            return await self._update(request)
        response = await super()._handle(request)
        if res is not None and request.action == enums.action.DELETE and request.name:
            await self._collect_garbage()
        return response

    async def _create(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        assert request.resource is not None
        obj = copy.deepcopy(request.data)
        meta = obj.setdefault("metadata", {})
        if request.namespace:
            meta["namespace"] = request.namespace
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        meta.update(
            uid=str(uuid.uuid4()),
            resourceVersion=str(next(_rv)),
            generation=1,
            creationTimestamp=dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        )
        if request.resource in self._status_subresource and request.resource in self._schemas:
            obj.pop("status", None)
        obj = self._admit(request.resource, obj)
        response = await super()._handle(self._substitute(request, data=obj))
        if response.status == 200:
            response.set_status(201)
        return response

    async def _update(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        assert request.resource is not None
        res = request.resource
        old = self._stored(request)
        if old is None:
            raise kmock.KubernetesObjectNotFoundError()
        body = copy.deepcopy(request.data)
        sub = request.subresource
        is_put = request.method == enums.method.PUT
        # The body's resourceVersion (PUT always has one; a PATCH may): optimistic concurrency.
        if isinstance(body, dict):
            want_rv = (body.get("metadata") or {}).get("resourceVersion")
            if want_rv is not None and str(want_rv) != str(old["metadata"].get("resourceVersion")):
                raise kmock.KubernetesError(
                    status=409, reason="Conflict", message="the object has been modified"
                )
        if sub == "scale" and res in self._scale_paths and isinstance(body, dict):
            replicas = (body.get("spec") or {}).get("replicas")
            body = {}
            node = body
            parts = self._scale_paths[res].strip(".").split(".")
            for part in parts[:-1]:
                node = node.setdefault(part, {})
            node[parts[-1]] = replicas
            sub = None
        # Compute the new object.
        if isinstance(body, list):
            try:
                new = jsonpatch.apply_patch(copy.deepcopy(old), body)
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
                raise kmock.KubernetesError(status=422, reason="Invalid", message=str(exc)) from None
        elif is_put:
            new = copy.deepcopy(body)
            new.setdefault("metadata", {})
            for key in ("uid", "creationTimestamp", "namespace", "name", "generation"):
                if key in old["metadata"]:
                    new["metadata"][key] = old["metadata"][key]
        else:
            new = self._apply_merge(copy.deepcopy(old), body)
        if res in self._status_subresource:
            if sub == "status":
                new = {**old, "status": new.get("status"), "metadata": {**old["metadata"], **new["metadata"]}}
                if new["status"] is None:
                    new.pop("status")
            elif "status" in old:
                new["status"] = old["status"]
            else:
                new.pop("status", None)
        new = self._admit(res, new)
        meta = new.setdefault("metadata", {})
        meta["resourceVersion"] = str(next(_rv))
        strip = ("metadata", "status")
        if {k: v for k, v in new.items() if k not in strip} != {
            k: v for k, v in old.items() if k not in strip
        }:
            meta["generation"] = int(old["metadata"].get("generation") or 1) + 1
        diff = self._merge_diff(old, new)
        evolved = self._substitute(request, data=diff, action=enums.action.UPDATE, subresource=None)
        response = await super()._handle(evolved)
        stored: Any = (res, request.namespace, request.name)
        if stored in self.objects and self.objects[stored].deleted:
            await self._collect_garbage()  # a finalizer removal completed a deletion
        return response

    async def _serve_version(self, request: kmock.Request) -> Any:
        """kmock's discovery, with the core group's ``groupVersion`` spelled ``v1`` (not ``/v1``)."""
        payload = await super()._serve_version(request)
        if isinstance(payload, dict) and str(payload.get("groupVersion", "")).startswith("/"):
            payload["groupVersion"] = payload["groupVersion"][1:]
        return payload

    async def _serve_list(self, request: kmock.Request) -> Any:
        """kmock's list, plus the ``kind``/``apiVersion`` a real list carries (kubectl needs them)."""
        payload = await super()._serve_list(request)
        if isinstance(payload, dict) and request.resource is not None:
            res = request.resource
            info = self.resources.get(res, None)
            kind = (getattr(info, "kind", None) or "List") + "List"
            payload["kind"] = kind
            payload["apiVersion"] = f"{res.group}/{res.version}" if res.group else res.version
        return payload

    @staticmethod
    def _apply_merge(target: Any, patch: Any) -> Any:
        if not isinstance(patch, dict):
            return copy.deepcopy(patch)
        if not isinstance(target, dict):
            target = {}
        for k, v in patch.items():
            if v is None:
                target.pop(k, None)
            else:
                target[k] = ApiServerEmulator._apply_merge(target.get(k), v)
        return target

    async def _collect_garbage(self) -> None:
        """Background cascading deletion of objects whose owners are gone."""
        while True:
            live_uids = {
                (obj.get("metadata") or {}).get("uid") for _, obj in self.objects.items() if not obj.deleted
            }
            orphans = [
                key
                for key, obj in self.objects.items()
                if not obj.deleted
                and any(
                    ref.get("uid") not in live_uids
                    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []
                )
            ]
            if not orphans:
                return
            async with self._lock:
                for key in orphans:
                    raw = copy.deepcopy(dict(self.objects[key].raw))
                    self.objects[key].delete()
                    await self._buses[key[0]].put({"type": "DELETED", "object": raw})


def dump(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=True)


@contextlib.asynccontextmanager
async def emulated_api_server(crd_path: Path) -> AsyncIterator[tuple[ApiServerEmulator, str]]:
    """The emulator serving on loopback with the CRD at ``crd_path`` and :data:`BUILTINS` loaded;
    yields ``(emulator, base URL)``."""
    async with ApiServerEmulator() as emu, kmock.Server(emu):
        emu.load_crd(crd_path)
        for gv, plural, kind, status in BUILTINS:
            emu.add_builtin(gv if "/" in gv else f"/{gv}", plural, kind, status=status)
        # kopf's namespace observer waits for the namespaces resource to be discoverable (it is not
        # listed: the operator runs cluster-wide).
        emu.add_builtin("/v1", "namespaces", "Namespace", namespaced=False)
        yield emu, str(emu.url).rstrip("/")
