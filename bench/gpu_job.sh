#!/bin/bash
# A whole pipeline job on a GPU machine that has torch and CUDA but not this project's other packages, and no
# network: by default the pruned 4-layer/312 student's SST-2 job (configs/sst2_pruned.yaml) on the whole training set
# (67,349 sentences: the CPU cap applies only on a CPU) without augmentation (GloVe does not travel), the MiniLM-L6
# teacher fine-tuned there. Needs bench/device/ written by `JOB=1 bash bench/prepare_device.sh` (carry it along).
# Output, under ${OUT:-runs/gpu_job}: job.log (the pipeline's log, progress bars left out, and its exit status),
# report.md and report.json.
# TEACHER=mpnet: the 12-layer MPNet teacher instead (bench/device/mpnet/ from `JOB=1 MPNET=1 bash
# bench/prepare_device.sh`, carried over several calls as it prints) and by default configs/sst2_mpnet.yaml with the
# student pruned from it (`student.init=pruned`), on the same whole training set.
#   bash bench/gpu_job.sh      (CONFIG=... another config; LIMIT=seconds for the pipeline (default 480); EXTRA="--set
#                               ..." more overrides; PYTHON=... another interpreter; TEACHER=mpnet)
set -uo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-python3}"
out="${OUT:-runs/gpu_job}"
mkdir -p "$out"
[ -d bench/device/job ] || { echo "bench/device/job is missing: run JOB=1 bash bench/prepare_device.sh first"; exit 2; }
teacher="${TEACHER:-minilm}"
case "$teacher" in
  minilm) config="${CONFIG:-configs/sst2_pruned.yaml}"; init=() ;;
  mpnet) config="${CONFIG:-configs/sst2_mpnet.yaml}"; init=(--set student.init=pruned)
         [ -f bench/device/mpnet/files/manifest.json ] \
           || { echo "bench/device/mpnet is missing: run JOB=1 MPNET=1 bash bench/prepare_device.sh first"; exit 2; } ;;
  *) echo "TEACHER must be minilm or mpnet, got $teacher"; exit 2 ;;
esac
site="$(mktemp -d)"
assets="$(mktemp -d)"
raw="$(mktemp)"
trap 'rm -rf "$site" "$assets" "$raw"' EXIT
"$py" -m pip install --quiet --no-index --no-deps --target "$site" bench/device/wheels/*.whl bench/device/job/wheels/*.whl \
  > "$out/job.log" 2>&1 || { echo "installing the wheels failed; see $out/job.log"; exit 3; }
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
"$py" - "$assets" "$teacher" >> "$out/job.log" 2>&1 <<'PY' || { echo "restoring $teacher failed; see $out/job.log"; exit 4; }
import hashlib, json, lzma, shutil, sys
from pathlib import Path
from safetensors.torch import load, save_file
assets, teacher = Path(sys.argv[1]), sys.argv[2]
dest = assets / "teacher_base"
dest.mkdir()
if teacher == "minilm":
    source = Path("bench/device/job/minilm")
    blob = lzma.decompress((source / "model16.safetensors.xz").read_bytes())
else:  # the parts, carried by several calls, joined in order and checked against the manifest
    source = Path("bench/device/mpnet/files")
    manifest = json.loads((source / "manifest.json").read_text())
    missing = [p for p in manifest["parts"] if not (source.parent / p).is_file()]
    if missing:
        sys.exit(f"MPNet parts missing: {missing} (carry them in earlier calls while the machine stays warm)")
    blob = b"".join((source.parent / p).read_bytes() for p in manifest["parts"])
    if hashlib.sha256(blob).hexdigest() != manifest["sha256"]:
        sys.exit("MPNet parts do not match the manifest's SHA-256: carry them again")
half = load(blob)
save_file({k: (v.float() if v.is_floating_point() else v).contiguous() for k, v in half.items()},
          dest / "model.safetensors")
for path in source.iterdir():
    if not path.name.startswith(("model16", "manifest")):
        shutil.copy(path, dest)
PY
mkdir -p "$assets/SST-2"
{ gzip -dc bench/device/job/SST-2/train.tsv.gz > "$assets/SST-2/train.tsv" && cp bench/device/job/SST-2/dev.tsv "$assets/SST-2/"; } \
  || { echo "unpacking SST-2 failed"; exit 5; }
start=$SECONDS
# shellcheck disable=SC2086
timeout "${LIMIT:-480}" "$py" run_distill.py pipeline --config "$config" \
  --data-dir "$assets/SST-2" --output-dir "$assets/run" --set "teacher.base_model=$assets/teacher_base" \
  --set augment.enabled=false "${init[@]}" ${EXTRA:-} > "$raw" 2>&1
status=$?
tr '\r' '\n' < "$raw" | grep -v -E '%\||^\s*$' >> "$out/job.log"
echo "pipeline exit $status after $((SECONDS - start)) s" | tee -a "$out/job.log"
cp "$assets/run/report.md" "$assets/run/report.json" "$out/" 2>/dev/null
exit "$status"
