"""The parts of a CustomResourceDefinition the API-server double applies, and JSON merge patches. Pure:
no I/O (cel-python, from the ``test`` extra, is imported when a CRD is loaded).

- :func:`plain_json_schema`: the CRD's openAPIV3Schema as plain JSON Schema (``nullable`` honoured);
- :func:`default_and_prune`: structural defaulting and pruning of unknown fields;
- :class:`CelRules`: the ``x-kubernetes-validations`` rules, evaluated with cel-python
  (https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/#validation-rules);
- :func:`apply_merge_patch`, :func:`merge_diff`: RFC 7386 merge patches (apply one; compute one).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from multilane.testing.kube_rules import Cause

__all__ = ["CelRules", "apply_merge_patch", "default_and_prune", "merge_diff", "plain_json_schema"]


def plain_json_schema(schema: Any) -> Any:
    """The CRD schema as plain JSON Schema: drop x-kubernetes-* keys; OpenAPI's ``nullable: true``
    becomes ``type: [T, "null"]``."""
    if isinstance(schema, dict):
        out = {
            k: plain_json_schema(v)
            for k, v in schema.items()
            if not k.startswith("x-kubernetes-") and k != "nullable"
        }
        if schema.get("nullable") and isinstance(out.get("type"), str):
            out["type"] = [out["type"], "null"]
        return out
    if isinstance(schema, list):
        return [plain_json_schema(v) for v in schema]
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


def apply_merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if not isinstance(target, dict):
        target = {}
    for k, v in patch.items():
        if v is None:
            target.pop(k, None)
        else:
            target[k] = apply_merge_patch(target.get(k), v)
    return target


def merge_diff(old: Any, new: Any) -> Any:
    """A JSON merge patch turning ``old`` into ``new``."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return new
    out: dict[str, Any] = {k: None for k in old if k not in new}
    for k, v in new.items():
        if k not in old:
            out[k] = v
        elif old[k] != v:
            out[k] = merge_diff(old[k], v)
    return out


class CelRules:
    """The ``x-kubernetes-validations`` rules of one CRD version's schema, compiled once."""

    def __init__(self, schema: Mapping[str, Any]) -> None:
        import celpy  # the `test` extra

        self._celpy = celpy
        self._env = celpy.Environment()
        self._programs: dict[str, Any] = {}
        self.schema = schema

    def _program(self, rule: str) -> Any:
        if rule not in self._programs:
            self._programs[rule] = self._env.program(self._env.compile(rule))
        return self._programs[rule]

    def causes(self, obj: Mapping[str, Any], old: Mapping[str, Any] | None = None) -> list[Cause]:
        """Rules ``obj`` breaks (transition rules, those naming ``oldSelf``, only with ``old``).

        On update, a value equal to its old value is not validated again, nor anything below it
        (validation ratcheting, on by default since Kubernetes 1.30:
        https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/#validation-ratcheting),
        so a status write evaluates no spec rule. At the root, rules see ``metadata.name`` and
        ``metadata.generateName`` only, and ``status`` only if a root rule names it (cel-python
        converts the whole value for every rule)."""
        root_rules = " ".join(str(r["rule"]) for r in self.schema.get("x-kubernetes-validations") or [])

        def rooted(body: Mapping[str, Any]) -> dict[str, Any]:
            meta = body.get("metadata") or {}
            out = {k: v for k, v in body.items() if k != "status" or "status" in root_rules}
            out["metadata"] = {k: meta[k] for k in ("name", "generateName") if k in meta}
            return out

        out: list[Cause] = []
        self._walk(self.schema, rooted(obj), None if old is None else rooted(old), "", out)
        return out

    def _walk(self, schema: Mapping[str, Any], value: Any, old: Any, path: str, out: list[Cause]) -> None:
        if value is None or (old is not None and value == old):
            return  # absent, or unchanged (ratcheting)
        for rule in schema.get("x-kubernetes-validations") or []:
            text = str(rule["rule"])
            transition = "oldSelf" in text
            if transition and old is None:
                continue
            activation = {"self": self._celpy.json_to_cel(value)}
            if transition:
                activation["oldSelf"] = self._celpy.json_to_cel(old)
            try:
                result = self._program(text).evaluate(activation)
            except Exception as exc:  # an evaluation error refuses too (the API server's behaviour)
                result = exc
            if isinstance(result, Exception) or not bool(result):
                message = str(rule.get("message") or f"failed rule: {text}")
                reason = {
                    "FieldValueForbidden": "FieldValueForbidden",
                    "FieldValueRequired": "FieldValueRequired",
                }.get(str(rule.get("reason")), "FieldValueInvalid")
                out.append(Cause(path or "<nil>", f"Invalid value: {message}", reason))
        if isinstance(value, Mapping):
            props = schema.get("properties") or {}
            extra = schema.get("additionalProperties")
            for key, sub_value in value.items():
                sub = props.get(key) if key in props else (extra if isinstance(extra, Mapping) else None)
                if sub is not None:
                    sub_old = old.get(key) if isinstance(old, Mapping) else None
                    self._walk(sub, sub_value, sub_old, f"{path}.{key}" if path else key, out)
        elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
            for i, item in enumerate(value):
                self._walk(schema["items"], item, None, f"{path}[{i}]", out)
