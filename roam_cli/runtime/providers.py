"""ONNX Runtime's execution providers by `--provider` name, and whether this ONNX Runtime has them."""

import onnxruntime as ort

from roam_cli.errors import RoamError

PROVIDERS = {"cpu": ["CPUExecutionProvider"], "cuda": ["CUDAExecutionProvider", "CPUExecutionProvider"]}


def check_device(device: str) -> None:
    """Before any work: refuse a provider this ONNX Runtime build does not have."""
    if device == "cuda" and "CUDAExecutionProvider" not in ort.get_available_providers():
        raise RoamError("CUDA is not available: this ONNX Runtime has only "
                        f"{', '.join(ort.get_available_providers())} (install onnxruntime-training on a CUDA machine)")


def check_started(session: ort.InferenceSession, device: str) -> None:
    """A listed provider can still fail to start (no GPU, no driver): ORT then falls back to the CPU."""
    if device == "cuda" and "CUDAExecutionProvider" not in session.get_providers():
        raise RoamError("CUDA is not available: ONNX Runtime could not start CUDAExecutionProvider (no GPU or driver?)")
