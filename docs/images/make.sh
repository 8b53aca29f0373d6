#!/bin/sh
# Redraws the pictures in docs/images (shown by the README and docs/cli.md). From the repository
# root:   sh docs/images/make.sh [GPT2_SMALL_MODEL]
# GPT2_SMALL_MODEL defaults to where `python sample_models/make_gpt2_tiny.py --preset small`
# writes GPT-2 small's training graph. ORDER and LAYOUT choose the strategies (default: the
# optimize command's defaults).
set -eu
small=${1:-/work/suite_cache/gpt2_small/training_model.onnx}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for pair in "gpt2_tiny:sample_models/gpt2_tiny/training_model.onnx" "gpt2_small:$small"; do
    name=${pair%%:*}
    model=${pair#*:}
    roam -q optimize "$model" -o "$work/$name.json" ${ORDER:+--order "$ORDER"} ${LAYOUT:+--layout "$LAYOUT"}
    mkdir "$work/$name"
    roam -q plot "$work/$name.json" -o "$work/$name" --format png
    for picture in live_memory layout; do
        install -m 644 "$work/$name/$picture.png" "docs/images/${name}_$picture.png"
    done
done
