#!/bin/bash
# The GPU measurement of the training loop, prepared to run in one go (under 10 minutes) on a fresh machine with one
# CUDA GPU: the BERT-base-shaped teacher (12 layers, 768; random weights from a config, no download) and the
# 4-layer/312 student, the intermediate step, batches padded to length 128, at batch 32 and 256 in fp32, bf16 and
# fp16, then bf16 at batch 256 and 32 collated in two worker processes, then bf16 at batch 256 with the student
# compiled.
#
# On a machine without this project's packages, first run `bash bench/prepare_device.sh` where pip reaches the
# registry: it writes bench/device/ (git-ignored; wheels of the versions installed here and the MiniLM tokenizer's
# files, about 2 MB), which this script installs into a temporary folder (no network needed) and uses. A tiny smoke
# run on the GPU comes first and stops the script, with its log, if it fails.
#
# Output, under ${OUT:-runs}: gpu_loop.jsonl (a first line with the GPU, its driver and torch, then each
# configuration's JSON object from bench/loop_overhead.py, GPU utilisation included, or {"failed": ...}) and
# gpu_loop.log (every configuration's log, progress bars left out). A configuration that fails or runs past its
# time limit is recorded as such and the rest still run; configurations that would start after DEADLINE seconds
# (default 540) are skipped and recorded as such.
#   bash bench/gpu_loop.sh            (REPEATS=N to change the repeats; PYTHON=... for another interpreter; DEVICE=cpu
#                                      to try the script itself where there is no GPU; ONLY='batch-size 256 ' runs
#                                      the configurations whose arguments match that regular expression)
set -uo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
py="${PYTHON:-python3}"
outdir="${OUT:-runs}"
out="$outdir/gpu_loop.jsonl"
biglog="$outdir/gpu_loop.log"
mkdir -p "$outdir"
: > "$biglog"
if [ -d bench/device/wheels ]; then
  site="$(mktemp -d)"
  "$py" -m pip install --quiet --no-index --no-deps --target "$site" bench/device/wheels/*.whl >> "$biglog" 2>&1 \
    || { echo "installing bench/device/wheels failed; see $biglog"; tail -n 30 "$biglog"; exit 3; }
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
tokenizer=minilm
[ -d bench/device/tokenizer ] && tokenizer=bench/device/tokenizer
gpu="$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -1)"
versions="$("$py" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'transformers', transformers.__version__)")"
echo "{\"gpu\": \"$gpu\", \"versions\": \"$versions\"}" | tee "$out"
log="$(mktemp)"
failed=0
bench() {  # bench SECONDS ARGS...: one run of bench/loop_overhead.py with a time limit; its log into $biglog
  local limit=$1
  shift
  timeout "$limit" "$py" bench/loop_overhead.py --tokenizer "$tokenizer" --device "${DEVICE:-cuda}" \
    --max-seq-length 128 --pad-to-max-length "$@" > "$log" 2>&1
  local status=$?
  # Progress bars ("loop:  50%|...") left out: they would fill the log.
  { echo "=== $* (exit $status)"; tr '\r' '\n' < "$log" | grep -v -E '^[^:{]*: *[0-9]+%\||^\s*$'; } >> "$biglog"
  return $status
}
if ! bench 240 --shape tiny --steps 5 --warmup 2 --repeats 1 --batch-size 8; then
  echo "{\"failed\": \"smoke run (--shape tiny)\"}" >> "$out"
  echo "the smoke run failed; its log:"
  tail -n 40 "$biglog"
  exit 2
fi
echo "smoke run passed: $(tail -n 1 "$log" | cut -c1-200)"
run() {  # run LIMIT ARGS...: one configuration, recorded in $out
  local limit=$1
  shift
  if [ -n "${ONLY:-}" ] && ! [[ " $* " =~ ${ONLY} ]]; then  # ONLY: a regular expression the arguments must match
    return
  fi
  if [ $((SECONDS - started + limit)) -gt "${DEADLINE:-540}" ]; then
    echo "{\"skipped\": \"$*\", \"why\": \"past DEADLINE\"}" | tee -a "$out"
    return
  fi
  if bench "$limit" --shape bert-base --repeats "${REPEATS:-3}" --no-inline "$@"; then
    grep '^{"shape"' "$log" | tail -n 1 >> "$out"
    grep '^median' "$log" | tail -n 1
  else
    echo "{\"failed\": \"$*\", \"exit\": $?}" | tee -a "$out"
    tail -n 15 "$log"
    failed=1
  fi
}
# Timed steps per run: a few seconds of GPU time each. On an H200 a step took about 50 ms at batch 32 in any precision
# (the host sets the pace), 90 ms at batch 256 in bf16 or fp16 and 210 ms in fp32; 300 steps at batch 32 ran past
# the 80 s limits.
run 100 --batch-size 32 --mixed-precision no --steps 100 --warmup 10
run 80 --batch-size 32 --mixed-precision bf16 --steps 100 --warmup 10
run 80 --batch-size 32 --mixed-precision fp16 --steps 100 --warmup 10
run 120 --batch-size 256 --mixed-precision no --steps 40 --warmup 5
run 90 --batch-size 256 --mixed-precision bf16 --steps 80 --warmup 5
run 90 --batch-size 256 --mixed-precision fp16 --steps 80 --warmup 5
# The same in bf16 with collation in two worker processes instead of the prefetch thread (TrainConfig.num_workers)
run 90 --batch-size 256 --mixed-precision bf16 --steps 80 --warmup 5 --num-workers 2
run 80 --batch-size 32 --mixed-precision bf16 --steps 100 --warmup 10 --num-workers 2
REPEATS=2 run 180 --batch-size 256 --mixed-precision bf16 --steps 80 --warmup 5 --compile
rm -f "$log"
echo "done in $((SECONDS - started)) s; results in $out, logs in $biglog"
exit "$failed"
