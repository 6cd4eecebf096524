"""What kube-apiserver refuses, as checks for the API-server double (:mod:`multilane.testing.kube_api`).
Does I/O: reads the OpenAPI schemas bundled with ``kubernetes-validate`` (files, once per kind).

Each check returns :class:`Cause` entries (field path, reason, message), and :class:`RefusalError` turns
them into the answer kube-apiserver gives: a ``Status`` object (``kind: Status``, ``code``,
``reason`` ``Invalid``/``Conflict``/``AlreadyExists``/``Expired``/``BadRequest``/``Forbidden``,
``details.causes``) -- https://kubernetes.io/docs/reference/kubernetes-api/common-definitions/status/

- :func:`name_causes`, :func:`label_causes`: object names (DNS-1123 subdomain; DNS-1123 label for
  Namespaces; DNS-1035 label for Services; CronJobs <= 52 characters; Jobs <= 63, their name becomes a
  label value) and label keys/values (<= 63 characters)
  -- https://kubernetes.io/docs/concepts/overview/working-with-objects/names/ and
  https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#syntax-and-character-set
- :func:`revision_hash_label`: the ``controller-revision-hash`` label a StatefulSet's controller puts on
  its pods (``NAME-<10 chars>``), so that a StatefulSet named over 52 characters gets pods refused;
- :func:`immutable_causes`: fields kube-apiserver lets no update change (StatefulSet spec except
  replicas, template, updateStrategy, persistentVolumeClaimRetentionPolicy, minReadySeconds, ordinals
  and revisionHistoryLimit; Service ``clusterIP``; PVC spec except the storage request; Job selector
  and template; a RoleBinding's ``roleRef``);
- :func:`statefulset_defaults`, :func:`statefulset_causes`: a new StatefulSet's strategy defaulting
  and ValidateStatefulSetSpec's checks of ``podManagementPolicy`` and ``updateStrategy``;
- :class:`BuiltinSchemas`: built-in kinds against the Kubernetes OpenAPI schema of
  :data:`KUBE_VERSION`, with unknown fields refused (``fieldValidation=Strict``, what kubectl asks for
  by default: https://kubernetes.io/docs/reference/using-api/api-concepts/#field-validation), or
  dropped (:meth:`BuiltinSchemas.drop_unknown`, the server's default ``Warn``);
- a CRD's CEL rules: :class:`multilane.testing.kube_crd.CelRules`.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import jsonschema
import referencing
from kubernetes_validate import utils as kv_utils

__all__ = [
    "KUBE_VERSION",
    "BuiltinSchemas",
    "Cause",
    "RefusalError",
    "immutable_causes",
    "label_causes",
    "name_causes",
    "revision_hash_label",
    "statefulset_causes",
    "statefulset_defaults",
]

#: Kubernetes version whose OpenAPI schemas built-in kinds are validated against (the newest
#: kubernetes-validate ships; the chart tests use the same).
KUBE_VERSION = "1.37.0"

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
REVISION_HASH_LABEL = "controller-revision-hash"
_HASH_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # the characters Kubernetes' safe-encoded hashes use


@dataclass(frozen=True, slots=True)
class Cause:
    """One refused field: ``reason`` is a ``metav1.CauseType`` (``FieldValueInvalid``, ...)."""

    field: str
    message: str
    reason: str = "FieldValueInvalid"

    def as_dict(self) -> dict[str, str]:
        return {"reason": self.reason, "message": self.message, "field": self.field}

    def text(self) -> str:
        return f"{self.field}: {self.message}"


@dataclass(frozen=True)
class RefusalError(Exception):
    """An error answer of kube-apiserver; :meth:`status` is its ``Status`` body."""

    code: int
    reason: str
    message: str
    details: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{self.code} {self.reason}: {self.message}"

    def status(self) -> dict[str, Any]:
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "details": self.details,
            "code": self.code,
        }

    @classmethod
    def invalid(cls, kind: str, group: str | None, name: str, causes: list[Cause]) -> RefusalError:
        group = group or ""
        qualified = f"{kind}.{group}" if group else kind
        texts = [c.text() for c in causes]
        listed = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
        return cls(
            422,
            "Invalid",
            f'{qualified} "{name}" is invalid: {listed}',
            {"name": name, "group": group, "kind": kind, "causes": [c.as_dict() for c in causes]},
        )

    @classmethod
    def conflict(cls, plural: str | None, group: str | None, name: str) -> RefusalError:
        plural, group = plural or "", group or ""
        what = f"{plural}.{group}" if group else plural
        return cls(
            409,
            "Conflict",
            f'Operation cannot be fulfilled on {what} "{name}": the object has been modified; '
            "please apply your changes to the latest version and try again",
            {"name": name, "group": group, "kind": plural},
        )

    @classmethod
    def already_exists(cls, plural: str | None, group: str | None, name: str) -> RefusalError:
        plural, group = plural or "", group or ""
        what = f"{plural}.{group}" if group else plural
        return cls(
            409,
            "AlreadyExists",
            f'{what} "{name}" already exists',
            {"name": name, "group": group, "kind": plural},
        )

    @classmethod
    def not_found(cls, plural: str | None, group: str | None, name: str) -> RefusalError:
        plural, group = plural or "", group or ""
        what = f"{plural}.{group}" if group else plural
        details = {"name": name, "kind": plural, **({"group": group} if group else {})}
        return cls(404, "NotFound", f'{what} "{name}" not found', details)

    @classmethod
    def expired(cls, requested: int, oldest: int) -> RefusalError:
        return cls(410, "Expired", f"too old resource version: {requested} ({oldest})")

    @classmethod
    def bad_request(cls, message: str) -> RefusalError:
        return cls(400, "BadRequest", message)


# ---- names and labels ----------------------------------------------------------------------------


def _dns_causes(path: str, value: str, pattern: re.Pattern[str], limit: int, what: str) -> list[Cause]:
    out = []
    if len(value) > limit:
        out.append(Cause(path, f'Invalid value: "{value}": must be no more than {limit} characters'))
    if not pattern.match(value):
        out.append(Cause(path, f'Invalid value: "{value}": {what}'))
    return out


_SUBDOMAIN_TEXT = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and "
    "must start and end with an alphanumeric character"
)
_LABEL1123_TEXT = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must "
    "start and end with an alphanumeric character"
)
_LABEL1035_TEXT = (
    "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an "
    "alphabetic character, and end with an alphanumeric character"
)


def name_causes(kind: str, name: str) -> list[Cause]:
    """The name rules of ``kind`` (kinds not listed follow the DNS-1123 subdomain rule)."""
    path = "metadata.name"
    if not name:
        return [Cause(path, "Required value: name or generateName is required", "FieldValueRequired")]
    if kind == "Service":
        return _dns_causes(path, name, DNS1035_LABEL, 63, _LABEL1035_TEXT)
    if kind == "Namespace":
        return _dns_causes(path, name, DNS1123_LABEL, 63, _LABEL1123_TEXT)
    causes = _dns_causes(path, name, DNS1123_SUBDOMAIN, 253, _SUBDOMAIN_TEXT)
    if kind == "CronJob" and len(name) > 52:  # its Jobs are named NAME-<11 digits>
        causes.append(Cause(path, f'Invalid value: "{name}": must be no more than 52 characters'))
    if kind == "Job" and len(name) > 63:  # the name becomes the pods' job-name label value
        causes.append(Cause(path, f'Invalid value: "{name}": must be no more than 63 characters'))
    return causes


def label_causes(path: str, labels: Mapping[str, Any] | None) -> list[Cause]:
    """Label keys (``[prefix/]name``, name <= 63, prefix a DNS subdomain) and values (<= 63)."""
    out: list[Cause] = []
    for key, value in (labels or {}).items():
        prefix, _, name = str(key).rpartition("/")
        if prefix and (len(prefix) > 253 or not DNS1123_SUBDOMAIN.match(prefix)):
            out.append(Cause(path, f'Invalid value: "{key}": prefix part {_SUBDOMAIN_TEXT}'))
        if len(name) > 63 or not LABEL_NAME.match(name):
            out.append(
                Cause(
                    path,
                    f'Invalid value: "{key}": name part must be no more than 63 characters '
                    "of alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric",
                )
            )
        text = "" if value is None else str(value)
        if len(text) > 63:
            out.append(Cause(f"{path}", f'Invalid value: "{text}": must be no more than 63 characters'))
        elif not LABEL_VALUE.match(text):
            out.append(
                Cause(
                    path,
                    f'Invalid value: "{text}": a valid label must be an empty string or '
                    "consist of alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric",
                )
            )
    return out


def _templates(obj: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    spec = obj.get("spec") or {}
    if isinstance(spec.get("template"), Mapping):
        yield "spec.template", spec["template"]
    job = (spec.get("jobTemplate") or {}) if isinstance(spec.get("jobTemplate"), Mapping) else {}
    if job:
        yield "spec.jobTemplate", job
        if isinstance((job.get("spec") or {}).get("template"), Mapping):
            yield "spec.jobTemplate.spec.template", job["spec"]["template"]


def object_label_causes(obj: Mapping[str, Any]) -> list[Cause]:
    """Labels of the object, of its (job/pod) templates and of its ``spec.selector.matchLabels``."""
    out = label_causes("metadata.labels", (obj.get("metadata") or {}).get("labels"))
    for path, template in _templates(obj):
        out += label_causes(f"{path}.metadata.labels", (template.get("metadata") or {}).get("labels"))
    selector = (obj.get("spec") or {}).get("selector")
    if isinstance(selector, Mapping) and isinstance(selector.get("matchLabels"), Mapping):
        out += label_causes("spec.selector.matchLabels", selector["matchLabels"])
    return out


def revision_hash_label(sts: Mapping[str, Any]) -> dict[str, str]:
    """``{"controller-revision-hash": "NAME-<10 chars>"}`` for the StatefulSet's current template:
    the label its controller puts on every pod (the hash here is not Kubernetes' own, the length is)."""
    template = json.dumps((sts.get("spec") or {}).get("template") or {}, sort_keys=True)
    digest = hashlib.sha256(template.encode()).digest()
    encoded = "".join(_HASH_ALPHABET[b % len(_HASH_ALPHABET)] for b in digest[:10])
    return {REVISION_HASH_LABEL: f"{(sts.get('metadata') or {}).get('name', '')}-{encoded}"}


# ---- StatefulSet: defaulting and hand-written validation -----------------------------------------


def statefulset_defaults(obj: dict[str, Any]) -> None:
    """kube-apiserver's defaulting of a new StatefulSet that the operator's writes depend on:
    ``podManagementPolicy: OrderedReady`` and ``updateStrategy: {type: RollingUpdate, rollingUpdate:
    {partition: 0}}`` when absent (so a later patch to ``OnDelete`` must remove ``rollingUpdate``)."""
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    spec.setdefault("podManagementPolicy", "OrderedReady")
    strategy = spec.setdefault("updateStrategy", {})
    if isinstance(strategy, dict):
        strategy.setdefault("type", "RollingUpdate")
        if strategy["type"] == "RollingUpdate":
            rolling = strategy.setdefault("rollingUpdate", {})
            if isinstance(rolling, dict):
                rolling.setdefault("partition", 0)


def statefulset_causes(obj: Mapping[str, Any]) -> list[Cause]:
    """What ValidateStatefulSetSpec refuses beyond the OpenAPI schema, for the fields the operator
    sets: ``podManagementPolicy`` and ``updateStrategy`` (``rollingUpdate`` only beside
    ``RollingUpdate``). Messages as kube-apiserver v1.34 words them."""
    spec = obj.get("spec") or {}
    out: list[Cause] = []
    policy = spec.get("podManagementPolicy")
    if policy is not None and policy not in ("OrderedReady", "Parallel"):
        out.append(
            Cause(
                "spec.podManagementPolicy",
                f"Invalid value: \"{policy}\": must be 'OrderedReady' or 'Parallel'",
            )
        )
    strategy = spec.get("updateStrategy") or {}
    kind = strategy.get("type")
    if kind is not None and kind not in ("RollingUpdate", "OnDelete"):
        out.append(
            Cause(
                "spec.updateStrategy.type",
                f'Unsupported value: "{kind}": supported values: "OnDelete", "RollingUpdate"',
                "FieldValueNotSupported",
            )
        )
    if kind == "OnDelete" and strategy.get("rollingUpdate") is not None:
        out.append(
            Cause(
                "spec.updateStrategy.rollingUpdate",
                f"Invalid value: {json.dumps(strategy['rollingUpdate'])}: only allowed for updateStrategy "
                "'RollingUpdate'",
            )
        )
    return out


# ---- immutable fields ----------------------------------------------------------------------------

#: StatefulSet spec fields an update may change (kube-apiserver's ValidateStatefulSetUpdate).
STATEFULSET_MUTABLE = (
    "replicas",
    "template",
    "updateStrategy",
    "persistentVolumeClaimRetentionPolicy",
    "minReadySeconds",
    "ordinals",
    "revisionHistoryLimit",
)
_FORBIDDEN_STS = (
    "updates to statefulset spec for fields other than 'replicas', 'ordinals', 'template', "
    "'updateStrategy', 'revisionHistoryLimit', 'persistentVolumeClaimRetentionPolicy' and "
    "'minReadySeconds' are forbidden"
)


def _immutable(path: str) -> Cause:
    return Cause(path, "Invalid value: field is immutable", "FieldValueInvalid")


def immutable_causes(kind: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Cause]:
    """Fields an update of ``kind`` changed that kube-apiserver keeps immutable."""
    old_spec = dict(old.get("spec") or {})
    new_spec = dict(new.get("spec") or {})
    if kind == "StatefulSet":
        changed = sorted(
            k
            for k in set(old_spec) | set(new_spec)
            if k not in STATEFULSET_MUTABLE and old_spec.get(k) != new_spec.get(k)
        )
        if changed:
            # The answer names no single field; the cause lists them (callers name the field).
            return [
                Cause(
                    "spec",
                    f"Forbidden: {_FORBIDDEN_STS} (changed: {', '.join(changed)})",
                    "FieldValueForbidden",
                )
            ]
        return []
    if kind == "Service":
        before, after = old_spec.get("clusterIP"), new_spec.get("clusterIP")
        if before and after != before and new_spec.get("type") != "ExternalName":
            return [_immutable("spec.clusterIP")]
        return []
    if kind == "PersistentVolumeClaim":

        def rest(spec: Mapping[str, Any]) -> dict[str, Any]:
            out = {
                k: v
                for k, v in spec.items()
                if k not in ("resources", "volumeAttributesClassName", "volumeName")
            }
            out["limits"] = (spec.get("resources") or {}).get("limits")
            return out

        if rest(old_spec) != rest(new_spec):
            return [
                Cause(
                    "spec",
                    "Forbidden: spec is immutable after creation except resources.requests "
                    "and volumeAttributesClassName for bound claims",
                    "FieldValueForbidden",
                )
            ]
        before = ((old_spec.get("resources") or {}).get("requests") or {}).get("storage")
        after = ((new_spec.get("resources") or {}).get("requests") or {}).get("storage")
        if before != after and old_spec.get("volumeName") is None:
            return [
                Cause(
                    "spec.resources.requests.storage",
                    "Forbidden: only dynamically provisioned pvc can be resized",
                    "FieldValueForbidden",
                )
            ]
        return []
    if kind == "Job":
        return [
            _immutable(f"spec.{k}")
            for k in ("selector", "template", "completionMode")
            if k in old_spec and old_spec.get(k) != new_spec.get(k)
        ]
    if kind == "RoleBinding" and old.get("roleRef") != new.get("roleRef"):
        return [Cause("roleRef", "Invalid value: cannot change roleRef")]
    return []


# ---- OpenAPI schemas of built-in kinds -----------------------------------------------------------


class BuiltinSchemas:
    """Validators of built-in kinds (``apiVersion``, ``kind``) from kubernetes-validate's strict schemas
    of :data:`KUBE_VERSION`, built once per kind (building one costs ~40 ms; validating ~1 ms)."""

    def __init__(self, version: str = KUBE_VERSION) -> None:
        self.version = version
        self._dir = f"kubernetes-json-schema/v{version}-local-strict"
        self._defs: Any = None
        self._validators: dict[tuple[str, str], Any] = {}

    def _validator(self, api_version: str, kind: str) -> Any:
        key = (api_version, kind)
        if key not in self._validators:
            file_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
            schema = kv_utils.schema_contents(f"{self._dir}/{kind.lower()}-{file_version}.json", self.version)
            if self._defs is None:
                self._defs = kv_utils.schema_contents(f"{self._dir}/_definitions.json", self.version)
            registry: Any = referencing.Registry()
            registry = referencing.Resource.from_contents(schema) @ registry
            registry = referencing.Resource.from_contents(self._defs) @ registry
            self._validators[key] = jsonschema.Draft202012Validator(schema, registry=registry)
        return self._validators[key]

    def drop_unknown(self, obj: dict[str, Any]) -> list[str]:
        """Remove the fields ``obj``'s kind does not know (in place); returns their paths. What
        kube-apiserver does without ``fieldValidation=Strict`` (the default is ``Warn``: the field is
        dropped, the answer carries a ``Warning`` header, the write succeeds)."""
        validator = self._validator(str(obj.get("apiVersion")), str(obj.get("kind")))
        dropped = []
        for exc in list(validator.iter_errors(obj)):  # listed first: the loop changes obj
            if exc.validator != "additionalProperties" or not isinstance(exc.instance, dict):
                continue
            where = ".".join(str(p) for p in exc.absolute_path)
            for name in re.findall(r"'([^']+)' was unexpected", exc.message):
                exc.instance.pop(name, None)
                dropped.append(f"{where}.{name}" if where else name)
        return dropped

    def refusal(self, obj: Mapping[str, Any], group: str, *, required: bool = True) -> RefusalError | None:
        """None when ``obj`` fits its kind's schema; else the answer: an unknown field or a wrong type
        is a 400 ``BadRequest`` (a decoding error, as kube-apiserver says it), anything else 422.

        ``required`` properties are enforced under ``spec`` only (and not at all with
        ``required=False``, for status writes): kube-apiserver decodes built-in kinds into Go types, so
        an absent field is a zero value, refused by its hand-written validation for spec fields such
        as a StatefulSet's selector or a container's name and image, not for status fields."""
        kind = str(obj.get("kind"))
        name = str((obj.get("metadata") or {}).get("name") or "")
        validator = self._validator(str(obj.get("apiVersion")), kind)
        errors = [
            e
            for e in validator.iter_errors(obj)
            if e.validator != "required" or (required and list(e.absolute_path)[:1] == ["spec"])
        ]
        errors.sort(key=lambda e: [str(p) for p in e.absolute_path])
        if not errors:
            return None
        decoding = [e for e in errors if e.validator in ("additionalProperties", "type")]
        if decoding:
            exc = decoding[0]
            where = ".".join(str(p) for p in exc.absolute_path)
            if exc.validator == "additionalProperties":
                unknown = re.findall(r"'([^']+)' was unexpected", exc.message) or [exc.message]
                fields = ", ".join(f'unknown field "{where + "." if where else ""}{u}"' for u in unknown)
                return RefusalError.bad_request(f"strict decoding error: {fields}")
            return RefusalError.bad_request(
                f'{kind} in version "{obj.get("apiVersion")}" cannot be handled: {where}: {exc.message}'
            )
        causes = []
        for exc in errors:
            where = ".".join(str(p) for p in exc.absolute_path)
            if exc.validator == "required":
                missing = re.findall(r"'([^']+)' is a required property", exc.message)
                path = f"{where}.{missing[0]}" if missing and where else (missing[0] if missing else where)
                causes.append(Cause(path, "Required value", "FieldValueRequired"))
            elif exc.validator == "enum":
                causes.append(Cause(where, f"Unsupported value: {exc.instance!r}", "FieldValueNotSupported"))
            else:
                causes.append(Cause(where, f"Invalid value: {exc.message}"))
        return RefusalError.invalid(kind, group, name, causes)
