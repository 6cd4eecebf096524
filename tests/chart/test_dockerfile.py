"""The Dockerfile (parsed, not built: no Docker engine here) and .dockerignore."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from .conftest import DOCKERFILE, REPO, Manifest

COMPILERS = re.compile(
    r"\b(gcc|g\+\+|cc|clang|make|build-essential|cmake|rustc|cargo|libc6-dev|python3-dev|[a-z0-9.+-]+-dev)\b"
)


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]


def parse_dockerfile(text: str) -> tuple[dict[str, str], list[Stage]]:
    """Global ARGs (with defaults) and the stages, with line continuations joined."""
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    assert not pending, "dangling line continuation"
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical:
        keyword, _, args = line.partition(" ")
        keyword = keyword.upper()
        args = args.strip()
        if keyword == "FROM":
            parts = args.split()
            parts = [p for p in parts if not p.startswith("--platform")]
            name = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else None
            stages.append(Stage(base=parts[0], name=name))
        elif not stages:
            assert keyword == "ARG", f"only ARG may precede the first FROM, got {keyword}"
            key, _, default = args.partition("=")
            global_args[key] = default
        else:
            stages[-1].instructions.append((keyword, args))
    return global_args, stages


@pytest.fixture(scope="module")
def dockerfile() -> tuple[dict[str, str], list[Stage]]:
    return parse_dockerfile(DOCKERFILE.read_text(encoding="utf-8"))


def _resolve(base: str, global_args: dict[str, str]) -> str:
    return re.sub(r"\$\{?(\w+)\}?", lambda m: global_args.get(m.group(1), m.group(0)), base)


def test_stages_on_python_311_slim(dockerfile: tuple[dict[str, str], list[Stage]]) -> None:
    global_args, stages = dockerfile
    # runtime last: the default target (`docker build .`) is the operator/worker image.
    assert [s.name for s in stages] == ["builder", "pipeline-builder", "pipeline", "runtime"]
    for stage in stages:
        base = _resolve(stage.base, global_args)
        assert base.startswith("python:3.11-slim") or base in {s.name for s in stages}, base


def test_pipeline_target_has_a_jre_and_the_pipeline_extra(
    dockerfile: tuple[dict[str, str], list[Stage]],
) -> None:
    """Issue 22 item 8: the snapshot CronJob runs `multilane snapshot` (PySpark) in the workload image;
    `docker build --target pipeline` gives a base with a headless JRE and multilane[pipeline]. Parsed,
    not built (no Docker engine here)."""
    stages = {s.name: s for s in dockerfile[1]}
    builder_runs = " ".join(stages["pipeline-builder"].all("RUN"))
    assert stages["pipeline-builder"].base == "builder"
    assert re.search(r"\[state,snapshots,operator,pipeline\]", builder_runs)
    assert "-c constraints.txt" in builder_runs and "--only-binary=:all:" in builder_runs
    assert "multilane snapshot --help" in builder_runs  # the CronJob's command starts in it
    pipeline = stages["pipeline"]
    runs = " ".join(pipeline.all("RUN"))
    assert "openjdk-17-jre-headless" in runs and "--no-install-recommends" in runs
    assert "rm -rf /var/lib/apt/lists" in runs and not COMPILERS.search(runs.replace("jre-headless", ""))
    assert pipeline.all("COPY") == ["--from=pipeline-builder /opt/venv-pipeline /opt/venv"]
    env = " ".join(pipeline.all("ENV"))
    assert "JAVA_HOME=" in env and "HOME=/tmp" in env and "PATH=/opt/venv/bin:$PATH" in env
    assert pipeline.all("USER") == dockerfile[1][-1].all("USER")  # the chart's uid, as the runtime


def test_base_image_is_pinned_by_digest(dockerfile: tuple[dict[str, str], list[Stage]]) -> None:
    """Every stage's base names one image (``name:tag@sha256:<64 hex>``), not a moving tag, or an
    earlier stage of this file. The form only: the digest is not checked against a registry here."""
    global_args, stages = dockerfile
    names = {s.name for s in stages if s.name}
    for stage in stages:
        base = _resolve(stage.base, global_args)
        if base in names:
            continue
        assert re.fullmatch(r"[a-z0-9./-]+:[\w.-]+@sha256:[0-9a-f]{64}", base), base


def test_builder_installs_the_worker_and_operator_extras_at_tested_versions(
    dockerfile: tuple[dict[str, str], list[Stage]],
) -> None:
    builder = dockerfile[1][0]
    runs = " ".join(builder.all("RUN"))
    assert "pip wheel" in runs
    assert re.search(r"\[state,snapshots,operator\]", runs)
    assert "-c constraints.txt" in runs and "constraints.txt" in " ".join(builder.all("COPY"))
    assert "pipeline" not in runs and "pyspark" not in runs.lower()
    assert "--only-binary=:all:" in runs


def test_final_stage_is_non_root_without_build_tools(dockerfile: tuple[dict[str, str], list[Stage]]) -> None:
    runtime = dockerfile[1][-1]
    users = runtime.all("USER")
    assert users, "the final stage must set USER"
    user = users[-1].split(":")[0]
    assert user not in {"root", "0"}
    assert user.isdigit() and int(user) >= 10000, "a numeric uid lets runAsNonRoot verify it"
    # nothing is installed or compiled in the final stage: it only copies the venv
    runs = " ".join(runtime.all("RUN"))
    assert "apt-get install" not in runs and "pip install" not in runs and "apk add" not in runs
    assert not COMPILERS.search(runs), runs
    copies = runtime.all("COPY")
    assert copies == ["--from=builder /opt/venv /opt/venv"]
    assert json.loads(runtime.all("ENTRYPOINT")[-1]) == ["multilane"]


def test_final_stage_works_with_a_read_only_root_filesystem(
    dockerfile: tuple[dict[str, str], list[Stage]],
) -> None:
    runtime = dockerfile[1][-1]
    env = " ".join(runtime.all("ENV"))
    for setting in ("PYTHONDONTWRITEBYTECODE=1", "HOME=/tmp", "TMPDIR=/tmp", "PATH=/opt/venv/bin:$PATH"):
        assert setting in env
    assert runtime.all("WORKDIR") == ["/tmp"]


def test_image_uid_matches_the_chart(
    dockerfile: tuple[dict[str, str], list[Stage]], render: Callable[..., list[Manifest]]
) -> None:
    runtime = dockerfile[1][-1]
    uid = int(runtime.all("USER")[-1].split(":")[0])
    docs = render()
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == uid


def test_dockerignore_is_an_allow_list() -> None:
    lines = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "*"
    allowed = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    assert allowed == {"pyproject.toml", "README.md", "constraints.txt", "multilane"}
    # everything the Dockerfile copies is allowed
    copied = re.findall(r"^COPY (?!--from)(.+) \S+$", DOCKERFILE.read_text(encoding="utf-8"), re.M)
    for sources in copied:
        for src in sources.split():
            assert src.rstrip("/") in allowed, src
