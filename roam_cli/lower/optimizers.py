"""ONNX Runtime's optimizer ops (filled in below)."""

RULES = {}
