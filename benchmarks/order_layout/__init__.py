"""Every suite graph (GPT-2 small to XL, BERT base and large, ViT, T5, ResNet-50: ONNX Runtime's
artifacts training graphs and roam's full AdamW steps) planned with every order strategy (roam, the
exported order, ONNX Runtime's, a greedy list schedule, one global ILP) and every layout strategy
(roam's exact search, first-fit, best-fit, greedy-by-size, and replays of PyTorch's caching
allocator and ONNX Runtime's BFC arena), each (graph, order) in its own process, every plan checked
by `roam verify`'s checker. The order benchmark adds roam's lower bound on the peak and, on the
graphs small enough for it, how long the global ILP takes to match roam. The layout is also put
against google/minimalloc on minimalloc's own challenging instances, both solvers at the same
capacity and time limit, every layout checked for overlaps. Peak live bytes (the most transient
bytes live at one step) bound any layout of an order from below; fragmentation is arena / peak − 1."""

TITLE = "Order and layout against the baselines and minimalloc"
# The records whose tables open the area's section (and what `python -m benchmarks run order_layout` runs).
HEADLINES = [("order_layout/suite_plans", []), ("order_layout/order", ["--time-limit", "60", "--jobs", "2"]),
             ("order_layout/layout_csv", [])]
DETAILS = "docs/benchmarks/order_layout.md"


def readme_rows(load) -> list[dict]:
    """The order proven optimal and the layout's fragmentation on the suite, and the layout against
    minimalloc on its challenging instances."""
    rows = []
    plans = load("order_layout/suite_plans")
    roam = [g["cells"]["roam"] for g in plans["graphs"] if "peak" in g["cells"].get("roam", {})]
    base = [g["cells"]["original"]["peak"] for g in plans["graphs"] if "peak" in g["cells"].get("roam", {})]
    proven = sum(bool(c.get("proven_optimal")) for c in roam)
    best = min(c["peak"] / b - 1 for c, b in zip(roam, base))
    greedy = [(g["cells"]["roam"]["peak"], g["cells"]["greedy"]["peak"]) for g in plans["graphs"]
              if "peak" in g["cells"].get("roam", {}) and "peak" in g["cells"].get("greedy", {})]
    rows.append({"against": "the exported node order, and XLA's list and DFS memory schedulers (roam's `greedy`)",
                 "workload": f"{len(roam)} suite training graphs and full steps (GPT-2, BERT, ViT, T5, ResNet-50)",
                 "figure": f"order proven optimal on {proven} of {len(roam)}; peak up to {-100 * best:.1f} % below the "
                           f"exported order's and up to {-100 * min(r / g - 1 for r, g in greedy):.1f} % below XLA's "
                           f"(never above, {len(greedy)} graphs)",
                 "record": "order_layout/suite_plans"})

    def fragmentation(strategy: str) -> float:
        return sum(c["arenas"][strategy] / c["peak"] - 1 for c in roam) / len(roam)

    rows.append({"against": "PyTorch's caching allocator and ONNX Runtime's BFC arena (replayed)",
                 "workload": "the same graphs, roam's order",
                 "figure": f"fragmentation {100 * max(c['arenas']['roam'] / c['peak'] - 1 for c in roam):.1f} % "
                           f"(at most) against {100 * fragmentation('pytorch'):.1f} % and "
                           f"{100 * fragmentation('bfc'):.1f} % (mean)",
                 "record": "order_layout/suite_plans"})
    from benchmarks.order_layout.layout_csv import summary
    try:
        s = summary(load("order_layout/layout_csv"))
    except FileNotFoundError:  # not measured yet on this clone
        return rows
    if s["median_speedup"]:
        rows.append({"against": "google/minimalloc", "workload": f"its {s['instances']} challenging layout instances",
                     "figure": f"fits {s['roam_fits']} of {s['instances']} (minimalloc {s['minimalloc_fits']}), "
                               f"median {s['median_speedup']:.0f}× faster",
                     "record": "order_layout/layout_csv"})
    return rows
