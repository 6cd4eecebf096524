"""The snapshot CronJob, exercised (issue 22 item 8): the real kopf operator creates NAME-snapshot
through the API-server double (which serves batch/v1 CronJobs and Jobs and validates them against the
Kubernetes schema), a Job is made from its jobTemplate as the CronJob controller would, and the Job's
container command runs as a process against the embedded broker (PySpark local), publishing a
snapshot equal to the changelog's replay.

Emulated, not real: the API server, the CronJob controller (the test makes the Job) and the kubelet
(the test runs the container's command with this interpreter); the workers (WorkerFleet). Real: kopf,
the operator, the rendered manifests, ``multilane snapshot`` on Spark, Kafka.
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
from pathlib import Path
from typing import Any

import pytest

from multilane.operator.k8s.kube import KubeClient, api_path
from multilane.operator.rollout.workers import WorkerControlClient
from multilane.snapshots.reader import SnapshotReader
from multilane.testing.broker import EmbeddedBroker
from tests.operator.conftest import CR_COLLECTION, NS, consumer_body
from tests.operator.doubles import StatefulSetControllerDouble, WorkerFleet, wait_for
from tests.pipeline.test_snapshot_spark import _commit, generate, oracle, produce

pytestmark = [pytest.mark.asyncio(loop_scope="function"), pytest.mark.spark, pytest.mark.broker]

CRONJOBS = api_path("batch/v1", "cronjobs", NS)
# The Job's command starts a JVM and runs Spark local[1]: a minute on an idle 2-core machine, several
# when the suite's other workers share the cores; the test's own limit leaves room for the teardown.
JOB_LIMIT_S = 600
JOBS = api_path("batch/v1", "jobs", NS)


@pytest.mark.timeout(JOB_LIMIT_S + 180)
async def test_operator_made_cronjob_runs_its_job_command(
    kube: KubeClient,
    broker: EmbeddedBroker,
    topic_name: str,
    fleet: WorkerFleet,
    sts_controller: StatefulSetControllerDouble,
    operator_factory: Any,
    tmp_path: Path,
) -> None:
    pytest.importorskip("pyspark")
    group = f"{topic_name}-group"
    broker.create_topic(topic_name, 1)
    changelog = f"{group}.{topic_name}.changelog"
    broker.create_topic(changelog, 1)
    records = generate(random.Random(22), 150, keys=25)
    produce(broker, changelog, 0, records)
    _commit(broker, group, topic_name, 0, 10**6)  # every change counts as committed

    runner = operator_factory(control_factory=lambda token: WorkerControlClient(token))
    await runner.start()
    body = consumer_body("snap", broker.bootstrap, topic_name)
    body["spec"]["kafka"]["consumerGroup"] = group
    uri = str(tmp_path / "snapshots")
    body["spec"]["state"] = {
        "enabled": True,
        "snapshot": {"uri": uri, "schedule": "*/30 * * * *", "retention": 2},
    }
    cr = await kube.create(CR_COLLECTION, body)

    # 1. The operator's CronJob, as stored by the API double (schema-validated, name <= 52).
    cronjob = await wait_for(lambda: kube.get(f"{CRONJOBS}/snap-snapshot"), timeout=60, what="CronJob")
    assert cronjob["metadata"]["ownerReferences"][0]["uid"] == cr["metadata"]["uid"]
    assert cronjob["spec"]["schedule"] == "*/30 * * * *" and cronjob["spec"]["suspend"] is False

    # 2. The CronJob controller's part: a Job from the jobTemplate, owned by the CronJob.
    template = cronjob["spec"]["jobTemplate"]
    owner = {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "name": "snap-snapshot",
        "uid": cronjob["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    meta = {"name": "snap-snapshot-29000000", "labels": template.get("metadata", {}).get("labels", {})}
    job = await kube.create(
        JOBS, {"metadata": {**meta, "ownerReferences": [owner]}, "spec": template["spec"]}
    )
    assert job["kind"] == "Job"

    # 3. The kubelet's part: the container's command as a process (this interpreter, Spark local[1]).
    container = job["spec"]["template"]["spec"]["containers"][0]
    command = [*container["command"], *(container.get("args") or [])]
    assert command[:2] == ["multilane", "snapshot"]
    env = {e["name"]: e["value"] for e in container.get("env") or [] if "value" in e}
    master = command.index("--master") + 1 if "--master" in command else None
    if master is not None:
        command[master] = "local[1]"
    argv = [sys.executable, "-m", "multilane", *command[1:]]
    # An asyncio subprocess: the API double and the operator keep running meanwhile, and a test that
    # times out here kills the JVM's driver at once (a thread running subprocess.run would hold the
    # event loop's teardown, which joins the default executor's threads, for up to its own timeout).
    proc = await asyncio.create_subprocess_exec(
        *argv, env={**os.environ, **env}, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        _, err = await asyncio.wait_for(proc.communicate(), JOB_LIMIT_S)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, err.decode(errors="replace")[-3000:]

    # 4. Its snapshot holds exactly the state the changelog replays to.
    part = SnapshotReader(uri).latest_covering(topic_name, 0, committed_offset=10**6)
    assert part is not None and dict(part.iter_items()) == oracle(records)
    await kube.patch(f"{JOBS}/snap-snapshot-29000000/status", {"status": {"succeeded": 1}})
    assert ((await kube.get(f"{JOBS}/snap-snapshot-29000000")) or {})["status"]["succeeded"] == 1
