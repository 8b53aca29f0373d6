#!/usr/bin/env bash
# `roam execute` on CUDAExecutionProvider, beside the CPU run, on the bundled sample and on any
# training graphs given; prints one table row per model and provider. Then `roam train` on the
# sample's full step per provider: ORT's session allocating from roam's arena (CUDA: through the
# provider's gpu_external_alloc), 8 steps checked against a plain ORT session.
#
#   benchmarks/cuda_check.sh [MODEL.onnx ...]          # from the repository root
#   PROVIDERS=cpu benchmarks/cuda_check.sh MODEL.onnx  # the same table without a GPU
#   ORDER=original benchmarks/cuda_check.sh            # plans made with another order (default roam)
#
# Needs ONNX Runtime's GPU build in place of the CPU one (pip uninstall -y onnxruntime && pip install
# onnxruntime-gpu; for fused graphs onnxruntime-training, its own environment). Exit 2 when
# CUDA is not available, 1 when a run failed its checks.
set -euo pipefail
PROVIDERS=${PROVIDERS:-cuda cpu}
ORDER=${ORDER:-roam}
python - $PROVIDERS <<'PY'
import sys
import onnxruntime as ort
print(f"onnxruntime {ort.__version__}: {', '.join(ort.get_available_providers())}")
if "cuda" in sys.argv[1:] and "CUDAExecutionProvider" not in ort.get_available_providers():
    print("CUDA is not available: install onnxruntime-gpu in place of onnxruntime on a CUDA machine", file=sys.stderr)
    sys.exit(2)
PY
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true

work=$(mktemp -d)
status=0
for model in sample_models/gpt2_tiny/training_model.onnx "$@"; do
  plan="$work/$(echo "$model" | tr '/.' '__').json"
  python -m roam_cli -q optimize "$model" -o "$plan" --order "$ORDER"
  for provider in $PROVIDERS; do
    python -m roam_cli execute "$model" --plan "$plan" --provider "$provider" --json \
      > "$plan.$provider.result" || status=1
  done
done
python - "$work" <<'PY'
import json, pathlib, sys
print(f"{'model':<44} {'provider':<8} {'order':<9} {'agreement':>9} {'replay rel':>10} {'bitwise':>9} "
      f"{'ORT pow2':>13} {'ORT exact':>13} {'ORT exact':>13} {'roam arena':>13} {'s':>5}  result")
print(f"{'':<44} {'':<8} {'':<9} {'':>9} {'':>10} {'':>9} {'orig. order':>13} {'orig. order':>13} "
      f"{'plan order':>13}")
for path in sorted(pathlib.Path(sys.argv[1]).glob("*.result")):
    text = path.read_text()
    if not text.strip():
        print(f"{path.name:<44} no result (see the error above)")
        continue
    r = json.loads(text)
    a, rp = r["ort_arena_bytes"], r["replay"]
    rel = "n/a" if rp["max_rel"] is None else f"{rp['max_rel']:.1e}"
    print(f"{r['model'][-44:]:<44} {r['provider']:<8} {r['plan']['order_strategy']:<9} "
          f"{r['order']['agreement']:>9.4%} {rel:>10} {rp['bitwise_equal']:>4}/{rp['tensors']:<4} "
          f"{a['original_order']['next_power_of_two'] or 0:>13,} {a['original_order']['same_as_requested'] or 0:>13,} "
          f"{a['plan_order']['same_as_requested'] or 0:>13,} {r['plan']['arena_bytes']:>13,} "
          f"{sum(r['seconds'].values()):>5.0f}  {'; '.join(r['failures']) or 'OK'}")
PY

# roam's allocator in ORT's own session: the sample's full step, per provider
python -m roam_cli -q make-training-graph sample_models/gpt2_tiny/training_model.onnx -o "$work/step.onnx" --in-graph-optimizer
python -m roam_cli -q optimize "$work/step.onnx" -o "$work/step_plan.json"
for provider in $PROVIDERS; do
  python -m roam_cli train "$work/step.onnx" --plan "$work/step_plan.json" --provider "$provider" --steps 8 \
    --compare --json > "$work/train.$provider.json" || status=1
done
python - "$work" <<'PY'
import json, pathlib, sys
print(f"\n{'roam train (sample full step)':<32} {'provider':<8} {'arena':>11} {'plan arena':>11} {'requests':>9} "
      f"{'unplanned':>9} {'loss rel':>9} {'state rel':>9}")
for path in sorted(pathlib.Path(sys.argv[1]).glob("train.*.json")):
    text = path.read_text()
    if not text.strip():
        print(f"{path.name:<32} no result (see the error above)")
        continue
    r = json.loads(text)
    unplanned = sum(s["memory"].get("unplanned", 0) for s in r["per_step"][1:])
    c = r["compare"]
    print(f"{'':<32} {r['provider']:<8} {r['arena']['arena_bytes']:>11,} {r['plan']['arena_bytes']:>11,} "
          f"{r['arena']['requests']:>9} {unplanned:>9} {c['outputs_max_rel']:>9.1e} {c['state_max_rel']:>9.1e}")
PY
exit $status
