# syntax=docker/dockerfile:1
# The operator image: `servegraph run` on a slim Python 3.11, as a non-root user.
# Build from the repository root:
#   docker build -f docker/operator.Dockerfile -t ghcr.io/servegraph/servegraph-operator:0.1.0 .
# Only pyproject.toml, README.md and src/ reach the build (operator.Dockerfile.dockerignore).

#
# Air-gapped builds (the test bed builds it this way, with buildah): give pip a
# directory of wheels instead of an index,
#   --build-context wheels=DIR --build-arg PIP_NO_INDEX=1
# and a local base image through PYTHON_IMAGE.

# Pinned base; pin its digest too when you build releases
# (--build-arg PYTHON_IMAGE=python:3.11.14-slim-trixie@sha256:...).
ARG PYTHON_IMAGE=python:3.11.14-slim-trixie

# ---- wheels: empty unless the build is given a `wheels` context (see above)
FROM scratch AS wheels

# ---- build: the wheel, and a virtualenv holding it with its operator dependencies
FROM ${PYTHON_IMAGE} AS build
ARG PIP_NO_INDEX
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY . .
# Dependencies as wheels only (--only-binary): nothing is compiled, so neither
# stage needs a compiler. The venv has no pip of its own; the build stage's pip
# installs into it.
RUN --mount=type=bind,from=wheels,target=/wheels \
    export PIP_FIND_LINKS=/wheels \
    && pip wheel --no-deps --wheel-dir /dist . \
    && python -m venv --without-pip /opt/servegraph \
    && pip --python /opt/servegraph/bin/python install --only-binary=:all: \
        "$(find /dist -name 'servegraph-*.whl')[operator]"

# ---- final: the base image plus the virtualenv; no pip, no build tools
FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="servegraph-operator" \
      org.opencontainers.image.description="Kubernetes operator: protobuf serving graphs to KubeRay RayServices" \
      org.opencontainers.image.source="https://github.com/servegraph/servegraph" \
      org.opencontainers.image.licenses="Apache-2.0"
# The system pip/setuptools/wheel are build tools nobody runs here; the numeric
# user matches the Deployment's runAsUser.
RUN python -m pip uninstall --yes --quiet pip setuptools wheel \
    && groupadd --gid 65532 servegraph \
    && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin servegraph
COPY --from=build /opt/servegraph /opt/servegraph
# pip compiled the bytecode at install time; the root filesystem is read-only at run time.
ENV PATH=/opt/servegraph/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 65532:65532
# /healthz, /readyz, /metrics; the "graph published" event endpoint.
EXPOSE 8080 8081
ENTRYPOINT ["servegraph", "run"]
