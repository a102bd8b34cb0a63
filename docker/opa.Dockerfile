# OPA for capgate's sidecars, built locally: nothing but the static OPA binary that
# scripts/install-tools.sh builds (CGO disabled), so the image has no shell, no libc
# and no package manager to attack. It stands in for the official static image of the
# pinned version (openpolicyagent/opa:<version>-static), which has the same layout:
# the binary at /opa as the entrypoint, run as a non-root user.
#
#   docker build -f docker/opa.Dockerfile -t openpolicyagent/opa:1.22.4-static .
#
# (scripts/docker-images.sh does this with the pinned version; .dockerignore keeps the
# build context to the two paths the images need.)
FROM scratch
# scripts/docker-images.sh removes the untagged images of earlier builds by this label.
LABEL dev.capgate.image=opa
COPY .tools/bin/opa /opa
# The official images' user. OPA only reads its configuration (world-readable, no
# secret) and fetches its bundle over HTTP; it writes nothing to disk.
USER 1000:1000
ENTRYPOINT ["/opa"]
CMD ["run", "--server", "--addr", "127.0.0.1:8181"]
