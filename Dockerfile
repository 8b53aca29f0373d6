# roam with ONNX Runtime, entrypoint `roam`; models are read from the mounted working directory:
#   docker build -t roam .
#   docker run --rm -v "$PWD:/work" roam optimize model.onnx -o plan.json --plot .
#
# GPU variant: a base image with CUDA, cuDNN and Python 3.10+ (with its venv module), and ONNX
# Runtime's CUDA build in place of the CPU one (see docs/cli.md, "Docker"):
#   docker build -t roam-gpu --build-arg BASE=<cuda image with python> --build-arg ORT_PACKAGE=onnxruntime-gpu .
#   docker run --rm --gpus all -v "$PWD:/work" roam-gpu optimize model.onnx -o plan.json
#
# Two stages on the same base, so that the venv's Python is at the same path in both: the first
# compiles roam into a venv at /opt/venv, the second takes the venv without the compiler.
# CI builds the image and runs roam in it on the sample: scripts/image_check.sh.
ARG BASE=python:3.13-slim

FROM ${BASE} AS build
ARG ORT_PACKAGE=onnxruntime
# a C compiler: roam's plan-consuming allocator for ONNX Runtime and its layout search are C extensions;
# and Python's headers where the base's Python has none (a distribution's python3 keeps them in python3-dev)
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev $(python3 -c 'import os, sysconfig; \
        print("" if os.path.exists(sysconfig.get_path("include") + "/Python.h") else "python3-dev")') \
    && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
COPY . /src
# onnxruntime-gpu ships the same `onnxruntime` module as the CPU build: one goes before the other
# comes in. The extensions are optional in setup.py (an install goes on without them): here their
# absence fails the build.
RUN pip install --no-cache-dir "/src[plot]" \
    && if [ "$ORT_PACKAGE" != onnxruntime ]; then \
        pip uninstall -y onnxruntime && pip install --no-cache-dir "$ORT_PACKAGE"; fi \
    && python -c 'import roam_cli.runtime._planalloc, roam_cli.layout._search, roam_cli.order._ideals'

FROM ${BASE}
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /work
ENTRYPOINT ["roam"]
CMD ["--help"]
