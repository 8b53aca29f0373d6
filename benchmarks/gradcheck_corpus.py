#!/usr/bin/env python3
"""`roam gradcheck` over the exporter corpus, beside PyTorch's verdict on the same training graphs.

    PYTHONPATH=. python benchmarks/exporters_corpus.py --exporters dynamo-optimize-false --out DIR
    PYTHONPATH=. python benchmarks/gradcheck_corpus.py DIR [--json OUT]

For each cell of `exporters_corpus.py --out DIR` that wrote a training graph (`DIR/<model>-<exporter>/
train.onnx`, its export beside it), `roam gradcheck train.onnx --json` on its export's weights and
drawn inputs (zero token ids and labels, small normal images), with no PyTorch; beside it the
corpus's comparison with PyTorch autograd (`result.json`: each gradient against autograd's, within
max(1e-4, 10 x PyTorch's own float32 error)). Prints a markdown table."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path


def check(cell: Path) -> dict:
    r = subprocess.run([sys.executable, "-m", "roam_cli", "gradcheck", str(cell / "train.onnx"), "--json"],
                       capture_output=True, text=True, timeout=1800)
    corpus = json.loads((cell / "result.json").read_text())
    row = {"cell": cell.name, "exit": r.returncode, "pytorch_over": len(corpus.get("over", ())),
           "pytorch_compared": len(corpus.get("errors", {}))}
    if r.returncode in (0, 1) and r.stdout:
        found = json.loads(r.stdout)
        params = found["parameters"]
        row |= {"parameters": len(params), "rules_worst": max(p["rule_error"] for p in params),
                "float32_worst": max(p["float32_error"] for p in params), "seconds": found["seconds"],
                "runner": "ort" if found["runner"] == "onnxruntime" else "reference", "passed": found["passed"]}
    else:
        row["error"] = (r.stderr.strip().splitlines() or ["?"])[-1]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="exporters_corpus.py's --out folder")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows = [check(cell) for cell in sorted(args.out.iterdir()) if (cell / "train.onnx").is_file()]
    print("| cell | parameters | gradcheck: rules worst | as run vs float64 worst | verdict | s | PyTorch: gradients over tolerance |")
    print("|---|---:|---:|---:|---|---:|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['cell']} | — | — | — | exit {r['exit']}: {r['error']} | — | {r['pytorch_over']} of {r['pytorch_compared']} |")
            continue
        print(f"| {r['cell']} | {r['parameters']} | {r['rules_worst']:.1e} | {r['float32_worst']:.1e} | "
              f"{'pass' if r['passed'] else 'exit 1'} | {r['seconds']:.1f} | {r['pytorch_over']} of {r['pytorch_compared']} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
