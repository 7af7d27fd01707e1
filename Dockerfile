# Spotlight's one image for the scheduler, the workers and a driver: `dask scheduler`,
# `dask worker` (the manifests of `spotlight deploy kubernetes` run these) and `spotlight`.
#
#   CPU:   docker build -t spotlight:cpu .
#   CUDA:  docker build --build-arg TORCH_INDEX_URL=https://pypi.org/simple -t spotlight:cuda .
#
# The CUDA variant is PyPI's Linux torch wheel, which brings its CUDA libraries; the host's
# NVIDIA container toolkit (or Kubernetes' device plugin) provides the driver.
FROM python:3.11-slim

ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH

# tini: PID 1 that passes SIGTERM on to the worker (its preemption watch hands requests back)
# and reaps children; libGL and glib: OpenCV, under the OCR reward.
RUN apt-get update \
    && apt-get install -y --no-install-recommends tini libgl1 libglib2.0-0 \
    && rm -rf /var/lib/apt/lists/* \
    && python -m venv "$VIRTUAL_ENV"

# torch first, pinned as in pyproject.toml, from the variant's index (CPU: no CUDA wheels).
RUN pip install torch==2.13.0 --index-url "$TORCH_INDEX_URL"

WORKDIR /opt/spotlight
COPY pyproject.toml LICENSE ./
COPY spotlight ./spotlight
COPY pipelines ./pipelines
COPY storage ./storage
COPY configs ./configs
# A regular install (a spill folder of Dask's cannot shadow its packages); the shipped configs
# go with it, under the environment's share/spotlight-dit/ (checked from /, where the sources
# are not importable).
RUN pip install . && cd / \
    && python -c "import spotlight, storage, pipelines.cluster.cloud_class, pipelines.run.tasks" \
    && python -c "from pipelines.front.cli import config_path; \
from spotlight.config import load_config; import argparse; \
load_config(config_path(argparse.Namespace(config=None)))"

RUN useradd --create-home --uid 1000 spotlight
USER spotlight
WORKDIR /home/spotlight

EXPOSE 8786 8787 8788
ENTRYPOINT ["tini", "--"]
CMD ["spotlight", "--help"]
