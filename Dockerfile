# agent-reach: one image for every process (reach router, reach worker NAME, reach beat).
#   docker build -t agent-reach .
#   docker run --rm -e REACH_BROKER_URL=... -v "$PWD/examples/catalog:/etc/reach/catalog:ro" agent-reach router

FROM python:3.12-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY producers ./producers
COPY connectors ./connectors
COPY workers ./workers
RUN pip wheel --wheel-dir /wheels .

FROM python:3.12-slim
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    REACH_CATALOG=/etc/reach/catalog \
    REACH_METRICS_PORT=9100
RUN groupadd --system --gid 10001 reach \
 && useradd --system --uid 10001 --gid reach --home-dir /home/reach --create-home --shell /usr/sbin/nologin reach
COPY --from=build /wheels /tmp/wheels
RUN pip install /tmp/wheels/*.whl && rm -rf /tmp/wheels
# The demo catalog and ticket system, so `docker compose up` and a first `helm install` work as is.
WORKDIR /opt/reach
COPY examples ./examples
COPY examples/catalog /etc/reach/catalog
USER 10001:10001
EXPOSE 9100
# Exec form: reach is PID 1 and gets SIGTERM itself, so Celery shuts down warm (finishes the
# actions in hand, returns unstarted messages to the queue).
ENTRYPOINT ["reach"]
CMD ["--help"]
