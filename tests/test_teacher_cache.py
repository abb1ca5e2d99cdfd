"""The teacher-output cache of the intermediate step: the losses it gives, its storage, resume and disk checks."""

import json
import shutil

import datasets
import numpy as np
import pytest
import torch
from transformers import DataCollatorWithPadding

import distill.method.teacher_cache as teacher_cache
from distill.config import ConfigError, TrainConfig
from distill.method.objective import DistillationObjective
from distill.method.teacher_cache import (
    INDEX_COLUMN,
    CacheLayout,
    TeacherCache,
    build_teacher_cache,
    cache_bytes,
    cached_logits,
    with_cache_index,
)
from distill.method.trainer import train
from tests.conftest import tiny_bert

TERMS = {"embedding": 1, "hidden": 1, "attention": 1}


def _data(n=26):
    generator = torch.Generator().manual_seed(3)
    rows = []
    for i in range(n):
        length = 3 + (7 * i) % 11
        rows.append({"input_ids": torch.randint(5, 30, (length,), generator=generator).tolist(),
                     "attention_mask": [1] * length, "labels": i % 2})
    return datasets.Dataset.from_list(rows)


def _objective(terms=TERMS, seed=1):
    teacher = tiny_bert(seed=0, num_hidden_layers=3)
    student = tiny_bert(seed=seed, hidden_size=16, intermediate_size=32).train()
    return DistillationObjective(teacher, student, terms, [2, 3], relation_heads=4)


def _cache(objective, data, collate, folder, dtype=torch.float32, **kwargs):
    layout = CacheLayout.of(objective.teacher_reads, objective.teacher.config)
    build_teacher_cache(objective.teacher, data, collate, layout, folder, "cache-run", dtype,
                        device=torch.device("cpu"), **kwargs)
    return TeacherCache(folder)


def _step_losses(objective, data, collate, batch_size=4):
    """Each batch's terms in the step's batches (student in eval mode: no dropout draws)."""
    objective.eval()
    found = []
    with torch.no_grad():
        for start in range(0, len(data), batch_size):
            rows = [data[i] for i in range(start, min(start + batch_size, len(data)))]
            loss, terms = objective(collate(rows))
            found.append({"loss": float(loss), **{k: float(v) for k, v in terms.items()}})
    return found


@pytest.mark.parametrize("terms", [TERMS, {**TERMS, "relation": 1}], ids=["tinybert", "with-relation"])
def test_float32_cache_gives_the_uncached_losses(tmp_path, tiny_tokenizer, terms):
    """The cache is built in batches of 5 sorted by length (other padding than the step's batches of 4): every term of
    every batch equals the uncached step's to float rounding."""
    data, collate = _data(), DataCollatorWithPadding(tiny_tokenizer)
    objective = _objective(terms)
    cache = _cache(objective, data, collate, tmp_path / "cache", batch_size=5)
    uncached = _step_losses(objective, data, collate)
    cached = _step_losses(objective, with_cache_index(data), cache.collator(collate))
    assert len(cached) == len(uncached) == 7
    for a, b in zip(uncached, cached):
        assert a.keys() == b.keys() == {"loss", *terms}
        for name in a:
            assert b[name] == pytest.approx(a[name], rel=1e-5, abs=1e-7), name


@pytest.mark.parametrize("dtype, tolerance", [(torch.float16, 2**-11), (torch.bfloat16, 2**-8)])
def test_half_precision_cache_moves_the_losses_within_the_stated_tolerance(tmp_path, tiny_tokenizer, dtype, tolerance):
    """float16 keeps 11 significant bits, bfloat16 8: each term within one rounding unit of the storage dtype
    (relative) of the uncached one (measured here: 3.7e-5 and 2.5e-4), and not equal to it (the rounding is real)."""
    data, collate = _data(), DataCollatorWithPadding(tiny_tokenizer)
    objective = _objective()
    cache = _cache(objective, data, collate, tmp_path / "cache", dtype=dtype)
    uncached = _step_losses(objective, data, collate)
    cached = _step_losses(objective, with_cache_index(data), cache.collator(collate))
    differ = False
    for a, b in zip(uncached, cached):
        for name in a:
            assert b[name] == pytest.approx(a[name], rel=tolerance), name
            differ |= b[name] != a[name]
    assert differ
    full = cache_bytes(cache.layout, [len(ids) for ids in data["input_ids"]], torch.float32)
    stored = sum(path.stat().st_size for path in (tmp_path / "cache" / "shards").glob("*.bin"))
    assert stored * 2 == full


def test_training_with_the_cache_gives_the_uncached_student(tmp_path, tiny_tokenizer):
    """Six optimizer steps with dropout on: the same draws (the frozen teacher draws none) and the same weights to
    float rounding; the cached run never calls the teacher."""
    data, collate = _data(), DataCollatorWithPadding(tiny_tokenizer)
    config = TrainConfig(max_steps=6, batch_size=4, learning_rate=1e-3, save_steps=3, log_steps=1, seed=5)
    reference = _objective()
    train(reference, data, collate, config, tmp_path / "a", "run")
    cached = _objective()
    cache = _cache(cached, data, collate, tmp_path / "cache")
    calls = []
    cached.teacher.register_forward_hook(lambda *args: calls.append(1))
    train(cached, with_cache_index(data), cache.collator(collate), config, tmp_path / "b", "run")
    assert not calls
    for (name, a), (_, b) in zip(reference.trainable.state_dict().items(), cached.trainable.state_dict().items()):
        assert torch.allclose(a, b, atol=1e-5), name


def test_a_stopped_build_resumes_at_its_first_missing_shard(tmp_path, tiny_tokenizer, monkeypatch):
    data, collate = _data(), DataCollatorWithPadding(tiny_tokenizer)
    objective = _objective()
    whole = tmp_path / "whole"
    _cache(objective, data, collate, whole, shard_bytes=20_000)
    shards = json.loads((whole / "shards" / "run.json").read_text())["shards"]
    assert len(shards) >= 4 and shards[0][0] == 0 and shards[-1][1] == len(data)

    write = teacher_cache._write_shard
    written = []

    def stop_after_two(*args):
        if len(written) == 2:
            raise KeyboardInterrupt("simulated kill")
        written.append(args[8])
        write(*args)

    monkeypatch.setattr(teacher_cache, "_write_shard", stop_after_two)
    stopped = tmp_path / "stopped"
    with pytest.raises(KeyboardInterrupt):
        _cache(objective, data, collate, stopped, shard_bytes=20_000)
    assert not (stopped / "stage.json").exists() and written == [0, 1]
    with pytest.raises(FileNotFoundError, match="not finished"):
        TeacherCache(stopped)
    written.clear()
    monkeypatch.setattr(teacher_cache, "_write_shard", lambda *args: (written.append(args[8]), write(*args)))
    _cache(objective, data, collate, stopped, shard_bytes=20_000)
    assert written == list(range(2, len(shards)))
    for path in sorted((whole / "shards").glob("shard-*")):
        assert path.read_bytes() == (stopped / "shards" / path.name).read_bytes(), path.name


def test_a_cache_of_other_settings_is_replaced(tmp_path, tiny_tokenizer):
    data, collate = _data(), DataCollatorWithPadding(tiny_tokenizer)
    objective = _objective()
    folder = tmp_path / "cache"
    _cache(objective, data, collate, folder)
    layout = CacheLayout.of(objective.teacher_reads, objective.teacher.config)
    build_teacher_cache(objective.teacher, data, collate, layout, folder, "other-run", torch.float16,
                        device=torch.device("cpu"))
    assert json.loads((folder / "stage.json").read_text())["run_id"] == "other-run"
    assert TeacherCache(folder).dtype == torch.float16


def test_a_disk_without_room_is_a_clear_error_before_anything_is_written(tmp_path, tiny_tokenizer, monkeypatch):
    data, collate = _data(), DataCollatorWithPadding(tiny_tokenizer)
    objective = _objective()
    layout = CacheLayout.of(objective.teacher_reads, objective.teacher.config)
    needed = cache_bytes(layout, [len(ids) for ids in data["input_ids"]], torch.float32)
    monkeypatch.setattr(teacher_cache.shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**12, 10**12,
                                                                                                   needed // 2))
    with pytest.raises(ConfigError, match=r"needs 0\.00 GiB more .*, over 95% of the 0\.00 GiB the disk has free "
                                          r"\(the rest is left for the run\); .*float16.*null"):
        build_teacher_cache(objective.teacher, data, collate, layout, tmp_path / "cache", "run", torch.float32,
                            device=torch.device("cpu"))
    assert not list((tmp_path / "cache").glob("shards/shard-*"))
    # Already at half the size: the advice is not to halve it again.
    with pytest.raises(ConfigError, match=r"move output_dir, or turn the cache off") as refused:
        build_teacher_cache(objective.teacher, data, collate, layout, tmp_path / "cache16", "run", torch.float16,
                            device=torch.device("cpu"))
    assert "float16" not in str(refused.value).split("; ", 1)[1]


def test_size_estimate_is_the_bytes_written(tmp_path, tiny_tokenizer):
    """hidden states (T, H) at layers 0, 2, 3 and scores (A, T, T) at 2, 3, per example, float32."""
    data, collate = _data(), DataCollatorWithPadding(tiny_tokenizer)
    objective = _objective()
    cache = _cache(objective, data, collate, tmp_path / "cache")
    lengths = [len(ids) for ids in data["input_ids"]]
    assert cache.layout.reads == (("attentions", 2), ("attentions", 3), ("hidden_states", 0), ("hidden_states", 2),
                                  ("hidden_states", 3))
    expected = sum(3 * t * 32 + 2 * 4 * t * t for t in lengths) * 4
    assert cache_bytes(cache.layout, lengths, torch.float32) == expected
    assert sum(p.stat().st_size for p in (tmp_path / "cache" / "shards").glob("*.bin")) == expected
    assert json.loads((tmp_path / "cache" / "stage.json").read_text())["bytes"] == expected


def test_cached_buffers_are_placed_on_the_tokenizer_padding_side(tmp_path, tiny_tokenizer):
    """Left padding: an example's values sit at the batch's last T_i positions, zeros before them."""
    data = _data(6)
    objective = _objective()
    cache = _cache(objective, data, DataCollatorWithPadding(tiny_tokenizer), tmp_path / "cache")
    tiny_tokenizer.padding_side = "left"
    batch = cache.collator(DataCollatorWithPadding(tiny_tokenizer))([with_cache_index(data)[i] for i in (0, 1)])
    assert INDEX_COLUMN not in batch
    width = batch["input_ids"].shape[1]
    for row, index in enumerate((0, 1)):
        length = len(data[index]["input_ids"])
        hidden, scores = cache.example(index)[2], cache.example(index)[0]
        assert torch.equal(batch["teacher.hidden_states.0"][row, width - length:], hidden)
        assert torch.equal(batch["teacher.attentions.2"][row, :, width - length:, width - length:], scores)
        assert not batch["teacher.hidden_states.0"][row, :width - length].any()
        assert bool((batch["attention_mask"][row, :width - length] == 0).all())
    assert np.prod(batch["teacher.attentions.3"].shape) == 2 * 4 * width * width


def test_teacher_logit_cache_stores_the_predicted_logits_per_example_and_per_token(tmp_path, tiny_tokenizer):
    """The prediction step's cache (built from the arrays, no Python floats) reads back the teacher's float32 logits:
    (C,) per example for a classifier, (T_i, C) per example for a per-token head."""
    from transformers import BertForTokenClassification

    from distill.tasks.evaluate import predict
    from distill.job.stage_distill import with_teacher_logits
    from tests.conftest import tiny_bert_config

    data = _data().remove_columns("labels")
    torch.manual_seed(0)
    from distill.tasks import get_task_type

    for name, teacher in [("sequence", tiny_bert(seed=0, num_labels=3)),
                          ("token", BertForTokenClassification(tiny_bert_config(num_labels=5)).eval())]:
        kind = get_task_type(f"{name}_classification")
        cached = with_teacher_logits(data, teacher, tiny_tokenizer, tmp_path / name, "run", task_type=kind,
                                     device=torch.device("cpu"))
        expected = predict(teacher, data, tiny_tokenizer, task_type=kind, device="cpu", batch_size=128)
        stored = cached["teacher_logits"]
        assert len(stored) == len(data)
        for row, want in zip(stored, expected):
            assert np.asarray(row, dtype=np.float32).shape == want.shape
            assert np.array_equal(np.asarray(row, dtype=np.float32), want)
        calls = []
        hook = teacher.register_forward_hook(lambda *args: calls.append(1))
        again = with_teacher_logits(data, teacher, tiny_tokenizer, tmp_path / name, "run", task_type=kind,
                                    device=torch.device("cpu"))
        hook.remove()
        assert not calls and again["teacher_logits"] == stored  # read back from disk: the teacher never ran again


def test_a_cache_built_from_left_padded_batches_gives_the_uncached_losses(tmp_path, tiny_roberta_tokenizer):
    """Left padding (RoBERTa counts positions from the first real token, so padding does not move them): built and
    read on the left, the cached terms equal the uncached ones."""
    from tests.conftest import tiny_roberta

    tiny_roberta_tokenizer.padding_side = "left"
    data, collate = _data(), DataCollatorWithPadding(tiny_roberta_tokenizer)
    teacher = tiny_roberta(seed=0, num_hidden_layers=3)
    student = tiny_roberta(seed=1, hidden_size=16, intermediate_size=32).train()
    objective = DistillationObjective(teacher, student, TERMS, [2, 3])
    cache = _cache(objective, data, collate, tmp_path / "cache", batch_size=5)
    assert bool((collate([data[0], data[1]])["attention_mask"][:, 0] == 0).any())  # really left-padded
    uncached = _step_losses(objective, data, collate)
    cached = _step_losses(objective, with_cache_index(data), cache.collator(collate))
    for a, b in zip(uncached, cached):
        for name in a:
            assert b[name] == pytest.approx(a[name], rel=1e-5, abs=1e-7), name


def _logit_teachers(family="bert"):
    """A sentence classifier and a token tagger (a per-token head) of 3 layers: tiny BERT, or tiny RoBERTa (which
    counts positions from the first real token, so left padding does not move them)."""
    from transformers import BertForTokenClassification, RobertaConfig, RobertaForTokenClassification

    from distill.tasks import get_task_type
    from tests.conftest import tiny_bert_config, tiny_roberta

    sentence, token = get_task_type("sequence_classification"), get_task_type("token_classification")
    torch.manual_seed(0)
    if family == "roberta":
        tagger = RobertaForTokenClassification(RobertaConfig(
            vocab_size=400, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=70, num_labels=5, type_vocab_size=1, pad_token_id=1)).eval()
        return [(sentence, tiny_roberta(seed=0, vocab_size=400, num_labels=3, num_hidden_layers=3)), (token, tagger)]
    tagger = BertForTokenClassification(tiny_bert_config(num_labels=5, num_hidden_layers=3)).eval()
    return [(sentence, tiny_bert(seed=0, num_labels=3, num_hidden_layers=3)), (token, tagger)]


@pytest.mark.parametrize("family, side", [("bert", "right"), ("roberta", "left")])
def test_the_cache_keeps_the_logits_of_its_forward_pass_in_the_dataset_order(tmp_path, tiny_tokenizer,
                                                                             tiny_roberta_tokenizer, family, side):
    """Given the task type's logit reader, every shard keeps the teacher's float32 logits; read back they are
    predict()'s, per example and per token, whichever side the batches are padded on (on the left, the tagger only: a
    sentence classifier reads its first position, which left padding fills); without the reader, or under another run
    id, there are none to read."""
    from distill.tasks.evaluate import predict

    tokenizer = tiny_roberta_tokenizer if family == "roberta" else tiny_tokenizer
    tokenizer.padding_side = side
    data, collate = _data().remove_columns("labels"), DataCollatorWithPadding(tokenizer)
    for kind, teacher in _logit_teachers(family)[1 if side == "left" else 0:]:
        layout = CacheLayout((("hidden_states", 0), ("hidden_states", 3)), 32, 4)
        folder = tmp_path / kind.name
        build_teacher_cache(teacher, data, collate, layout, folder, "run", torch.float16, device=torch.device("cpu"),
                            batch_size=5, shard_bytes=3_000, logits=kind.logits, per_token=kind.per_token)
        assert len(json.loads((folder / "shards" / "run.json").read_text())["shards"]) >= 3
        stored = cached_logits(folder, "run")
        expected = predict(teacher, data, tokenizer, task_type=kind, device="cpu", batch_size=128)
        assert len(stored) == len(data)
        for got, want in zip(stored, expected):
            assert got.dtype == np.float32 and got.shape == want.shape
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        assert cached_logits(folder, "other run") is None
        plain = tmp_path / f"{kind.name}-plain"
        build_teacher_cache(teacher, data, collate, layout, plain, "run", torch.float16, device=torch.device("cpu"))
        assert cached_logits(plain, "run") is None


def test_a_cache_resumed_from_shards_without_logits_gives_none(tmp_path, tiny_tokenizer, monkeypatch):
    """A build stopped before it kept logits (an earlier version) and resumed with the reader has shards without them:
    the prediction step must then run the teacher itself, so there are none to read rather than some."""
    data, collate = _data(), DataCollatorWithPadding(tiny_tokenizer)
    kind, teacher = _logit_teachers()[0]
    layout = CacheLayout((("hidden_states", 0),), 32, 4)
    write = teacher_cache._write_shard
    calls = []

    def stop_after_one(*args):
        if calls:
            raise KeyboardInterrupt("simulated kill")
        calls.append(args[8])
        write(*args)

    monkeypatch.setattr(teacher_cache, "_write_shard", stop_after_one)
    with pytest.raises(KeyboardInterrupt):
        build_teacher_cache(teacher, data, collate, layout, tmp_path / "cache", "run", torch.float32,
                            device=torch.device("cpu"), shard_bytes=1_000)
    monkeypatch.setattr(teacher_cache, "_write_shard", write)
    build_teacher_cache(teacher, data, collate, layout, tmp_path / "cache", "run", torch.float32,
                        device=torch.device("cpu"), shard_bytes=1_000, logits=kind.logits)
    assert (tmp_path / "cache" / "shards" / "shard-00001.logits.npz").is_file()
    assert not (tmp_path / "cache" / "shards" / "shard-00000.logits.npz").exists()
    assert cached_logits(tmp_path / "cache", "run") is None


def test_the_teacher_logit_stage_takes_the_cached_logits_and_the_teacher_does_not_run(tmp_path, tiny_tokenizer):
    """with_teacher_logits given the intermediate step's cache stores that cache's logits (the teacher never runs)
    and says where they came from; given a cache without them, it runs the teacher as before."""
    from distill.job.stage_distill import with_teacher_logits
    from distill.tasks.evaluate import predict

    data, collate = _data().remove_columns("labels"), DataCollatorWithPadding(tiny_tokenizer)
    for kind, teacher in _logit_teachers():
        layout = CacheLayout((("hidden_states", 0),), 32, 4)
        cache = tmp_path / kind.name / "teacher_outputs"
        build_teacher_cache(teacher, data, collate, layout, cache, "cache-run", torch.float16,
                            device=torch.device("cpu"), shard_bytes=2_000, logits=kind.logits, per_token=kind.per_token)
        calls = []
        hook = teacher.register_forward_hook(lambda *args: calls.append(1))
        folder = tmp_path / kind.name / "teacher_logits"
        added = with_teacher_logits(data, teacher, tiny_tokenizer, folder, "logits-run", task_type=kind,
                                    device=torch.device("cpu"), cache=(cache, "cache-run"))
        hook.remove()
        assert not calls
        assert json.loads((folder / "stage.json").read_text())["source"] == "teacher_outputs"
        expected = predict(teacher, data, tiny_tokenizer, task_type=kind, device="cpu", batch_size=128)
        for row, want in zip(added["teacher_logits"], expected):
            np.testing.assert_allclose(np.asarray(row, dtype=np.float32), want, rtol=1e-5, atol=1e-6)
        plain = tmp_path / kind.name / "plain_outputs"
        build_teacher_cache(teacher, data, collate, layout, plain, "cache-run", torch.float16,
                            device=torch.device("cpu"))
        folder = tmp_path / kind.name / "teacher_logits_plain"
        with_teacher_logits(data, teacher, tiny_tokenizer, folder, "logits-run", task_type=kind,
                            device=torch.device("cpu"), cache=(plain, "cache-run"))
        assert json.loads((folder / "stage.json").read_text())["source"] == "teacher"
