"""The files and environment of one pod of the process kubelet: its volumes as directories and each
container's env (steps 1 and 2 of :mod:`multilane.testing.kubelet_pods`). Does I/O (files, API calls
as the node).
"""

from __future__ import annotations

import base64
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from multilane.operator.k8s.kube import KubeClient, KubeError, api_path

__all__ = ["PodFiles", "VolumeError", "expand", "run_as"]

_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


class VolumeError(RuntimeError):
    """A volume or env source cannot be made yet (its Secret, ConfigMap or claim is missing): the pod
    waits."""


def expand(value: str, env: dict[str, str]) -> str:
    """``$(VAR)`` replaced by ``env``'s value; an unknown name stays as written (as the kubelet)."""
    return _VAR.sub(lambda m: env.get(m.group(1), m.group(0)), value)


def run_as(spec: dict[str, Any], container: dict[str, Any] | None = None) -> tuple[int, int] | None:
    """(uid, gid) a container runs as: ``runAsUser``/``runAsGroup`` (container over pod); 65534 when
    only ``runAsNonRoot`` is set (the host has no image user); None: as the kubelet."""
    sc = {**(spec.get("securityContext") or {}), **((container or {}).get("securityContext") or {})}
    uid = sc.get("runAsUser")
    if uid is None and sc.get("runAsNonRoot"):
        uid = 65534
    if uid is None:
        return None
    return int(uid), int(sc.get("runAsGroup", uid))


class PodFiles:
    """The volumes and env of one pod.

    Invariants: ``volumes`` maps a volume's name to its directory once it is complete; ``_tokens``
    holds when each projected token is due for renewal (80 % of its life); Secret, ConfigMap and
    downward-API files are rewritten where they changed every ``refresh_every_s`` (``refresh``).
    """

    def __init__(self, kube: KubeClient, pod: dict[str, Any], dir: Path, pod_ip: str, api_port: int) -> None:
        self.kube = kube
        self.pod = pod
        self.dir = dir
        self.pod_ip = pod_ip
        self.api_port = api_port
        self.uid = str(pod["metadata"]["uid"])
        self.namespace = str(pod["metadata"]["namespace"])
        self.name = str(pod["metadata"]["name"])
        self.spec: dict[str, Any] = pod["spec"]
        self.volumes: dict[str, Path] = {}
        self.volume_error = ""
        self._tokens: dict[Path, float] = {}
        self.refresh_every_s = 10.0
        self._refreshed_at = time.monotonic()
        self.fs_group: int | None = (self.spec.get("securityContext") or {}).get("fsGroup")

    # -- 1. volumes --------------------------------------------------------------------------------

    async def prepare_volumes(self) -> bool:
        """Make every volume; False (with ``volume_error``) while one cannot be made yet."""
        try:
            for vol in self.spec.get("volumes") or []:
                if vol["name"] not in self.volumes:
                    self.volumes[vol["name"]] = await self._volume(vol)
        except (VolumeError, KubeError) as exc:  # KubeError: e.g. 403 before the Node authorizer's graph
            self.volume_error = str(exc)  # knows the pod; the next round tries again
            return False
        self.volume_error = ""
        return True

    async def _volume(self, vol: dict[str, Any]) -> Path:
        path = self.dir / "volumes" / vol["name"]
        if "persistentVolumeClaim" in vol:
            return await self._claim(vol["persistentVolumeClaim"]["claimName"])
        path.mkdir(parents=True, exist_ok=True)
        if "emptyDir" in vol:
            path.chmod(0o777)
            return path
        mode = 0o644
        if "secret" in vol:
            src = vol["secret"]
            mode = int(src.get("defaultMode", 0o644))
            await self._write_items(
                path, await self._data("secrets", src.get("secretName", ""), src), src, mode
            )
        elif "configMap" in vol:
            src = vol["configMap"]
            mode = int(src.get("defaultMode", 0o644))
            await self._write_items(path, await self._data("configmaps", src["name"], src), src, mode)
        elif "downwardAPI" in vol:
            mode = int(vol["downwardAPI"].get("defaultMode", 0o644))
            await self._downward(path, vol["downwardAPI"].get("items") or [], mode)
        elif "projected" in vol:
            mode = int(vol["projected"].get("defaultMode", 0o644))
            for source in vol["projected"].get("sources") or []:
                await self._projected(path, source, mode)
        else:
            raise VolumeError(f"volume {vol['name']}: unsupported type {sorted(set(vol) - {'name'})}")
        return path

    async def _claim(self, claim: str) -> Path:
        pvc = await self.kube.get(api_path("v1", "persistentvolumeclaims", self.namespace, claim))
        volume = ((pvc or {}).get("spec") or {}).get("volumeName")
        if not pvc or (pvc.get("status") or {}).get("phase") != "Bound" or not volume:
            raise VolumeError(f'persistentvolumeclaim "{claim}" is not bound')
        pv = await self.kube.get(api_path("v1", "persistentvolumes", name=volume))
        spec = (pv or {}).get("spec") or {}
        where = (spec.get("hostPath") or spec.get("local") or {}).get("path")
        if not where:
            raise VolumeError(f'persistentvolume "{volume}" has no hostPath or local path')
        Path(where).mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 (a local directory)
        return Path(where)

    async def _data(self, plural: str, name: str, src: dict[str, Any]) -> dict[str, bytes] | None:
        obj = await self.kube.get(api_path("v1", plural, self.namespace, name))
        if obj is None:
            if src.get("optional"):
                return None
            raise VolumeError(f'{plural[:-1]} "{name}" not found')
        out = (
            {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
            if plural == "secrets"
            else {k: str(v).encode() for k, v in (obj.get("data") or {}).items()}
        )
        out.update({k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()})
        return out

    async def _write_items(
        self, path: Path, data: dict[str, bytes] | None, src: dict[str, Any], mode: int
    ) -> None:
        if data is None:
            return
        items = src.get("items") or [{"key": k, "path": k} for k in data]
        for item in items:
            if item["key"] not in data:
                if src.get("optional"):
                    continue
                raise VolumeError(f"key {item['key']} not found")
            self._write(path / item["path"], data[item["key"]], int(item.get("mode", mode)))

    def _write(self, target: Path, content: bytes, mode: int) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_file() and target.read_bytes() == content:
            return  # unchanged (a refresh): no new file for watchers to see
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_bytes(content)
        tmp.chmod(mode)
        if os.geteuid() == 0:
            user = run_as(self.spec)
            os.chown(tmp, user[0] if user else 0, self.fs_group if self.fs_group is not None else -1)
            if self.fs_group is not None:
                tmp.chmod(mode | 0o040)
        os.replace(tmp, target)  # atomic, as the kubelet's symlink swap

    async def _downward(self, path: Path, items: list[dict[str, Any]], mode: int) -> None:
        for item in items:
            if "fieldRef" in item:
                value = self.field(item["fieldRef"]["fieldPath"])
            else:
                value = self.resource(item["resourceFieldRef"])
            self._write(path / item["path"], value.encode(), int(item.get("mode", mode)))

    async def _projected(self, path: Path, source: dict[str, Any], mode: int) -> None:
        if "serviceAccountToken" in source:
            token = source["serviceAccountToken"]
            await self._token(path / token["path"], token, mode)
        elif "secret" in source:
            src = source["secret"]
            await self._write_items(path, await self._data("secrets", src["name"], src), src, mode)
        elif "configMap" in source:
            src = source["configMap"]
            await self._write_items(path, await self._data("configmaps", src["name"], src), src, mode)
        elif "downwardAPI" in source:
            await self._downward(path, source["downwardAPI"].get("items") or [], mode)

    async def _token(self, target: Path, token: dict[str, Any], mode: int) -> None:
        ttl = int(token.get("expirationSeconds", 3600))
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "audiences": [token["audience"]] if token.get("audience") else [],
                "expirationSeconds": ttl,
                "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": self.name, "uid": self.uid},
            },
        }
        account = self.spec.get("serviceAccountName") or "default"
        path = api_path("v1", "serviceaccounts", self.namespace, account, "token")
        answer = await self.kube.create(path, body)
        self._write(target, str(answer["status"]["token"]).encode(), mode)
        self._tokens[target] = time.monotonic() + 0.8 * ttl

    async def refresh(self, now: float) -> None:
        """Every ``refresh_every_s``: rewrite what changed in the Secret, ConfigMap and downward-API
        files (the kubelet's periodic sync; tokens renew on their own schedule). A failed read
        keeps the files as they are, as the kubelet does."""
        if now - self._refreshed_at < self.refresh_every_s:
            return
        self._refreshed_at = now
        for vol in self.spec.get("volumes") or []:
            path = self.volumes.get(vol["name"])
            if path is None:
                continue
            try:
                if "secret" in vol or "configMap" in vol or "downwardAPI" in vol:
                    await self._volume(vol)
                elif "projected" in vol:
                    mode = int(vol["projected"].get("defaultMode", 0o644))
                    for source in vol["projected"].get("sources") or []:
                        if "serviceAccountToken" not in source:
                            await self._projected(path, source, mode)
            except (VolumeError, KubeError):
                continue

    async def renew_tokens(self, now: float) -> None:
        due = [t for t, at in self._tokens.items() if now >= at]
        if not due:
            return
        for vol in self.spec.get("volumes") or []:
            for source in (vol.get("projected") or {}).get("sources") or []:
                token = source.get("serviceAccountToken")
                target = self.volumes.get(vol["name"], Path()) / (token or {}).get("path", "")
                if token and target in due:
                    await self._token(target, token, int(vol["projected"].get("defaultMode", 0o644)))

    # -- 2. env ------------------------------------------------------------------------------------

    def field(self, path: str) -> str:
        meta = self.pod["metadata"]
        m = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
        if m:
            return str((meta.get(m.group(1)) or {}).get(m.group(2), ""))
        values = {
            "metadata.name": self.name,
            "metadata.namespace": self.namespace,
            "metadata.uid": self.uid,
            "spec.nodeName": self.spec.get("nodeName", ""),
            "spec.serviceAccountName": self.spec.get("serviceAccountName", ""),
            "status.podIP": self.pod_ip,
            "status.podIPs": self.pod_ip,
            "status.hostIP": "127.0.0.1",
            "status.hostIPs": "127.0.0.1",
        }
        if path not in values:
            raise VolumeError(f"unsupported fieldPath {path}")
        return str(values[path])

    def resource(self, ref: dict[str, Any]) -> str:
        container = next(
            (c for c in self.spec["containers"] if c["name"] == ref.get("containerName")),
            self.spec["containers"][0],
        )
        kind, _, res = str(ref["resource"]).partition(".")
        value = ((container.get("resources") or {}).get(kind) or {}).get(res)
        if value is None:  # no limit: the node's allocatable, as the kubelet reports
            value = str(os.cpu_count() or 1) if res == "cpu" else "0"
        return str(value)

    async def env(self, container: dict[str, Any]) -> dict[str, str]:
        python_dir = str(Path(sys.executable).parent)
        env = {
            "PATH": f"{python_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "HOSTNAME": self.name,
            "KUBERNETES_SERVICE_HOST": "127.0.0.1",
            "KUBERNETES_SERVICE_PORT": str(self.api_port),
            "KUBERNETES_SERVICE_PORT_HTTPS": str(self.api_port),
        }
        for source in container.get("envFrom") or []:
            ref = source.get("secretRef") or source.get("configMapRef") or {}
            plural = "secrets" if "secretRef" in source else "configmaps"
            for k, v in (await self._data(plural, ref["name"], ref) or {}).items():
                env[source.get("prefix", "") + k] = v.decode()
        for item in container.get("env") or []:
            ref = item.get("valueFrom")
            if ref is None:
                env[item["name"]] = expand(str(item.get("value", "")), env)
            elif "fieldRef" in ref:
                env[item["name"]] = self.field(ref["fieldRef"]["fieldPath"])
            elif "resourceFieldRef" in ref:
                env[item["name"]] = self.resource(
                    {"containerName": container["name"], **ref["resourceFieldRef"]}
                )
            else:
                key = ref.get("secretKeyRef") or ref.get("configMapKeyRef") or {}
                plural = "secrets" if "secretKeyRef" in ref else "configmaps"
                data = await self._data(plural, key["name"], key)
                if data is not None and key["key"] in data:
                    env[item["name"]] = data[key["key"]].decode()
                elif not key.get("optional"):
                    raise VolumeError(f"couldn't find key {key['key']} in {plural[:-1]} {key['name']}")
        return env
