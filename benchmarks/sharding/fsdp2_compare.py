"""roam's rank plans against PyTorch FSDP2 at the same model, batch and ranks: per-rank memory, bytes
sent per step, and the exposed communication time.

    python -m benchmarks run sharding/fsdp2_compare [--only gpt2_small-n8,70b-n64] [--precisions float32,bf16]

FSDP2's side is sharding/fsdp2_memory's record (`--fsdp2`): per row, precision and policy (`default`:
reshard_after_forward True for the blocks, False for the root; `reshard`: True everywhere; `keep`:
False everywhere) the per-rank peak and the collectives' bytes. roam's side is the same model at the
same per-rank batch, made by roam: GPT-2 small 4 × 256 (the suite's fused full step; in bf16
precision/amp_memory's step, roam's backward with `--precision bf16`), and scale/scale's LLaMA steps at
1 × 512 (`7b`, `70b`, `405b`; variant `base`, ONNX Runtime's backward, and `bf16`, roam's backward with
`--precision bf16`). Per row and precision, each command timed under /usr/bin/time -v:

    roam shard STEP --ranks N -o RANK.onnx
    roam optimize RANK.onnx -o PLAN --recompute free|off --gap 0.01 --jobs 2 --device PROFILE
    roam optimize RANK.onnx -o PLAN --recompute budget --budget FSDP2_DEFAULT_PEAK ...   (the same options)
    roam verify RANK.onnx PLAN

`budget` is the plan an engineer moving off FSDP2 would ask for: no more memory than FSDP2's default
needs, and within it the least recomputation and communication (a parameter gathered again priced at
its ring time on the profile). PROFILE: nvlink4-gpu at N = 8 (one HGX node), infiniband-ndr-gpu at
N = 64 (the ring crosses nodes).

What a rank needs, roam: the plan's persistent bytes (its shards of the parameters and both AdamW
moments, replicated inputs, the batch, constants) plus its arena (activations, gathered parameters,
gradients before their reduce-scatter, the update's temporaries), laid out. FSDP2: the tracker's
peak, at the phase where it peaks; no allocator fragmentation counted. Like for like, checked per
row (`checks`): the same parameter elements, rows and sequence per rank, and ranks. FSDP2 pads a
parameter on its first dimension, roam flat; FSDP2 gathers a unit (a block, the root) in one
collective, roam each parameter in its own; FSDP2's bf16 runs the whole module in bf16, roam's bf16
step is autocast's (matrix products in bf16; the embedding, norms in float32), so roam gathers in
bf16 only the weights read through a bf16 Cast alone. Both reduce-scatter float32 gradients and keep
float32 masters and moments.

Sent: what each rank sends per step (a ring sends (N − 1)/N of every buffer). Exposed time: the same
ring formula on the same profile and the same compute (roam's cost model of the rank's nodes).
roam's is its plan's (its order, a collective per parameter issued where the order reaches it).
FSDP2's is `fsdp2_steps`: a collective per unit with FSDP2's bytes on one stream beside the compute,
the other nodes in the order of roam's plan without recompute, the optimizer after the whole
backward; assumed of FSDP2's overlap: the root's all-gather exposed at the start, each unit's forward
all-gather issued when the unit before it starts (prefetch 1), each resharded unit's backward
all-gather when the unit after it starts its backward, each reduce-scatter when its last gradient is
made, no contention between NCCL and the compute.

Needs the steps: the suite (`python -m benchmarks.suite`), precision/amp_memory's bf16 step and
scale/scale's LLaMA steps (their --build; torch). Rank steps and plans go to --work. Hours in all
(the `budget` plans of the large rows take minutes each); `--roam-from` reuses an earlier record's
plans."""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

import onnx

from benchmarks import harness
from roam_cli.core import memory
from roam_cli.core.collectives import ALL_GATHER, REDUCE_SCATTER, SHARDING_KEY
from roam_cli.cost import profile as profiles
from roam_cli.cost.estimate import COLLECTIVE, Step, estimate
from roam_cli.frontend.onnx_import import import_model
from roam_cli.offload import timing

TAKES = "hours (every row; 70B/405B budget plans minutes each); needs the suite, the AMP and scale steps (torch)"
PRECISIONS = ("float32", "bf16")
POLICIES = ("default", "reshard", "keep")
MODES = ("free", "off", "budget")  # budget: --recompute budget at FSDP2 default's peak
ROWS = ("gpt2_small-n8", "llama_7b-n8", "70b-n8", "70b-n64", "405b-n64")
LLAMA = {"llama_7b-n8": "7b", "70b-n8": "70b", "70b-n64": "70b", "405b-n64": "405b"}
BLOCK = re.compile(r"(?:^|\.)(?:h|layers)\.(\d+)\.")  # GPT-2's and LLaMA's transformer blocks


def step_of(name: str, precision: str, args) -> Path:
    """roam's full step for FSDP2's row `name` in `precision`."""
    if name == "gpt2_small-n8":
        return args.suite / "gpt2_small" / "full_step.onnx" if precision == "float32" else \
            args.amp / "gpt2_small" / "step.bf16.onnx"
    from benchmarks.scale import scale

    return scale.step_path(args.scale, LLAMA[name], scale.VARIANTS["base" if precision == "float32" else "bf16"])


def device_for(ranks: int) -> str:
    """8 ranks: one HGX/DGX node (NVLink); more: nodes joined by InfiniBand, which bounds a ring."""
    return "nvlink4-gpu" if ranks <= 8 else "infiniband-ndr-gpu"


# ---- roam's side ------------------------------------------------------------------------------------

def sharding_record(rank: Path) -> dict:
    return json.loads({p.key: p.value for p in onnx.load(rank, load_external_data=False).metadata_props}[SHARDING_KEY])


def roam_side(name: str, precision: str, step: Path, ranks: int, work: Path, gap: str, jobs: int,
              budget: int | None, earlier: dict | None = None) -> dict:
    """Shard, plan (free, off, and budget at `budget` bytes: FSDP2 default's peak) and verify one
    step, each command timed; what `earlier` has (a former run's) is kept, not made again."""
    rank = work / f"{name}.{precision}.rank.onnx"
    device = device_for(ranks)
    if earlier and "failed" not in earlier and Path(earlier["rank_step"]).exists():
        out = dict(earlier)
        commands = out.pop("commands")
    else:
        commands, out = [], {"step": str(step), "rank_step": str(rank), "device": device}

    def timed(*args) -> tuple[int, str, dict]:
        from benchmarks.scale import scale

        code, message, wall, cpu, rss = scale.timed(*map(str, args))
        commands.append({"command": "roam " + " ".join(map(str, args)), "exit": code, "seconds": round(wall, 1),
                         "cpu_seconds": round(cpu, 1), "rss_gib": round(rss, 2)})
        return code, message, commands[-1]

    if "shard" not in out:
        code, message, out["shard"] = timed("shard", step, "--ranks", ranks, "-o", rank)
        if code != 0:
            return out | {"failed": message.splitlines()[-1], "commands": commands}
        out["record"] = {k: v for k, v in sharding_record(rank).items() if k in ("ranks", "batch", "data_inputs")}
    for mode in MODES:
        if mode in out or (mode == "budget" and budget is None):
            continue
        plan = work / f"{name}.{precision}.{mode}.plan.json"
        within = ("--budget", budget) if mode == "budget" else ()
        code, message, t = timed("optimize", rank, "-o", plan, "--recompute", mode, *within, "--gap", gap,
                                 "--jobs", jobs, "--device", device)
        if code != 0:
            out[mode] = {"failed": message.splitlines()[-1] if message else f"exit {code}", "optimize": t}
            continue
        verified, _, v = timed("verify", rank, plan)
        p = json.loads(plan.read_text())
        out[mode] = {"plan": str(plan), "optimize": t, "verify": v, "verified": verified == 0,
                     "persistent_bytes": p["persistent_bytes"], "arena_bytes": p["arena_bytes"],
                     "per_rank_bytes": p["persistent_bytes"] + p["arena_bytes"],
                     "peak_live_bytes": p["peak_live_bytes"], "communication": p["sharding"]["communication"]}
    return out | {"commands": commands}


# ---- FSDP2's communication estimate -------------------------------------------------------------------

def unit_of(parameter: str) -> int | str:
    m = BLOCK.search(parameter)
    return int(m.group(1)) if m else "root"


def gathered_by(graph, parameters: dict) -> dict[int, str]:
    """The nodes that make a parameter's gathered value (the cast of its shard, the all-gather, the
    unpad and reshape, a cast of the full value) -> the parameter: FSDP2's all-gather with its
    copy-in cast and copy-out."""
    chain: dict[int, str] = {}
    for p in parameters:
        values = [p]
        while values:
            v = values.pop()
            for u in graph.consumers.get(v, ()):
                n = graph.nodes[u]
                if u in chain or n.op_type not in ("Cast", "AllGather", "Slice", "Reshape"):
                    continue
                if v == p and (n.domain, n.op_type) != ALL_GATHER and not (
                        n.op_type == "Cast" and any((graph.nodes[w].domain, graph.nodes[w].op_type) == ALL_GATHER
                                                    for w in graph.consumers.get(n.outputs[0], ()))):
                    continue  # the update's reads of the shard
                chain[u] = p
                values.extend(n.outputs)
    return chain


def reduced_parameter(graph, i: int, parameters: dict, state: dict) -> str:
    """The parameter whose gradient reduce-scatter `i` reduces: the first parameter or optimizer
    state its update reads."""
    seen, values = set(), [graph.nodes[i].outputs[0]]
    while values:
        for u in graph.consumers.get(values.pop(), ()):
            for x in graph.nodes[u].inputs:
                if x in parameters:
                    return x
                if x in state:
                    return state[x]
            values.extend(o for o in graph.nodes[u].outputs if o not in seen)
            seen.update(graph.nodes[u].outputs)
    raise ValueError(f"reduce-scatter {graph.nodes[i].name} feeds no parameter's update")


def fsdp2_steps(graph, mm, planned: list[int], record: dict, resharded, gather_bytes: dict,
                reduce_bytes: dict) -> list[Step]:
    """The rank step's compute in the order `planned` (node indices), its collectives as FSDP2
    schedules them (see the module's docstring): `resharded(unit)` says whether a unit is gathered
    again in the backward; the bytes are FSDP2's per unit."""
    nodes, classes = graph.nodes, mm.node_class
    at = {i: k for k, i in enumerate(planned)}
    base = [dataclasses.replace(s, after=tuple(planned[j] for j in s.after)) for s in timing.steps(graph, mm, planned)]
    base = [base[at[i]] for i in range(len(nodes))]  # by node index, reading node indices
    chain = gathered_by(graph, record["parameters"])
    scatters = {i: reduced_parameter(graph, i, record["parameters"], record["state"])
                for i, n in enumerate(nodes) if (n.domain, n.op_type) == REDUCE_SCATTER}
    compute = [i for i in planned if i not in chain and i not in scatters]
    order = [i for i in compute if classes[i] != "update"] + [i for i in compute if classes[i] == "update"]
    pos = {i: k for k, i in enumerate(order)}
    phase = {i: "forward" if classes[i] == "forward" else "backward" for i in order}
    first: dict[str, dict] = {"forward": {}, "backward": {}}  # phase -> unit -> position of its first reader
    shape_only = {i for i in order if nodes[i].op_type in ("Shape", "Size")}  # metadata: no gathered data read
    for k, i in enumerate(order):
        for j in base[i].after:
            if j in chain and i not in shape_only:
                first[phase[i]].setdefault(unit_of(chain[j]), k)
    issue = defaultdict(list)  # position -> the all-gathers issued just before it
    for ph in ("forward", "backward"):
        units = sorted(first[ph], key=first[ph].get)
        for k, u in enumerate(units):
            if ph == "forward" or resharded(u):
                issue[first[ph][units[max(k - 1, 0)]]].append((u, ph))
    sources = defaultdict(set)  # unit -> the nodes its reduce-scatter reads (its gradients, flat and padded)
    for i, p in scatters.items():
        sources[unit_of(p)].update(base[i].after)
    scatter_after = defaultdict(list)
    for u, js in sources.items():
        scatter_after[max(pos[j] for j in js)].append(u)

    out: list[Step] = []
    new, gathered, reduced = {}, {}, {}
    first_update = next((i for i in order if classes[i] == "update"), None)
    for k, i in enumerate(order):
        for u, ph in issue.get(k, ()):
            gathered[u, ph] = len(out)
            out.append(Step(COLLECTIVE, "AllGather", 0, gather_bytes[u], ()))
        after = set()
        for j in base[i].after:
            if j in chain:
                if i not in shape_only:
                    u = unit_of(chain[j])
                    after.add(gathered[u, "backward"] if (u, "backward") in gathered and phase[i] == "backward"
                              else gathered[u, "forward"])
            elif j in scatters:
                after.add(reduced[unit_of(scatters[j])])
            else:
                after.add(new[j])
        if i == first_update:
            after.update(reduced.values())
        new[i] = len(out)
        out.append(dataclasses.replace(base[i], after=tuple(sorted(after))))
        for u in scatter_after.get(k, ()):
            reduced[u] = len(out)
            out.append(Step(COLLECTIVE, "ReduceScatter", 0, reduce_bytes[u], tuple(sorted(new[j] for j in sources[u]))))
    return out


def fsdp2_estimates(rank: Path, plan: Path | None, ranks: int, runs: dict, fp32_hand: dict) -> dict:
    """Per FSDP2 policy: the estimated communication, exposed and step seconds, on the row's profile,
    the compute in the order of `plan` (roam's plan without recompute; None: the graph's order)."""
    graph = import_model(rank).graph
    mm = memory.build(graph)
    index = {n.name: i for i, n in enumerate(graph.nodes)}
    planned = [index[name] for name in json.loads(plan.read_text())["order"]] if plan else list(range(len(index)))
    record = json.loads(graph.metadata[SHARDING_KEY])
    profile = profiles.for_step(device_for(ranks), sharded=True)
    reshard = {"default": lambda u: u != "root", "reshard": lambda u: True, "keep": lambda u: False}
    reduce_bytes = {"root": fp32_hand["root_gathered_bytes"]} | dict(enumerate(fp32_hand["block_gathered_bytes"]))
    out = {}
    for policy, run in runs.items():
        hand = run["hand"]
        gather_bytes = {"root": hand["root_gathered_bytes"]} | dict(enumerate(hand["block_gathered_bytes"]))
        steps = fsdp2_steps(graph, mm, planned, record, reshard[policy], gather_bytes, reduce_bytes)
        gathers = sum(s.bytes for s in steps if s.kind == COLLECTIVE and s.op_type == "AllGather")
        scatters = sum(s.bytes for s in steps if s.kind == COLLECTIVE and s.op_type == "ReduceScatter")
        c = run["communication"]
        assert gathers == c["all_gather_forward_bytes"] + c["all_gather_backward_bytes"], (policy, gathers, c)
        assert scatters == c["reduce_scatter_bytes"], (policy, scatters, c)
        with_them, without = estimate(profile, steps, ranks), estimate(profile, steps, 1)
        out[policy] = {"seconds": with_them.network_seconds, "exposed_seconds": with_them.seconds - without.seconds,
                       "step_seconds": with_them.seconds, "profile": profile.name}
    return out


# ---- the comparison -----------------------------------------------------------------------------------

def checks(row: dict, roam: dict, fsdp_run: dict) -> dict:
    """Like for like: parameter elements, rows and sequence per rank, ranks."""
    rank = Path(roam["rank_step"])
    record = sharding_record(rank)
    model = onnx.load(rank, load_external_data=False)
    data = next(vi for vi in model.graph.input if vi.name == record["data_inputs"][0])
    seq = [d.dim_value for d in data.type.tensor_type.shape.dim][1]
    elements = sum(p["numel"] for p in record["parameters"].values())
    low = sum(n.op_type == "AllGather" and n.input[0].endswith(".cast") for n in model.graph.node)
    found = {"parameters": [elements, fsdp_run["hand"]["parameters"]],
             "batch_per_rank": [record["batch"]["rank"], row["batch_per_rank"]], "seq": [seq, row["seq"]],
             "ranks": [record["ranks"], row["ranks"]],
             "gathered_16_bit": f"{low} of {len(record['parameters'])} parameters"}
    found["equal"] = all(a == b for a, b in (v for v in found.values() if isinstance(v, list)))
    return found


def sent(c: dict, ranks: int) -> int:
    """FSDP2's bytes each rank sends per step: (N - 1)/N of every collective's buffer."""
    return (c["all_gather_forward_bytes"] + c["all_gather_backward_bytes"] + c["reduce_scatter_bytes"]) \
        * (ranks - 1) // ranks


def main(argv: list[str]) -> list[dict]:
    ap = harness.options(__name__, __doc__)
    ap.add_argument("--fsdp2", default="sharding/fsdp2_memory", help="the record of FSDP2's side")
    ap.add_argument("--only", help="comma-separated rows (" + ", ".join(ROWS) + ")")
    ap.add_argument("--precisions", default=",".join(PRECISIONS))
    ap.add_argument("--gap", default="0.01")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--suite", type=Path, default=harness.CACHE / "suite", help="the suite (GPT-2 small's step)")
    ap.add_argument("--amp", type=Path, default=harness.CACHE / "amp",
                    help="precision/amp_memory's steps (GPT-2 small's bf16 step)")
    ap.add_argument("--scale", type=Path, default=harness.CACHE / "scale", help="scale/scale's LLaMA steps")
    ap.add_argument("--work", type=Path, default=harness.CACHE / "fsdp2_compare",
                    help="where the rank steps and plans go")
    ap.add_argument("--roam-from", metavar="RECORD", help="take roam's side (plans, timings) from this earlier "
                    "record where it has the row and its rank step is still in --work, plan only the modes it "
                    "lacks, and compute FSDP2's side again")
    args = ap.parse_args(argv)
    fsdp = {r["row"]: r for r in harness.load(args.fsdp2)["results"]["rows"]}
    earlier = {(r["row"], r["precision"]): r["roam"] for r in
               (harness.load(args.roam_from)["results"] if args.roam_from else ())}
    names = args.only.split(",") if args.only else list(ROWS)
    args.work.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in names:
        row = fsdp.get(name, {"ranks": int(name.rsplit("-n", 1)[1]), "runs": ()})  # FSDP2's may come later
        runs = defaultdict(dict)
        for run in row["runs"]:
            runs[run["precision"]][run["policy"]] = run
        for precision in args.precisions.split(","):
            step = step_of(name, precision, args)
            r = {"row": name, "precision": precision, "ranks": row["ranks"], "fsdp2": runs[precision]}
            budget = runs[precision]["default"]["peak"]["Total"] if "default" in runs[precision] else None
            if not step.exists() and (name, precision) not in earlier:
                r["roam"] = {"failed": f"{step} is missing (the suite, precision/amp_memory or scale/scale builds it)"}
            else:
                r["roam"] = roam_side(name, precision, step, row["ranks"], args.work, args.gap, args.jobs, budget,
                                      earlier.get((name, precision)))
            if "failed" not in r["roam"] and runs[precision]:
                r["checks"] = checks(row, r["roam"], next(iter(runs[precision].values())))
                off = args.work / f"{name}.{precision}.off.plan.json" if "verified" in r["roam"]["off"] else None
                r["fsdp2_estimate"] = fsdp2_estimates(Path(r["roam"]["rank_step"]), off, row["ranks"], runs[precision],
                                                      runs["float32"]["default"]["hand"])
            rows.append(r)
            print(f"{name} {precision}: done", file=sys.stderr, flush=True)
    return rows


def three(values, fmt) -> str:
    return " / ".join("–" if v is None else format(v, fmt) for v in values)


def table_row(r: dict) -> list:
    fs, roam, est = r["fsdp2"], r["roam"], r.get("fsdp2_estimate", {})
    if "failed" in roam:
        return [r["row"], r["precision"], f"failed: {roam['failed']}"] + [""] * 9
    plans = [roam.get(m, {}) for m in MODES]
    per_rank = [p.get("per_rank_bytes") for p in plans]
    default = fs["default"]["peak"]["Total"] if fs else None
    fs_peak = [fs[p]["peak"]["Total"] / harness.MIB if p in fs else None for p in POLICIES]
    fs_sent = [sent(fs[p]["communication"], r["ranks"]) / 2**30 if p in fs else None for p in POLICIES]
    roam_sent = [p["communication"]["sent_bytes"] / 2**30 if "communication" in p else None for p in plans]
    fs_exposed = [est[p]["exposed_seconds"] * 1e3 if p in est else None for p in POLICIES]
    roam_exposed = [p["communication"]["exposed_seconds"] * 1e3 if "communication" in p else None for p in plans]
    planning = " / ".join(f"{p['optimize']['seconds']:.0f} ({p['optimize']['cpu_seconds']:.0f})" if "optimize" in p
                          else "–" for p in plans)
    return [r["row"], r["precision"], three(fs_peak, ",.0f"),
            three([b / harness.MIB if b else None for b in per_rank], ",.0f"),
            three([b / default if b and default else None for b in per_rank], ".2f"), three(fs_sent, ",.2f"),
            three(roam_sent, ",.2f"), three(fs_exposed, ",.1f"), three(roam_exposed, ",.1f"),
            f"{roam['shard']['seconds']:.0f} ({roam['shard']['cpu_seconds']:.0f})", planning,
            "yes" if all(p.get("verified") for p in plans) else "NO"]


def table(results: list[dict]) -> str:
    return harness.markdown_table(
        ["row", "precision", "FSDP2 peak MiB (default / reshard / keep)", "roam per rank MiB (free / off / budget)",
         "roam ÷ FSDP2 default (free / off / budget)", "FSDP2 sent GiB (default / reshard / keep)",
         "roam sent GiB (free / off / budget)", "FSDP2 exposed ms, estimated (default / reshard / keep)",
         "roam exposed ms, plan (free / off / budget)", "shard s (CPU s)", "optimize s (CPU s) (free / off / budget)",
         "verifies"], [table_row(r) for r in results], "ll" + "r" * 9 + "l")


if __name__ == "__main__":
    sys.exit("run it as: python -m benchmarks run sharding/fsdp2_compare [options]")
