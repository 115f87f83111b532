#!/usr/bin/env bash
# CI: build the Dockerfile and start the image once, where a container builder works here
# (a Docker engine that answers `docker info`, else podman, else buildah); otherwise say why
# the build was skipped and exit 0. The Dockerfile's content is tested either way
# (tests/test_proxy_ops.py).
set -euo pipefail
cd "$(dirname "$0")/.."
tag=selftaught-ci:latest
if command -v docker >/dev/null && why=$(docker info 2>&1); then
    tool=docker
elif command -v podman >/dev/null && why=$(podman info 2>&1); then
    tool=podman
elif command -v buildah >/dev/null && why=$(buildah info 2>&1); then
    tool=buildah
else
    reason=$(printf '%s' "${why:-}" | grep -m1 -iE 'cannot|error|denied' || true)
    echo "container build skipped: no usable container builder here (docker info: ${reason:-no docker}; no podman or buildah)"
    exit 0
fi
echo "container build: $tool build -t $tag ."
if [ "$tool" = buildah ]; then
    buildah bud -t "$tag" .
    echo "container build: built with buildah (not started: buildah runs no containers)"
    exit 0
fi
"$tool" build -t "$tag" .
# the entry point refuses to start without a client key, and starts with one
if "$tool" run --rm "$tag" --upstream http://127.0.0.1:9/v1#m >/dev/null 2>&1; then
    echo "container build: the image started without a client key" >&2
    exit 1
fi
"$tool" run --rm --entrypoint selftaught "$tag" proxy --help >/dev/null
echo "container build: $tag built; it refuses to start without a client key, and its selftaught runs"
