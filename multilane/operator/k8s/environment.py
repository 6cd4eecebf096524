"""``EnvironmentCheck``: what a consumer needs outside its spec -- the credentials Secret (only with
``read_kafka_credentials``) and its topics (Kafka admin, short timeout; an unreachable broker is a
problem, not a crash). Does I/O (Kubernetes API: the Secret; Kafka admin).

Used by the reconcile handler (``fresh``: the Secret read again) and by every control pass (the
Secret from memory, read again after ``secret_ttl_s``).
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Mapping
from typing import Any

from multilane.operator.k8s.kube import KubeClient, api_path
from multilane.operator.k8s.memory import Slot
from multilane.operator.kafka_admin import KafkaAdminClient, KafkaUnavailableError
from multilane.operator.metrics import OperatorMetrics
from multilane.operator.spec.child_meta import ConsumerRef
from multilane.operator.spec.validation import ConsumerSpec, Problem, check_environment

__all__ = ["EnvironmentCheck"]


class EnvironmentCheck:
    def __init__(
        self,
        kube: KubeClient,
        admins: Callable[[Mapping[str, str]], KafkaAdminClient],
        metrics: OperatorMetrics,
        secrets: Slot[tuple[float, dict[str, Any] | None]],
        *,
        read_credentials: bool,
        secret_ttl_s: float,
    ) -> None:
        self._kube = kube
        self._admins = admins
        self._metrics = metrics
        # uid -> (monotonic time read, Secret or None): the credentials Secret between reconciles
        self._secrets = secrets
        self._read_credentials = read_credentials  # HandlerSettings.read_kafka_credentials (confused deputy)
        self._secret_ttl_s = secret_ttl_s

    async def check(
        self, ref: ConsumerRef, spec: ConsumerSpec, fresh: bool = True
    ) -> tuple[list[Problem], dict[str, str], dict[str, int] | None]:
        """Problems, the Kafka client config (with credentials, in memory only), partition counts."""
        secret_exists: bool | None = None
        config: dict[str, str] = {"bootstrap.servers": spec.bootstrap_servers, **spec.kafka_config}
        if spec.credentials_secret and self._read_credentials:
            secret = await self._credentials(ref, spec.credentials_secret, fresh)
            secret_exists = secret is not None
            for key, value in ((secret or {}).get("data") or {}).items():
                config[key] = base64.b64decode(value).decode()
        topic_partitions: dict[str, int] | None
        kafka_error = None
        if secret_exists is False:
            topic_partitions = {
                t: 0 for t in spec.topics
            }  # cannot ask without credentials; report the Secret
        else:
            try:
                topic_partitions = await self._admins(config).topic_partitions(spec.topics)
            except KafkaUnavailableError as exc:
                self._metrics.errors.labels("kafka").inc()
                topic_partitions, kafka_error = None, str(exc)
        problems = check_environment(
            spec, secret_exists=secret_exists, topic_partitions=topic_partitions, kafka_error=kafka_error
        )
        return problems, config, topic_partitions

    async def _credentials(self, ref: ConsumerRef, name: str, fresh: bool) -> dict[str, Any] | None:
        """The credentials Secret: read on reconcile (``fresh``) and after ``secret_ttl_s``."""
        cached = self._secrets.get(ref.uid)
        now = time.monotonic()
        if fresh or cached is None or now - cached[0] > self._secret_ttl_s:
            cached = self._secrets.set(
                ref.uid, (now, await self._kube.get(api_path("v1", "secrets", ref.namespace, name)))
            )
        return cached[1]
