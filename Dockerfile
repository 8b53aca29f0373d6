# roam with ONNX Runtime training (CPU). Models are read from the mounted working directory:
#   docker build -t roam . && docker run --rm -v "$PWD:/work" roam optimize model.onnx -o plan.json
# GPU variant: build FROM an nvidia/cuda runtime image and install `onnxruntime-training`
# (the CUDA build) instead of `onnxruntime-training-cpu`.
FROM python:3.11-slim
COPY . /opt/roam
RUN python -m pip install --no-cache-dir /opt/roam
WORKDIR /work
ENTRYPOINT ["roam"]
CMD ["--help"]
