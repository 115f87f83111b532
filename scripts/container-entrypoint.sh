#!/bin/sh
# The container's entry point (Dockerfile): `selftaught proxy` on all of the container's
# interfaces, since a container reaches nobody on its loopback. Its port is then reachable
# from the container's network, so it refuses to start unless clients must send a key:
# SELFTAUGHT_PROXY_KEY (or --require-key KEY), or --client-keys FILE. docs/operations.md.
set -eu
keyed=${SELFTAUGHT_PROXY_KEY:+yes}
for arg in "$@"; do
    case "$arg" in
        --require-key|--require-key=*|--client-keys|--client-keys=*|--help) keyed=yes ;;
    esac
done
if [ -z "$keyed" ]; then
    echo "selftaught container: set SELFTAUGHT_PROXY_KEY (or pass --client-keys FILE):" \
        "the proxy listens on the container's network and must not answer without a key" >&2
    exit 2
fi
exec selftaught proxy --host 0.0.0.0 --port "${SELFTAUGHT_PORT:-8080}" --allow-remote "$@"
