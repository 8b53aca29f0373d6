"""`roam train --ranks N` against the single process on the global batch, and what ends a run.

    python -m benchmarks run sharding/ranks [--only sample,llama,end] [--steps 20] [--export-python PY]

Per model and N: the whole step (`roam make-training-graph --in-graph-optimizer`) is sharded
(`roam shard --ranks N`), both are planned (`roam optimize`), and --steps steps run: the whole step
in one process on the global batch, the rank step on N processes over MPI with --compare. A row
gives the largest relative difference of the loss per step and of the trained weights against the
single process, whether --compare (the same ranks without the plan) was bit-equal, how many of each
rank's requests were served at their plan offsets in a step after the first (the rest: kernel
scratch the plan does not place), the same for the collectives' outputs, and the median step times.

- The README's sample (`sample_models/gpt2_tiny`) exists at one batch, 2 × 32: each rank takes 2
  rows, so the global batch is that batch repeated N times, and the single process runs it once
  (the mean of N equal gradients is that gradient).
- Tiny LLaMA (2 layers, hidden 64, grouped-query attention; the suite's `llama_tiny`) is exported
  by torch at 2 rows and at 2N rows from one model: each rank its own 2 rows of 2N distinct ones,
  the single process all 2N. It needs torch and transformers, in this Python or --export-python.

Then two runs of the sample's 2-rank step are ended on purpose: rank 1 killed (SIGKILL) after its
third step, and rank 0 stopped (SIGSTOP) with --timeout 5: the seconds from the signal until the
launcher exited, and its one line. Needs the mpi extra (mpi4py and an MPI); a few minutes. With more
ranks than cores the step times measure MPI's busy polling, not roam."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks import harness

TAKES = "a few minutes; needs the mpi extra, and torch with transformers (--export-python) for tiny LLaMA"
SAMPLE = harness.ROOT / "sample_models" / "gpt2_tiny" / "training_model.onnx"

EXPORT = """
import sys, torch, transformers as hf
from pathlib import Path
from roam_cli.core.fileio import write_atomic
from roam_cli.frontend import torch_export
torch.manual_seed(0)
config = hf.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, max_position_embeddings=64, use_cache=False)
class Loss(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m
    def forward(self, input_ids, labels):
        return self.m(input_ids=input_ids, labels=labels).loss
model = Loss(hf.LlamaForCausalLM(config)).train()
for rows in map(int, sys.argv[2:]):
    ids = torch.zeros(rows, 16, dtype=torch.int64)
    exported = torch_export.export(model, (ids, ids.clone()), ["input_ids", "labels"], ["loss"], prefix="m.")
    write_atomic(Path(sys.argv[1]) / f"forward_{rows}.onnx", exported.model.SerializeToString())
"""


def roam(*args, env=None) -> dict | None:
    r = subprocess.run([sys.executable, "-m", "roam_cli", *map(str, args)], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(harness.ROOT), **(env or {})})
    if r.returncode:
        raise SystemExit(f"roam {' '.join(map(str, args[:2]))}: {r.stderr.strip()}")
    return json.loads(r.stdout) if "--json" in args else None


def planned(step: Path) -> Path:
    roam("optimize", step, "-o", step.with_suffix(".plan.json"))
    return step.with_suffix(".plan.json")


def relative(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / max(np.abs(a).max(), 1e-3))


def row(name: str, n: int, whole: Path, rank: Path, whole_inputs: Path, global_inputs: Path, steps: int,
        d: Path) -> dict:
    one = roam("train", whole, "--plan", planned(whole), "--steps", steps, "--inputs", whole_inputs,
               "--save-weights", d / f"{whole.stem}.npz", "--json")
    ranks = roam("train", rank, "--plan", planned(rank), "--ranks", n, "--steps", steps, "--inputs", global_inputs,
                 "--compare", "--save-weights", d / f"{rank.stem}.npz", "--json")
    w1, wn = np.load(d / f"{whole.stem}.npz"), np.load(d / f"{rank.stem}.npz")
    assert set(w1.files) == set(wn.files), (w1.files, wn.files)
    losses = [(a["outputs"]["loss"], b["outputs"]["loss"]) for a, b in zip(one["per_step"], ranks["per_step"])]
    later = ranks["per_step"][1:]
    served = min(s["memory"][k]["served_at_plan_offset"] for s in later for k in range(n))
    requests = max(s["memory"][k]["requests"] for s in later for k in range(n))
    collectives = [r["collective_outputs"] for r in ranks["per_rank"]]
    return {"model": name, "ranks": n, "steps": steps,
            "loss_max_rel": max(abs(a - b) / abs(a) for a, b in losses),
            "weights_max_rel": max(relative(w1[k], wn[k]) for k in w1.files), "weights": len(w1.files),
            "compare_bit_equal": ranks["compare"]["bit_equal"],
            "at_plan_offset": f"{served} of {requests}",
            "unplanned": sum(m["unplanned"] for s in later for m in s["memory"]),
            "collectives_at_plan_offset": f"{min(len(c['at_plan_offset']) for c in collectives)} of "
                                          f"{max(len(c['planned']) for c in collectives)}",
            "rank_step_ms": float(np.median([s["seconds"] for s in later]) * 1e3),
            "single_step_ms": float(np.median([s["seconds"] for s in one["per_step"][1:]]) * 1e3)}


def sample_rows(d: Path, steps: int) -> list[dict]:
    whole = d / "sample.onnx"
    roam("make-training-graph", SAMPLE, "-o", whole, "--in-graph-optimizer")
    rng = np.random.default_rng(1)
    ids, labels = (rng.integers(0, 100, (2, 32)).astype(np.int64) for _ in range(2))
    np.savez(d / "sample_batch.npz", input_ids=ids, labels=labels)
    rows = []
    for n in (2, 4):
        np.savez(d / f"sample_batch_x{n}.npz", input_ids=np.tile(ids, (n, 1)), labels=np.tile(labels, (n, 1)))
        roam("shard", whole, "--ranks", n, "-o", d / f"sample_rank{n}.onnx")
        rows.append(row("README sample (batch repeated)", n, whole, d / f"sample_rank{n}.onnx", d / "sample_batch.npz",
                        d / f"sample_batch_x{n}.npz", steps, d))
    return rows


def llama_rows(d: Path, steps: int, python: str) -> list[dict]:
    r = subprocess.run([python, "-c", EXPORT, str(d), "2", "4", "8"], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(harness.ROOT)})
    if r.returncode:
        print(f"tiny LLaMA left out: its export failed ({(r.stderr.strip().splitlines() or ['?'])[-1]})",
              file=sys.stderr)
        return []
    for rows in (2, 4, 8):
        roam("make-training-graph", d / f"forward_{rows}.onnx", "-o", d / f"llama_{rows}.onnx", "--loss", "none",
             "--in-graph-optimizer")
    rng = np.random.default_rng(3)
    out = []
    for n in (2, 4):
        ids = rng.integers(0, 256, (2 * n, 16)).astype(np.int64)
        np.savez(d / f"llama_batch_{2 * n}.npz", input_ids=ids, labels=ids.copy())
        roam("shard", d / "llama_2.onnx", "--ranks", n, "-o", d / f"llama_rank{n}.onnx")
        out.append(row("tiny LLaMA (distinct rows)", n, d / f"llama_{2 * n}.onnx", d / f"llama_rank{n}.onnx",
                       d / f"llama_batch_{2 * n}.npz", d / f"llama_batch_{2 * n}.npz", steps, d))
    return out


def ended(d: Path, how: str) -> dict:
    """The sample's 2-rank step, ended by `how` ("kill": rank 1 SIGKILL; "hang": rank 0 SIGSTOP,
    --timeout 5) after every rank's third step: seconds from the signal to the launcher's exit."""
    folder = Path(tempfile.mkdtemp(dir=d))
    timeout = 5 if how == "hang" else 60
    proc = subprocess.Popen([sys.executable, "-m", "roam_cli", "train", d / "sample_rank2.onnx", "--plan",
                             d / "sample_rank2.plan.json", "--ranks", "2", "--steps", "1000000", "--timeout",
                             str(timeout)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(harness.ROOT), "TMPDIR": str(folder)})
    while True:
        runs = list(folder.glob("roam-ranks-*"))
        counts = [f.read_text().count("\n") for f in runs[0].glob("rank*.steps")] if runs else []
        if len(counts) == 2 and min(counts) >= 3:
            break
        time.sleep(0.05)
    victim = 1 if how == "kill" else 0
    pid = json.loads((runs[0] / f"rank{victim}.status").read_text())["pid"]
    t = time.monotonic()
    os.kill(pid, signal.SIGKILL if how == "kill" else signal.SIGSTOP)
    err = proc.communicate()[1].strip()
    return {"how": how, "seconds": time.monotonic() - t, "exit": proc.returncode, "line": err}


def main(argv: list[str]) -> dict:
    ap = harness.options(__name__, __doc__)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--only", default="sample,llama,end", help="comma-separated: sample, llama, end")
    ap.add_argument("--export-python", default=sys.executable, help="a Python with torch and transformers")
    args = ap.parse_args(argv)
    only = set(args.only.split(","))
    with tempfile.TemporaryDirectory(prefix="roam-ranks-bench-") as scratch:
        d = Path(scratch)
        rows = sample_rows(d, args.steps) if only & {"sample", "end"} else []
        rows = rows if "sample" in only else []
        rows += llama_rows(d, args.steps, args.export_python) if "llama" in only else []
        ends = [ended(d, how) for how in ("kill", "hang")] if "end" in only else []
    return {"rows": rows, "ended": ends}


COLUMNS = ["model", "ranks", "steps", "loss_max_rel", "weights_max_rel", "compare_bit_equal", "at_plan_offset",
           "collectives_at_plan_offset", "unplanned", "rank_step_ms", "single_step_ms"]


def table(results: dict) -> str:
    rows = [[f"{r[c]:.3g}" if isinstance(r[c], float) else str(r[c]) for c in COLUMNS] for r in results["rows"]]
    text = harness.markdown_table(
        ["model", "ranks", "steps", "loss max rel", "weights max rel", "--compare bit-equal", "at plan offset",
         "collectives' outputs at plan offset", "unplanned", "rank step ms", "single step ms"], rows,
        "lrrrrlllrrr")
    if results["ended"]:
        text += "\nEnded on purpose (the sample's 2-rank step, after every rank's third step):\n\n" + "".join(
            f"- {'rank 1 killed (SIGKILL)' if e['how'] == 'kill' else 'rank 0 stopped (SIGSTOP), --timeout 5'}: "
            f"exit {e['exit']}, {e['seconds']:.2f} s after the signal: `{e['line']}`\n" for e in results["ended"])
    return text


if __name__ == "__main__":
    sys.exit("run it as: python -m benchmarks run sharding/ranks [options]")
