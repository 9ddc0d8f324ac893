# The streamwal image: one image for the streaming node, the operator and coord
# (`streamwal node|operator|coord`); the Helm chart picks the command.
# Build: docker build -t streamwal:0.1.0 .
FROM python:3.11-slim AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
# Dependencies first, so code edits do not re-download them.
COPY pyproject.toml README.md* ./
COPY common/ common/
COPY proto/ proto/
COPY node/ node/
COPY coord/ coord/
COPY operator/ operator/
COPY client/ client/
COPY spark/ spark/
COPY bench/ bench/
COPY testing/ testing/
# A regular (not editable) install into a virtualenv that the runtime stage copies whole.
# The `kube` extra (kopf, the kubernetes client) is what `streamwal operator` needs.
RUN python -m venv /opt/streamwal \
 && /opt/streamwal/bin/pip install ".[kube]"

FROM python:3.11-slim
# Non-root, fixed ids (the chart's securityContext uses 10001), no shell login.
RUN groupadd --system --gid 10001 streamwal \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin streamwal
COPY --from=build /opt/streamwal /opt/streamwal
ENV PATH=/opt/streamwal/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
# The root filesystem is mounted read-only in the chart: data lives on /data, scratch on /tmp.
RUN mkdir -p /data && chown streamwal:streamwal /data
VOLUME ["/data"]
USER 10001:10001
EXPOSE 19530 19531 19500 9091
ENTRYPOINT ["streamwal"]
CMD ["--help"]
