# syntax=docker/dockerfile:1
# The image the Helm chart (helm/core-jobs) runs: `core-jobs` as the entrypoint, non-root
# user 10001, the locked dependencies only. Build from the repository root:
#   docker build -t core-jobs:0.1.0 .
# Both stages use the same Python image, so the virtualenv's interpreter path
# (/usr/local/bin/python3.11) is the same where it is built and where it runs.
ARG PYTHON_IMAGE=python:3.11-slim
ARG UV_VERSION=0.13.9

FROM ghcr.io/astral-sh/uv:${UV_VERSION} AS uv

FROM ${PYTHON_IMAGE} AS builder
COPY --from=uv /uv /usr/local/bin/uv
# Compile bytecode now (the runtime filesystem is read-only); copy, not hard-link, out of the
# cache; never download a Python: use the image's.
ENV UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PYTHON_DOWNLOADS=never \
    UV_PROJECT_ENVIRONMENT=/app/.venv
WORKDIR /src
# Dependencies first, in their own layer: it is rebuilt only when the lockfile changes. The
# workspace members' pyprojects (core-jobs-harness, core-jobs-demo) are needed to read the lock;
# no distribution of the workspace is installed yet. --no-dev leaves out the dev group, and with it
# the demo (core-jobs-demo) and the embedded PostgreSQL (pgserver): the image has neither. --extra otel:
# the OpenTelemetry SDK and OTLP exporter, idle unless OTEL_* turns traces on (docs/deployment.md, "Traces").
COPY pyproject.toml uv.lock ./
COPY harness/pyproject.toml ./harness/
COPY demo/pyproject.toml ./demo/
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --frozen --no-dev --extra otel --no-install-workspace
# Then core-jobs and core-jobs-harness, installed as packages (not editable): /src is not copied onward.
COPY README.md ./
COPY maintenance ./maintenance
COPY alerts ./alerts
COPY harness ./harness
COPY migrations ./migrations
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --frozen --no-dev --extra otel --no-editable

FROM ${PYTHON_IMAGE}
# The official image ships its standard library without bytecode, and this one runs with
# PYTHONDONTWRITEBYTECODE=1 on a read-only filesystem: every process (each CronJob run, each
# check-config) would compile the ~220 standard-library modules it imports from source again,
# several times the cost of loading them (bench/cli.py). Compiled once here; the test suites'
# directories left out (some of their files are not valid Python on purpose), and site-packages (pip's, which core-jobs does not run).
RUN python -m compileall -q -j 0 -x '/(test|tests|idle_test|site-packages)/' "$(python -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')"
RUN groupadd --system --gid 10001 core-jobs \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin core-jobs
COPY --from=builder /app/.venv /app/.venv
ENV PATH=/app/.venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /app
USER 10001:10001
# /healthz and /metrics of `core-jobs serve`.
EXPOSE 9108
ENTRYPOINT ["core-jobs"]
CMD ["--help"]
