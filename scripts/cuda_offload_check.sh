#!/bin/sh
# NOT RUN YET: written without a GPU; run it where one is (onnxruntime-gpu installed, roam installed
# with its allocator built) and read what it prints.
#
# The sample's full step planned with --offload host at half the device bytes it needs without
# tiers, then trained on CUDA with roam's allocator: the device pool in GPU memory, the host pool
# in pinned host memory (cudaMallocHost), which the transfers' and the host update's kernels reach
# over the bus. PASS: exit 0 from --compare (loss and state as a plain ORT run), no request left
# the plan, and every planned request of both pools at its plan offset after step 1.
#   scripts/cuda_offload_check.sh [ROAM]    (ROAM: the roam executable, default `roam`)
set -eu
roam=${1:-roam}
here=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
"$roam" make-training-graph "$here/sample_models/gpt2_tiny/training_model.onnx" -o step.onnx --in-graph-optimizer
"$roam" optimize step.onnx -o keep.json
half=$(python3 -c 'import json; p = json.load(open("keep.json")); print((p["persistent_bytes"] + p["arena_bytes"]) // 2)')
"$roam" optimize step.onnx -o plan.json --offload host --budget "$half" --workspace calibrate
status=0
"$roam" train plan.annotated.onnx --plan plan.json --provider cuda --steps 3 --compare --json >train.json || status=$?
python3 - "$status" <<'EOF'
import json, sys
r = json.load(open("train.json")) if sys.argv[1] in ("0", "1") else None
checks = {"roam train exited 0": sys.argv[1] == "0"}
if r:
    pools, later = r["arena"]["pools"], r["per_step"][1:]
    c = r["compare"]
    checks["loss and state equal a plain run"] = c["outputs_max_rel"] == 0 and c["state_max_rel"] == 0
    checks["no unplanned request"] = all(s["memory"]["unplanned"] == 0 for s in later)
    for pool in ("device", "slow"):
        served = min(s["memory"]["pools"][pool]["served_at_plan_offset"] for s in later)
        checks[f"{pool} pool: {served} of {pools[pool]['planned_requests']} at plan offsets, "
               f"{pools[pool]['arena_bytes']} bytes (plan {pools[pool]['plan_arena_bytes']})"] = \
            served == pools[pool]["planned_requests"] and pools[pool]["arena_bytes"] == pools[pool]["plan_arena_bytes"]
for what, ok in checks.items():
    print(("pass  " if ok else "FAIL  ") + what)
print("PASS" if all(checks.values()) else "FAIL")
sys.exit(0 if all(checks.values()) else 1)
EOF
