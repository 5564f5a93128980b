# A local stand-in for rayproject/ray:<version>-py311, which cannot be pulled here
# (no image registry): Ray from PyPI wheels on the Python base, run as user `ray`
# (uid 1000, group users) with `ray`, `python` and `pip` on PATH, plus the `bash`,
# `wget` and `grep` that KubeRay's container command and probes call (the base has them).
# The test bed builds docker/ray.Dockerfile on top of it, exactly as users build it
# on Ray's own image.
ARG PYTHON_IMAGE
FROM scratch AS wheels

FROM ${PYTHON_IMAGE}
ARG RAY_VERSION=2.60.0
ARG PIP_NO_INDEX
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/home/ray/venv/bin:$PATH
RUN useradd --uid 1000 --gid users --create-home --shell /bin/bash ray
USER 1000:100
WORKDIR /home/ray
RUN --mount=type=bind,from=wheels,target=/wheels \
    export PIP_FIND_LINKS=/wheels \
    && python -m venv /home/ray/venv \
    && pip install "ray[serve]==${RAY_VERSION}" \
    && ray --version
