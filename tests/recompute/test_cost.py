"""The cost model: the step simulation on tiny step lists worked out by hand, the op classes, and
the device profiles (every shipped one loads; a bad one is refused in one line)."""

import json

import pytest

from roam_cli.core.errors import RoamError
from roam_cli.cost import profile as profile_mod
from roam_cli.cost.estimate import Step, estimate
from roam_cli.cost.profile import Interconnect, Profile, op_class
from roam_cli.recompute import flops as flops_mod

# Round figures so every duration below is exact: a MatMul runs at 100 FLOP/s, a Conv at 50,
# anything else at 10; device memory 1000 B/s; the host 5 FLOP/s and 100 B/s; 0.5 s per compute
# node; a transfer costs 1 s plus 10 B/s out to the host, 20 B/s back in.
TOY = Profile(
    name="toy", description="hand-checkable", source="made up",
    device_flops={"matmul": 100.0, "conv": 50.0, "other": 10.0}, device_memory_bandwidth=1000.0, device_memory_bytes=10**6,
    host_flops=5.0, host_memory_bandwidth=100.0, host_memory_bytes=10**9, link="host",
    to_host_bandwidth=10.0, to_device_bandwidth=20.0, link_latency=1.0, duplex=True, overlap=True,
    kernel_overhead=0.5, energy_per_flop=1e-3, energy_per_byte_moved=1e-2, energy_per_byte_accessed=1e-4)


def toy(**changes) -> Profile:
    return Profile(**{**TOY.__dict__, **changes})


# Two compute steps and one transfer. 0: MatMul 0.5 + max(200/100, 100/1000) = 2.5 s;
# 1: 40 B out 1 + 40/10 = 5 s, after 0; 2: Relu 0.5 + max(30/10, 10/1000) = 3.5 s, after 0.
TWO_AND_ONE = [Step("device", "MatMul", 200, 100, ()), Step("to_host", "", 0, 40, (0,)),
               Step("device", "Relu", 30, 10, (0,))]


def test_an_overlapped_transfer_runs_beside_compute():
    # 0 on the device [0, 2.5]; 1 on the link [2.5, 7.5]; 2 on the device [2.5, 6]: 7.5 s, the
    # device never waits (its span 6 s is all compute)
    e = estimate(TOY, TWO_AND_ONE)
    assert (e.seconds, e.device_compute_seconds, e.to_host_seconds, e.stall_seconds) == (7.5, 6.0, 5.0, 0.0)
    assert (e.host_compute_seconds, e.to_device_seconds) == (0.0, 0.0)


def test_a_transfer_that_does_not_overlap_stalls_compute():
    # the transfer takes the device stream [2.5, 7.5], so 2 runs [7.5, 11]: 11 s, of which the
    # device spent 11 - 6 = 5 s not computing
    e = estimate(toy(overlap=False), TWO_AND_ONE)
    assert (e.seconds, e.device_compute_seconds, e.stall_seconds) == (11.0, 6.0, 5.0)


# Two transfers the other ways at once, then an Add that reads both:
# 0: 40 B in, 1 + 40/20 = 3 s; 1: 40 B out, 1 + 40/10 = 5 s; 2: Add 0.5 + 10/10 = 1.5 s.
BOTH_WAYS = [Step("to_device", "", 0, 40, ()), Step("to_host", "", 0, 40, ()), Step("device", "Add", 10, 0, (0, 1))]


def test_a_duplex_link_moves_both_ways_at_once():
    # in [0, 3] and out [0, 5] side by side; the Add [5, 6.5]; the device waited 5 s
    e = estimate(TOY, BOTH_WAYS)
    assert (e.seconds, e.to_device_seconds, e.to_host_seconds, e.stall_seconds) == (6.5, 3.0, 5.0, 5.0)


@pytest.mark.parametrize("changes", [{"duplex": False}, {"overlap": False}, {"duplex": False, "overlap": False}])
def test_a_shared_link_moves_one_way_at_a_time(changes):
    # in [0, 3], then out [3, 8], then the Add [8, 9.5]; without overlap the device stream carries
    # both transfers: the same times, 8 s of them stall either way
    e = estimate(toy(**changes), BOTH_WAYS)
    assert (e.seconds, e.stall_seconds) == (9.5, 8.0)


def test_an_update_on_the_host_waits_for_its_transfers_and_the_device_for_it():
    # 0: MatMul [0, 2.5]; 1: out [2.5, 7.5]; 2: host 0.5 + max(50/5, 100/100) = 10.5 s, [7.5, 18];
    # 3: in 1 + 40/20 = 3 s, [18, 21]; 4: Add [21, 22.5]. The device computed 2.5 + 1.5 = 4 s of 22.5.
    steps = [Step("device", "MatMul", 200, 100, ()), Step("to_host", "", 0, 40, (0,)), Step("host", "Adam", 50, 100, (1,)),
             Step("to_device", "", 0, 40, (2,)), Step("device", "Add", 10, 0, (3,))]
    e = estimate(TOY, steps)
    assert (e.seconds, e.host_compute_seconds, e.device_compute_seconds, e.stall_seconds) == (22.5, 10.5, 4.0, 18.5)


def test_each_op_runs_at_its_class_rate_or_its_memory_bound():
    # Conv 0.5 + 100/50 = 2.5 s; Relu with the same FLOPs 0.5 + 100/10 = 10.5 s; a Relu reading and
    # writing 5000 B at 1000 B/s is memory-bound: 0.5 + max(10/10, 5) = 5.5 s. In order: 18.5 s.
    steps = [Step("device", "Conv", 100, 0, ()), Step("device", "Relu", 100, 0, ()), Step("device", "Relu", 10, 5000, ())]
    assert estimate(TOY, steps).seconds == 18.5


def test_energy_counts_flops_bytes_moved_and_bytes_accessed():
    # 230 FLOP x 1e-3 + 40 B moved x 1e-2 + 110 B accessed x 1e-4 = 0.23 + 0.4 + 0.011
    assert estimate(TOY, TWO_AND_ONE).energy_joules == pytest.approx(0.641, rel=1e-12)


def test_energy_is_unknown_only_when_a_needed_figure_is():
    no_moves = toy(energy_per_byte_moved=None)
    assert estimate(no_moves, TWO_AND_ONE).energy_joules is None
    assert estimate(no_moves, [TWO_AND_ONE[0]]).energy_joules == pytest.approx(0.2 + 0.01)  # nothing moved


# A ring over 4 ranks on a 10 B/s interconnect with 1 s a hop: 3/4 x 40 B / 10 B/s + 3 x 1 s = 6 s.
RING = Interconnect("toy ring", bandwidth=10.0, latency=1.0)


def test_a_ring_collective_moves_n_minus_1_nths_of_its_bytes_in_n_minus_1_hops():
    assert RING.ring_seconds(40, 4) == 6.0
    assert RING.ring_seconds(40, 2) == 0.5 * 40 / 10 + 1.0
    assert RING.ring_seconds(40, 1) == 0.0  # one rank moves nothing


@pytest.mark.parametrize("ranks,seconds,network", [(4, 9.5, 6.0), (2, 6.5, 3.0), (1, 6.0, 0.0)])
def test_a_collective_runs_beside_compute_and_what_it_delays_is_exposed(ranks, seconds, network):
    # 0: MatMul [0, 2.5]; 1: an all-gather of 40 B on the interconnect from 0 (issued when 0
    # starts): [0, 6] over 4 ranks, [0, 3] over 2, nothing over 1; 2: a Relu reading it, 3.5 s,
    # from when both have finished: [6, 9.5], [3, 6.5], [2.5, 6]
    steps = [Step("device", "MatMul", 200, 100, ()), Step("collective", "AllGather", 0, 40, ()),
             Step("device", "Relu", 30, 10, (1,))]
    e = estimate(toy(interconnect=RING), steps, ranks)
    assert (e.seconds, e.network_seconds) == (seconds, network)


def test_a_collective_starts_no_earlier_than_the_order_issues_it():
    # 0: MatMul [0, 2.5]; 1: Relu [2.5, 6]; 2: the all-gather, issued when 1 starts: [2.5, 8.5]
    # (not [0, 6]: its buffer is allocated where the order puts it); 3: a Relu reading it [8.5, 12]
    steps = [Step("device", "MatMul", 200, 100, ()), Step("device", "Relu", 30, 10, ()),
             Step("collective", "AllGather", 0, 40, ()), Step("device", "Relu", 30, 10, (2,))]
    assert estimate(toy(interconnect=RING), steps, 4).seconds == 12.0


def test_a_collective_on_a_profile_without_an_interconnect_is_refused():
    with pytest.raises(ValueError, match="no interconnect"):
        estimate(TOY, [Step("collective", "AllGather", 0, 40, ())], 2)
    with pytest.raises(RoamError, match="has no interconnect for a rank step's collectives: choose one that has "
                                        r"\(infiniband-ndr-gpu, nvlink4-gpu\)"):
        profile_mod.for_step("pcie-gen4-gpu", sharded=True)
    assert profile_mod.for_step(None, sharded=True).name == "nvlink4-gpu"
    assert profile_mod.for_step(None, sharded=False).name == "pcie-gen4-gpu"


def test_an_empty_step_list_takes_no_time():
    e = estimate(TOY, [])
    assert (e.seconds, e.energy_joules, e.stall_seconds) == (0.0, 0.0, 0.0)
    assert set(e.as_dict()) == {"seconds", "energy_joules", "device_compute_seconds", "host_compute_seconds",
                                "to_host_seconds", "to_device_seconds", "stall_seconds", "network_seconds"}


def test_an_unknown_step_kind_is_refused():
    with pytest.raises(ValueError, match="step 0: kind 'gpu'"):
        estimate(TOY, [Step("gpu", "MatMul", 1, 1, ())])


def test_op_classes_follow_how_roam_counts_flops():
    assert [op_class(op) for op in ("MatMul", "Gemm", "Conv", "ConvGrad", "Relu", "Einsum", "")] == \
        ["matmul", "matmul", "conv", "conv", "other", "other", "other"]
    # the ops counted as products run at the product rate; those counted as convolutions at the conv rate
    assert {op_class(op) for op in flops_mod.PRODUCTS} == {"matmul"}
    assert {op_class(op) for op in flops_mod.CONVOLUTIONS} == {"conv"}


@pytest.mark.parametrize("name", profile_mod.shipped())
def test_every_shipped_profile_loads_under_its_file_name(name):
    p = profile_mod.load(name)
    assert p.name == name and p.source and p.description
    assert p.link in ("host", "storage")


def test_the_shipped_profiles_include_the_default_and_poet_s_chipsets():
    assert {profile_mod.DEFAULT, "pcie-gen5-gpu", "coherent-gpu", "phone-soc-flash",
            "poet-m0", "poet-m4", "poet-a72", "poet-jetsontx2"} <= set(profile_mod.shipped())


def test_the_interconnect_profiles_carry_the_datasheets_figures():
    nvlink, ib = profile_mod.load("nvlink4-gpu"), profile_mod.load("infiniband-ndr-gpu")
    # NVLink 4: 900 GB/s both ways together per H100, 450 each way; NDR: 400 Gb/s = 50 GB/s each way
    assert (nvlink.interconnect.bandwidth, ib.interconnect.bandwidth) == (450e9, 50e9)
    # NCCL's ring step latency with the Simple protocol (src/graph/tuning.cc): NVLink 3.4 us, network 9.6 us
    assert (nvlink.interconnect.latency, ib.interconnect.latency) == (3.4e-6, 9.6e-6)
    assert nvlink.device_flops == ib.device_flops == profile_mod.load("pcie-gen5-gpu").device_flops  # H100 SXM both
    assert [n for n in profile_mod.shipped() if profile_mod.load(n).interconnect] == ["infiniband-ndr-gpu", "nvlink4-gpu"]


def test_poet_s_figures_arrive_as_poet_has_them():
    # poet/chipsets.py, MKR1000: FLOPS = 2000 / 0.012, FLOPS_PER_WATT = 2000 / (0.012 * 0.020 * 3.3)
    m0 = profile_mod.load("poet-m0")
    assert m0.device_flops["matmul"] == pytest.approx(2000 / 0.012)
    assert m0.energy_per_flop == pytest.approx(0.012 * 0.020 * 3.3 / 2000)
    assert (m0.to_device_bandwidth, m0.to_host_bandwidth) == (4616.51e3, 4440e3)


def shipped_document() -> dict:
    return json.loads((profile_mod._profiles_dir() / f"{profile_mod.DEFAULT}.json").read_text())


def test_a_profile_file_loads_by_its_path(tmp_path):
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({**shipped_document(), "name": "mine", "to_host_bandwidth": 12e9}))
    p = profile_mod.load(str(path))
    assert (p.name, p.to_host_bandwidth) == ("mine", 12e9)


def without(key: str) -> dict:
    d = shipped_document()
    del d[key]
    return d


@pytest.mark.parametrize("document, message", [
    (without("link_latency"), "missing field 'link_latency'"),
    ({**shipped_document(), "to_host_bandwidth": -25e9}, "to_host_bandwidth must be a positive number"),
    ({**shipped_document(), "device_flops": {"matmul": 1e12, "conv": 1e12}}, "device_flops must give exactly"),
    ({**shipped_document(), "device_flops": {"matmul": 1e12, "conv": 0, "other": 1e12}}, "device_flops.conv must be"),
    ({**shipped_document(), "device_memory_bytes": 4.5e10}, "device_memory_bytes must be a positive whole number"),
    ({**shipped_document(), "duplex": 1}, "duplex must be true or false"),
    ({**shipped_document(), "kernel_overhead": True}, "kernel_overhead must be a number of seconds"),
    ({**shipped_document(), "energy_per_flop": -1e-12}, "energy_per_flop must be joules >= 0, or null"),
    ({**shipped_document(), "link": "nvlink"}, "link must be one of host, storage"),
    ({**shipped_document(), "interconnect": {"name": "nvlink", "bandwidth": 4.5e11}},
     "interconnect must be null or {name, bandwidth, latency}"),
    ({**shipped_document(), "interconnect": {"name": "nvlink", "bandwidth": 0, "latency": 1e-6}},
     "interconnect.bandwidth must be a positive number"),
    ({**shipped_document(), "bandwidth": 1}, "unknown field 'bandwidth'"),
    ({**shipped_document(), "notes": {"bandwith": "typo"}}, "notes must map field names to text"),
    ([], "must be a JSON object"),
])
def test_a_bad_profile_is_refused_in_one_line(tmp_path, document, message):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(document))
    with pytest.raises(RoamError, match=message) as caught:
        profile_mod.load(str(path))
    assert "\n" not in str(caught.value) and str(path) in str(caught.value)


def test_a_file_that_is_not_json_is_refused_in_one_line(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text("{ not json")
    with pytest.raises(RoamError, match="cannot read it as JSON") as caught:
        profile_mod.load(str(path))
    assert "\n" not in str(caught.value)


def test_an_unknown_name_lists_the_shipped_profiles():
    with pytest.raises(RoamError, match="neither a file nor a shipped profile") as caught:
        profile_mod.load("pcie-gen9-gpu")
    assert all(name in str(caught.value) for name in profile_mod.shipped())
