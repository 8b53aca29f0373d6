#!/bin/sh
# The Dockerfile's install steps, as a script, so that CI can run them in a clean virtualenv
# and the image recipe is tested without a docker engine:
#   scripts/docker_steps.sh SOURCE_DIR
# installs roam from SOURCE_DIR with the `plot` extra into the current Python, then checks
# that the installed `roam` plans, reports, draws and exports the bundled sample.
# ORT_PACKAGE=onnxruntime-gpu puts ONNX Runtime's CUDA build in place of the CPU one (the GPU
# image): the same `onnxruntime` module, so one is uninstalled before the other goes in.
set -eu
src=${1:?usage: scripts/docker_steps.sh SOURCE_DIR}
ort=${ORT_PACKAGE:-onnxruntime}

python -m pip install --no-cache-dir "$src[plot]"
if [ "$ort" != onnxruntime ]; then
    python -m pip uninstall -y onnxruntime
    python -m pip install --no-cache-dir "$ort"
fi

# smoke test, as the image's user would run it
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
roam --version
roam -q optimize "$src/sample_models/gpt2_tiny/training_model.onnx" -o "$work/plan.json"
roam -q report "$work/plan.json" --format markdown > "$work/plan.md"
roam -q plot "$work/plan.json" -o "$work"
roam -q export "$work/plan.json" --perfetto "$work/trace.json" --memory-snapshot "$work/snapshot.pickle"
# a training loop on the plan: full step (standard ONNX, which the image's onnxruntime runs), plan,
# 3 steps from the plan's arena, checked against plain ORT
roam -q make-training-graph "$src/sample_models/gpt2_tiny/training_model.onnx" -o "$work/step.onnx" --in-graph-optimizer
roam -q optimize "$work/step.onnx" -o "$work/step_plan.json"
roam -q train "$work/step.onnx" --plan "$work/step_plan.json" --steps 3 --compare
# the same step recomputing cheap values: the annotated model carries the copies, the maths must not change
roam -q optimize "$work/step.onnx" -o "$work/step_rc.json" --recompute free --time-limit 10
roam -q verify "$work/step.onnx" "$work/step_rc.json"
roam -q train "$work/step_rc.annotated.onnx" --plan "$work/step_rc.json" --steps 3 --compare
for f in plan.md live_memory.png layout.svg trace.json snapshot.pickle; do
    test -s "$work/$f" || { echo "docker_steps: $f was not written" >&2; exit 1; }
done
echo "docker_steps: roam installed and working"
