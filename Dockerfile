# selftaught's proxy in a container (docs/operations.md, "A container"):
#
#   docker build -t selftaught .                       # --build-arg EXTRAS=postgres,local: more
#   docker run -d --name selftaught -p 127.0.0.1:8080:8080 \
#       -e SELFTAUGHT_PROXY_KEY=... -v selftaught:/var/lib/selftaught \
#       selftaught --upstream "http://vllm.internal:8000/v1#MODEL" --project demo
#
# The image installs the wheel built from this tree (never the tree itself) and runs as an
# unprivileged user. Inside a container loopback reaches nobody, so the proxy binds 0.0.0.0
# with --allow-remote, and the entry point refuses to start without a client key.

# ---- stage 1: the wheel -----------------------------------------------------------------
FROM python:3.12-slim AS wheel
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY src ./src
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /dist .

# ---- stage 2: the proxy -----------------------------------------------------------------
FROM python:3.12-slim
# the extras installed beside the core: postgres (a shared log); add local for `--upstream local`
ARG EXTRAS=postgres
RUN useradd --system --uid 10001 --user-group --home-dir /var/lib/selftaught --create-home \
        --shell /usr/sbin/nologin selftaught
COPY --from=wheel /dist/ /tmp/dist/
RUN wheel="$(ls /tmp/dist/selftaught-*.whl)" \
    && pip install --no-cache-dir "${wheel}[${EXTRAS}]" \
    && rm -rf /tmp/dist
COPY scripts/container-entrypoint.sh /usr/local/bin/selftaught-proxy
ENV SELFTAUGHT_HOME=/var/lib/selftaught \
    SELFTAUGHT_CACHE=/var/lib/selftaught/cache \
    SELFTAUGHT_PORT=8080 \
    PYTHONUNBUFFERED=1
USER selftaught
WORKDIR /var/lib/selftaught
VOLUME /var/lib/selftaught
EXPOSE 8080
# a stop drains the answers in flight (--drain-timeout, 60 s): give `docker stop` --time 90
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s \
    CMD python -c "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/ready' % os.environ['SELFTAUGHT_PORT'], timeout=4)"
ENTRYPOINT ["selftaught-proxy"]
