# capgate's gateway: `capgate serve --http` (the MCP server over HTTP) in front of an
# OPA sidecar, installed offline from wheels built on the host.
#
# The base is a variable: by default the official Python image, for a machine that
# reaches a registry; scripts/docker-images.sh builds a local stand-in under the same
# name (a Debian root made with debootstrap, with python3 and python3-venv) where
# none is reachable. Any base with Python 3.11, `python3 -m venv` and glibc works: the
# wheels include compiled ones for CPython 3.11 on manylinux x86_64.
#
#   docker build -f docker/gateway.Dockerfile -t capgate-gateway:local .
#
# The build context is the repository, cut down by .dockerignore to
# .tools/images/wheels: capgate's wheel and those of its dependencies with the mcp
# extra, at the versions of the checkout's .venv (scripts/docker-images.sh fills it).
ARG PYTHON_IMAGE=python:3.11-slim
FROM ${PYTHON_IMAGE}
# scripts/docker-images.sh removes the untagged images of earlier builds by this label.
LABEL dev.capgate.image=gateway

COPY .tools/images/wheels /tmp/wheels
# --no-index: nothing is downloaded while building; what is installed is exactly the
# wheels the host built and tested.
RUN python3 -m venv /opt/capgate \
    && /opt/capgate/bin/pip install --no-cache-dir --no-index --find-links /tmp/wheels \
        "capgate[mcp]" \
    && rm -rf /tmp/wheels \
    && /opt/capgate/bin/capgate --version

ENV PATH=/opt/capgate/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/tmp \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# Not root. docker-compose.yml runs it as the owner of the deployment folder instead
# (`user:`), because capgate refuses a serve configuration or a token file that
# another user owns or may read.
USER 65534:65534
ENTRYPOINT ["capgate"]
CMD ["--help"]
