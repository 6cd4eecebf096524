# syntax=docker/dockerfile:1
# One image for the multilane operator and for workers (`multilane operator`, `multilane worker`, ...).
#
#   docker build -t multilane:dev .
#
# builder:  builds the multilane wheel and installs it with the `state`, `snapshots` and `operator`
#           extras into /opt/venv, from binary wheels only, at the versions CI tested (constraints.txt).
# pipeline-builder: the same wheel with the `pipeline` extra too (PySpark) into /opt/venv.
# pipeline: runtime plus a headless JRE and that venv: the base of a workload image whose
#           ParallelConsumer takes scheduled snapshots (the NAME-snapshot CronJob runs
#           `multilane snapshot` in the workload image):
#             docker build --target pipeline -t multilane-pipeline:dev .
# runtime:  (the default target) python slim + the builder's venv; no compilers, no pip cache; runs as
#           uid 10001 and works with a read-only root filesystem (HOME and TMPDIR are /tmp: mount an
#           emptyDir there).
# The base is pinned by digest (the tag moves; a digest names exactly one image). This digest was not
# pulled or verified here (no registry access where this file was written, and the image is never
# built by the test suite): before a release, re-pin it to the current one with
#   docker buildx imagetools inspect python:3.11-slim-bookworm --format '{{json .Manifest.Digest}}'
# tests/chart/test_dockerfile.py checks the form (name:tag@sha256:<64 hex>), not the registry.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm@sha256:a36c24f9cbdf4fd0f52d67f0823eeac19c2028c637cecc392d97f980d4fec56b

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore
RUN python -m venv /opt/venv
WORKDIR /src
COPY pyproject.toml README.md constraints.txt ./
COPY multilane ./multilane
# 1. The wheel of multilane itself (pure Python; setuptools runs in an isolated build env).
RUN python -m pip wheel --no-deps --wheel-dir /wheels .
# 2. Install it with its runtime extras, at the tested versions. Dependencies must come as binary
#    wheels: the build fails instead of silently needing a compiler.
RUN set -eux; \
    wheel="$(ls /wheels/multilane-*.whl)"; \
    /opt/venv/bin/pip install --only-binary=:all: -c constraints.txt "${wheel}[state,snapshots,operator]"; \
    /opt/venv/bin/pip check; \
    /opt/venv/bin/multilane --help >/dev/null; \
    /opt/venv/bin/python -m compileall -q /opt/venv/lib; \
    /opt/venv/bin/pip uninstall -y pip setuptools wheel || true

FROM builder AS pipeline-builder
# The pipeline extra (PySpark, pyarrow) on top, at the tested versions, from binary wheels only.
RUN set -eux; \
    python -m venv /opt/venv-pipeline; \
    wheel="$(ls /wheels/multilane-*.whl)"; \
    /opt/venv-pipeline/bin/pip install --only-binary=:all: -c constraints.txt \
        "${wheel}[state,snapshots,operator,pipeline]"; \
    /opt/venv-pipeline/bin/pip check; \
    /opt/venv-pipeline/bin/multilane snapshot --help >/dev/null; \
    /opt/venv-pipeline/bin/pip uninstall -y pip setuptools wheel || true

FROM ${PYTHON_IMAGE} AS pipeline
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="multilane-pipeline" \
      org.opencontainers.image.description="multilane with the snapshot pipeline (PySpark, headless JRE)" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
# A headless JRE for Spark (and procps: Spark's launch scripts call ps); no compilers.
RUN set -eux; \
    mkdir -p /usr/share/man/man1; \
    apt-get update; \
    apt-get install -y --no-install-recommends openjdk-17-jre-headless procps; \
    rm -rf /var/lib/apt/lists/*; \
    java -version
RUN groupadd --system --gid 10001 multilane \
 && useradd --system --uid 10001 --gid 10001 --home-dir /tmp --no-create-home \
        --shell /usr/sbin/nologin multilane
COPY --from=pipeline-builder /opt/venv-pipeline /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    JAVA_HOME=/usr/lib/jvm/java-17-openjdk-amd64 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    TMPDIR=/tmp
WORKDIR /tmp
USER 10001:10001
ENTRYPOINT ["multilane"]
CMD ["--help"]

FROM ${PYTHON_IMAGE} AS runtime
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="multilane" \
      org.opencontainers.image.description="Kafka consumers scaled past the partition count: operator and worker" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 multilane \
 && useradd --system --uid 10001 --gid 10001 --home-dir /tmp --no-create-home \
        --shell /usr/sbin/nologin multilane
COPY --from=builder /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    TMPDIR=/tmp
WORKDIR /tmp
USER 10001:10001
ENTRYPOINT ["multilane"]
CMD ["--help"]
