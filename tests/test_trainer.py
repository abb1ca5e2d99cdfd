"""The training loop: exact resume, run-id checks, non-finite losses."""

import dataclasses
import json
import threading

import datasets
import pytest
import torch
from transformers import DataCollatorWithPadding

from distill.method.checkpoint import CheckpointError
from distill.config import ConfigError, TrainConfig
from distill.method.objective import DistillationObjective, ModelLossObjective
from distill.method.trainer import EpochBatchSampler, NonFiniteLossError, example_lengths, train
from tests.conftest import tiny_bert


def _data(n=24):
    generator = torch.Generator().manual_seed(0)
    rows = []
    for i in range(n):
        length = 4 + i % 5
        rows.append({"input_ids": torch.randint(5, 30, (length,), generator=generator).tolist(),
                     "attention_mask": [1] * length, "labels": i % 2})
    return datasets.Dataset.from_list(rows)


class _Pad:
    """Pads input_ids/attention_mask; optionally raises after ``fail_after`` batches (a simulated kill)."""

    def __init__(self, tokenizer, fail_after=None):
        self.collate, self.calls, self.fail_after = DataCollatorWithPadding(tokenizer), 0, fail_after

    def __call__(self, rows):
        self.calls += 1
        if self.fail_after is not None and self.calls > self.fail_after:
            raise KeyboardInterrupt("simulated kill")
        return self.collate(rows)


def _distill_objective():
    teacher = tiny_bert(seed=0)
    student = tiny_bert(seed=1, hidden_size=16, intermediate_size=32).train()
    return DistillationObjective(teacher, student, {"embedding": 1, "hidden": 1, "attention": 1, "prediction": 1}, [1, 2])


def test_resume_after_interruption_gives_the_same_weights(tmp_path, tiny_tokenizer):
    config = TrainConfig(max_steps=8, batch_size=5, learning_rate=1e-3, save_steps=3, log_steps=1, seed=5)
    reference = _distill_objective()
    train(reference, _data(), _Pad(tiny_tokenizer), config, tmp_path / "a", "run")

    interrupted = _distill_objective()
    with pytest.raises(KeyboardInterrupt):
        train(interrupted, _data(), _Pad(tiny_tokenizer, fail_after=4), config, tmp_path / "b", "run")
    assert sorted(p.name for p in (tmp_path / "b" / "checkpoints").iterdir()) == ["step-000003"]
    saved = json.loads((tmp_path / "b" / "checkpoints" / "step-000003" / "state.json").read_text())
    assert saved["run_id"] == "run" and saved["state"]["step"] == 3 and saved["config"]["save_steps"] == 3
    resumed = _distill_objective()  # a fresh process would rebuild everything from scratch
    state = train(resumed, _data(), _Pad(tiny_tokenizer), config, tmp_path / "b", "run")
    assert state.step == 8 and state.epoch == 1  # 24 examples / 5 = 5 batches an epoch
    for (name, a), (_, b) in zip(reference.trainable.state_dict().items(), resumed.trainable.state_dict().items()):
        assert torch.equal(a, b), name
    lines = (tmp_path / "b" / "log.jsonl").read_text().splitlines()
    # Steps 1-3 kept from before the kill (step 4 was logged but not checkpointed: dropped), 4-8 after.
    assert [json.loads(line)["step"] for line in lines] == list(range(1, 9))
    assert '"loss/attention"' in lines[0] and '"samples_per_s"' in lines[0]


def test_streamed_data_resumes_at_the_same_position(tmp_path, tiny_tokenizer):
    """A streamed dataset (read in order, no length) resumes from its saved position: same weights as one run,
    across the end of the stream (24 examples, 5 batches of 5 a pass)."""
    config = TrainConfig(max_steps=8, batch_size=5, learning_rate=1e-3, save_steps=3, log_steps=1, seed=5)
    reference = _distill_objective()
    train(reference, _data().to_iterable_dataset(), _Pad(tiny_tokenizer), config, tmp_path / "a", "run")
    interrupted = _distill_objective()
    with pytest.raises(KeyboardInterrupt):
        train(interrupted, _data().to_iterable_dataset(), _Pad(tiny_tokenizer, fail_after=4), config,
              tmp_path / "b", "run")
    resumed = _distill_objective()
    state = train(resumed, _data().to_iterable_dataset(), _Pad(tiny_tokenizer), config, tmp_path / "b", "run")
    assert state.step == 8 and state.epoch == 1
    for (name, a), (_, b) in zip(reference.trainable.state_dict().items(), resumed.trainable.state_dict().items()):
        assert torch.equal(a, b), name
    # Started from the beginning instead, the run would differ: the position matters.
    restarted = _distill_objective()
    train(restarted, _data().to_iterable_dataset(), _Pad(tiny_tokenizer), TrainConfig(**{**vars(config), "max_steps": 5}),
          tmp_path / "c", "run")
    assert not torch.equal(restarted.trainable["student"].bert.embeddings.word_embeddings.weight,
                           reference.trainable["student"].bert.embeddings.word_embeddings.weight)


def test_gradient_accumulation_matches_a_large_batch(tmp_path, tiny_tokenizer):
    no_dropout = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    big = ModelLossObjective(tiny_bert(seed=2, **no_dropout))
    small = ModelLossObjective(tiny_bert(seed=2, **no_dropout))
    rows = _data(8).map(lambda r: {"input_ids": r["input_ids"][:4], "attention_mask": [1] * 4})  # equal lengths
    common = dict(max_steps=1, learning_rate=1e-2, warmup_ratio=0.0, max_grad_norm=0.0, seed=1)
    train(big, rows, _Pad(tiny_tokenizer), TrainConfig(batch_size=8, **common), tmp_path / "big", "r")
    train(small, rows, _Pad(tiny_tokenizer), TrainConfig(batch_size=4, gradient_accumulation_steps=2, **common),
          tmp_path / "small", "r")
    # AdamW's first moment after one step is (1 - beta1) * gradient: linear in the gradient, so a wrong loss scale
    # (summing instead of averaging micro-batches) would double it. Weights after AdamW are nearly scale-free.
    moments = [torch.load(tmp_path / run / "checkpoints" / "step-000001" / "train.pt", weights_only=False)["optimizer"]["state"]
               for run in ("big", "small")]
    assert moments[0].keys() == moments[1].keys() and len(moments[0]) > 10
    for index in moments[0]:
        torch.testing.assert_close(moments[1][index]["exp_avg"], moments[0][index]["exp_avg"], rtol=1e-4, atol=1e-8)
    for a, b in zip(big.parameters(), small.parameters()):
        # Elements whose gradient is near 0 move by lr * g / (|g| + eps): float noise there is amplified.
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_checkpoint_of_another_run_is_refused(tmp_path, tiny_tokenizer):
    config = TrainConfig(max_steps=2, batch_size=4, save_steps=1)
    train(ModelLossObjective(tiny_bert()), _data(), _Pad(tiny_tokenizer), config, tmp_path, "run-a")
    with pytest.raises(CheckpointError, match="belongs to another run"):
        train(ModelLossObjective(tiny_bert()), _data(), _Pad(tiny_tokenizer), config, tmp_path, "run-b")


def test_corrupt_newest_checkpoint_falls_back_to_the_previous_good_one(tmp_path, tiny_tokenizer, caplog):
    config = TrainConfig(max_steps=8, batch_size=5, learning_rate=1e-3, save_steps=2, log_steps=1, seed=5)
    reference = _distill_objective()
    train(reference, _data(), _Pad(tiny_tokenizer), config, tmp_path / "a", "run")
    with pytest.raises(KeyboardInterrupt):
        train(_distill_objective(), _data(), _Pad(tiny_tokenizer, fail_after=5), config, tmp_path / "b", "run")
    folder = tmp_path / "b" / "checkpoints"
    assert sorted(p.name for p in folder.iterdir()) == ["step-000002", "step-000004"]  # the newest two are kept
    (folder / "step-000004" / "trainable.safetensors").write_bytes(b"truncated")
    resumed = _distill_objective()
    state = train(resumed, _data(), _Pad(tiny_tokenizer), config, tmp_path / "b", "run")
    assert state.step == 8
    assert "step-000004 is unreadable" in caplog.text and "trying the previous checkpoint" in caplog.text
    assert (folder / "corrupt-step-000004").is_dir()  # kept aside for inspection, never read again
    for (name, a), (_, b) in zip(reference.trainable.state_dict().items(), resumed.trainable.state_dict().items()):
        assert torch.equal(a, b), name


def test_every_checkpoint_corrupt_is_an_error_that_says_how_to_restart(tmp_path, tiny_tokenizer):
    config = TrainConfig(max_steps=2, batch_size=4, save_steps=1)
    train(ModelLossObjective(tiny_bert()), _data(), _Pad(tiny_tokenizer), config, tmp_path, "run")
    for path in (tmp_path / "checkpoints").glob("step-*"):
        (path / "state.json").write_text("{")
    with pytest.raises(CheckpointError, match="every checkpoint in .* is unreadable .* delete"):
        train(ModelLossObjective(tiny_bert()), _data(), _Pad(tiny_tokenizer), TrainConfig(max_steps=3, batch_size=4),
              tmp_path, "run")


def test_disk_full_while_checkpointing_keeps_the_previous_checkpoint(tmp_path, tiny_tokenizer, monkeypatch):
    import errno

    import distill.method.checkpoint as checkpoint

    config = TrainConfig(max_steps=4, batch_size=4, save_steps=1, log_steps=1)
    calls = {"n": 0}
    real_save = checkpoint.save_file

    def fill_disk_on_third_save(tensors, path):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real_save(tensors, path)

    monkeypatch.setattr(checkpoint, "save_file", fill_disk_on_third_save)
    with pytest.raises(CheckpointError, match=r"cannot write checkpoint .*step-000003: the disk is full; free space "
                                              r"and re-run .*previous checkpoint .*step-000002 is intact"):
        train(ModelLossObjective(tiny_bert()), _data(), _Pad(tiny_tokenizer), config, tmp_path, "run")
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-000001", "step-000002"]  # no .tmp
    monkeypatch.setattr(checkpoint, "save_file", real_save)
    log = tmp_path / "log.jsonl"
    with log.open("a", encoding="utf-8") as handle:  # the full disk also cut the log's last line short
        handle.write('{"step": 3, "loss')
    state = train(ModelLossObjective(tiny_bert()), _data(), _Pad(tiny_tokenizer), config, tmp_path, "run")
    assert state.step == 4
    assert [json.loads(line)["step"] for line in log.read_text(encoding="utf-8").splitlines()] == [1, 2, 3, 4]


def test_checkpoints_are_kept_and_found_in_step_order_past_six_digits(tmp_path):
    """step-1000000 is newer than step-999000 though it sorts before it as text: the newest is resumed from and
    kept, the oldest pruned."""
    from distill.method.checkpoint import latest_checkpoint, save_checkpoint
    from distill.method.trainer import TrainState

    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    folder = tmp_path / "checkpoints"
    for step in (998000, 999000, 1000000):
        save_checkpoint(folder, "run", model, optimizer, scheduler, TrainState(step=step), rng={})
    assert sorted(p.name for p in folder.iterdir()) == ["step-1000000", "step-999000"]
    assert latest_checkpoint(folder).name == "step-1000000"


def test_a_checkpoint_resumes_with_the_kernel_of_the_resuming_process(tmp_path):
    """A checkpoint saved by one AdamW kernel (the default, or the fused one a CPU or a GPU uses) restores into an
    optimizer of the other with that optimizer's kernel kept and the same next step as the saving kernel's: torch
    places the restored step counts by the saved groups' flags, so the fused flag must be the resuming process's."""
    from distill.method.checkpoint import load_checkpoint, save_checkpoint
    from distill.method.trainer import TrainState

    def step(model, optimizer):
        model(torch.ones(3, 4)).square().sum().backward()
        optimizer.step()
        optimizer.zero_grad()

    for saving, resuming in [(None, True), (True, None)]:
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 4)
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.1, fused=saving)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
        for _ in range(3):
            step(model, optimizer)
        folder = save_checkpoint(tmp_path / f"from-{saving}", "run", model, optimizer, scheduler,
                                 TrainState(step=3), rng={})
        restored = torch.nn.Linear(4, 4)
        again = torch.optim.AdamW(restored.parameters(), lr=0.1, fused=resuming)
        load_checkpoint(folder, "run", restored, again, torch.optim.lr_scheduler.LambdaLR(again, lambda _: 1.0))
        assert [group["fused"] for group in again.param_groups] == [resuming]
        assert all(state["step"].dtype == torch.float32 and state["step"].item() == 3.0
                   for state in again.state.values())
        step(model, optimizer)
        step(restored, again)
        for mine, theirs in zip(model.parameters(), restored.parameters()):
            torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-6)


def _sigterm_in_step(step: int):
    """A distillation objective that sends this process SIGTERM inside the forward of its ``step``-th step."""
    import os
    import signal

    objective = _distill_objective()
    forward, calls = objective.forward, []

    def forward_then_signal(batch):
        calls.append(1)
        if len(calls) == step:
            os.kill(os.getpid(), signal.SIGTERM)
        return forward(batch)

    objective.forward = forward_then_signal
    return objective


def test_sigterm_finishes_the_step_writes_a_checkpoint_and_resumes_exactly(tmp_path, tiny_tokenizer):
    import signal

    from distill.method.trainer import TrainingInterrupted

    config = TrainConfig(max_steps=8, batch_size=5, learning_rate=1e-3, save_steps=100, log_steps=1, seed=5)
    reference = _distill_objective()
    train(reference, _data(), _Pad(tiny_tokenizer), config, tmp_path / "a", "run")

    interrupted = _sigterm_in_step(4)  # inside the fourth step's forward: that step finishes, then the loop stops
    with pytest.raises(TrainingInterrupted, match=r"stopped by SIGTERM after step 4 of 8; checkpoint written to "
                                                  r".*step-000004. Re-run the same command"):
        train(interrupted, _data(), _Pad(tiny_tokenizer), config, tmp_path / "b", "run")
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the loop's handler is gone again
    assert not any(t.name == "batch-prefetch" for t in threading.enumerate())  # nor its prefetch thread
    resumed = _distill_objective()
    assert train(resumed, _data(), _Pad(tiny_tokenizer), config, tmp_path / "b", "run").step == 8
    for (name, a), (_, b) in zip(reference.trainable.state_dict().items(), resumed.trainable.state_dict().items()):
        assert torch.equal(a, b), name


def test_a_signal_in_the_last_step_stops_the_job_rather_than_being_lost(tmp_path, tiny_tokenizer):
    """A stop asked for during the last step (or its scoring) cannot stop before it, but it must still stop the job,
    not let the caller go on to the next stage; a re-run finds every step done and returns the same weights."""
    import signal

    from distill.method.trainer import TrainingInterrupted

    config = TrainConfig(max_steps=4, batch_size=5, learning_rate=1e-3, save_steps=100, log_steps=1, seed=5)
    reference = _distill_objective()
    train(reference, _data(), _Pad(tiny_tokenizer), config, tmp_path / "a", "run")

    interrupted = _sigterm_in_step(4)  # the last step
    with pytest.raises(TrainingInterrupted, match=r"stopped by SIGTERM during its last step; all 4 steps are done"):
        train(interrupted, _data(), _Pad(tiny_tokenizer), config, tmp_path / "b", "run")
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    resumed = _distill_objective()
    assert train(resumed, _data(), _Pad(tiny_tokenizer), config, tmp_path / "b", "run").step == 4
    for (name, a), (_, b) in zip(reference.trainable.state_dict().items(), resumed.trainable.state_dict().items()):
        assert torch.equal(a, b), name


def test_non_finite_loss_names_step_and_term(tmp_path, tiny_tokenizer):
    objective = _distill_objective()
    with torch.no_grad():
        objective.trainable["student"].bert.embeddings.word_embeddings.weight.fill_(float("nan"))
    with pytest.raises(NonFiniteLossError, match=r"loss term 'embedding' is nan at optimizer step 1 \(epoch 0, batch 0\)"):
        train(objective, _data(), _Pad(tiny_tokenizer), TrainConfig(max_steps=2, batch_size=4), tmp_path, "run")


def test_logs_go_to_jsonl_and_tensorboard(tmp_path, tiny_tokenizer):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    config = TrainConfig(max_steps=4, batch_size=4, learning_rate=1e-3, log_steps=2, save_steps=4)
    train(_distill_objective(), _data(), _Pad(tiny_tokenizer), config, tmp_path, "run")
    lines = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [2, 4]
    events = EventAccumulator(str(next((tmp_path / "tensorboard").rglob("events.out.tfevents.*")).parent))
    events.Reload()
    for tag in ("loss/hidden", "loss/attention", "learning_rate", "samples_per_s"):
        scalars = events.Scalars(tag)
        assert [s.step for s in scalars] == [2, 4], tag
        assert [s.value for s in scalars] == pytest.approx([line[tag] for line in lines], rel=1e-6), tag


def test_fp16_on_cpu_is_refused_not_silently_fp32(tmp_path, tiny_tokenizer):
    with pytest.raises(ConfigError, match="fp16 needs a GPU.*bf16"):
        train(_distill_objective(), _data(), _Pad(tiny_tokenizer), TrainConfig(max_steps=1, mixed_precision="fp16"),
              tmp_path, "run")
    assert not (tmp_path / "checkpoints").exists()


def test_fp16_loss_scaling_skips_a_step_whose_gradients_overflowed(tmp_path, tiny_tokenizer):
    """The loop's fp16 path: accelerate's autocast and gradient scaler, on a CPU set up as accelerate does on a GPU
    (torch has fp16 autocast and GradScaler for CPU); tests/test_accelerator.py runs this test on a real GPU too. A
    step whose gradients hold inf is skipped, weights and schedule untouched, and training goes on with finite
    weights."""
    from accelerate import Accelerator

    from distill.method.trainer import _allow_new_mixed_precision

    common = dict(max_steps=2, batch_size=4, learning_rate=1e-3, log_steps=1, warmup_ratio=0.0)
    reference = _distill_objective()
    train(reference, _data(), _Pad(tiny_tokenizer), TrainConfig(**common), tmp_path / "fp32", "run")
    objective = _distill_objective()
    before = {k: v.clone() for k, v in objective.trainable.state_dict().items()}
    calls = []

    def overflow_once(grad):
        calls.append(1)
        return grad * float("inf") if len(calls) == 1 else grad

    objective.trainable["student"].classifier.weight.register_hook(overflow_once)
    _allow_new_mixed_precision("fp16")  # accelerate keeps one precision per process otherwise
    accelerator = Accelerator(mixed_precision="fp16")
    if accelerator.scaler is None:  # a CPU, where accelerate sets up no scaler
        accelerator.native_amp, accelerator.scaler = True, torch.amp.GradScaler("cpu")
    train(objective, _data(), _Pad(tiny_tokenizer), TrainConfig(mixed_precision="fp16", **common), tmp_path / "fp16",
          "run", accelerator=accelerator)
    logs = [json.loads(line) for line in (tmp_path / "fp16" / "log.jsonl").read_text().splitlines()]
    fp32 = [json.loads(line) for line in (tmp_path / "fp32" / "log.jsonl").read_text().splitlines()]
    assert len(calls) == 2
    # Step 1 was skipped: the schedule did not move (fp32: 1e-3 -> 5e-4 -> 0), the scale was halved ...
    assert [line["learning_rate"] for line in fp32] == pytest.approx([5e-4, 0.0])
    assert [line["learning_rate"] for line in logs] == pytest.approx([1e-3, 5e-4])
    assert accelerator.scaler.get_scale() == 2.0**15
    # ... step 2 was applied, and every weight is finite.
    after = {k: v.cpu() for k, v in objective.trainable.state_dict().items()}
    assert any(not torch.equal(before[k].cpu(), after[k]) for k in before)
    assert all(bool(torch.isfinite(after[k]).all()) for k in after)
    # The forward ran in fp16 (autocast): the same loss as fp32 up to rounding, but not the same.
    assert logs[0]["loss"] == pytest.approx(fp32[0]["loss"], rel=0.05) and logs[0]["loss"] != fp32[0]["loss"]


def test_fp16_resume_restores_the_loss_scale(tmp_path, tiny_tokenizer):
    """The gradient scaler's state is part of the checkpoint: a resumed fp16 run goes on with the scale it had, not
    the initial one (which would skip steps while it came back down). A scale that grows every step makes the
    difference visible: 1024 doubled four times."""
    from accelerate import Accelerator

    from distill.method.trainer import TrainingInterrupted, _allow_new_mixed_precision

    def fp16_accelerator():
        _allow_new_mixed_precision("fp16")
        accelerator = Accelerator(mixed_precision="fp16")
        if accelerator.scaler is None:  # a CPU, where accelerate sets up no scaler
            accelerator.native_amp = True
            accelerator.scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=1)
            accelerator.ours = True
        return accelerator

    config = TrainConfig(max_steps=4, batch_size=5, learning_rate=1e-3, save_steps=100, log_steps=1, seed=5,
                         mixed_precision="fp16")
    whole = fp16_accelerator()
    if not getattr(whole, "ours", False):
        pytest.skip("this accelerate set up its own scaler (a GPU): the growth schedule differs")
    train(_distill_objective(), _data(), _Pad(tiny_tokenizer), config, tmp_path / "a", "run", accelerator=whole)
    assert whole.scaler.get_scale() == 1024.0 * 2**4  # four steps, none overflowed: the scale doubled each time
    with pytest.raises(TrainingInterrupted):
        train(_sigterm_in_step(2), _data(), _Pad(tiny_tokenizer), config, tmp_path / "b", "run",
              accelerator=fp16_accelerator())
    resumed = fp16_accelerator()
    assert train(_distill_objective(), _data(), _Pad(tiny_tokenizer), config, tmp_path / "b", "run",
                 accelerator=resumed).step == 4
    assert resumed.scaler.get_scale() == whole.scaler.get_scale()


def test_bf16_mixed_precision_runs_the_step_in_bf16(tmp_path, tiny_tokenizer):
    """mixed_precision "bf16" goes through accelerate's autocast (on CPU here, as on a GPU that has bf16): the run
    finishes with finite losses and differs from the fp32 run by rounding only."""
    common = dict(max_steps=3, batch_size=4, learning_rate=1e-3, log_steps=1, warmup_ratio=0.0)
    full, half = _distill_objective(), _distill_objective()
    train(full, _data(), _Pad(tiny_tokenizer), TrainConfig(**common), tmp_path / "fp32", "run")
    train(half, _data(), _Pad(tiny_tokenizer), TrainConfig(mixed_precision="bf16", **common), tmp_path / "bf16", "run")
    logs = [[json.loads(line) for line in (tmp_path / run / "log.jsonl").read_text().splitlines()]
            for run in ("fp32", "bf16")]
    for fp32, bf16 in zip(*logs):
        assert bf16["loss"] == pytest.approx(fp32["loss"], rel=0.05)  # same computation, bf16 rounding
        assert bf16["loss"] != fp32["loss"]  # and autocast really was on
    for a, b in zip(full.trainable.parameters(), half.trainable.parameters()):
        assert a.dtype == b.dtype == torch.float32  # master weights stay fp32


def test_a_term_exactly_zero_while_its_inputs_differ_stops_training(tmp_path, tiny_tokenizer, monkeypatch):
    """The check behind fp16's silent failure (a count that overflows to inf makes a loss exactly 0): a term that is
    0.0 while the values it compares differ stops training, naming the term and the step."""
    from distill.method.terms import LOSS_TERMS, TermValue

    real = LOSS_TERMS["attention"]

    def lost(objective, student, teacher, batch):
        value = real.compute(objective, student, teacher, batch)
        return TermValue(value.loss / torch.tensor(float("inf")), value.inputs_differ)  # count overflowed

    monkeypatch.setitem(LOSS_TERMS, "attention", dataclasses.replace(real, compute=lost))
    with pytest.raises(NonFiniteLossError, match=r"loss term 'attention' is exactly 0 at optimizer step 1 \(epoch 0, "
                       r"batch 0\) while the student's and teacher's values it compares differ"):
        train(_distill_objective(), _data(), _Pad(tiny_tokenizer), TrainConfig(max_steps=2, batch_size=4), tmp_path,
              "run")


def test_a_term_exactly_zero_because_student_equals_teacher_trains_on(tmp_path, tiny_tokenizer):
    no_dropout = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    teacher, student = tiny_bert(seed=0, **no_dropout), tiny_bert(seed=0, **no_dropout).train()
    objective = DistillationObjective(teacher, student, {"embedding": 1}, [1, 2])
    config = TrainConfig(max_steps=1, batch_size=4, log_steps=1)
    train(objective, _data(), _Pad(tiny_tokenizer), config, tmp_path, "run")
    (line,) = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert line["loss/embedding"] == 0.0


def test_min_steps_gives_a_small_data_set_more_epochs():
    from distill.method.trainer import total_steps

    assert total_steps(TrainConfig(num_epochs=2, batch_size=10), 100) == 20
    assert total_steps(TrainConfig(num_epochs=2, batch_size=10, min_steps=50), 100) == 50  # 5 epochs
    assert total_steps(TrainConfig(num_epochs=2, batch_size=10, min_steps=5), 100) == 20
    assert total_steps(TrainConfig(num_epochs=2, batch_size=10, min_steps=50, max_steps=7), 100) == 7


def _selection_objective():
    return ModelLossObjective(tiny_bert(seed=3).train())


def test_selection_ends_with_the_best_scored_weights_not_the_last(tmp_path, tiny_tokenizer):
    from distill.method.trainer import Selection

    objective = _selection_objective()
    scores, snapshots = iter([0.5, 0.9, 0.7]), []

    def evaluate():
        snapshots.append({k: v.clone() for k, v in objective.trainable.state_dict().items()})
        return next(scores)

    config = TrainConfig(num_epochs=3, batch_size=8, learning_rate=1e-3, warmup_ratio=0.0, log_steps=1)
    state = train(objective, _data(), _Pad(tiny_tokenizer), config, tmp_path, "run", selection=Selection(evaluate))
    assert [step for step, _ in state.evaluations] == [3, 6, 9]  # 24 examples / 8: an evaluation per epoch
    assert state.best_step == 6 and state.best_metric == 0.9
    for name, value in objective.trainable.state_dict().items():
        assert torch.equal(value, snapshots[1][name]), name
    assert not all(torch.equal(snapshots[1][k], snapshots[2][k]) for k in snapshots[1])  # the last ones differ
    dev = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines() if "dev_metric" in line]
    assert [line["dev_metric"] for line in dev] == [0.5, 0.9, 0.7]


def test_selection_resumes_to_the_same_best_weights(tmp_path, tiny_tokenizer):
    """Killed between evaluations and resumed, training keeps the same evaluations and ends with the same weights."""
    from distill.method.trainer import Selection

    def run(folder, objective, fail_after=None):
        score = lambda: float(objective.trainable["model"].classifier.weight.sum())  # noqa: E731
        config = TrainConfig(num_epochs=4, batch_size=8, learning_rate=1e-2, warmup_ratio=0.0, save_steps=2, seed=2)
        return train(objective, _data(), _Pad(tiny_tokenizer, fail_after=fail_after), config, folder, "run",
                     selection=Selection(score, eval_steps=3))

    reference = _selection_objective()
    expected = run(tmp_path / "a", reference)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "b", _selection_objective(), fail_after=8)
    resumed = _selection_objective()
    state = run(tmp_path / "b", resumed)
    assert state.evaluations == expected.evaluations and state.best_step == expected.best_step
    for (name, a), (_, b) in zip(reference.trainable.state_dict().items(), resumed.trainable.state_dict().items()):
        assert torch.equal(a, b), name


def _varied_lengths(n: int, seed: int = 0) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(5, 120, (n,), generator=generator).tolist()


def test_grouped_batches_visit_every_example_once_with_far_less_padding():
    lengths = _varied_lengths(1000)
    plain = EpochBatchSampler(1000, 32, seed=3)
    grouped = EpochBatchSampler(1000, 32, seed=3, lengths=lengths)

    def padded_tokens(batches):
        return sum(max(lengths[i] for i in batch) * len(batch) for batch in batches)

    for epoch in range(2):
        batches = grouped.global_batches(epoch)
        assert sorted(i for batch in batches for i in batch) == list(range(1000))
        assert sorted(map(len, batches)) == sorted(map(len, plain.global_batches(epoch)))  # same batch sizes
        # Random batches pad to the longest of 32 random examples; grouped ones to about their own length.
        assert padded_tokens(batches) < 0.6 * padded_tokens(plain.global_batches(epoch))
        assert padded_tokens(batches) < 1.1 * sum(lengths)
        assert max(lengths[i] for i in batches[0]) == max(lengths)  # the longest batch first
    assert grouped.global_batches(0) != grouped.global_batches(1)  # a new grouping every epoch
    assert grouped.global_batches(0) == EpochBatchSampler(1000, 32, seed=3, lengths=lengths).global_batches(0)
    assert grouped.global_batches(0) != EpochBatchSampler(1000, 32, seed=4, lengths=lengths).global_batches(0)


def test_grouped_batches_are_sorted_within_groups_of_the_shuffle(monkeypatch):
    monkeypatch.setattr("distill.method.trainer.LENGTH_GROUP_BATCHES", 2)  # groups of 2 batches: 10 examples here
    lengths = _varied_lengths(47, seed=2)
    batches = EpochBatchSampler(47, 5, seed=1, lengths=lengths).global_batches(0)
    order = torch.randperm(47, generator=torch.Generator().manual_seed(1000)).tolist()
    groups = [set(order[g:g + 10]) for g in range(0, 47, 10)]  # 4 full groups and one of 7
    assert [len(b) for b in batches] == [5] * 9 + [2]  # the short batch stays last
    for batch in batches:
        group = next(g for g in groups if batch[0] in g)
        assert set(batch) <= group  # a batch never mixes groups ...
        others = sorted(lengths[i] for i in group - set(batch))
        inside = [lengths[i] for i in batch]
        # ... and is a slice of its group sorted by length: no member outside lies strictly between its extremes
        assert not [n for n in others if min(inside) < n < max(inside)]
    assert max(lengths[i] for i in batches[0]) == max(lengths)
    assert EpochBatchSampler(0, 5, seed=1, lengths=[]).global_batches(0) == []


def test_grouped_batches_resume_at_a_batch_and_split_across_processes():
    lengths = _varied_lengths(203, seed=1)
    expected = EpochBatchSampler(203, 8, seed=0, world_size=2, lengths=lengths).global_batches(1)
    assert len(expected) == 13 and len(expected[-1]) == 11
    ranks = [EpochBatchSampler(203, 8, seed=0, rank=r, world_size=2, lengths=lengths) for r in (0, 1)]
    for sampler in ranks:
        sampler.set_position(epoch=1, start_batch=5)
    shares = [list(sampler) for sampler in ranks]
    assert [len(share) for share in shares] == [len(ranks[0]), len(ranks[1])] == [8, 8]
    for b, (zero, one) in enumerate(zip(*shares)):
        assert zero + one and sorted(zero + one) == sorted(expected[5 + b])
        assert len(zero) == (8 if b < 7 else 6) and len(one) == (8 if b < 7 else 5)
    with pytest.raises(ValueError, match="lengths: 3 values for 203 examples"):
        EpochBatchSampler(203, 8, seed=0, lengths=[1, 2, 3])


def test_without_grouping_the_batches_are_the_seeded_permutation_in_order():
    """The plain order stays what earlier runs used (their run ids are kept too: see the fingerprint test)."""
    order = torch.randperm(50, generator=torch.Generator().manual_seed(7 * 1000 + 2)).tolist()
    assert EpochBatchSampler(50, 16, seed=7).global_batches(2) == [order[i:i + 16] for i in range(0, 50, 16)]


def test_training_grouped_by_length_sees_the_same_examples_and_resumes_exactly(tmp_path, tiny_tokenizer):
    config = TrainConfig(max_steps=8, batch_size=5, learning_rate=1e-3, save_steps=3, log_steps=1, seed=5,
                         group_by_length=True)
    reference = _distill_objective()
    recording = _Recording(tiny_tokenizer)
    train(reference, _data(), recording, config, tmp_path / "a", "run")
    seen = recording.lengths
    first_epoch = sorted(n for batch in seen[:5] for n in batch)
    assert first_epoch == sorted(len(r) for r in _data()["input_ids"])
    assert sum(max(b) - min(b) for b in seen[:5]) < sum(max(b) - min(b) for b in _plain_batches(config))

    interrupted = _distill_objective()
    with pytest.raises(KeyboardInterrupt):
        train(interrupted, _data(), _Pad(tiny_tokenizer, fail_after=4), config, tmp_path / "b", "run")
    resumed = _distill_objective()
    train(resumed, _data(), _Pad(tiny_tokenizer), config, tmp_path / "b", "run")
    for name, value in reference.trainable.state_dict().items():
        torch.testing.assert_close(resumed.trainable.state_dict()[name], value, msg=name)


class _Recording(_Pad):
    """Pads like :class:`_Pad` and keeps the lengths of every batch's examples."""

    def __init__(self, tokenizer):
        super().__init__(tokenizer)
        self.lengths = []

    def __call__(self, rows):
        self.lengths.append([len(r["input_ids"]) for r in rows])
        return super().__call__(rows)


def _plain_batches(config):
    lengths = [len(r) for r in _data()["input_ids"]]
    return [[lengths[i] for i in batch] for batch in EpochBatchSampler(24, config.batch_size, config.seed).global_batches(0)]


def test_grouping_measures_the_rows_a_selected_dataset_holds():
    data = _data()
    picked = data.shuffle(seed=3).select([4, 0, 7])
    assert example_lengths(picked) == [len(ids) for ids in picked["input_ids"]] != example_lengths(data)[:3]


def test_grouping_needs_token_ids_to_measure(tmp_path, tiny_tokenizer):
    data = datasets.Dataset.from_dict({"features": [[0.0]] * 6, "labels": [0, 1] * 3})
    config = TrainConfig(max_steps=1, batch_size=2, group_by_length=True)
    with pytest.raises(ConfigError, match="has no input_ids column to group by"):
        train(_distill_objective(), data, _Pad(tiny_tokenizer), config, tmp_path / "a", "run")
    with pytest.raises(ConfigError, match="a streamed dataset is read in order"):
        train(_distill_objective(), _data().to_iterable_dataset(), _Pad(tiny_tokenizer), config, tmp_path / "b", "run")


def test_prefetched_batches_come_in_order_and_errors_and_early_stops_reach_the_training_thread():
    import threading

    from distill.method.trainer import prefetched

    batches = [{"x": torch.full((2,), float(i))} for i in range(7)]
    assert [b["x"][0].item() for b in prefetched(iter(batches), depth=2)] == list(range(7))

    def failing():
        yield batches[0]
        raise ValueError("bad row 1")

    got = []
    with pytest.raises(ValueError, match="bad row 1"):
        for batch in prefetched(failing(), depth=2):
            got.append(batch)
    assert len(got) == 1  # the batch made before the error still arrives first

    stream = prefetched(iter(batches * 100), depth=2)
    next(stream)
    assert any(t.name == "batch-prefetch" for t in threading.enumerate())
    stream.close()  # the loop stopped early (its last step): the thread ends too
    assert not any(t.name == "batch-prefetch" for t in threading.enumerate())
    with pytest.raises(ValueError, match="depth must be >= 1"):
        next(prefetched(iter(batches), depth=0))


def test_prefetching_changes_no_number(tmp_path, tiny_tokenizer):
    """Collating in the background thread gives the same batches in the same order and draws nothing from the global
    RNG: the trained weights are bit-identical to collating in the training thread."""
    config = TrainConfig(max_steps=6, batch_size=5, learning_rate=1e-3, save_steps=100, log_steps=1, seed=3)
    ahead, inline = _distill_objective(), _distill_objective()
    train(ahead, _data(), _Pad(tiny_tokenizer), config, tmp_path / "a", "run", prefetch=True)
    train(inline, _data(), _Pad(tiny_tokenizer), config, tmp_path / "b", "run", prefetch=False)
    for (name, a), (_, b) in zip(ahead.trainable.state_dict().items(), inline.trainable.state_dict().items()):
        assert torch.equal(a, b), name


def test_collating_in_worker_processes_changes_no_number(tmp_path, tiny_tokenizer):
    """``num_workers``: batches collated in DataLoader worker processes are the same batches in the same order, over
    an epoch boundary and from a resume position inside an epoch, and creating the workers draws nothing from the
    global RNG (dropout's): the trained weights are bit-identical to collating in the background thread, and every
    stage's run id is that of a run without the setting (speed only)."""
    from distill.config import PipelineConfig, with_overrides
    from distill.job.general import general_config, general_run_id
    from distill.job.stages import STAGES
    from distill.method.trainer import _Batches

    config = TrainConfig(max_steps=9, batch_size=5, learning_rate=1e-3, save_steps=100, log_steps=1, seed=3)
    assert len(_data()) < 9 * 5  # more than one epoch
    workers = dataclasses.replace(config, num_workers=2)
    threaded, processes = _distill_objective(), _distill_objective()
    train(threaded, _data(), _Pad(tiny_tokenizer), config, tmp_path / "a", "run", prefetch=True)
    train(processes, _data(), _Pad(tiny_tokenizer), workers, tmp_path / "b", "run", prefetch=True)
    for (name, a), (_, b) in zip(threaded.trainable.state_dict().items(), processes.trainable.state_dict().items()):
        assert torch.equal(a, b), name
    # The position a resumed run starts from (epoch 1, batch 2), in workers and in the thread.
    ids = [[b["input_ids"].tolist() for b in _Batches(_data(), _Pad(tiny_tokenizer), c, 0, 1, prefetch=2).epoch(1, 2)]
           for c in (config, workers)]
    assert len(ids[0]) == 3 and ids[0] == ids[1]

    def run_ids(pipeline):
        return {name: spec.run_id(pipeline, {i: "x" for i in spec.inputs}) for name, spec in STAGES.items()}

    sections = ("teacher.train", "mlm.train", "distill.intermediate", "distill.prediction", "general.train")
    base = PipelineConfig()
    on = with_overrides(base, {f"{section}.num_workers": 2 for section in sections})
    assert run_ids(on) == run_ids(base)
    assert general_run_id(general_config(on)) == general_run_id(general_config(base))
    with pytest.raises(ConfigError, match="num_workers"):
        TrainConfig(num_workers=-1)
    with pytest.raises(ConfigError, match="num_workers"):
        TrainConfig(num_workers="many")


def test_num_workers_auto_collates_in_processes_on_cuda_only(monkeypatch, tiny_tokenizer):
    """``num_workers: auto`` (the default) starts two collation processes on a CUDA device where processes fork, and
    none on a CPU (the thread) or where they would be spawned; an integer is taken as it is."""
    import multiprocessing
    import sys

    from distill.method.trainer import AUTO_WORKERS_CUDA, _Batches, resolve_num_workers

    assert TrainConfig().num_workers == "auto"
    monkeypatch.setattr(sys, "platform", "linux")
    # Python 3.14's default is forkserver; fork is still there, and the loader asks for it.
    monkeypatch.setattr(multiprocessing, "get_all_start_methods", lambda: ["forkserver", "spawn", "fork"])
    assert resolve_num_workers("auto", "cuda") == AUTO_WORKERS_CUDA == 2
    assert resolve_num_workers("auto", "cpu") == resolve_num_workers("auto", "mps") == 0
    assert resolve_num_workers(3, "cpu") == 3 and resolve_num_workers(0, "cuda") == 0
    monkeypatch.setattr(multiprocessing, "get_all_start_methods", lambda: ["spawn"])
    assert resolve_num_workers("auto", "cuda") == 0
    monkeypatch.setattr(multiprocessing, "get_all_start_methods", lambda: ["fork", "spawn"])
    monkeypatch.setattr(sys, "platform", "darwin")  # fork there, but not the default: spawned, so none
    assert resolve_num_workers("auto", "cuda") == 0
    monkeypatch.setattr(sys, "platform", "linux")
    config = TrainConfig(batch_size=5)
    cuda = _Batches(_data(), _Pad(tiny_tokenizer), config, 0, 1, prefetch=2, device_type="cuda")
    assert cuda.workers == 2 and cuda.loader.multiprocessing_context.get_start_method() == "fork"
    assert _Batches(_data(), _Pad(tiny_tokenizer), config, 0, 1, prefetch=2).workers == 0
    # A collate function that draws from the global RNG (prefetch off) collates in the training process.
    assert _Batches(_data(), _Pad(tiny_tokenizer), config, 0, 1, prefetch=0, device_type="cuda").workers == 0


def test_terms_read_every_k_steps_still_stop_before_a_bad_step_is_checkpointed(tmp_path, tiny_tokenizer,
                                                                              monkeypatch):
    """On an accelerator the terms are read every ``log_steps`` steps (one host synchronisation, not one a step): a
    loss that turns NaN at step 3 is named as step 3 when read at step 4, before step 4's checkpoint is written."""
    import distill.method.trainer as trainer

    monkeypatch.setattr(trainer, "check_interval", lambda device, config: 4)
    objective = _distill_objective()
    student = objective.trainable["student"]
    calls = []

    def poison_third_step(module, args):
        calls.append(1)
        if len(calls) == 3:
            with torch.no_grad():
                student.bert.embeddings.word_embeddings.weight.fill_(float("nan"))

    student.register_forward_pre_hook(poison_third_step)
    config = TrainConfig(max_steps=8, batch_size=4, save_steps=2, log_steps=4)
    with pytest.raises(NonFiniteLossError, match=r"'embedding' is nan at optimizer step 3 \(epoch 0, batch 2\)"):
        train(objective, _data(), _Pad(tiny_tokenizer), config, tmp_path, "run")
    assert len(calls) == 4  # read at step 4, not at each step
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-000002"]
    lines = (tmp_path / "log.jsonl").read_text().splitlines()
    assert lines == []  # the first log line (step 4) is never written


def test_a_folder_another_process_moved_aside_first_is_not_an_error(tmp_path, monkeypatch):
    """The old run's folder is gone between reading its run ids and moving it aside (moved by another): not an
    error; nothing is moved and the stage runs."""
    from distill.method import checkpoint

    folder = tmp_path / "student"
    monkeypatch.setattr(checkpoint, "folder_run_ids", lambda directory: {"old-run"})  # read before the move ...
    assert checkpoint.finished_or_superseded(folder, "new-run") is None  # ... which another then made
    assert not list((tmp_path / checkpoint.SUPERSEDED).iterdir())
