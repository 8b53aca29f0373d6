"""roam's benchmarks, by area (one folder each) with one entry point: `python -m benchmarks`."""

# In the README's order: what the planner achieves first, then what runs and at what scale.
AREAS = ["order_layout", "recompute", "tiers", "precision", "exporters", "runtime", "sharding", "scale"]
