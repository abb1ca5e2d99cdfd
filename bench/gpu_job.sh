#!/bin/bash
# A whole pipeline job on a GPU machine that has torch and CUDA but not this project's other packages, and no
# network: by default the pruned 4-layer/312 student's SST-2 job (configs/sst2_pruned.yaml) on the whole training set
# (67,349 sentences: the CPU cap applies only on a CPU) without augmentation (GloVe does not travel), the MiniLM-L6
# teacher fine-tuned there. Needs bench/device/ written by `JOB=1 bash bench/prepare_device.sh` (carry it along).
# Output, under ${OUT:-runs/gpu_job}: job.log (the pipeline's log, progress bars left out, and its exit status),
# report.md and report.json.
#   bash bench/gpu_job.sh      (CONFIG=... another config; LIMIT=seconds for the pipeline (default 480); EXTRA="--set
#                               ..." more overrides; PYTHON=... another interpreter)
set -uo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-python3}"
out="${OUT:-runs/gpu_job}"
mkdir -p "$out"
[ -d bench/device/job ] || { echo "bench/device/job is missing: run JOB=1 bash bench/prepare_device.sh first"; exit 2; }
site="$(mktemp -d)"
assets="$(mktemp -d)"
raw="$(mktemp)"
trap 'rm -rf "$site" "$assets" "$raw"' EXIT
"$py" -m pip install --quiet --no-index --no-deps --target "$site" bench/device/wheels/*.whl bench/device/job/wheels/*.whl \
  > "$out/job.log" 2>&1 || { echo "installing the wheels failed; see $out/job.log"; exit 3; }
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
"$py" -c "import lzma, shutil, sys
from pathlib import Path
from safetensors.torch import load, save_file
source, dest = Path('bench/device/job/minilm'), Path(sys.argv[1]) / 'minilm'
dest.mkdir()
half = load(lzma.decompress((source / 'model16.safetensors.xz').read_bytes()))
save_file({k: (v.float() if v.is_floating_point() else v).contiguous() for k, v in half.items()}, dest / 'model.safetensors')
for path in source.iterdir():
    if not path.name.startswith('model16'):
        shutil.copy(path, dest)" "$assets" >> "$out/job.log" 2>&1 || { echo "restoring MiniLM failed"; exit 4; }
mkdir -p "$assets/SST-2"
{ gzip -dc bench/device/job/SST-2/train.tsv.gz > "$assets/SST-2/train.tsv" && cp bench/device/job/SST-2/dev.tsv "$assets/SST-2/"; } \
  || { echo "unpacking SST-2 failed"; exit 5; }
start=$SECONDS
# shellcheck disable=SC2086
timeout "${LIMIT:-480}" "$py" run_distill.py pipeline --config "${CONFIG:-configs/sst2_pruned.yaml}" \
  --data-dir "$assets/SST-2" --output-dir "$assets/run" --set "teacher.base_model=$assets/minilm" \
  --set augment.enabled=false ${EXTRA:-} > "$raw" 2>&1
status=$?
tr '\r' '\n' < "$raw" | grep -v -E '%\||^\s*$' >> "$out/job.log"
echo "pipeline exit $status after $((SECONDS - start)) s" | tee -a "$out/job.log"
cp "$assets/run/report.md" "$assets/run/report.json" "$out/" 2>/dev/null
exit "$status"
