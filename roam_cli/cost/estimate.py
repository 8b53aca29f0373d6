"""A planned step's time and energy on a device profile, by simulating its order once.

The resources are streams: the device's compute, the host's compute, the link (one stream each
way when the profile is duplex, else one shared), and a rank step's collectives on the
interconnect (a ring over the ranks, issued when the order reaches it, as a runtime that allocates
its buffer there issues it). When transfers do not overlap compute they run on the device's
compute stream. Each step starts once its stream is free and every step it
reads has finished, and holds its stream for its duration; the step time is the last finish.
That is all it models: no contention beyond the streams, no caches, peak rates (docs/cost.md).
One pass over plain lists, since a planner calls it on every candidate plan of 100,000 steps."""

from dataclasses import asdict, dataclass

from roam_cli.cost.profile import Profile, op_class

DEVICE, HOST, TO_HOST, TO_DEVICE, COLLECTIVE = "device", "host", "to_host", "to_device", "collective"


@dataclass(frozen=True)
class Step:
    """One node of the planned order."""
    kind: str  # DEVICE or HOST (compute), TO_HOST or TO_DEVICE (a transfer), COLLECTIVE
    op_type: str  # the ONNX op type of a compute step or a collective, "" for a transfer
    flops: int
    bytes: int  # compute: bytes read + written; transfer: bytes moved; collective: bytes gathered or reduced
    after: tuple[int, ...]  # indices of earlier steps whose outputs this step reads


@dataclass(frozen=True)
class Estimate:
    seconds: float
    energy_joules: float | None  # None when the profile lacks a figure the steps need
    device_compute_seconds: float
    host_compute_seconds: float
    to_host_seconds: float  # link busy time, each way
    to_device_seconds: float
    stall_seconds: float  # time the device compute waited on transfers, collectives or the host
    network_seconds: float = 0.0  # the interconnect's busy time: a rank step's collectives

    def as_dict(self) -> dict:
        return asdict(self)


def estimate(profile: Profile, steps: list[Step], ranks: int = 1) -> Estimate:
    """`steps` in their order; a collective is a ring over `ranks` on the profile's interconnect."""
    # stream indices into `free`: 0 device compute, 1 host compute, 2 and 3 the link, 4 the interconnect
    to_host_stream, to_device_stream = (0, 0) if not profile.overlap else (2, 3) if profile.duplex else (2, 2)
    free = [0.0, 0.0, 0.0, 0.0, 0.0]
    finish: list[float] = []
    device_rate: dict[str, float] = {}  # op type -> FLOP/s, resolved once per type
    overhead = profile.kernel_overhead
    device_bandwidth, host_bandwidth = profile.device_memory_bandwidth, profile.host_memory_bandwidth
    host_rate, latency = profile.host_flops, profile.link_latency
    to_host_bandwidth, to_device_bandwidth = profile.to_host_bandwidth, profile.to_device_bandwidth
    device_busy = host_busy = to_host_busy = to_device_busy = network_busy = 0.0
    flops = moved = accessed = 0
    issued = 0.0  # when the step before this one started: a collective starts no earlier
    for index, step in enumerate(steps):
        kind = step.kind
        earliest = 0.0
        if kind == DEVICE:
            rate = device_rate.get(step.op_type)
            if rate is None:
                rate = device_rate[step.op_type] = profile.device_flops[op_class(step.op_type)]
            duration = overhead + max(step.flops / rate, step.bytes / device_bandwidth)
            stream = 0
            device_busy += duration
            flops += step.flops
            accessed += step.bytes
        elif kind == TO_HOST:
            duration = latency + step.bytes / to_host_bandwidth
            stream = to_host_stream
            to_host_busy += duration
            moved += step.bytes
        elif kind == TO_DEVICE:
            duration = latency + step.bytes / to_device_bandwidth
            stream = to_device_stream
            to_device_busy += duration
            moved += step.bytes
        elif kind == HOST:
            duration = overhead + max(step.flops / host_rate, step.bytes / host_bandwidth)
            stream = 1
            host_busy += duration
            flops += step.flops
            accessed += step.bytes
        elif kind == COLLECTIVE:
            if profile.interconnect is None and ranks > 1:
                raise ValueError(f"step {index}: a collective, and profile {profile.name} has no interconnect")
            duration = profile.interconnect.ring_seconds(step.bytes, ranks) if ranks > 1 else 0.0
            stream = 4
            network_busy += duration
            earliest = issued
        else:
            raise ValueError(f"step {index}: kind {kind!r} is none of {DEVICE}, {HOST}, {TO_HOST}, {TO_DEVICE}, "
                             f"{COLLECTIVE}")
        start = max(free[stream], earliest)
        for j in step.after:
            if finish[j] > start:
                start = finish[j]
        end = start + duration
        free[stream] = end
        finish.append(end)
        issued = start
    return Estimate(
        seconds=max(finish, default=0.0), energy_joules=_energy(profile, flops, moved, accessed),
        device_compute_seconds=device_busy, host_compute_seconds=host_busy,
        to_host_seconds=to_host_busy, to_device_seconds=to_device_busy, network_seconds=network_busy,
        # the device stream's span less its compute: its idle gaps, each waiting on a transfer, a
        # collective or the host (an earlier device step has always finished by then), and the
        # transfers it ran
        stall_seconds=max(0.0, free[0] - device_busy))


def _energy(profile: Profile, flops: int, moved: int, accessed: int) -> float | None:
    """Joules for the counts, None when a count is nonzero and its figure unknown."""
    total = 0.0
    for count, per_unit in ((flops, profile.energy_per_flop), (moved, profile.energy_per_byte_moved),
                            (accessed, profile.energy_per_byte_accessed)):
        if count:
            if per_unit is None:
                return None
            total += count * per_unit
    return total
