"""Data read from disk a batch at a time: does `roam train`'s memory stay flat as the data set grows?

    python -m benchmarks run runtime/data_rss [--sizes-mib 20,200,2048] [--steps 50]

The README sample's export made a full step (`make-training-graph --in-graph-optimizer`, batch 4 x
32 tokens), then trained `--steps` steps, `--shuffle`, on data folders of growing size
(`input_ids.npy` and `labels/` of .npy shards, int64 [examples, 32]: 512 bytes an example) and on
a token file (`tokens.bin`, uint16) of each size, each run one `roam train` under `/usr/bin/time -v`
(its peak RSS) with an .npz of 2 batches beside them as the baseline. The folders are written once
into `--cache` (default benchmarks/.cache/data_rss, about 4.5 GB at the default sizes)."""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from benchmarks import harness

TAKES = "about 3 min; needs /usr/bin/time and 4.5 GB of disk at the default sizes"
EXPORT = harness.ROOT / "sample_models" / "gpt2_tiny" / "model.onnx"
SEQ, VOCAB, EXAMPLE_BYTES = 32, 100, 2 * 32 * 8  # ids and labels, int64


def data_folder(root: Path, mib: int) -> Path:
    """input_ids.npy and labels/ (4 shards) holding `mib` MiB of examples, written 64 MiB at a time."""
    folder = root / f"folder-{mib}"
    if (folder / "input_ids.npy").exists():
        return folder
    (folder / "labels").mkdir(parents=True, exist_ok=True)
    rows = mib * (1 << 20) // EXAMPLE_BYTES
    rng = np.random.default_rng(0)
    chunk = (64 << 20) // (SEQ * 8)
    ids = np.lib.format.open_memmap(folder / "input_ids.npy", "w+", np.int64, (rows, SEQ))
    for start in range(0, rows, chunk):
        ids[start:start + chunk] = rng.integers(0, VOCAB, (min(chunk, rows - start), SEQ))
    ids.flush()
    for k, part in enumerate(np.array_split(np.arange(rows), 4)):
        labels = np.lib.format.open_memmap(folder / "labels" / f"part-{k}.npy", "w+", np.int64, (len(part), SEQ))
        for start in range(0, len(part), chunk):
            labels[start:start + chunk] = ids[part[start:start + chunk]]
        labels.flush()
    return folder


def token_file(root: Path, mib: int) -> Path:
    path = root / f"tokens-{mib}.bin"
    if not path.exists():
        rng = np.random.default_rng(1)
        with open(path, "wb") as f:
            for _ in range(mib // 64 or 1):
                rng.integers(0, VOCAB, (min(mib, 64) << 20) // 2, dtype=np.uint16).tofile(f)
    return path


def peak_rss_mib(argv: list[str], cwd: Path) -> tuple[float, float]:
    """(peak RSS MiB, wall s) of one command under /usr/bin/time -v."""
    proc = subprocess.run(["/usr/bin/time", "-v", sys.executable, "-m", "roam_cli", "-q", *argv], cwd=cwd,
                          capture_output=True, text=True, check=False)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(argv)}: exit {proc.returncode}: {proc.stderr.strip()[-400:]}")
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr).group(1)) / 1024
    wall = re.search(r"Elapsed \(wall clock\) time .*: (?:(\d+):)?(\d+):([\d.]+)", proc.stderr).groups()
    return round(rss, 1), round(int(wall[0] or 0) * 3600 + int(wall[1]) * 60 + float(wall[2]), 1)


def main(argv: list[str]) -> dict:
    ap = harness.options(__name__, __doc__)
    ap.add_argument("--sizes-mib", default="20,200,2048")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--cache", type=Path, default=harness.CACHE / "data_rss")
    a = ap.parse_args(argv)
    a.cache.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        subprocess.run([sys.executable, "-m", "roam_cli", "-q", "make-training-graph", str(EXPORT), "-o", "step.onnx",
                        "--loss", "cross-entropy", "--in-graph-optimizer", "--dim", "batch=4"], cwd=work, check=True)
        subprocess.run([sys.executable, "-m", "roam_cli", "-q", "optimize", "step.onnx", "-o", "plan.json"], cwd=work,
                       check=True)
        rng = np.random.default_rng(2)
        batches = rng.integers(0, VOCAB, (2, 4, SEQ))
        np.savez(work / "two.npz", input_ids=batches, labels=batches)
        train = ["train", "step.onnx", "--plan", "plan.json", "--steps", str(a.steps)]
        rss, wall = peak_rss_mib([*train, "--inputs", "two.npz"], work)
        rows.append({"data": ".npz of 2 batches (held in memory)", "mib": round((work / "two.npz").stat().st_size / 2**20, 3),
                     "rss_mib": rss, "seconds": wall})
        for mib in (int(s) for s in a.sizes_mib.split(",")):
            for kind, path in (("folder", data_folder(a.cache, mib)), ("token file", token_file(a.cache, mib))):
                size = sum(p.stat().st_size for p in ([path] if path.is_file() else path.rglob("*.npy")))
                rss, wall = peak_rss_mib([*train, "--inputs", str(path), "--shuffle"], work)
                rows.append({"data": f"{kind}, {mib:,} MiB", "mib": round(size / 2**20, 1), "rss_mib": rss, "seconds": wall})
                print(f"{kind} {mib} MiB: peak RSS {rss} MiB", file=sys.stderr, flush=True)
    return {"steps": a.steps, "rows": rows}


def table(results: dict) -> str:
    rows = results["rows"]
    base = rows[0]["rss_mib"]
    body = harness.markdown_table(["data (`--shuffle`)", "MiB on disk", "peak RSS MiB", "over the .npz run", "wall s"],
                                  [[r["data"], r["mib"], r["rss_mib"], f"{r['rss_mib'] - base:+.1f}", r["seconds"]]
                                   for r in rows], "lrrrr")
    spread = max(r["rss_mib"] for r in rows[1:]) - min(r["rss_mib"] for r in rows[1:])
    return (body + f"\n{results['steps']} steps each, one `roam train` a row; the peak RSS of the runs on data "
            f"from disk spans {spread:.1f} MiB across {rows[1]['mib']:,}–{rows[-1]['mib']:,} MiB of data.\n")
