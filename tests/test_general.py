"""General distillation: corpus packing, the packed-corpus cache, the `distill --stage general` command, and the
hand-over of its student and projections to task distillation."""

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModel, AutoModelForSequenceClassification, BertModel

from distill.method.checkpoint import CheckpointError
from distill.job.corpus import load_packed_corpus, pack_lines
from distill.tasks import DataError
from distill.method.objective import DistillationObjective
from distill.job.stage_distill import load_projections
from tests.conftest import tiny_bert, tiny_bert_config

ROOT = Path(__file__).resolve().parents[1]


def _decode(tokenizer, ids):
    return tokenizer.decode(ids)


def test_packing_fills_sequences_within_a_document_and_never_crosses_one(tiny_tokenizer):
    lines = ["the movie was good", "the plot was fun", "it was fine", "", "a great film",
             "very very very very very very very good"]
    packed = pack_lines(lines, tiny_tokenizer, max_seq_length=10)["input_ids"]
    texts = [_decode(tiny_tokenizer, ids) for ids in packed]
    assert texts == [
        "[CLS] the movie was good the plot was fun [SEP]",  # 8 pieces fit in 10 - 2
        "[CLS] it was fine [SEP]",  # the document ends: not joined with "a great film"
        "[CLS] a great film [SEP]",  # 3 + 8 pieces do not fit: the long sentence starts a new sequence
        "[CLS] very very very very very very very good [SEP]",
    ]
    cut = pack_lines(["very very very very very very very good"], tiny_tokenizer, max_seq_length=6)["input_ids"]
    assert [_decode(tiny_tokenizer, ids) for ids in cut] == [
        "[CLS] very very very very [SEP]", "[CLS] very very very good [SEP]"]  # too long for one sequence: cut
    assert all(len(ids) <= 6 for ids in cut)


def test_packing_uses_the_tokenizers_own_frame(tiny_roberta_tokenizer):
    (ids,) = pack_lines(["the movie was good", "the cast was great"], tiny_roberta_tokenizer, 32)["input_ids"]
    assert ids[0] == tiny_roberta_tokenizer.bos_token_id and ids[-1] == tiny_roberta_tokenizer.eos_token_id
    assert tiny_roberta_tokenizer.decode(ids[1:-1]).replace(" ", "") == "themoviewasgoodthecastwasgreat"


def _write_corpus(folder: Path) -> list[str]:
    first = folder / "a.txt.gz"
    with gzip.open(first, "wt", encoding="utf-8") as f:
        f.write("the movie was good\nthe plot was fun\n\nit was a great film\n")
    second = folder / "b.txt"
    second.write_text("the cast was boring\nnot a fun story\n", encoding="utf-8")
    return [str(first), str(second)]


def test_streamed_corpus_equals_the_saved_one_and_the_cache_knows_its_source(tmp_path, tiny_tokenizer):
    files = _write_corpus(tmp_path)
    saved = load_packed_corpus(files, tiny_tokenizer, 12, cache_dir=tmp_path / "corpus", cache_id="one")
    texts = [_decode(tiny_tokenizer, ids) for ids in saved["input_ids"]]
    # Each file ends a document: "it was a great film" is not joined with the next file's first line.
    assert texts == ["[CLS] the movie was good the plot was fun [SEP]", "[CLS] it was a great film [SEP]",
                     "[CLS] the cast was boring not a fun story [SEP]"]
    streamed = load_packed_corpus(files, tiny_tokenizer, 12, streaming=True)
    assert [row["input_ids"] for row in streamed] == saved["input_ids"]
    again = load_packed_corpus(files, tiny_tokenizer, 12, cache_dir=tmp_path / "corpus", cache_id="one")
    assert again["input_ids"] == saved["input_ids"]
    with pytest.raises(CheckpointError, match="another run"):
        load_packed_corpus(files, tiny_tokenizer, 16, cache_dir=tmp_path / "corpus", cache_id="two")
    with pytest.raises(DataError, match="not found"):
        load_packed_corpus([str(tmp_path / "missing.txt")], tiny_tokenizer, 12)


def test_the_general_run_id_follows_the_corpus_text_not_its_path_or_file_times(tmp_path):
    # A 46-minute general stage is found again when the same corpus is copied, downloaded anew or named another
    # way; a changed word makes another stage.
    from distill.config import GeneralConfig
    from distill.job.general import general_run_id

    (tmp_path / "first").mkdir()
    (tmp_path / "second").mkdir()
    files = _write_corpus(tmp_path / "first")
    copies = [tmp_path / "second" / Path(f).name for f in files]
    for source, copy in zip(files, copies):
        copy.write_bytes(Path(source).read_bytes())
        os.utime(copy, ns=(1, 1))  # another modification time
    first = general_run_id(GeneralConfig(teacher="minilm", corpus=files))
    assert general_run_id(GeneralConfig(teacher="minilm", corpus=[str(c) for c in copies])) == first
    relative = [os.path.relpath(f) for f in files]
    assert general_run_id(GeneralConfig(teacher="minilm", corpus=relative)) == first
    copies[1].write_text("the cast was boring\nnot a good story\n", encoding="utf-8")
    changed = general_run_id(GeneralConfig(teacher="minilm", corpus=[str(c) for c in copies]))
    assert changed[0] != first[0] and changed[1] != first[1]
    swapped = general_run_id(GeneralConfig(teacher="minilm", corpus=files[::-1]))  # the order packs other sequences
    assert swapped[0] != first[0]
    assert general_run_id(GeneralConfig(teacher="minilm", corpus=files, max_seq_length=64))[0] != first[0]
    # A hub dataset counts by its name (nothing is downloaded to name it).
    hub = [general_run_id(GeneralConfig(teacher="minilm", corpus=[name]))[0] for name in ("wikitext:a", "wikitext:b")]
    assert hub[0] != hub[1]
    # A hub corpus's text column decides the packed text (its default leaves the ids as they were).
    column = general_run_id(GeneralConfig(teacher="minilm", corpus=["wikitext:a"], corpus_column="content"))
    assert column[1] != general_run_id(GeneralConfig(teacher="minilm", corpus=["wikitext:a"]))[1]


@pytest.fixture(scope="module")
def general_run(tmp_path_factory):
    """`distill --stage general` through the real CLI: a tiny pre-trained encoder saved to disk teaches a smaller
    student on a text file for a few steps."""
    from tests.conftest import SPECIAL, WORDS
    from transformers import BertTokenizer

    root = tmp_path_factory.mktemp("general")
    torch.manual_seed(0)
    BertModel(tiny_bert_config()).save_pretrained(root / "teacher")
    BertTokenizer(vocab={w: i for i, w in enumerate(SPECIAL + WORDS)}).save_pretrained(root / "teacher")
    corpus = root / "corpus.txt"
    sentences = ["the movie was good", "the plot was fun .", "a great film , not boring !", "the cast was fine",
                 "it is a very bad story", ""]
    corpus.write_text("\n".join(sentences * 20), encoding="utf-8")
    student = ["--set", "general.student.preset=null", "--set", "general.student.num_hidden_layers=2",
               "--set", "general.student.hidden_size=16", "--set", "general.student.intermediate_size=32",
               "--set", "general.student.num_attention_heads=4", "--set", "general.max_seq_length=16",
               "--set", "general.train={max_steps: 12, batch_size: 8, learning_rate: 0.002, save_steps: 6, "
               "log_steps: 1, warmup_ratio: 0.0}"]
    command = [sys.executable, str(ROOT / "run_distill.py"), "distill", "--stage", "general", "--teacher",
               str(root / "teacher"), "--corpus", str(corpus), "--output-dir", str(root / "run"), *student]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=root)
    assert result.returncode == 0, result.stderr[-3000:]
    return root, result, command


def test_general_distillation_learns_and_saves_a_student_encoder(general_run):
    root, result, _ = general_run
    out = root / "run" / "general"
    record = json.loads((out / "stage.json").read_text())
    assert record["steps"] == 12 and record["layer_map"] == [0, 1, 2]
    assert record["seconds"] > 0 and record["resumed"] is False
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [entry["step"] for entry in log] == list(range(1, 13))
    assert "loss/prediction" not in log[0]  # no prediction term in general distillation
    first, last = log[0], log[-1]
    for term in ("loss/hidden", "loss/attention"):
        assert last[term] < 0.8 * first[term], term  # the student learns to imitate the teacher
    student = AutoModel.from_pretrained(out)
    assert isinstance(student, BertModel) and student.config.hidden_size == 16
    projections = load_file(out / "projections.safetensors")
    assert projections["embedding.weight"].shape == projections["hidden.weight"].shape == (32, 16)
    assert (out / "corpus" / "stage.json").exists() and not (out / "checkpoints").exists()
    assert f"pipeline --student {out}" in result.stdout


def test_general_student_and_projections_start_task_distillation(general_run):
    root, _, _ = general_run
    out = root / "run" / "general"
    student = AutoModelForSequenceClassification.from_pretrained(out, num_labels=2)
    encoder = AutoModel.from_pretrained(out)
    for name, value in encoder.state_dict().items():
        if not name.startswith("pooler"):
            assert torch.equal(student.bert.state_dict()[name], value), name
    objective = DistillationObjective(tiny_bert(), student, {"embedding": 1, "hidden": 1}, [1, 2])
    assert load_projections(objective, out)
    saved = load_file(out / "projections.safetensors")
    assert torch.equal(objective.projection("hidden").weight, saved["hidden.weight"])
    # Projections of another shape are not forced in: the objective keeps new ones.
    other = DistillationObjective(tiny_bert(), tiny_bert(hidden_size=8, intermediate_size=16), {"hidden": 1}, [1, 2])
    assert not load_projections(other, out)


def test_rerun_of_a_finished_general_distillation_is_skipped_and_another_config_refused(general_run):
    root, _, command = general_run
    weights = root / "run" / "general" / "model.safetensors"
    before = weights.stat().st_mtime_ns
    again = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=root)
    assert again.returncode == 0 and "done (12 steps), skipping" in again.stderr
    # Another layer map is another run: refused with the folder named, nothing overwritten.
    result = subprocess.run([*command, "--set", "general.layer_map=last"], capture_output=True, text=True,
                            timeout=300, cwd=root)
    assert result.returncode == 2 and "another run" in result.stderr
    assert (root / "run" / "general" / "model.safetensors").stat().st_mtime_ns == before
    # A layer map that does not fit the student is a one-line error naming the field, before any work.
    other = [*command[:command.index("--output-dir")], "--output-dir", str(root / "other"),
             *command[command.index("--output-dir") + 2:], "--set", "general.layer_map=[1]"]
    result = subprocess.run(other, capture_output=True, text=True, timeout=300, cwd=root)
    assert result.returncode == 2 and "error: general.layer_map: " in result.stderr
    assert "Traceback" not in result.stderr and not (root / "other" / "general" / "corpus").exists()


# One process of a launch around the general stage's lock: "ready", then "entered <time>" inside it. The main process
# stays in until the other is in too, as general_stage's barrier at the start of the block keeps it.
_LOCK_TAKER = """
import signal, sys, time
from pathlib import Path
from distill.job.general import exclusive
signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C, even where the launching shell ignores SIGINT
folder, rank = Path(sys.argv[1]), sys.argv[2]
other_in = folder.with_name("other-entered")
print("ready", flush=True)
with exclusive(folder):
    print("entered", time.time(), flush=True)
    if rank == "1":
        other_in.touch()
    deadline = time.time() + 60
    while not other_in.exists():
        if time.time() > deadline:
            sys.exit("the other process did not go in while the main one held the lock")
        time.sleep(0.05)
"""


@pytest.fixture
def lock_takers():
    """Starts the main process (rank 0) and another (rank 1) of one launch, each past its imports and about to take
    the lock; whatever the test's outcome, none is left running."""
    started = []

    def start(folder: Path) -> list[subprocess.Popen]:
        takers = [subprocess.Popen([sys.executable, "-c", _LOCK_TAKER, str(folder), str(rank)],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   cwd=Path(__file__).parent.parent, env={**os.environ, "RANK": str(rank)})
                  for rank in (0, 1)]
        started.extend(takers)
        for taker in takers:
            assert taker.stdout.readline().strip() == "ready"
        return takers

    yield start
    for taker in started:
        if taker.poll() is None:
            taker.kill()
            taker.wait()


def _waits_for_flock(pid: int) -> None:
    """Return once process ``pid`` is blocked waiting for a flock (a "->" line of /proc/locks)."""
    import time

    deadline = time.time() + 60
    while not any(line.split()[1:3] == ["->", "FLOCK"] and line.split()[5] == str(pid)
                  for line in Path("/proc/locks").read_text().splitlines()):
        assert time.time() < deadline, f"process {pid} never waited for the lock"
        time.sleep(0.05)


@pytest.mark.skipif(not Path("/proc/locks").exists(), reason="reads the kernel's table of waiting locks")
def test_the_cache_lock_is_the_main_processs_and_the_others_wait_for_it_by_reading(tmp_path, monkeypatch,
                                                                                   lock_takers):
    """Under `accelerate launch` the main process holds the general stage's lock for all of the job's processes (a
    second process's own lock would wait for the main one, which waits for it inside the stage); the others wait
    until the main one holds it, by reading its holder file, not at a collective barrier, which would time out after
    30 minutes while another job holds the lock. An earlier launch's holder file lets nobody through, and a main
    process stopped while waiting for the lock stops the others with its error."""
    import fcntl
    import signal
    import time

    from distill.method import processes

    folder = tmp_path / "cache" / "minilm-4l312-x"
    folder.parent.mkdir(parents=True)
    for name, value in {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29517",
                        "TORCHELASTIC_RUN_ID": "none"}.items():
        monkeypatch.setenv(name, value)
    holder = folder.with_name(folder.name + ".holder")
    holder.write_text(json.dumps(processes.launch_marker(entry=1)))  # this rendezvous's, but an earlier launch's
    os.utime(holder, (time.time() - 3600,) * 2)
    with open(folder.with_name(folder.name + ".lock"), "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # another job holds the lock
        takers = lock_takers(folder)
        _waits_for_flock(takers[0].pid)
        time.sleep(3.0)  # long enough for the other to have gone in, were it not waiting
        released = time.time()
        fcntl.flock(handle, fcntl.LOCK_UN)
        outputs = [taker.communicate(timeout=120) for taker in takers]
    # Both went in after the other job let go, and together: the other while the main one held the lock.
    assert [taker.returncode for taker in takers] == [0, 0], [err for _, err in outputs]
    assert min(float(out.split()[-1]) for out, _ in outputs) >= released
    assert not holder.exists()  # the main process's holder file went with its lock

    # The main process stopped (Ctrl-C) while the lock is held elsewhere: the other stops with its rank and error.
    monkeypatch.setenv("MASTER_PORT", "29518")
    with open(folder.with_name(folder.name + ".lock"), "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        main, other = lock_takers(folder)
        _waits_for_flock(main.pid)
        main.send_signal(signal.SIGINT)
        _, main_err = main.communicate(timeout=120)
        _, other_err = other.communicate(timeout=120)
    assert main.returncode != 0 and "KeyboardInterrupt" in main_err
    assert other.returncode != 0
    assert "ProcessFailedError" in other_err and "process 0 of this launch stopped" in other_err
    assert "KeyboardInterrupt" in other_err.splitlines()[-1]


def test_the_holder_file_of_an_earlier_entry_lets_nobody_through(tmp_path, monkeypatch):
    """A sweep enters the general stage's lock once per student: a process that arrives at the next entry while the
    main process has not yet removed the previous entry's holder file must not take it for this one's."""
    from distill.job.general import _held
    from distill.method.processes import launch_marker

    monkeypatch.setenv("MASTER_PORT", "29519")
    holder = tmp_path / "minilm-4l312-x.holder"
    holder.write_text(json.dumps(launch_marker(entry=1)))
    assert _held(holder, 1)["entry"] == 1
    assert _held(holder, 2) is None
    monkeypatch.setenv("MASTER_PORT", "29520")  # another launch's file
    assert _held(holder, 1) is None
