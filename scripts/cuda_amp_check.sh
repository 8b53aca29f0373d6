#!/bin/sh
# NOT RUN YET: written without a GPU; run it where one is (onnxruntime-gpu installed, roam installed
# with its allocator built) and read what it prints.
#
# Mixed precision on CUDA's native bf16 and fp16 kernels (docs/precision.md): a two-layer MLP
# exported in float32 (written here with onnx.helper: no torch), made into its bf16 and fp16 AMP
# steps, each planned as written and trained 5 steps on CUDA with roam's allocator, then the same
# step emulated (`roam emulate`) and trained on the CPU provider. PASS per precision: exit 0 from
# --compare (loss and state as a plain CUDA run), no request left the plan, every planned request
# at its offset after step 1, and the CUDA losses within the type's rounding of the emulated ones
# (relative 2^-6 for bf16, 2^-9 for fp16: a few roundings of 8 and 11 significant bits).
#   scripts/cuda_amp_check.sh [ROAM]    (ROAM: the roam executable, default `roam`)
set -eu
roam=${1:-roam}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
python3 - <<'EOF'
import numpy as np, onnx
from onnx import helper, numpy_helper, TensorProto as T
rng = np.random.default_rng(0)
w = {"fc1.weight": rng.standard_normal((64, 256)) * 0.1, "fc1.bias": np.zeros(256),
     "fc2.weight": rng.standard_normal((256, 10)) * 0.1, "fc2.bias": np.zeros(10)}
nodes = [helper.make_node("MatMul", ["x", "fc1.weight"], ["h"]), helper.make_node("Add", ["h", "fc1.bias"], ["hb"]),
         helper.make_node("Relu", ["hb"], ["a"]), helper.make_node("MatMul", ["a", "fc2.weight"], ["o"]),
         helper.make_node("Add", ["o", "fc2.bias"], ["logits"])]
g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", T.FLOAT, [32, 64])],
                      [helper.make_tensor_value_info("logits", T.FLOAT, [32, 10])],
                      [numpy_helper.from_array(v.astype(np.float32), k) for k, v in w.items()])
onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), "mlp.onnx")
EOF
status=0
for p in bf16 fp16; do
  "$roam" make-training-graph mlp.onnx -o "$p.onnx" --loss cross-entropy --in-graph-optimizer --precision "$p"
  "$roam" optimize "$p.onnx" -o "$p.json"
  "$roam" train "$p.onnx" --plan "$p.json" --provider cuda --steps 5 --compare --json >"$p.cuda.json" || status=$?
  "$roam" emulate "$p.onnx" -o "$p.cpu.onnx"
  "$roam" optimize "$p.cpu.onnx" -o "$p.cpu.json"
  "$roam" train "$p.cpu.onnx" --plan "$p.cpu.json" --steps 5 --json >"$p.cpu.out.json" || status=$?
done
python3 - "$status" <<'EOF'
import json, sys
checks = {"every roam train exited 0": sys.argv[1] == "0"}
for p, tol in (("bf16", 2**-6), ("fp16", 2**-9)):
    cuda, cpu = json.load(open(f"{p}.cuda.json")), json.load(open(f"{p}.cpu.out.json"))
    later = cuda["per_step"][1:]
    c = cuda["compare"]
    checks[f"{p}: loss and state equal a plain CUDA run"] = c["outputs_max_rel"] == 0 and c["state_max_rel"] == 0
    checks[f"{p}: no unplanned request"] = all(s["memory"]["unplanned"] == 0 for s in later)
    served = min(s["memory"]["served_at_plan_offset"] for s in later)
    checks[f"{p}: {served} of {later[0]['memory']['planned_requests']} requests at plan offsets"] = \
        served == later[0]["memory"]["planned_requests"]
    losses = [(a["outputs"]["loss"], b["outputs"]["loss"]) for a, b in zip(cuda["per_step"], cpu["per_step"])]
    worst = max(abs(a - b) / abs(b) for a, b in losses)
    checks[f"{p}: CUDA's losses within {tol:g} of the CPU emulation's (worst {worst:.2e})"] = worst <= tol
for what, ok in checks.items():
    print(("pass  " if ok else "FAIL  ") + what)
print("PASS" if all(checks.values()) else "FAIL")
sys.exit(0 if all(checks.values()) else 1)
EOF
