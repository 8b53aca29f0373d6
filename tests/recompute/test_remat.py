"""`roam remat` on hand-built graphs whose optimal schedules are worked out below, and its
checker on tampered schedules. Memory is Moccasin's: an output is live from its step to the last
read of that computation; a step holds its output and every live value."""

import json
import random

import pytest

from roam_cli.remat import graph as graph_mod, solve as solve_mod
from roam_cli.remat.check import check
from tests.conftest import roam


def node_link(path, ram, cpu, edges, order=None, spelling="checkmate"):
    """Write a node-link graph in Checkmate's spelling (id, cost_ram, cost_cpu, links) or the random
    layered graphs' (name, out_cost, duration, edges as "0"/"1", order as a string)."""
    if spelling == "checkmate":
        nodes = [{"id": v, "cost_ram": r, "cost_cpu": c} for v, (r, c) in enumerate(zip(ram, cpu))]
        doc = {"directed": True, "graph": {"name": path.stem}, "nodes": nodes,
               "links": [{"source": u, "target": v} for u, v in edges]}
        if order is not None:
            doc["graph"]["order"] = order
    else:
        nodes = [{"name": v, "out_cost": r, "duration": c} for v, (r, c) in enumerate(zip(ram, cpu))]
        doc = {"directed": True, "graph": {"name": path.stem, "order": str(order)}, "nodes": nodes,
               "edges": [{"0": u, "1": v} for u, v in edges]}
    path.write_text(json.dumps(doc))
    return path


# A training chain: forward 0 -> 1 -> 2, loss 3, gradients 4, 5, 6, each reading the next
# gradient and its forward activation. Every value 1 byte. Its only order peaks at 5 (step 4
# holds 0, 1 and reads 2, 3). At 4 bytes one of 0 (cpu 5) or 1 (cpu 2) is recomputed: +2. At 3
# bytes step 4 can hold nothing else, so 1 is recomputed (which needs 0 again) and 0 once more
# for 6 after step 5 (reads 4, 1): 0 1 2 3 4 0 1 5 0 6, +5+2+5 = 12.
CHAIN = dict(ram=[1] * 7, cpu=[5, 2, 1, 1, 1, 1, 1],
             edges=[(0, 1), (1, 2), (2, 3), (3, 4), (2, 4), (4, 5), (1, 5), (5, 6), (0, 6)])

# U-Net-like skips (Moccasin's gen_unet_graph, 2 levels): the path 0..4 plus 0 -> 4 and 1 -> 3.
# Step 3 reads 1, 2 and writes 3, so at 3 bytes nothing else is held: 0 (cpu 4) is recomputed
# before 4, the least extra compute: +4.
UNET = dict(ram=[1] * 5, cpu=[4, 1, 1, 1, 1], edges=[(0, 1), (1, 2), (2, 3), (3, 4), (0, 4), (1, 3)])

# A diamond with two branches 0 -> 1 (5 bytes) -> 2 and 0 -> 3 (5 bytes) -> 4, joined by 5. The
# given order runs both wide nodes first: peak 11 (step 3 holds 1, reads 0). Each branch in
# turn peaks at 7: at budget 8 reordering alone fits, every node once, proven optimal.
DIAMOND = dict(ram=[1, 5, 1, 5, 1, 1], cpu=[1] * 6, edges=[(0, 1), (1, 2), (0, 3), (3, 4), (2, 5), (4, 5)],
               order=[0, 1, 3, 2, 4, 5])


def graph_of(spec, order=None) -> graph_mod.Graph:
    n = len(spec["ram"])
    preds = tuple(tuple(sorted(u for u, v in spec["edges"] if v == w)) for w in range(n))
    return graph_mod.Graph(tuple(range(n)), tuple(spec["ram"]), tuple(spec["cpu"]), preds,
                           tuple(order or spec.get("order") or range(n)))


@pytest.mark.parametrize("spec, budget, extra", [(CHAIN, 5, 0), (CHAIN, 4, 2), (CHAIN, 3, 12), (UNET, 4, 0),
                                                 (UNET, 3, 4), (DIAMOND, 8, 0), (DIAMOND, 7, 0)])
def test_the_least_compute_that_fits(spec, budget, extra):
    g = graph_of(spec)
    found = solve_mod.solve(g, budget, time_limit=1)  # found in 0.3 s; a search that recomputes runs to its limit
    assert found.compute == sum(spec["cpu"]) + extra
    assert found.peak <= budget
    assert graph_mod.cost(g, found.schedule) == (found.peak, found.compute)
    assert found.optimal == (extra == 0)  # proven only when every node runs once


def test_the_given_order_costs_what_moccasin_counts():
    assert graph_mod.cost(graph_of(CHAIN), list(range(7))) == (5, 12)
    assert graph_mod.cost(graph_of(DIAMOND), DIAMOND["order"]) == (11, 6)
    assert graph_mod.cost(graph_of(CHAIN), [0, 1, 2, 3, 4, 0, 1, 5, 0, 6]) == (3, 24)
    assert graph_mod.step_floor(graph_of(CHAIN)) == (3, 6)


def test_command_writes_a_schedule_the_checker_accepts(tmp_path):
    g = node_link(tmp_path / "chain.json", **CHAIN)
    r = roam("remat", g, "--budget", "3", "-o", tmp_path / "s.json", "--time-limit", "1")
    assert r.code == 0, r.err
    doc = json.loads((tmp_path / "s.json").read_text())
    assert (doc["peak"], doc["compute"], doc["baseline_compute"], doc["recomputations"]) == (3, 24, 12, 3)
    assert doc["overhead_percent"] == 100.0 and doc["status"] == "feasible"
    assert doc["given_order_peak"] == 5 and doc["schedule"].count(0) == 3
    assert roam("remat", "--check", g, tmp_path / "s.json").code == 0


def test_budget_fraction_and_the_random_layered_spelling(tmp_path):
    g = node_link(tmp_path / "diamond.json", **DIAMOND, spelling="random_layered")
    r = roam("remat", g, "--budget-fraction", "0.7", "-o", tmp_path / "s.json", "--json")
    assert r.code == 0, r.err
    summary = r.json()
    assert summary["budget"] == 8 and summary["given_order_peak"] == 11  # ceil(0.7 * 11)
    assert summary["status"] == "optimal" and summary["compute"] == 6 and summary["peak"] == 7
    assert check(g, tmp_path / "s.json")[0] is None


def random_layered(seed: int, layers: int = 10, width: int = 4) -> dict:
    """A random layered graph in the manner of Moccasin's generator: 1..width nodes a layer, each
    reading one or two nodes of the layer before and, half the time, one of an earlier layer."""
    rng = random.Random(seed)
    by_layer = []
    for _ in range(layers):
        start = sum(map(len, by_layer))
        by_layer.append(list(range(start, start + rng.randint(1, width))))
    edges = set()
    for layer, nodes in enumerate(by_layer[1:], 1):
        for v in nodes:
            edges.update((u, v) for u in rng.sample(by_layer[layer - 1], min(len(by_layer[layer - 1]), rng.randint(1, 2))))
            if layer >= 2 and rng.random() < 0.5:
                edges.add((rng.choice([u for earlier in by_layer[:layer - 1] for u in earlier]), v))
    n = by_layer[-1][-1] + 1
    return dict(ram=[rng.randint(1, 9) for _ in range(n)], cpu=[rng.randint(1, 9) for _ in range(n)], edges=sorted(edges))


def least_peak_without_recomputation(spec) -> int:
    """The exact least peak over all topological orders, by dynamic programming over the sets of
    nodes run so far: running v after the set S holds v and every value of S read outside S."""
    n = len(spec["ram"])
    preds = [{u for u, w in spec["edges"] if w == v} for v in range(n)]
    succs = [{w for u, w in spec["edges"] if u == v} for v in range(n)]
    best = {frozenset(): 0}
    for _ in range(n):
        grown: dict[frozenset, int] = {}
        for done, peak in best.items():
            held = sum(spec["ram"][u] for u in done if not succs[u] <= done)
            for v in range(n):
                if v not in done and preds[v] <= done:
                    key, value = done | {v}, max(peak, held + spec["ram"][v])
                    grown[key] = min(value, grown.get(key, value))
        best = grown
    return best[frozenset(range(n))]


def test_a_random_layered_graph_that_no_order_fits(tmp_path):
    # Seed 0: 32 nodes, 47 edges; the given (layer by layer) order peaks at 36, the best order at
    # 27, and 0.8 of that is 22 bytes, above the largest single step (20): only recomputation fits.
    spec = random_layered(0)
    assert least_peak_without_recomputation(spec) == 27
    g = node_link(tmp_path / "layered.json", **spec)
    assert graph_mod.step_floor(graph_mod.read(g))[0] == 20
    r = roam("remat", g, "--budget", "22", "-o", tmp_path / "s.json", "--time-limit", "2")
    assert r.code == 0, r.err
    doc = json.loads((tmp_path / "s.json").read_text())
    assert doc["peak"] <= 22 and doc["recomputations"] > 0 and doc["status"] == "feasible"
    assert check(g, tmp_path / "s.json")[0] is None
    assert roam("remat", "--check", g, tmp_path / "s.json").code == 0


def tampered(tmp_path, steps, **changes):
    g = node_link(tmp_path / "unet.json", **UNET)
    doc = {"schedule": steps, "budget": 3, "peak": 3, "compute": 12, "baseline_compute": 8, **changes}
    (tmp_path / "s.json").write_text(json.dumps(doc))
    return g, tmp_path / "s.json"


def test_checker_accepts_the_hand_schedule(tmp_path):
    assert check(*tampered(tmp_path, [0, 1, 2, 3, 0, 4])) == (None, {"peak": 3, "compute": 12, "baseline_compute": 8})


@pytest.mark.parametrize("steps, changes, why", [
    ([1, 0, 2, 3, 0, 4], {}, "step 0 runs 1, which reads 0 before any computation of it"),
    ([0, 1, 2, 3, 4], {"compute": 8}, "peak 4 at step 3 (3) is over the budget 3"),
    ([0, 1, 2, 3, 0], {"compute": 11}, "node 4 never runs (1 node(s) missing)"),
    ([0, 1, 2, 3, 0, 4], {"compute": 11}, "the schedule reports compute 11, the graph gives 12"),
    ([0, 1, 2, 3, 0, 9], {}, "step 5 runs 9, which is no node of the graph"),
])
def test_checker_rejects_tampered_schedules(tmp_path, steps, changes, why):
    assert check(*tampered(tmp_path, steps, **changes))[0] == why
    r = roam("remat", "--check", tmp_path / "unet.json", tmp_path / "s.json")
    assert r.code == 1 and r.err.strip() == f"roam: invalid schedule: {why}"


def test_checker_takes_a_tighter_budget(tmp_path):
    g, s = tampered(tmp_path, [0, 1, 2, 3, 0, 4])
    r = roam("remat", "--check", g, s, "--budget", "2")
    assert r.code == 1 and "over the budget 2" in r.err


def test_budget_below_the_largest_step_names_it(tmp_path):
    g = node_link(tmp_path / "chain.json", **CHAIN)
    r = roam("remat", g, "--budget", "2", "-o", tmp_path / "s.json")
    assert r.code == 1 and "node 6 needs 3 bytes" in r.err
    assert not (tmp_path / "s.json").exists()


@pytest.mark.parametrize("doc, why", [
    ("not json", "cannot read"),
    ({"nodes": [{"id": 0, "cost_ram": 1, "cost_cpu": 1}], "links": [{"source": 0, "target": 7}]}, "names no node"),
    ({"nodes": [{"id": 0, "cost_ram": -1, "cost_cpu": 1}], "links": []}, "not a non-negative integer"),
    ({"nodes": [{"id": 0, "cost_ram": 1}], "links": []}, "neither cost_cpu nor duration"),
    ({"nodes": [{"id": 0, "cost_ram": 1, "cost_cpu": 1}, {"id": 1, "cost_ram": 1, "cost_cpu": 1}],
      "links": [{"source": 0, "target": 1}, {"source": 1, "target": 0}]}, "cycle"),
    ({"graph": {"order": [1, 0]}, "nodes": [{"id": 0, "cost_ram": 1, "cost_cpu": 1},
                                            {"id": 1, "cost_ram": 1, "cost_cpu": 1}],
      "links": [{"source": 0, "target": 1}]}, "not a topological order"),
])
def test_bad_input_is_one_line_and_nothing_written(tmp_path, doc, why):
    (tmp_path / "g.json").write_text(doc if isinstance(doc, str) else json.dumps(doc))
    r = roam("remat", tmp_path / "g.json", "--budget", "10", "-o", tmp_path / "s.json")
    assert r.code == 2 and why in r.err and len(r.err.strip().splitlines()) == 1
    assert not (tmp_path / "s.json").exists()


def test_usage_errors(tmp_path):
    g = node_link(tmp_path / "chain.json", **CHAIN)
    assert roam("remat", g, "-o", tmp_path / "s.json").code == 2  # no budget
    assert roam("remat", g, "--budget", "4", "--budget-fraction", "0.5", "-o", tmp_path / "s.json").code == 2
    assert roam("remat", g, "--budget", "4").code == 2  # no -o
    assert roam("remat", "--check", g).code == 2  # no schedule
