"""From files to the graph IR: ONNX import and shape inference, ORT's graph optimisations, and the
training graphs roam builds from an inference export."""
