#!/bin/bash
# The GPU measurement of the training loop, prepared to run in one go on a machine with one CUDA GPU (about 5
# minutes on an H100): the BERT-base-shaped teacher (12 layers, 768; random weights from a config, no download) and
# the 4-layer/312 student, the intermediate step, batches padded to length 128, at batch 32 and 256 in fp32, bf16 and
# fp16, then bf16 at batch 256 with the student compiled. Each configuration's output goes to the terminal and its
# last line (bench/loop_overhead.py's JSON object, GPU utilisation included) to ${OUT:-runs}/gpu_loop.jsonl, which
# starts with the GPU's name, driver and torch; a configuration that fails is recorded as such and the rest still run.
#   bash bench/gpu_loop.sh            (STEPS=N REPEATS=N to change the timed steps and repeats)
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-runs}/gpu_loop.jsonl"
mkdir -p "$(dirname "$out")"
log="$(mktemp)"
gpu="$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -1)"
torch_version="$(python -c "import torch; print(torch.__version__, 'cuda', torch.version.cuda)")"
echo "{\"gpu\": \"$gpu\", \"torch\": \"$torch_version\"}" | tee "$out"
failed=0
run() {
  python bench/loop_overhead.py --shape bert-base --device cuda --max-seq-length 128 --pad-to-max-length \
    --steps "${STEPS:-200}" --warmup 10 --repeats "${REPEATS:-2}" "$@" > "$log" 2>&1
  local status=$?
  cat "$log"
  if [ "$status" -eq 0 ]; then
    tail -n 1 "$log" >> "$out"
  else
    echo "{\"failed\": \"$*\", \"exit\": $status}" >> "$out"
    failed=1
  fi
}
for batch in 32 256; do
  for precision in no bf16 fp16; do
    run --batch-size "$batch" --mixed-precision "$precision"
  done
done
run --batch-size 256 --mixed-precision bf16 --compile
rm -f "$log"
exit "$failed"
