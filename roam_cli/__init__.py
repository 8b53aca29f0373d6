"""roam: memory planning for ONNX training graphs (operator order + static arena layout)."""

__version__ = "0.1.0"
