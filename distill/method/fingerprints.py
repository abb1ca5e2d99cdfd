"""What a run's inputs hold, as short hashes: the bytes of local data files and model folders.

A stage's run id (:mod:`distill.job.stages`) covers the config fields it reads. A field that names a local file or folder
(``task.data_dir``, ``teacher.model``, ...) enters it by the SHA-256 of the bytes it names, not by its spelling: edit
a CSV, or retrain a teacher into the same folder, and the stages that read it run again; copy or move the same files
elsewhere and their finished outputs are found again. A name that is not a local path (a hub model or data set, the
bundled ``minilm``, the bundled SST-2 sample) counts by its name, as before, so outputs of those keep their run ids.

Each file is read once per process in 1 MiB blocks (about a second per GB) and remembered while its size and
modification time stay the same. Which files of a task's data folder count is the task's to say
(:func:`distill.job.stages.data_folder_content`); this module hashes what it is given and knows no task.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path
from typing import Any

# Parts of a model or data folder that do not change what is loaded from it: a pipeline stage's bookkeeping, its
# training checkpoints and logs, set-aside outputs, the model card and exported copies.
IGNORED_NAMES = frozenset({"stage.json", "started.json", "run.log", "log.jsonl", "README.md", "checkpoints",
                           "tensorboard", "best", "superseded", "onnx"})


@functools.lru_cache(maxsize=256)
def _file_sha256(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_sha256(path: str | Path) -> str:
    """SHA-256 (64 hex digits) of a file's bytes; remembered for the process while its size and mtime stay the same.

    Raises:
        OSError: the file cannot be read.
    """
    resolved = Path(path).resolve()
    stat = resolved.stat()
    return _file_sha256(str(resolved), stat.st_size, stat.st_mtime_ns)


def _folder_files(folder: Path) -> list[Path]:
    """The files of ``folder`` that a loader reads, recursively, in a stable order (hidden and
    :data:`IGNORED_NAMES` entries left out)."""
    files = []
    for path in sorted(folder.iterdir()):
        if path.name.startswith(".") or path.name in IGNORED_NAMES or path.name.endswith(".lock"):
            continue
        files.extend(_folder_files(path) if path.is_dir() else [path] if path.is_file() else [])
    return files


def content_digest(path: str | Path, names: list[str] | None = None) -> str:
    """16 hex digits identifying the bytes at ``path``: a file's SHA-256, or for a folder the SHA-256 of its files'
    relative paths and SHA-256s (``names``: only these files of the folder; default every file but
    :data:`IGNORED_NAMES`). The same bytes anywhere give the same digest.

    Raises:
        FileNotFoundError: ``path`` (or one of ``names``) does not exist.
    """
    path = Path(path)
    if path.is_file():
        return file_sha256(path)[:16]
    if not path.is_dir():
        raise FileNotFoundError(f"{path} does not exist")
    files = [path / name for name in names] if names is not None else _folder_files(path)
    lines = [f"{file.relative_to(path).as_posix()}\0{file_sha256(file)}" for file in files if file.is_file()]
    missing = [str(file) for file in files if not file.is_file()]
    if missing:
        raise FileNotFoundError(f"{missing[0]} does not exist")
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


def is_local(value: Any) -> bool:
    """Whether a config value names an existing local file or folder (as opposed to a hub name, a bundled name such
    as ``minilm`` or ``bundled``, or nothing)."""
    return isinstance(value, str) and bool(value) and Path(value).exists()


def content_or_name(value: Any, names: list[str] | None = None) -> Any:
    """``"sha256:<digest>"`` of a local file or folder (:func:`content_digest`); any other value as it is."""
    return f"sha256:{content_digest(value, names)}" if is_local(value) else value
