#!/bin/bash
# The GPU measurement of the training loop, prepared to run in one go on a machine with one CUDA GPU (about 5
# minutes on an H100): the BERT-base-shaped teacher (12 layers, 768; random weights from a config, no download) and
# the 4-layer/312 student, the intermediate step, batches padded to length 128, at batch 32 and 256 in fp32, bf16 and
# fp16, then bf16 at batch 256 with the student compiled. Each line of results is bench/loop_overhead.py's last line
# (a JSON object, GPU utilisation included), appended to ${OUT:-runs}/gpu_loop.jsonl; the GPU's name and driver first.
#   bash bench/gpu_loop.sh            (STEPS=N REPEATS=N to change the timed steps and repeats)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-runs}/gpu_loop.jsonl"
mkdir -p "$(dirname "$out")"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "${out%.jsonl}.gpu.txt"
python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" | tee -a "${out%.jsonl}.gpu.txt"
run() {
  python bench/loop_overhead.py --shape bert-base --device cuda --max-seq-length 128 --pad-to-max-length \
    --steps "${STEPS:-60}" --warmup 10 --repeats "${REPEATS:-2}" "$@" | tee /dev/stderr | tail -1 >> "$out"
}
for batch in 32 256; do
  for precision in no bf16 fp16; do
    run --batch-size "$batch" --mixed-precision "$precision"
  done
done
run --batch-size 256 --mixed-precision bf16 --compile
