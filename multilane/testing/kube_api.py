"""``ApiServerEmulator``: a ``kmock.KubernetesEmulator`` that refuses what kube-apiserver refuses, with the
API-server behaviours kopf and the operator rely on. A test double for kube-apiserver, not a cluster.

Emulated here (kmock 0.8 lacks them; see FACTS.md in the shared reference folder), each refusal answered
as kube-apiserver answers it (a ``Status`` object: reason, code, ``details.causes``; built by
:mod:`multilane.testing.kube_rules`):

- request dispatch starts with :attr:`ApiServerEmulator.authorizer` (None: everything allowed):
  :class:`~multilane.testing.kube_rbac.RbacAuthorizer` answers 401/403 by the chart's rendered RBAC;
- on create: ``apiVersion``/``kind`` from the URL when absent, ``metadata.namespace`` stamped from the
  URL (kmock's watch drops objects without it), ``uid``, ``resourceVersion`` (one global counter),
  ``generation: 1``, ``creationTimestamp``, ``generateName`` filled in; 409 ``AlreadyExists``; answer
  201 instead of 200;
- names and labels (:func:`~multilane.testing.kube_rules.name_causes`, ``object_label_causes``) -> 422;
- built-in kinds (:data:`BUILTINS`) against the OpenAPI schema of
  :data:`~multilane.testing.kube_rules.KUBE_VERSION` (wrong types -> 400; unknown fields -> 400 with
  ``fieldValidation=Strict``, else dropped, as the server's default ``Warn`` does; the rest -> 422;
  a StatefulSet's strategy defaulted at create and its ``podManagementPolicy``/``updateStrategy``
  checked; ``required`` is enforced under ``spec`` only: kube-apiserver decodes built-ins into Go types,
  so a missing status field is not refused);
- on PATCH (merge or JSON patch) and PUT (kmock answers PUT with 404): optimistic concurrency (a
  ``metadata.resourceVersion`` in the body that differs from the stored one -> 409 ``Conflict``; also
  a DELETE's ``preconditions``; a JSON patch whose ``test`` op fails, e.g. on the resourceVersion, is
  422, as kube-apiserver answers it and kopf expects), immutable fields
  (:func:`~multilane.testing.kube_rules.immutable_causes`) -> 422, a new ``resourceVersion``,
  ``generation`` + 1 when anything outside ``metadata``/``status`` changed; for resources with a
  status subresource, writes to the object ignore ``status`` and writes to ``/status`` only change
  ``status``; PATCH on ``/scale`` of a custom resource writes the CRD's
  ``specReplicasPath``;
- custom resources whose CRD was loaded (:meth:`ApiServerEmulator.load_crd`): structural defaulting
  (``default`` values, recursively), pruning of unknown fields (honouring
  ``x-kubernetes-preserve-unknown-fields``), dropping of nulls in non-nullable fields, ``jsonschema``
  validation of the result (``nullable`` honoured) and the CRD's CEL rules (``x-kubernetes-validations``,
  transition rules on update) -> 422 ``Invalid``;
- watches: :meth:`ApiServerEmulator.compact` forgets history; a watch from an older ``resourceVersion``
  gets an ``ERROR`` event with a 410 ``Expired`` Status (kopf then lists again); lists carry the
  current ``resourceVersion``;
- list answers carry ``kind``/``apiVersion`` and core discovery says ``groupVersion: v1`` (kubectl
  needs both);
- garbage collection by owner references: when an object is gone (deleted, finalizers cleared), every
  object whose ``ownerReferences`` name its uid is deleted too (background cascading, recursively); a
  DELETE with ``propagationPolicy: Orphan`` instead removes those references from the dependents.

What a write makes of the stored object, a DELETE's options and what the garbage collector takes:
the pure functions of :mod:`multilane.testing.kube_writes`.

A missing object is 404 ``NotFound`` as kube-apiserver words it. Every answer above was compared
with kube-apiserver v1.34.4's by ``tests/cluster/test_conformance.py`` (docs/real-cluster.md).

The request log (``kmock.requests``) keeps only the requests in flight (see ``_handle``).

Not emulated: controllers (no pods appear for a StatefulSet; tests create them, or
:class:`~multilane.testing.pods.StatefulSetProcessDouble` runs them), label-selector filtering on the
server (the operator filters on its side too), watch ``resourceVersion`` bookmarks,
admission webhooks; authentication and RBAC only with an ``authorizer`` (``kube_rbac``).

:func:`emulated_api_server` serves it on loopback with the ParallelConsumer CRD and the builtin
resources the operator and the workers use (the operator tests' ``api`` fixture, the burst
benchmark's ``operator`` variant). Test support: needs the ``test`` extra (kmock, jsonschema,
kubernetes-validate, cel-python).
"""

from __future__ import annotations

import contextlib
import copy
import datetime as dt
import itertools
import json
import logging
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp.web
import attrs
import jsonschema
import kmock
import yaml
from kmock._internal import enums  # the action enum is not re-exported under this name

from multilane.testing.kube_crd import CelRules, default_and_prune, merge_diff, plain_json_schema
from multilane.testing.kube_rules import (
    BuiltinSchemas,
    Cause,
    RefusalError,
    immutable_causes,
    name_causes,
    object_label_causes,
    statefulset_causes,
    statefulset_defaults,
)
from multilane.testing.kube_writes import (
    dangling,
    delete_orphans,
    next_generation,
    scale_patch,
    written_object,
)


class _ResourceVersions:
    """One counter for every object of every emulator in the process (as etcd's revision)."""

    def __init__(self) -> None:
        self._counter = itertools.count(1000)
        self.last = 999

    def __next__(self) -> int:
        self.last = next(self._counter)
        return self.last


_rv = _ResourceVersions()
log = logging.getLogger(__name__)
#: Validators of built-in kinds, shared by every emulator (building one costs ~40 ms).
_BUILTIN_SCHEMAS = BuiltinSchemas()

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
    ("v1", "persistentvolumeclaims", "PersistentVolumeClaim", True),
    ("batch/v1", "cronjobs", "CronJob", True),
    ("batch/v1", "jobs", "Job", True),
    ("networking.k8s.io/v1", "networkpolicies", "NetworkPolicy", False),
)


@attrs.define(kw_only=True)
class ApiServerEmulator(kmock.KubernetesEmulator):
    _schemas: dict[kmock.resource, dict[str, Any]] = attrs.field(factory=dict, init=False)
    _validators: dict[kmock.resource, Any] = attrs.field(factory=dict, init=False)
    _inflight: list[kmock.Request] = attrs.field(factory=list, init=False)
    _scale_paths: dict[kmock.resource, str] = attrs.field(factory=dict, init=False)
    _status_subresource: set[kmock.resource] = attrs.field(factory=set, init=False)
    _cel: dict[kmock.resource, CelRules] = attrs.field(factory=dict, init=False)
    _builtin_kinds: dict[kmock.resource, str] = attrs.field(factory=dict, init=False)
    #: Watches from a resourceVersion below this get 410 Expired (0: nothing compacted yet).
    compacted_rv: int = attrs.field(default=0, init=False)
    #: False: the CRDs' CEL rules are not evaluated (a cluster whose CRD predates a rule; tests of the
    #: operator's own validation, which must hold without them).
    cel_rules: bool = attrs.field(default=True)
    #: Authentication + RBAC, called first in request dispatch: ``check(emulator, request)`` raises a
    #: 401/403 (multilane.testing.kube_rbac.RbacAuthorizer); None: every request passes.
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
            plain = plain_json_schema(self._schemas[res])
            plain.get("properties", {}).pop("metadata", None)
            self._validators[res] = jsonschema.Draft7Validator(plain)
            self._cel[res] = CelRules(self._schemas[res])
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
        self._builtin_kinds[res] = kind

    def compact(self) -> int:
        """Forget the history up to now (etcd compaction): watches from an older resourceVersion get
        410 Gone. Returns the compacted revision."""
        self.compacted_rv = _rv.last
        return self.compacted_rv

    # ---- helpers ---------------------------------------------------------------------------------

    def _stored(self, request: kmock.Request) -> dict[str, Any] | None:
        key: Any = (request.resource, request.namespace, request.name)  # kmock's key types are narrower
        if key not in self.objects or self.objects[key].deleted:
            return None
        return copy.deepcopy(dict(self.objects[key].raw))

    def _kind(self, res: kmock.resource) -> str:
        info = self.resources.get(res, None)
        return str(getattr(info, "kind", None) or res.plural)

    def _admit(
        self,
        res: kmock.resource,
        obj: dict[str, Any],
        old: dict[str, Any] | None = None,
        *,
        status_only: bool = False,
        strict: bool = False,
    ) -> dict[str, Any]:
        """Defaulting/pruning (custom resources) and every refusal of kube-apiserver for ``obj`` (``old``:
        the stored object on update; ``strict``: the request asked ``fieldValidation=Strict``, else
        unknown fields of built-in kinds are dropped, as kube-apiserver's default ``Warn`` does).
        Raises :class:`RefusalError`."""
        kind = self._kind(res)
        name = str((obj.get("metadata") or {}).get("name") or "")
        causes: list[Cause] = []
        if old is None:
            causes += name_causes(kind, name)
        causes += object_label_causes(obj)
        schema = self._schemas.get(res)
        if schema is not None:
            obj = default_and_prune(obj, schema, root=True)
            for exc in self._validators[res].iter_errors({k: v for k, v in obj.items() if k != "metadata"}):
                path = ".".join(str(p) for p in exc.absolute_path)
                if exc.validator == "required":
                    causes.append(
                        Cause(path or "<root>", f"Required value: {exc.message}", "FieldValueRequired")
                    )
                elif exc.validator == "enum":
                    causes.append(
                        Cause(path, f"Unsupported value: {exc.instance!r}", "FieldValueNotSupported")
                    )
                else:
                    causes.append(Cause(path, f"Invalid value: {exc.message}"))
            if not causes and self.cel_rules:  # CEL runs on a schema-valid object only (as the API server)
                causes += self._cel[res].causes(obj, old)
        elif res in self._builtin_kinds:
            if not strict:
                _BUILTIN_SCHEMAS.drop_unknown(obj)
            if kind == "StatefulSet":
                causes += statefulset_causes(obj)
            # On update, only the top-level sections that changed are validated again (a pod's status
            # write does not re-validate its spec: ~14 ms for a worker pod's).
            subject = obj
            if old is not None:
                kept = ("apiVersion", "kind", "metadata")
                subject = {k: v for k, v in obj.items() if k in kept or v != old.get(k)}
            refusal = _BUILTIN_SCHEMAS.refusal(subject, res.group or "", required=not status_only)
            if refusal is not None and refusal.code == 400:
                raise refusal
            if refusal is not None:
                causes += [Cause(**c) for c in refusal.details.get("causes", [])]
            if old is not None:
                causes += immutable_causes(kind, old, obj)
        if causes:
            raise RefusalError.invalid(kind, res.group, name, causes)
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

    # ---- request handling ------------------------------------------------------------------------

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        # kmock matches a request to its reactions by identity against the whole request log: keep
        # only the requests in flight, or every request costs O(requests so far).
        self._inflight.append(request)
        self._requests[:] = [r for r in self._requests if any(r is f for f in self._inflight)]
        try:
            try:
                return await self._dispatch(request)
            except kmock.KubernetesObjectNotFoundError:  # kmock's own 404 names no object
                res = request.resource
                raise RefusalError.not_found(
                    res.plural if res else "", res.group if res else "", str(request.name or "")
                ) from None
        except RefusalError as refusal:
            log.info("refused %s %s: %s", request.method, request.url.path, refusal)
            return aiohttp.web.json_response(refusal.status(), status=refusal.code)
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
        if res is not None and request.action == enums.action.WATCH:
            expired = self._expired_watch(request)
            if expired is not None:
                return expired
        if res is not None and request.action == enums.action.DELETE and request.name:
            orphan = self._check_delete(request)
            response = await super()._handle(request)
            await self._collect_garbage(orphan_of=orphan)
            return response
        return await super()._handle(request)

    def _expired_watch(self, request: kmock.Request) -> aiohttp.web.StreamResponse | None:
        """A watch from a compacted resourceVersion: one ERROR event with a 410 Status, then the end
        (https://kubernetes.io/docs/reference/using-api/api-concepts/#efficient-detection-of-changes)."""
        since = str(request.params.get("resourceVersion") or "")
        if not since.isdigit() or int(since) == 0 or int(since) >= self.compacted_rv:
            return None
        event = {"type": "ERROR", "object": RefusalError.expired(int(since), self.compacted_rv).status()}
        return aiohttp.web.Response(
            status=200, text=json.dumps(event) + "\n", content_type="application/json"
        )

    def _check_delete(self, request: kmock.Request) -> str | None:
        """DeleteOptions (:func:`~multilane.testing.kube_writes.delete_orphans`); the uid whose
        dependents are orphaned, for ``Orphan``."""
        assert request.resource is not None and request.name is not None
        stored = self._stored(request)
        if stored is None:
            return None
        options = request.data if isinstance(request.data, dict) else {}
        res = request.resource
        return delete_orphans(stored, options, request.params, res.plural, res.group, request.name)

    async def _create(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        res = request.resource
        assert res is not None
        obj = copy.deepcopy(request.data)
        if res in self._builtin_kinds or res in self._schemas:
            obj.setdefault("apiVersion", f"{res.group}/{res.version}" if res.group else res.version)
            obj.setdefault("kind", self._kind(res))
        meta = obj.setdefault("metadata", {})
        if request.namespace:
            meta["namespace"] = request.namespace
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        key: Any = (res, meta.get("namespace"), meta.get("name"))
        if key in self.objects and not self.objects[key].deleted:
            raise RefusalError.already_exists(res.plural, res.group, str(meta.get("name")))
        meta.update(
            uid=str(uuid.uuid4()),
            resourceVersion=str(next(_rv)),
            generation=1,
            creationTimestamp=dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        )
        if res in self._status_subresource and res in self._schemas:
            obj.pop("status", None)
        if self._builtin_kinds.get(res) == "StatefulSet":
            statefulset_defaults(obj)
        obj = self._admit(res, obj, strict=_strict(request))
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
                raise RefusalError.conflict(res.plural, res.group, str(request.name))
        if sub == "scale" and res in self._scale_paths and isinstance(body, dict):
            body, sub = scale_patch(self._scale_paths[res], body), None
        new = written_object(
            old, body, put=is_put, status_write=sub == "status", has_status=res in self._status_subresource,
            where=request.url.path,
        )  # fmt: skip
        new = self._admit(res, new, old, status_only=sub == "status", strict=_strict(request))
        meta = new.setdefault("metadata", {})
        meta["resourceVersion"] = str(next(_rv))
        generation = next_generation(old, new)
        if generation is not None:
            meta["generation"] = generation
        diff = merge_diff(old, new)
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
        """kmock's list, plus the ``kind``/``apiVersion`` a real list carries (kubectl needs them) and
        the current ``resourceVersion`` (watches continue from it)."""
        payload = await super()._serve_list(request)
        if isinstance(payload, dict) and request.resource is not None:
            payload["metadata"] = {"resourceVersion": str(_rv.last)}
            res = request.resource
            info = self.resources.get(res, None)
            kind = (getattr(info, "kind", None) or "List") + "List"
            payload["kind"] = kind
            payload["apiVersion"] = f"{res.group}/{res.version}" if res.group else res.version
        return payload

    async def _collect_garbage(self, orphan_of: str | None = None) -> None:
        """Background cascading deletion of objects whose owners are gone; the dependents of
        ``orphan_of`` (a uid deleted with ``propagationPolicy: Orphan``) lose their reference to it
        instead (https://kubernetes.io/docs/concepts/architecture/garbage-collection/#cascading-deletion)."""
        if orphan_of is not None:
            async with self._lock:
                for key, obj in list(self.objects.items()):
                    refs = list((obj.get("metadata") or {}).get("ownerReferences") or [])
                    kept = [r for r in refs if r.get("uid") != orphan_of]
                    if obj.deleted or len(kept) == len(refs):
                        continue
                    obj.patch(
                        {"metadata": {"ownerReferences": kept or None, "resourceVersion": str(next(_rv))}}
                    )
                    await self._buses[key[0]].put(
                        {"type": "MODIFIED", "object": copy.deepcopy(dict(obj.raw))}
                    )
        while True:
            orphans = dangling((key, obj, obj.deleted) for key, obj in self.objects.items())
            if not orphans:
                return
            async with self._lock:
                for key in orphans:
                    raw = copy.deepcopy(dict(self.objects[key].raw))
                    self.objects[key].delete()
                    await self._buses[key[0]].put({"type": "DELETED", "object": raw})


def _strict(request: kmock.Request) -> bool:
    """``fieldValidation=Strict``: unknown fields are refused (400); else (``Warn``, the server's
    default, or ``Ignore``) they are dropped."""
    return str(request.params.get("fieldValidation") or "") == "Strict"


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
