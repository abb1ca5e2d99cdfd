"""Two CPU processes (PyTorch DDP over gloo, set up by `accelerate`) through the real training loop."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "distributed_worker.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(out: Path, batch_size: int, world_size: int) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if world_size > 1:
        # What `accelerate launch --cpu --num_processes 2` sets for each process.
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE=str(world_size),
                   ACCELERATE_USE_CPU="true")
    processes = [
        subprocess.Popen([sys.executable, str(WORKER), str(out), str(batch_size)], cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True,
                         env={**env, **({"RANK": str(r), "LOCAL_RANK": str(r)} if world_size > 1 else {})})
        for r in range(world_size)
    ]
    for process in processes:
        output, _ = process.communicate(timeout=300)
        assert process.returncode == 0, output[-3000:]


def test_two_ranks_agree_and_match_one_process_on_the_same_global_batch(tmp_path):
    _run(tmp_path / "ddp", batch_size=4, world_size=2)  # 2 processes x 4 examples
    _run(tmp_path / "single", batch_size=8, world_size=1)  # 1 process x 8 examples: the same global batches
    with safe_open(str(tmp_path / "ddp" / "rank0.safetensors"), "pt") as f:
        assert f.metadata() == {"world_size": "2", "step": "4", "samples": "32"}
    rank0, rank1 = (load_file(tmp_path / "ddp" / f"rank{r}.safetensors") for r in (0, 1))
    single = load_file(tmp_path / "single" / "rank0.safetensors")
    initial = load_file(tmp_path / "single" / "initial.safetensors")
    assert rank0.keys() == rank1.keys() == single.keys() == initial.keys()
    for name in rank0:
        assert torch.equal(rank0[name], rank1[name]), name  # gradients were all-reduced: ranks stay identical
        torch.testing.assert_close(rank0[name], single[name], rtol=1e-4, atol=1e-5, msg=name)
    moved = [n for n in single if n.startswith("student.") and not torch.equal(initial[n], single[n])]
    assert len(moved) > 10 and not torch.equal(initial["projections.hidden.weight"], single["projections.hidden.weight"])
