"""`roam remat` on POET's own problems (its models and platforms, exported from POET's public source;
recomputation and paging at least energy under RAM and runtime budgets) beside POET's MILP (PuLP/CBC)
with the same time limit, both schedules judged by `python -m roam_cli.remat.poet_check` under POET's
accounting. `roam tradeoff --offload host` on the suite's full steps and a 70B-class step: its
device-memory / estimated-step-time front beside the fixed policies users know (keep everything,
save_on_cpu, ZeRO-Offload, every persistent byte on the host, recompute only), each planned in full
by roam; and `roam optimize --offload host --budget` at two budgets. Step times are
estimates from a device profile's figures (`docs/cost.md`), not measurements."""

from benchmarks import harness

TITLE = "Memory tiers: offload, paging, and POET's problems"
HEADLINES = [("tiers/poet_peers", []), ("tiers/offload", ["--points", "3"])]
DETAILS = "docs/benchmarks/tiers.md"
NAMED = ("save_on_cpu", "zero_offload", "recompute_only")  # the fixed policies users reach for


def readme_rows(load) -> list[dict]:
    """POET's MILP on its own problems; the fixed offload policies on the suite and the 70B-class step."""
    rows = []
    poet = load("tiers/poet_peers")
    has_one = [r for r in poet["rows"] if not (r["poet"]["status"] == r["roam"]["status"] == "infeasible")]
    roam_valid = sum(valid(r["roam"]) for r in has_one)
    both = [r for r in has_one if valid(r["poet"]) and valid(r["roam"])]
    ratios = [r["roam"]["check"]["energy_joules"] / r["poet"]["check"]["energy_joules"] - 1 for r in both]
    at_most = sum(x <= 5e-5 for x in ratios)  # equal to the table's 0.01 %
    rows.append({"against": "POET (its MILP, PuLP/CBC)",
                 "workload": f"POET's {len(poet['rows'])} problems ({len({r['model'] for r in poet['rows']})} models "
                             f"× {len({r['platform'] for r in poet['rows']})} platforms × 3 RAM budgets), "
                             f"{poet['time_limit']:g} s each",
                 "figure": f"a valid schedule on {roam_valid} of the {len(has_one)} that have one (POET: "
                           f"{sum(valid(r['poet']) for r in has_one)}); energy at most POET's on {at_most} of those "
                           f"{len(both)} (down to {harness.signed_percent(min(ratios), 2)})",
                 "record": "tiers/poet_peers"})
    fronts = {k: f for k, f in load("tiers/offload")["fronts"].items() if "error" not in f}
    beaten, zero = 0, []
    for f in fronts.values():
        policies = {p["policy"]: p for p in f["policies"]}
        beaten += all(policies[n]["dominated_by"] is not None for n in NAMED)
        z = policies["zero_offload"]
        if z["dominated_by"] is not None:
            zero.append(1 - z["dominated_by"]["device_bytes"] / z["device_bytes"])
    rows.append({"against": "save_on_cpu, ZeRO-Offload, recompute only",
                 "workload": f"{len(fronts) - ('70b' in fronts)} suite full steps and a 70B-class step (estimated times)",
                 "figure": f"all three beaten on {beaten} of {len(fronts)} steps; ZeRO-Offload by {100 * min(zero):.0f}–"
                           f"{100 * max(zero):.0f} % less device memory at no more estimated time",
                 "record": "tiers/offload"})
    return rows


def valid(side: dict) -> bool:
    return bool(side.get("check", {}).get("valid"))
