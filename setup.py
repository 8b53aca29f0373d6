"""The C extensions; everything else is in pyproject.toml.

Each is optional: where one does not build (no C compiler; _planalloc needs Linux on x86-64 or
aarch64), the install goes on without it. roam then lays out with the layout search's Python
reference, orders with the exact search's, cuts the step bounds' networks with the Python Dinic, and
roam's runtime allocator says it is missing (train --allocator ort still runs).
ROAM_NO_EXTENSIONS=1 builds none (CI installs so once, to test the planner without them)."""

import os

from setuptools import Extension, setup

EXTENSIONS = [
    # the plan-consuming allocator (roam_cli/runtime/allocator.py): plain C, no ORT or CUDA headers
    Extension("roam_cli.runtime._planalloc", ["roam_cli/runtime/_planalloc.c"], optional=True),
    # the layout search's core: the same search as roam_cli/layout/search.py, in C
    Extension("roam_cli.layout._search", ["roam_cli/layout/_search.c"], optional=True),
    # the order's exact leaf search: the same search as roam_cli/order/ideals.py, in C
    Extension("roam_cli.order._ideals", ["roam_cli/order/_ideals.c"], optional=True),
    # the step bounds' minimum cuts: the same Dinic as roam_cli/solvers/maxflow.py, in C
    Extension("roam_cli.solvers._maxflow", ["roam_cli/solvers/_maxflow.c"], optional=True),
]

setup(ext_modules=[] if os.environ.get("ROAM_NO_EXTENSIONS") == "1" else EXTENSIONS)
