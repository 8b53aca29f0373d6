"""A device profile: the figures the cost model reads, from a shipped JSON file or the user's.

Every figure is a plain number in SI units (FLOP/s, bytes/s, bytes, seconds, joules) so a profile
is checkable against the datasheet it cites; `notes` (field -> text) says where each came from.
Loading checks every field, since a typo'd or negative bandwidth would only show up later as a
nonsensical plan. `interconnect`, the link between ranks a sharded step's collectives cross, is
the one optional field: a profile without one plans no rank step."""

import json
import math
from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path

from roam_cli.core.errors import RoamError, first_line

DEFAULT = "pcie-gen4-gpu"
DEFAULT_SHARDED = "nvlink4-gpu"  # a rank step's default: the profile needs an interconnect
OP_CLASSES = ("matmul", "conv", "other")
LINKS = ("host", "storage")

# The rate class of an op follows how roam counts its FLOPs (roam_cli/recompute/flops.py): the ops
# counted as 2·M·N·K products run at the matmul rate (tensor cores on a GPU), convolutions and
# their fused gradient at the conv rate; every other op is counted one FLOP per output element and
# runs at the general rate (Einsum and attention included, as they are counted that way).
MATMUL_OPS = frozenset({"MatMul", "Gemm", "FusedMatMul", "TransposeMatMul", "FusedGemm"})
CONV_OPS = frozenset({"Conv", "FusedConv", "ConvTranspose", "ConvGrad"})


@dataclass(frozen=True)
class Interconnect:
    """The link between ranks (NVLink, InfiniBand), as a ring collective sees it."""
    name: str
    bandwidth: float  # bytes/s each rank sends (and receives) at once, each way
    latency: float  # seconds per step of a ring (one hop)

    def ring_seconds(self, nbytes: int, ranks: int) -> float:
        """A ring all-gather of `nbytes` gathered, or reduce-scatter of `nbytes` reduced, over
        `ranks`: N − 1 steps, each moving one N-th of the bytes to the next rank."""
        return (ranks - 1) / ranks * nbytes / self.bandwidth + (ranks - 1) * self.latency


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    source: str  # where the figures come from, said plainly
    device_flops: dict[str, float]  # op class -> FLOP/s on the device
    device_memory_bandwidth: float  # bytes/s: the roofline of memory-bound ops
    device_memory_bytes: int
    host_flops: float  # the host CPU, which runs an offloaded optimizer update
    host_memory_bandwidth: float
    host_memory_bytes: int  # what the far tier holds: host RAM, or the storage paged to
    link: str  # "host" (PCIe / coherent link to host RAM) or "storage" (flash/SD paging)
    to_host_bandwidth: float  # bytes/s, device -> far tier
    to_device_bandwidth: float  # bytes/s, far tier -> device
    link_latency: float  # seconds per transfer
    duplex: bool  # both directions at once
    overlap: bool  # transfers overlap compute; False: they stall it
    kernel_overhead: float  # seconds per compute node (launch, dispatch)
    energy_per_flop: float | None  # joules; None where unknown
    energy_per_byte_moved: float | None
    energy_per_byte_accessed: float | None
    interconnect: Interconnect | None = None  # between ranks; None: the profile plans no rank step


def op_class(op_type: str) -> str:
    """"matmul", "conv" or "other": which of a profile's device rates an ONNX op runs at."""
    if op_type in MATMUL_OPS:
        return "matmul"
    if op_type in CONV_OPS:
        return "conv"
    return "other"


def for_step(name: str | None, sharded: bool) -> Profile:
    """The profile a step is estimated on: `name`, or the default for its kind; a rank step's
    (`sharded`) needs an interconnect for its collectives."""
    profile = load(name or (DEFAULT_SHARDED if sharded else DEFAULT))
    if sharded and profile.interconnect is None:
        raise RoamError(f"device profile {profile.name!r} has no interconnect for a rank step's collectives: "
                        f"choose one that has ({', '.join(n for n in shipped() if load(n).interconnect)})")
    return profile


def shipped() -> list[str]:
    return sorted(p.name.removesuffix(".json") for p in _profiles_dir().iterdir() if p.name.endswith(".json"))


def load(name_or_path: str) -> Profile:
    """A shipped profile by name, else a JSON file. RoamError, one line, on anything wrong."""
    if name_or_path in shipped():
        where = _profiles_dir().joinpath(name_or_path + ".json")
    elif Path(name_or_path).is_file():
        where = Path(name_or_path)
    else:
        raise RoamError(f"device profile {name_or_path!r} is neither a file nor a shipped profile "
                        f"({', '.join(shipped())})")
    try:
        document = json.loads(where.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise RoamError(f"device profile {name_or_path}: cannot read it as JSON: {first_line(e)}") from None
    try:
        return _parse(document)
    except ValueError as e:
        raise RoamError(f"device profile {name_or_path}: {e}") from None


def _profiles_dir():
    return resources.files("roam_cli").joinpath("cost/profiles")


def _parse(document) -> Profile:
    """The Profile a JSON document describes; ValueError naming the first bad field."""
    if not isinstance(document, dict):
        raise ValueError("must be a JSON object")
    names = [f.name for f in fields(Profile)]
    unknown = sorted(set(document) - set(names) - {"notes"})
    if unknown:
        raise ValueError(f"unknown field {unknown[0]!r} (fields: {', '.join(names)}, notes)")
    missing = [n for n in names if n not in document and n != "interconnect"]
    if missing:
        raise ValueError(f"missing field {missing[0]!r}")
    notes = document.get("notes", {})
    if not isinstance(notes, dict) or not all(k in names and isinstance(v, str) for k, v in notes.items()):
        raise ValueError("notes must map field names to text")
    d = document
    flops = d["device_flops"]
    if not isinstance(flops, dict) or sorted(flops) != sorted(OP_CLASSES):
        raise ValueError(f"device_flops must give exactly {', '.join(OP_CLASSES)}")
    if d["link"] not in LINKS:
        raise ValueError(f"link must be one of {', '.join(LINKS)}, got {d['link']!r}")
    return Profile(
        name=_text(d, "name"), description=_text(d, "description"), source=_text(d, "source"),
        device_flops={c: _positive(flops, c, "device_flops.") for c in OP_CLASSES},
        device_memory_bandwidth=_positive(d, "device_memory_bandwidth"),
        device_memory_bytes=_count(d, "device_memory_bytes"),
        host_flops=_positive(d, "host_flops"), host_memory_bandwidth=_positive(d, "host_memory_bandwidth"),
        host_memory_bytes=_count(d, "host_memory_bytes"), link=d["link"],
        to_host_bandwidth=_positive(d, "to_host_bandwidth"), to_device_bandwidth=_positive(d, "to_device_bandwidth"),
        link_latency=_seconds(d, "link_latency"), duplex=_flag(d, "duplex"), overlap=_flag(d, "overlap"),
        kernel_overhead=_seconds(d, "kernel_overhead"),
        energy_per_flop=_joules(d, "energy_per_flop"), energy_per_byte_moved=_joules(d, "energy_per_byte_moved"),
        energy_per_byte_accessed=_joules(d, "energy_per_byte_accessed"),
        interconnect=_interconnect(d.get("interconnect")))


def _interconnect(d) -> Interconnect | None:
    if d is None:
        return None
    if not isinstance(d, dict) or sorted(d) != ["bandwidth", "latency", "name"]:
        raise ValueError("interconnect must be null or {name, bandwidth, latency}")
    return Interconnect(_text(d, "name"), _positive(d, "bandwidth", "interconnect."),
                        _seconds(d, "latency", "interconnect."))


def _number(d: dict, key: str) -> float | None:
    """d[key] as a finite float; None when it is anything else (a bool is not a number here)."""
    value = d[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _positive(d: dict, key: str, prefix: str = "") -> float:
    value = _number(d, key)
    if value is None or value <= 0:
        raise ValueError(f"{prefix}{key} must be a positive number, got {d[key]!r}")
    return value


def _seconds(d: dict, key: str, prefix: str = "") -> float:
    value = _number(d, key)
    if value is None or value < 0:
        raise ValueError(f"{prefix}{key} must be a number of seconds >= 0, got {d[key]!r}")
    return value


def _joules(d: dict, key: str) -> float | None:
    if d[key] is None:
        return None
    value = _number(d, key)
    if value is None or value < 0:
        raise ValueError(f"{key} must be joules >= 0, or null where unknown, got {d[key]!r}")
    return value


def _count(d: dict, key: str) -> int:
    value = d[key]
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{key} must be a positive whole number of bytes, got {value!r}")
    return value


def _flag(d: dict, key: str) -> bool:
    if not isinstance(d[key], bool):
        raise ValueError(f"{key} must be true or false, got {d[key]!r}")
    return d[key]


def _text(d: dict, key: str) -> str:
    if not isinstance(d[key], str) or not d[key].strip():
        raise ValueError(f"{key} must be a non-empty string")
    return d[key]
