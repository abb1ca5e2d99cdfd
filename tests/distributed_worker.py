"""One rank of the two-process test (tests/test_distributed.py): a few steps of the real loop, weights saved.

Usage: python tests/distributed_worker.py OUTPUT_DIR BATCH_SIZE
Run with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT and ACCELERATE_USE_CPU=true set, as
`accelerate launch --cpu --num_processes 2` sets them (a CPU process group, gloo), or without them for the
single-process reference.
"""

import sys
from pathlib import Path

import datasets
import torch
from accelerate import PartialState
from safetensors.torch import save_file
from transformers import DataCollatorWithPadding

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from distill.config import TrainConfig  # noqa: E402
from distill.method.objective import DistillationObjective  # noqa: E402
from distill.method.trainer import train  # noqa: E402
from tests.conftest import SPECIAL, WORDS, tiny_bert  # noqa: E402

NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, classifier_dropout=0.0)


def data(num_examples: int = 32, length: int = 6) -> datasets.Dataset:
    """Equal lengths: the mean over a global batch equals the mean of the per-rank means."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(5, len(SPECIAL) + len(WORDS), (num_examples, length), generator=generator).tolist()
    return datasets.Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * length] * num_examples,
                                       "labels": [i % 2 for i in range(num_examples)]})


def main() -> None:
    output_dir, batch_size = Path(sys.argv[1]), int(sys.argv[2])
    output_dir.mkdir(parents=True, exist_ok=True)
    from transformers import BertTokenizer

    tokenizer = BertTokenizer(vocab={w: i for i, w in enumerate(SPECIAL + WORDS)})
    teacher = tiny_bert(seed=0, **NO_DROPOUT)
    student = tiny_bert(seed=1, hidden_size=16, intermediate_size=32, **NO_DROPOUT)
    torch.manual_seed(2)  # projections
    objective = DistillationObjective(teacher, student, {"embedding": 1, "hidden": 1, "attention": 1, "prediction": 1},
                                      [1, 2])
    process = PartialState(cpu=True)  # the process group train() joins (gloo on CPU when WORLD_SIZE > 1)
    if process.is_main_process:
        save_file({k: v.contiguous() for k, v in objective.trainable.state_dict().items()},
                  output_dir / "initial.safetensors")
    config = TrainConfig(max_steps=4, batch_size=batch_size, learning_rate=1e-3, warmup_ratio=0.0, save_steps=2,
                         log_steps=1, seed=3)
    state = train(objective, data(), DataCollatorWithPadding(tokenizer), config, output_dir / "run", "ddp-test")
    weights = {k: v.contiguous() for k, v in objective.trainable.state_dict().items()}
    save_file(weights, output_dir / f"rank{process.process_index}.safetensors",
              metadata={"world_size": str(process.num_processes), "step": str(state.step),
                        "samples": str(state.samples)})
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()  # a gloo group left to the exit's destructors can abort the rank


if __name__ == "__main__":
    main()
