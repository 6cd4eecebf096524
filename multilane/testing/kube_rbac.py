"""``RbacAuthorizer``: bearer-token authentication and RBAC authorization for the emulated API server
(:class:`~multilane.testing.kube_api.ApiServerEmulator`, attribute ``authorizer``). Test support; no
I/O of its own (it reads the emulator's objects and the manifests it is given).

A request is handled in three numbered steps (:meth:`RbacAuthorizer.check`):

1. **Authenticate.** The ``Authorization: Bearer`` token names a user: a token registered with
   :meth:`RbacAuthorizer.add_token` (the operator's service account), else the first resolver that
   knows it (the pods' bound tokens: a resolver maps a pod's token to its StatefulSet's service
   account, as a TokenReview of a bound token would). A token marked expired (:meth:`expire`) or
   unknown -> 401 ``Unauthorized``. No header: ``anonymous_user`` (the test harness itself, which
   on a real cluster authenticates as an administrator with a client certificate), or 401.
2. **Authorize.** The request's attributes (verb from the method, ``watch`` and the name; API group,
   resource and subresource, namespace, name) are checked against the rules bound to the user:
   ClusterRoleBindings grant everywhere, RoleBindings only in their namespace. The Roles,
   ClusterRoles and bindings come from the static manifests (the chart as rendered) and from the
   objects stored in the emulator (those the operator creates for its workers). Superusers pass.
   Discovery (``/api``, ``/apis``, ``/version``) is open to every authenticated user (on a cluster,
   ``system:discovery`` is bound to ``system:authenticated``). No rule -> 403 ``Forbidden`` with a
   kube-apiserver-shaped ``Status``.
3. **Escalation check.** Creating or patching a Role (a RoleBinding) also needs every permission the
   Role (the bound role) grants, as Kubernetes refuses to let a subject grant what it does not hold
   (the ``escalate``/``bind`` verbs are never granted here). The rules that cover them count as used.

Every rule that authorizes a request, or covers a permission in step 3, is recorded in
:class:`RuleUsage` per (role, rule index, API group, resource, verb): :func:`unused_grants` lists the
granted (group, resource, verb) triples of the static manifests no request needed (least privilege).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import kmock
from kmock._internal import enums

__all__ = [
    "Grant",
    "RbacAuthorizer",
    "RuleUsage",
    "granted_triples",
    "pod_token_resolver",
    "service_account_user",
    "unused_grants",
]

RBAC_GROUP = "rbac.authorization.k8s.io"
ROLE_KINDS = {"Role", "ClusterRole"}
BINDING_KINDS = {"RoleBinding", "ClusterRoleBinding"}
#: The user-facing ClusterRoles every cluster bootstraps (besides the ``system:`` ones).
BOOTSTRAP_CLUSTER_ROLES = {"cluster-admin", "admin", "edit", "view"}


def _unauthorized() -> kmock.KubernetesError:
    return kmock.KubernetesError(
        status=401,
        reason="Unauthorized",
        message="Unauthorized",
        details={"causes": [{"message": "invalid bearer token"}]},
    )


def service_account_user(namespace: str, name: str) -> str:
    return f"system:serviceaccount:{namespace}:{name}"


@dataclass(frozen=True)
class Grant:
    """One rule of one role: ``role`` is ``ClusterRole/NAME`` or ``Role/NS/NAME``; ``index`` the rule's
    position in it."""

    role: str
    index: int
    rule: Mapping[str, Any] = field(compare=False, hash=False)


@dataclass
class RuleUsage:
    """Which (role, rule index, group, resource, verb) authorized something; shared by every
    authorizer of a test session. Thread-safe (the operator runs in its own thread)."""

    used: dict[tuple[str, int, str, str, str], int] = field(default_factory=dict)
    denied: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(self, grant: Grant, group: str, resource: str, verb: str) -> None:
        key = (grant.role, grant.index, group, resource, verb)
        with self._lock:
            self.used[key] = self.used.get(key, 0) + 1

    def deny(self, line: str) -> None:
        with self._lock:
            self.denied.append(line)


def _role_id(doc: Mapping[str, Any]) -> str:
    meta = doc.get("metadata") or {}
    if doc.get("kind") == "ClusterRole":
        return f"ClusterRole/{meta.get('name')}"
    return f"Role/{meta.get('namespace')}/{meta.get('name')}"


def granted_triples(manifests: Iterable[Mapping[str, Any]]) -> list[tuple[str, int, str, str, str]]:
    """Every (role, rule index, group, resource, verb) the Roles and ClusterRoles grant."""
    out = []
    for doc in manifests:
        if doc.get("kind") not in ROLE_KINDS:
            continue
        for i, rule in enumerate(doc.get("rules") or []):
            for group in rule.get("apiGroups") or []:
                for resource in rule.get("resources") or []:
                    for verb in rule.get("verbs") or []:
                        out.append((_role_id(doc), i, group, resource, verb))
    return out


def unused_grants(
    manifests: Iterable[Mapping[str, Any]], usage: RuleUsage
) -> list[tuple[str, int, str, str, str]]:
    """The granted triples (see :func:`granted_triples`) that no request used."""
    used = {(role, i, g, r, v) for (role, i, g, r, v) in usage.used}
    return [t for t in granted_triples(manifests) if t not in used]


def _matches(rule: Mapping[str, Any], group: str, resource: str, verb: str, name: str | None) -> bool:
    def has(key: str, value: str) -> bool:
        values = rule.get(key) or []
        return value in values or "*" in values

    if not (has("apiGroups", group) and has("resources", resource) and has("verbs", verb)):
        return False
    names = rule.get("resourceNames") or []
    return not names or (name is not None and name in names)


def _subject_matches(subject: Mapping[str, Any], user: str, binding_ns: str | None) -> bool:
    kind = subject.get("kind")
    if kind == "ServiceAccount":
        ns = subject.get("namespace") or binding_ns
        return user == service_account_user(str(ns), str(subject.get("name")))
    if kind == "User":
        return user == subject.get("name")
    if kind == "Group":
        return subject.get("name") == "system:authenticated" or (
            subject.get("name") == "system:serviceaccounts" and user.startswith("system:serviceaccount:")
        )
    return False


def pod_token_resolver(emulator: Any, namespace: str) -> Callable[[str], str | None]:
    """Resolves the tokens :class:`~multilane.testing.pods.StatefulSetProcessDouble` writes
    (``token-of-POD``, POD = ``STS-ORDINAL``) to the service account of the pod's StatefulSet template:
    a bound token names its pod, the pod its service account."""
    pattern = re.compile(r"^token-of-(?P<sts>.+)-\d+$")
    statefulsets = kmock.resource("apps", "v1", "statefulsets")

    def resolve(token: str) -> str | None:
        m = pattern.match(token)
        if not m:
            return None
        key: Any = (statefulsets, namespace, m.group("sts"))
        if key not in emulator.objects or emulator.objects[key].deleted:
            return None
        sts = dict(emulator.objects[key].raw)
        sa = ((sts.get("spec") or {}).get("template") or {}).get("spec", {}).get("serviceAccountName")
        return service_account_user(namespace, sa or "default")

    return resolve


class RbacAuthorizer:
    """Set as ``ApiServerEmulator.authorizer``; ``check(emulator, request)`` raises a
    ``kmock.KubernetesError`` (401/403) or returns the user name."""

    def __init__(
        self,
        manifests: Iterable[Mapping[str, Any]],
        usage: RuleUsage | None = None,
        *,
        anonymous_user: str | None = None,
        superusers: Iterable[str] = ("system:admin",),
    ) -> None:
        self.manifests = [dict(m) for m in manifests if m.get("kind") in ROLE_KINDS | BINDING_KINDS]
        self.usage = usage if usage is not None else RuleUsage()
        self.anonymous_user = anonymous_user
        self.superusers = set(superusers)
        self.tokens: dict[str, str] = {}  # token -> user
        self.resolvers: list[Callable[[str], str | None]] = []
        self.expired: set[str] = set()  # tokens answered with 401 from now on
        self.requests_by_user: dict[str, int] = {}

    def add_token(self, token: str, user: str) -> None:
        self.tokens[token] = user

    def expire(self, token: str) -> None:
        """The token expired: every request carrying it gets 401 (a bound token past its expiry)."""
        self.expired.add(token)

    # ---- step 1 ----------------------------------------------------------------------------------

    def authenticate(self, headers: Mapping[str, str]) -> str:
        auth = headers.get("Authorization") or headers.get("authorization") or ""
        if not auth:
            if self.anonymous_user is None:
                raise _unauthorized()
            return self.anonymous_user
        token = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
        user = None
        if token and token not in self.expired:
            user = self.tokens.get(token)
            for resolve in self.resolvers:
                if user is not None:
                    break
                user = resolve(token)
        if user is None:
            self.usage.deny(f"401 token {token[:12]!r}...")
            raise _unauthorized()
        return user

    # ---- step 2 ----------------------------------------------------------------------------------

    def _roles_and_bindings(self, emulator: Any) -> list[Mapping[str, Any]]:
        docs: list[Mapping[str, Any]] = list(self.manifests)
        kinds = {"roles": "Role", "clusterroles": "ClusterRole", "rolebindings": "RoleBinding",
                 "clusterrolebindings": "ClusterRoleBinding"}  # fmt: skip
        for key, obj in list(emulator.objects.items()):
            res = key[0]
            if getattr(res, "group", None) == RBAC_GROUP and not obj.deleted:
                # the kind as the API server would state it (a body may leave it out)
                docs.append({**dict(obj.raw), "kind": kinds.get(res.plural, "")})
        return docs

    def grants_for(self, emulator: Any, user: str, namespace: str | None) -> list[Grant]:
        """The rules bound to ``user`` that apply in ``namespace`` (None: cluster-scoped request)."""
        docs = self._roles_and_bindings(emulator)
        roles = {
            (d["kind"], (d.get("metadata") or {}).get("namespace"), (d.get("metadata") or {}).get("name")): d
            for d in docs
            if d.get("kind") in ROLE_KINDS
        }
        out: list[Grant] = []
        for binding in docs:
            kind = binding.get("kind")
            if kind not in BINDING_KINDS:
                continue
            binding_ns = (binding.get("metadata") or {}).get("namespace")
            if kind == "RoleBinding" and binding_ns != namespace:
                continue
            if not any(_subject_matches(s, user, binding_ns) for s in binding.get("subjects") or []):
                continue
            ref = binding.get("roleRef") or {}
            role_ns = binding_ns if ref.get("kind") == "Role" else None
            role = roles.get((ref.get("kind"), role_ns, ref.get("name")))
            if role is None:
                continue
            out.extend(Grant(_role_id(role), i, rule) for i, rule in enumerate(role.get("rules") or []))
        return out

    def allowed(
        self, emulator: Any, user: str, namespace: str | None, group: str, resource: str, verb: str,
        name: str | None,
    ) -> bool:  # fmt: skip
        """Whether ``user`` may; records the rules that allow it."""
        if user in self.superusers:
            return True
        grants = self.grants_for(emulator, user, namespace)
        hits = [g for g in grants if _matches(g.rule, group, resource, verb, name)]
        for g in hits:
            self.usage.record(g, group, resource, verb)
        return bool(hits)

    @staticmethod
    def verb(request: kmock.Request) -> str:
        method = request.method
        if method == enums.method.GET:
            if str(request.params.get("watch", "")).lower() in ("true", "1"):
                return "watch"
            return "get" if request.name else "list"
        if method == enums.method.POST:
            return "create"
        if method == enums.method.PATCH:
            return "patch"
        if method == enums.method.PUT:
            return "update"
        if method == enums.method.DELETE:
            return "delete" if request.name else "deletecollection"
        return str(method).lower()

    def check(self, emulator: Any, request: kmock.Request) -> str:
        # 1. Authenticate.
        user = self.authenticate(request.headers)
        self.requests_by_user[user] = self.requests_by_user.get(user, 0) + 1
        res = request.resource
        if res is None or not res.plural:
            return user  # discovery and /version: every authenticated user
        group = res.group or ""
        resource = res.plural + (f"/{request.subresource}" if request.subresource else "")
        verb = self.verb(request)
        # 2. Authorize.
        if not self.allowed(emulator, user, request.namespace, group, resource, verb, request.name):
            ns = request.namespace
            where = f' in the namespace "{ns}"' if ns else " at the cluster scope"
            api = f'in API group "{group}"'
            line = f'User "{user}" cannot {verb} resource "{resource}" {api}{where}'
            self.usage.deny(line)
            raise kmock.KubernetesError(
                status=403,
                reason="Forbidden",
                message=f"{resource} {request.name or ''} is forbidden: {line}".replace("  ", " "),
                details={"name": request.name or "", "group": group, "kind": res.plural},
            )
        # 3. Escalation check for Roles and RoleBindings.
        if group == RBAC_GROUP and verb in ("create", "patch", "update") and isinstance(request.data, dict):
            self._check_escalation(emulator, user, request, res.plural)
        # 4. Owner references that block the owner's deletion need ``update`` on its finalizers.
        if verb in ("create", "patch", "update") and isinstance(request.data, dict):
            self._check_owner_references(emulator, user, request)
        return user

    def _check_owner_references(self, emulator: Any, user: str, request: kmock.Request) -> None:
        """The OwnerReferencesPermissionEnforcement admission plugin: setting ``blockOwnerDeletion:
        true`` on a reference needs ``update`` on the owner's ``finalizers`` subresource
        (https://kubernetes.io/docs/reference/access-authn-authz/admission-controllers/
        #ownerreferencespermissionenforcement), checked when a write sets or changes such a reference.
        It runs on OpenShift and hardened clusters; enforced here so the chart's rule for it is
        exercised."""
        meta = request.data.get("metadata") if isinstance(request.data, dict) else None
        # Only a change is checked: references the stored object already carries pass (a worker that
        # PUTs its Lease back unchanged needs no right on the owner).
        stored = emulator._stored(request) if request.name else None
        before = ((stored or {}).get("metadata") or {}).get("ownerReferences") or []
        for ref in (meta or {}).get("ownerReferences") or []:
            if not isinstance(ref, Mapping) or not ref.get("blockOwnerDeletion") or ref in before:
                continue
            api_version = str(ref.get("apiVersion") or "")
            owner_group = api_version.split("/")[0] if "/" in api_version else ""
            plural = str(ref.get("kind") or "").lower() + "s"
            resource = f"{plural}/finalizers"
            if not self.allowed(
                emulator, user, request.namespace, owner_group, resource, "update", ref.get("name")
            ):
                line = (
                    f'User "{user}" cannot set blockOwnerDeletion: it cannot update resource '
                    f'"{resource}" in API group "{owner_group}"'
                )
                self.usage.deny(line)
                raise kmock.KubernetesError(
                    status=403,
                    reason="Forbidden",
                    message=f"{request.resource.plural if request.resource else ''} is forbidden: {line}",
                    details={"group": owner_group, "kind": plural},
                )

    def _check_escalation(self, emulator: Any, user: str, request: kmock.Request, plural: str) -> None:
        body = request.data
        namespace = request.namespace
        rules: list[Mapping[str, Any]] = []
        if plural in ("roles", "clusterroles"):
            rules = list(body.get("rules") or [])
        elif plural in ("rolebindings", "clusterrolebindings") and body.get("roleRef"):
            ref = body["roleRef"]
            docs = self._roles_and_bindings(emulator)
            found = False
            for d in docs:
                meta = d.get("metadata") or {}
                if (
                    d.get("kind") == ref.get("kind")
                    and meta.get("name") == ref.get("name")
                    and (ref.get("kind") == "ClusterRole" or meta.get("namespace") == namespace)
                ):
                    rules, found = list(d.get("rules") or []), True
            if not found and user not in self.superusers:
                # kube-apiserver resolves the bound role's rules to check them (met on v1.34.4): a
                # missing role is a 404 naming it under the request's resource; a bootstrap
                # ClusterRole (cluster-admin, ...), which this double does not store, exists on every
                # cluster and no operator holds its rules: 403.
                name = str(ref.get("name") or "")
                if ref.get("kind") == "ClusterRole" and (
                    name in BOOTSTRAP_CLUSTER_ROLES or name.startswith("system:")
                ):
                    line = (
                        f'User "{user}" attempts to grant the rules of ClusterRole "{name}" it does not hold'
                    )
                    self.usage.deny(line)
                    raise kmock.KubernetesError(
                        status=403,
                        reason="Forbidden",
                        message=f"{plural} is forbidden: {line}",
                        details={"group": RBAC_GROUP, "kind": plural},
                    )
                raise kmock.KubernetesError(
                    status=404,
                    reason="NotFound",
                    message=f'{plural}.{RBAC_GROUP} "{name}" not found',
                    details={"name": name, "group": RBAC_GROUP, "kind": plural},
                )
        for rule in rules:
            names = rule.get("resourceNames") or [None]
            for g in rule.get("apiGroups") or []:
                for r in rule.get("resources") or []:
                    for v in rule.get("verbs") or []:
                        for n in names:
                            if not self.allowed(emulator, user, namespace, g, r, v, n):
                                line = f'User "{user}" attempts to grant {v} {g}/{r} it does not hold'
                                self.usage.deny(line)
                                raise kmock.KubernetesError(
                                    status=403,
                                    reason="Forbidden",
                                    message=f"{plural} is forbidden: {line}",
                                    details={"group": RBAC_GROUP, "kind": plural},
                                )
