# Oceanus container image: a slim CPU image by default.
#   docker build -t oceanus .
#   docker build --build-arg EXTRAS=s3,gcs -t oceanus .          # object storage repositories
#   docker build --build-arg BASE_IMAGE=nvidia/cuda:12.4.1-runtime-ubuntu22.04 ...   # GPU base
# The base must provide python3 (>= 3.10) with venv. The example repository is not baked in:
# mount or point --model-repository at yours.
ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS build
# pip extras to install, comma-separated (s3, gcs, azure, cloud, pytorch, openvino, opentelemetry)
ARG EXTRAS=""
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md triton_python_backend_utils.py ./
COPY oceanus ./oceanus
# Behind a TLS-intercepting proxy, pass its CA bundle: --secret id=ca-bundle,src=<file>
RUN --mount=type=secret,id=ca-bundle \
    if [ -s /run/secrets/ca-bundle ]; then export PIP_CERT=/run/secrets/ca-bundle; fi \
    && python3 -m venv /opt/oceanus \
    && /opt/oceanus/bin/pip install ".${EXTRAS:+[$EXTRAS]}"

FROM ${BASE_IMAGE}
LABEL org.opencontainers.image.title="oceanus" \
      org.opencontainers.image.description="An inference server that speaks NVIDIA Triton's protocols"
RUN groupadd --gid 1000 oceanus && useradd --uid 1000 --gid 1000 --no-create-home oceanus
COPY --from=build /opt/oceanus /opt/oceanus
ENV PATH=/opt/oceanus/bin:$PATH PYTHONUNBUFFERED=1 OCEANUS_CACHE_DIR=/tmp/oceanus-cache
USER 1000:1000
EXPOSE 8000 8001 8002
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s \
    CMD ["python3", "-c", "import urllib.request as u; u.urlopen('http://127.0.0.1:8000/v2/health/live', timeout=2)"]
ENTRYPOINT []
CMD ["tritonserver", "--model-repository=/models"]
