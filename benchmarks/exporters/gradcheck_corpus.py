"""`roam gradcheck` over the exporter corpus, beside PyTorch's verdict on the same training graphs.

For each cell of exporters/exporters_corpus that wrote a training graph (`<corpus>/<model>-<exporter>/
train.onnx`, its export beside it), `roam gradcheck train.onnx --json` on its export's weights and
drawn inputs (zero token ids and labels, small normal images), with no PyTorch; beside it the
corpus's comparison with PyTorch autograd (`result.json`: each gradient against autograd's, within
max(1e-4, 10 x PyTorch's own float32 error)).

    python -m benchmarks run exporters/exporters_corpus      # leaves its graphs in benchmarks/.cache/exporters_corpus
    python -m benchmarks run exporters/gradcheck_corpus      # gradcheck on its dynamo-optimize-false graphs

roam alone (no torch) once the corpus is there; seconds to a minute per graph (the float64 graphs
of ConvNets run on onnx's reference evaluator)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks import harness

TAKES = "about 10 min over the 27 dynamo-optimize-false graphs; roam alone, on exporters/exporters_corpus's graphs"


def check(cell: Path) -> dict:
    r = subprocess.run([sys.executable, "-m", "roam_cli", "gradcheck", str(cell / "train.onnx"), "--json"],
                       capture_output=True, text=True, timeout=1800)
    corpus = json.loads((cell / "result.json").read_text())
    row = {"cell": cell.name, "exit": r.returncode, "pytorch_over": len(corpus.get("over", ())),
           "pytorch_compared": len(corpus.get("errors", {}))}
    if r.returncode in (0, 1) and r.stdout:
        found = json.loads(r.stdout)
        params = found["parameters"]
        checked = [p["rule_error"] for p in params if p["rule_error"] is not None]
        row |= {"parameters": len(params), "rules_worst": max(checked, default=None),
                "at_kinks": len(params) - len(checked),
                "across_from_float64": sum(a["elements"] for a in found["across_from_float64"]),
                "float32_worst": max(p["float32_error"] for p in params), "seconds": found["seconds"],
                "runner": "ort" if found["runner"] == "onnxruntime" else "reference", "passed": found["passed"],
                "why": (r.stderr.strip().splitlines() or [""])[-1] if r.returncode == 1 else ""}
    else:
        row["error"] = (r.stderr.strip().splitlines() or ["?"])[-1]
    return row


def main(argv: list[str]) -> list[dict]:
    ap = harness.options(__name__, __doc__)
    ap.add_argument("--corpus", type=Path, default=harness.CACHE / "exporters_corpus",
                    help="exporters_corpus's --out folder (default: benchmarks/.cache/exporters_corpus)")
    ap.add_argument("--exporters", default="dynamo-optimize-false",
                    help="comma-separated: the cells of these exporters (default dynamo-optimize-false)")
    ap.add_argument("--only", help="comma-separated models (default: every cell)")
    args = ap.parse_args(argv)
    harness.needs(args.corpus, "python -m benchmarks run exporters/exporters_corpus (its cells' graphs)")
    exporters = args.exporters.split(",")
    rows = []
    for cell in sorted(args.corpus.iterdir()):
        if (cell / "train.onnx").is_file() and (cell / "result.json").is_file() \
                and json.loads((cell / "result.json").read_text())["exporter"] in exporters \
                and (not args.only or json.loads((cell / "result.json").read_text())["model"] in args.only.split(",")):
            rows.append(check(cell))
            print(f"{cell.name}: {rows[-1].get('error') or ('pass' if rows[-1]['passed'] else 'exit 1')}",
                  file=sys.stderr, flush=True)
    return rows


def verdict(row: dict) -> str:
    """pass, or exit 1 with the reason gradcheck named (records before the reasons: exit 1 alone)."""
    if row["passed"]:
        return "pass"
    why = row.get("why", "")
    for said, short in (("a backward rule is wrong", "a rule is wrong"), ("other side of an edge", "float32 across an edge"),
                        ("amplifies rounding", "rounding amplified")):
        if said in why:
            return f"exit 1: {short}"
    return "exit 1"


def table(rows: list[dict]) -> str:
    """One row per training graph, then the verdicts against PyTorch's."""
    out = []
    for r in rows:
        theirs = f"{r['pytorch_over']} of {r['pytorch_compared']}"
        if "error" in r:
            out.append([r["cell"], "–", "–", "–", f"exit {r['exit']}: {r['error']}", "–", theirs])
            continue
        worst = "–" if r["rules_worst"] is None else f"{r['rules_worst']:.1e}"
        out.append([r["cell"], r["parameters"], worst, r.get("at_kinks", "–"), f"{r['float32_worst']:.1e}",
                    r.get("across_from_float64", "–"), verdict(r), f"{r['seconds']:.1f}", theirs])
    text = harness.markdown_table(["cell", "parameters", "gradcheck: rules worst", "unchecked (at a kink)",
                                   "as run vs float64 worst", "elements across an edge from float64", "verdict", "s",
                                   "PyTorch: gradients over tolerance"], out, "lrrrrrlrl")
    passed = [r for r in rows if r.get("passed")]
    failed = [r for r in rows if "error" not in r and not r["passed"]]
    both = [r for r in failed if r["pytorch_over"]]
    return text + (f"\ngradcheck passes {len(passed)} of {len(rows)} graphs; fails {len(failed)} ({len(both)} of them "
                   f"PyTorch's comparison flags too, {len(failed) - len(both)} it finds right); "
                   f"{len(rows) - len(passed) - len(failed)} stop with an error.\n")
