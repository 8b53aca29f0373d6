# roam with ONNX Runtime, entrypoint `roam`; models are read from the mounted working directory:
#   docker build -t roam .
#   docker run --rm -v "$PWD:/work" roam optimize model.onnx -o plan.json --plot .
#
# GPU variant: a base image with CUDA, cuDNN and Python 3.10+ (with pip), and ONNX Runtime's CUDA
# build in place of the CPU one (see docs/cli.md, "Docker"):
#   docker build -t roam-gpu --build-arg BASE=<cuda image with python> --build-arg ORT_PACKAGE=onnxruntime-gpu .
#   docker run --rm --gpus all -v "$PWD:/work" roam-gpu optimize model.onnx -o plan.json
#
# The install steps live in scripts/docker_steps.sh, which CI also runs in a clean virtualenv.
ARG BASE=python:3.13-slim
FROM ${BASE}
ARG ORT_PACKAGE=onnxruntime
# a C compiler: roam's plan-consuming allocator for ONNX Runtime is a small C extension
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev && rm -rf /var/lib/apt/lists/*
COPY . /opt/roam
RUN ORT_PACKAGE=${ORT_PACKAGE} sh /opt/roam/scripts/docker_steps.sh /opt/roam
WORKDIR /work
ENTRYPOINT ["roam"]
CMD ["--help"]
