# syntax=docker/dockerfile:1
# A Ray image carrying the servegraph runtime, so the RayServices the operator
# renders can import servegraph.runtime:build (and servegraph.examples).
# Build from the repository root:
#   docker build -f docker/ray.Dockerfile -t ghcr.io/servegraph/servegraph-ray:0.1.0 .
#   docker build -f docker/ray.Dockerfile --build-arg RAY_IMAGE=rayproject/ray:2.60.0-py311-gpu \
#     -t ghcr.io/servegraph/servegraph-ray:0.1.0-gpu .
# Point ServeGraphs at it with spec.rayService.image (see config/samples).
#
# Air-gapped builds (the test bed builds it this way, with buildah): give pip a
# directory of wheels instead of an index,
#   --build-context wheels=DIR --build-arg PIP_NO_INDEX=1
# and local base images through PYTHON_IMAGE and RAY_IMAGE.

ARG PYTHON_IMAGE=python:3.11.14-slim-trixie
# Keep in step with the ray version in pyproject.toml and the renderer's default.
ARG RAY_IMAGE=rayproject/ray:2.60.0-py311

# ---- wheels: empty unless the build is given a `wheels` context (see above)
FROM scratch AS wheels

# ---- build: the servegraph wheel (pure Python)
FROM ${PYTHON_IMAGE} AS build
ARG PIP_NO_INDEX
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY . .
RUN --mount=type=bind,from=wheels,target=/wheels \
    PIP_FIND_LINKS=/wheels pip wheel --no-deps --wheel-dir /dist .

# ---- final: Ray's own image, user `ray`, plus the wheel
FROM ${RAY_IMAGE}
LABEL org.opencontainers.image.title="servegraph-ray" \
      org.opencontainers.image.description="Ray with the servegraph runtime" \
      org.opencontainers.image.source="https://github.com/servegraph/servegraph" \
      org.opencontainers.image.licenses="Apache-2.0"
# --no-deps: the runtime needs nothing but Ray (tests/unit/test_runtime_imports.py),
# so Ray's own protobuf and pyyaml stay as Ray shipped them. The wheel is
# bind-mounted, not copied, so no layer keeps it. The import check fails the
# build if this Ray cannot load the runtime.
RUN --mount=type=bind,from=build,source=/dist,target=/tmp/dist \
    pip install --no-cache-dir --no-deps /tmp/dist/servegraph-*.whl \
    && python -c "import servegraph.examples; from servegraph.runtime import build"
