# syntax=docker/dockerfile:1
# One small image for both `ebbtide run` (the controller) and `ebbtide agent` (the node agent).
# Runs as a non-root user and needs no writable root filesystem: mount an emptyDir at /tmp.

FROM python:3.11-slim-bookworm AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY streams ./streams
COPY policies ./policies
COPY controller ./controller
RUN python -m venv /opt/ebbtide \
 && /opt/ebbtide/bin/pip install --no-compile . \
 && /opt/ebbtide/bin/python -m compileall -q /opt/ebbtide

FROM python:3.11-slim-bookworm
LABEL org.opencontainers.image.title="ebbtide" \
      org.opencontainers.image.description="Event-driven GPU autoscaling and preemption for Kubernetes" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/ebbtide /opt/ebbtide
COPY policies/library /etc/ebbtide/policies
COPY examples /usr/share/ebbtide/examples
ENV PATH=/opt/ebbtide/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    EBBTIDE_LOG_FORMAT=json
# 65532: the conventional "nonroot" uid; no shell login, no home to write to.
USER 65532:65532
EXPOSE 9108
ENTRYPOINT ["ebbtide"]
CMD ["run", "--help"]
