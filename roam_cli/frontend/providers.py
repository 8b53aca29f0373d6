"""ONNX Runtime's execution providers by `--provider` name, whether this ONNX Runtime has them, and
how a session gets ORT's own arena."""

import onnxruntime as ort

from roam_cli.core.errors import RoamError

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


_same_as_requested_registered = False


def arena_providers(device: str, options: ort.SessionOptions, same_as_requested: bool) -> list:
    """Providers for a session on ORT's own arena, grown to the next power of two (ORT's default) or
    by exactly what is asked (kSameAsRequested). The CPU provider takes that setting only from a
    shared allocator: registered once per process (ORT refuses a second), the session told to use it."""
    global _same_as_requested_registered
    providers: list = list(PROVIDERS[device])
    if same_as_requested and device == "cpu":
        if not _same_as_requested_registered:
            memory = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
            ort.create_and_register_allocator(memory, ort.OrtArenaCfg(0, 1, -1, -1))  # 1 = kSameAsRequested
            _same_as_requested_registered = True
        options.add_session_config_entry("session.use_env_allocators", "1")
    elif device == "cuda":
        providers[0] = (providers[0], {"arena_extend_strategy": "kSameAsRequested" if same_as_requested
                                       else "kNextPowerOfTwo"})
    return providers
