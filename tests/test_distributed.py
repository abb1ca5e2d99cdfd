"""Two CPU processes (PyTorch DDP over gloo, set up by `accelerate`) through the real training loop."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "distributed_worker.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ranks(command: list[str], world_size: int, use_cpu_flag: bool) -> list[tuple[int, str]]:
    """Run ``command`` in ``world_size`` processes with the environment a launcher (torchrun, `accelerate launch`)
    gives each rank; returns each rank's exit status and output. ``use_cpu_flag``: also set ACCELERATE_USE_CPU=true,
    as `accelerate launch --cpu` does; without it the command must find the CPU process group itself."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("ACCELERATE_USE_CPU", None)
    if world_size > 1:
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE=str(world_size))
        if use_cpu_flag:
            env["ACCELERATE_USE_CPU"] = "true"
    processes = [
        subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env={**env, **({"RANK": str(r), "LOCAL_RANK": str(r)} if world_size > 1 else {})})
        for r in range(world_size)
    ]
    results = []
    for process in processes:
        try:
            output, _ = process.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            process.kill()
            output = "(killed after 300 s)\n" + process.communicate()[0]
        results.append((process.returncode, output))
    return results


def _launch(command: list[str], world_size: int, use_cpu_flag: bool) -> None:
    """:func:`_ranks`, checking that every rank exits 0 (the message holds every rank's output)."""
    results = _ranks(command, world_size, use_cpu_flag)
    assert all(code == 0 for code, _ in results), "\n".join(
        f"----- rank {rank}: exit {code} -----\n{output[-4000:]}" for rank, (code, output) in enumerate(results))


def _run(out: Path, batch_size: int, world_size: int) -> None:
    _launch([sys.executable, str(WORKER), str(out), str(batch_size)], world_size, use_cpu_flag=True)


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


def _general(out: Path, teacher: Path, corpus: Path, batch_size: int, world_size: int) -> None:
    """`run_distill.py distill --stage general` in ``world_size`` processes, launched as torchrun does (no
    ACCELERATE_USE_CPU: the command itself must join a CPU process group on a machine without CUDA)."""
    sets = ["general.student.preset=null", "general.student.num_hidden_layers=2", "general.student.hidden_size=16",
            "general.student.intermediate_size=32", "general.student.num_attention_heads=4", "general.max_seq_length=16",
            f"general.train={{max_steps: 4, batch_size: {batch_size}, save_steps: 2, log_steps: 1, "
            "learning_rate: 0.001, warmup_ratio: 0.0}"]
    command = [sys.executable, str(ROOT / "run_distill.py"), "distill", "--stage", "general", "--teacher", str(teacher),
               "--corpus", str(corpus), "--output-dir", str(out)] + [a for s in sets for a in ("--set", s)]
    _launch(command, world_size, use_cpu_flag=False)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU process group of a machine without CUDA")
def test_general_distillation_command_runs_on_two_processes(tmp_path):
    import json

    from transformers import BertModel, BertTokenizer

    from tests.conftest import SPECIAL, WORDS, tiny_bert_config

    torch.manual_seed(0)
    no_dropout = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    BertModel(tiny_bert_config(**no_dropout)).save_pretrained(tmp_path / "teacher")
    BertTokenizer(vocab={w: i for i, w in enumerate(SPECIAL + WORDS)}).save_pretrained(tmp_path / "teacher")
    corpus = tmp_path / "corpus.txt"
    # Every sentence packs alone into one 7-token sequence: equal lengths, so per-rank means average exactly.
    corpus.write_text("\n\n".join(["the movie was very good", "the plot was not fun", "a great film , bad"] * 12))
    _general(tmp_path / "ddp", tmp_path / "teacher", corpus, batch_size=4, world_size=2)
    _general(tmp_path / "single", tmp_path / "teacher", corpus, batch_size=8, world_size=1)
    ddp, single = tmp_path / "ddp" / "general", tmp_path / "single" / "general"
    record = json.loads((ddp / "stage.json").read_text())
    assert record["steps"] == 4 and record["samples"] == 32  # 4 steps x 4 sequences x 2 processes
    log = [json.loads(line) for line in (ddp / "log.jsonl").read_text().splitlines()]
    assert len(log) == 4  # one process writes the log
    assert log[-1]["loss"] < log[0]["loss"]  # it trained: the student moved towards the teacher
    a, b = load_file(ddp / "model.safetensors"), load_file(single / "model.safetensors")
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-5, msg=name)
    torch.testing.assert_close(load_file(ddp / "projections.safetensors")["hidden.weight"],
                               load_file(single / "projections.safetensors")["hidden.weight"], rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU process group of a machine without CUDA")
def test_the_pipeline_on_two_processes_times_and_writes_its_report_once(tmp_path):
    """Under `accelerate launch` every process runs the job; only the main one times the models and writes the
    report, the ONNX file and the card, and the others build their report from its stored timing instead of timing
    again. The training stages are made first in one process, so that the two processes run exactly the report and
    what ships."""
    import json
    import shutil

    import yaml
    from transformers import BertTokenizer

    import run_distill
    from tests.conftest import SPECIAL, WORDS, tiny_bert, tiny_job
    from tests.glue_fixtures import write_glue_folder

    tokenizer = BertTokenizer(vocab={w: i for i, w in enumerate(SPECIAL + WORDS)})
    path = tiny_job(tmp_path, tiny_bert(), tokenizer, task={"data_dir": str(write_glue_folder(tmp_path, "sst2"))},
                    export={"onnx": True, "int8": False})
    job = yaml.safe_load(open(path))
    out = Path(job["output_dir"])
    assert run_distill.main(["pipeline", "--config", path]) == 0
    for made in ("report.json", "report.md", "run.log", "student/README.md"):
        (out / made).unlink()
    shutil.rmtree(out / "student" / "onnx")
    (main_code, main_output), (other_code, other_output) = _ranks(
        [sys.executable, str(ROOT / "run_distill.py"), "pipeline", "--config", path], 2, use_cpu_flag=True)
    assert main_code == other_code == 0, main_output[-3000:] + other_output[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["student"]["timing"]["reused"] is False  # timed once, by the main process, and written once
    assert (out / "student" / "onnx" / "model.onnx").is_file() and (out / "student" / "README.md").is_file()
    # The main process timed the models; the other reused that timing (its log says so), timing nothing itself.
    assert "these models were timed" not in main_output and "these models were timed" in other_output
    assert (out / "run.log").read_text().count("these models were timed") == 1


def _stage_records(out: Path) -> dict[str, dict]:
    import json

    return {str(path.parent.relative_to(out)): json.loads(path.read_text()) for path in sorted(out.rglob("stage.json"))}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU process group of a machine without CUDA")
def test_every_stage_of_the_pipeline_runs_on_two_processes_and_resumes(tmp_path):
    """Two processes from an empty folder through every stage (a teacher fine-tuned, adapt-mlm, augmentation,
    general distillation, both steps, the report): the main process alone writes each stage's files, the other waits
    for its record; run again, every stage is found finished."""
    import json

    from transformers import BertTokenizer

    from tests.conftest import SPECIAL, WORDS, tiny_job_every_stage

    path = tiny_job_every_stage(tmp_path, BertTokenizer(vocab={w: i for i, w in enumerate(SPECIAL + WORDS)}))
    command = [sys.executable, str(ROOT / "run_distill.py"), "pipeline", "--config", path]
    _launch(command, 2, use_cpu_flag=True)
    out = tmp_path / "run"
    records = _stage_records(out)
    assert {"teacher", "mlm", "augmented", "student_intermediate", "teacher_logits", "student"} <= set(records)
    assert records["augmented"]["num_processes"] == 2  # shared out: the record says by how many
    assert not [p for p in tmp_path.rglob("failed.json")]
    # started.json is written once, by the main process: a second writer would find the first's and say "resumed"
    assert not [name for name, record in records.items() if record.get("resumed")]
    general = json.loads((out / "general.json").read_text())
    assert general["run_id"] != "none" and (Path(general["folder"]) / "stage.json").is_file()
    assert not list(Path(general["folder"]).parent.glob("*.holder"))  # the lock's holder file went with the lock
    assert json.loads((out / "report.json").read_text())["student"]["timing"]["reused"] is False
    assert (out / "student" / "README.md").is_file() and (out / "student" / "onnx" / "model.onnx").is_file()
    _launch(command, 2, use_cpu_flag=True)
    assert _stage_records(out) == records  # nothing ran again, nothing was rewritten


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU process group of a machine without CUDA")
def test_a_stage_failing_in_the_main_process_stops_the_other_with_its_error(tmp_path):
    """The main process refuses the teacher (its guard-rail) in a stage it runs alone; the other process, waiting for
    that stage's record, stops with the main process's error instead of waiting for ever."""
    import yaml
    from transformers import BertTokenizer

    from tests.conftest import SPECIAL, WORDS, tiny_bert, tiny_job
    from tests.glue_fixtures import write_glue_folder

    tokenizer = BertTokenizer(vocab={w: i for i, w in enumerate(SPECIAL + WORDS)})
    path = tiny_job(tmp_path, tiny_bert(), tokenizer, task={"data_dir": str(write_glue_folder(tmp_path, "sst2"))},
                    teacher={"min_dev_metric": 1.5})
    assert yaml.safe_load(open(path))["teacher"]["min_dev_metric"] == 1.5  # no teacher reaches it
    (main_code, main_output), (other_code, other_output) = _ranks(
        [sys.executable, str(ROOT / "run_distill.py"), "pipeline", "--config", path], 2, use_cpu_flag=True)
    assert main_code == 2 and "min_dev_metric" in main_output, main_output[-3000:]
    assert other_code == 2, other_output[-3000:]
    assert "process 0 of this launch stopped in this stage" in other_output and "min_dev_metric" in other_output
    assert not (tmp_path / "run" / "teacher" / "stage.json").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU process group of a machine without CUDA")
def test_two_processes_share_the_augmentation_and_make_the_set_one_process_makes(tmp_path):
    """Each process writes its share of the augmented shards with its own masked LM; every example draws from its own
    RNG, so the set is the one a single process makes, row for row."""
    import yaml
    from transformers import BertTokenizer

    from augment import load_shards
    from tests.conftest import SPECIAL, WORDS, tiny_bert, tiny_job, tiny_masked_lm, tiny_vectors
    from tests.glue_fixtures import write_glue_folder

    tokenizer = BertTokenizer(vocab={w: i for i, w in enumerate(SPECIAL + WORDS)})
    masked_lm = tmp_path / "masked_lm"
    tiny_masked_lm().save_pretrained(masked_lm)
    tokenizer.save_pretrained(masked_lm)
    tiny_vectors().save(str(tmp_path / "vectors.kv"))
    path = tiny_job(tmp_path, tiny_bert(), tokenizer, task={"data_dir": str(write_glue_folder(tmp_path, "sst2"))},
                    mlm={"model": str(masked_lm)},
                    augment={"enabled": True, "num_copies": 3, "max_examples": 10, "shard_size": 2,
                             "word_vectors": str(tmp_path / "vectors.kv")})
    command = [sys.executable, str(ROOT / "run_distill.py"), "pipeline", "--config", path, "--output-dir"]
    results = _ranks([*command, str(tmp_path / "two")], 2, use_cpu_flag=True)
    assert all(code == 0 for code, _ in results), [output[-3000:] for _, output in results]
    for rank, (_, output) in enumerate(results):
        assert f"augmentation: process {rank} of 2 writes {3 if rank == 0 else 2} of the shards" in output
    _launch([*command, str(tmp_path / "one")], 1, use_cpu_flag=False)
    two, one = (load_shards(tmp_path / name / "augmented").to_list() for name in ("two", "one"))
    assert len(two) == len(one) > 12 and two == one
    assert sum(row["is_augmented"] for row in one) > 0
