#!/bin/sh
# CI's test of the Docker image (.ci/run): builds the Dockerfile and runs roam in the image on the
# bundled sample as README.md's "Training with the plan" does, the sample's folder mounted at /work.
#   scripts/image_check.sh
# Root on Debian, no container registry needed: buildah (chroot isolation, no daemon) builds on a
# minimal Debian with Python made here by mmdebstrap, passed as BASE; both are installed with
# apt-get when missing. The base trusts the host's local certificate authorities, so that pip in
# the build reaches the package index wherever the host does. What it makes is removed at the end.
set -eu
cd "$(dirname "$0")/.."
if ! command -v buildah >/dev/null || ! command -v mmdebstrap >/dev/null; then
    apt-get update -qq && apt-get install -y -qq buildah mmdebstrap
fi
id=roam-image-check-$$
tmp=$(mktemp -d)
cleanup() {
    buildah rm "$id" >/dev/null 2>&1 || true
    buildah rmi "$id" >/dev/null 2>&1 || true  # the image before its base
    buildah rmi "$id-base" >/dev/null 2>&1 || true
    rm -rf "$tmp"
}
trap cleanup EXIT

# the base: the host's Debian release, without the documentation (as the slim images are)
mmdebstrap --quiet --variant=minbase --include=python3,python3-venv \
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --customize-hook='copy-in /usr/local/share/ca-certificates /usr/local/share' \
    --customize-hook='chroot "$1" update-ca-certificates' \
    "$(. /etc/os-release && echo "$VERSION_CODENAME")" "$tmp/base.tar"
buildah from --quiet --name "$id" scratch >/dev/null
buildah add --quiet "$id" "$tmp/base.tar" / >/dev/null
buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$id"
buildah commit --quiet --rm "$id" "$id-base" >/dev/null

buildah build --isolation chroot --build-arg BASE="localhost/$id-base" -t "$id" .
buildah images "$id"

# the README's training example, in the image
mkdir "$tmp/work"
cp sample_models/gpt2_tiny/training_model.onnx "$tmp/work"
buildah from --quiet --name "$id" "$id" >/dev/null
roam() { buildah run --isolation chroot -v "$tmp/work:/work" "$id" -- roam "$@"; }
roam --version
roam -q make-training-graph training_model.onnx -o step.onnx --in-graph-optimizer
roam -q optimize step.onnx -o plan.json --plot .
roam -q report plan.json --format markdown > "$tmp/work/plan.md"
roam -q export plan.json --perfetto trace.json
roam train step.onnx --plan plan.json --steps 20 --compare
for f in plan.md live_memory.png layout.svg trace.json; do
    test -s "$tmp/work/$f" || { echo "image_check: $f was not written" >&2; exit 1; }
done
echo "image_check: the image builds and roam runs in it"
