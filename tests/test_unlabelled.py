"""Unlabelled text in the distillation set (``augment.unlabelled``): sentences drawn at random from a corpus fill the
room ``augment.max_rows`` leaves after augmentation, as rows of the task's columns whose only target is the teacher's
logits; refused where a row is not one text or where a hard-label term would read their placeholder labels."""

from __future__ import annotations

import dataclasses
import gzip
import json
from pathlib import Path

import datasets
import pytest
import yaml

from distill.config import ConfigError, TaskConfig, load_config, with_overrides
from distill.job.corpus import sample_lines
from distill.tasks import DataError
from distill.tasks.data import task_spec
from distill.job.stage_augment import with_unlabelled
from distill.job.preflight import check_unlabelled, preflight
from distill.job.stages import STAGES
from distill.tasks.token_classification import IGNORE
from tests.test_token_classification import TAGS, write_conll


def write_corpus(path: Path, lines: list[str]) -> Path:
    text = "\n".join(lines) + "\n"
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text, encoding="utf-8")
    return path


def test_lines_are_drawn_at_random_from_every_file_the_same_for_a_seed(tmp_path):
    first = write_corpus(tmp_path / "a.txt", [f"first file line {i}" for i in range(50)] + ["too short", ""])
    second = write_corpus(tmp_path / "b.txt.gz", [f"second file line {i}" for i in range(50)])
    drawn = sample_lines([str(first), str(second)], 20, seed=1)
    assert len(drawn) == len(set(drawn)) == 20 and drawn == sample_lines([str(first), str(second)], 20, seed=1)
    assert drawn != sample_lines([str(first), str(second)], 20, seed=2)
    assert any(line.startswith("first") for line in drawn) and any(line.startswith("second") for line in drawn)
    everything = sample_lines([str(first), str(second)], 1000, seed=1)
    assert len(everything) == 100 and "too short" not in everything  # fewer than three words are skipped
    assert sample_lines([str(first)], 0, seed=1) == []
    with pytest.raises(DataError, match="not found"):
        sample_lines([str(tmp_path / "missing.txt")], 5, seed=1)


def test_a_dev_sentence_is_left_out_of_the_text_however_it_is_tokenised(tmp_path):
    """The dev file's tweet is a word list ("Hello , world !"); the same tweet in a user's text is written as people
    write it ("Hello, world!"): it is still a dev sentence, and never drawn."""
    from distill.job.stage_augment import dev_texts

    spec = _ner_spec(tmp_path)
    dev = datasets.DatasetDict({split: datasets.Dataset.from_dict({"tokens": [["Hello", ",", "world", "!", "again"]],
                                                                   "label": [[0] * 5]})
                                for split in spec.dev_splits})
    corpus = write_corpus(tmp_path / "tweets.txt", ["Hello,   world! again", "Hello , world ! again",
                                                    "a different line of text"])
    drawn = sample_lines([str(corpus)], 10, seed=1, exclude=dev_texts(dev, spec))
    assert drawn == ["a different line of text"]
    assert len(sample_lines([str(corpus)], 10, seed=1)) == 3


def _augmented(columns: dict, features: datasets.Features) -> datasets.Dataset:
    size = len(next(iter(columns.values())))
    features = datasets.Features({**features, "source_index": datasets.Value("int64"),
                                  "is_augmented": datasets.Value("bool")})
    return datasets.Dataset.from_dict({**columns, "source_index": list(range(size)), "is_augmented": [False] * size},
                                      features=features)


def _ner_spec(tmp_path):
    conll = write_conll(tmp_path / "ner.conll")
    return task_spec(TaskConfig(name="ner", task_type="token_classification", train_file=str(conll),
                                dev_file=str(conll), label_names=list(TAGS)))


def test_token_classification_rows_are_words_every_one_scored_and_written_once(tmp_path, tiny_tokenizer):
    spec = _ner_spec(tmp_path)
    corpus = write_corpus(tmp_path / "news.txt", ["the actor was in a movie, a fun story!", "the cast and the film",
                                                  "a terrible plot is fun", "it is a wonderful story"])
    augmented = _augmented({"tokens": [["the", "actor"], ["a", "film"]], "label": [[0, 1], [0, 3]]},
                           datasets.Features({"tokens": datasets.Sequence(datasets.Value("string")),
                                              "label": datasets.Sequence(datasets.Value("int64"))}))
    config = with_overrides(load_config(None), {"augment.unlabelled": [str(corpus)], "augment.max_rows": 5})
    folder = tmp_path / "augmented"
    folder.mkdir()
    (folder / ".tmp-killed").mkdir()  # a write killed before its rename
    rows = with_unlabelled(augmented, config, spec, folder, exclude={"the cast and the film"})  # a dev sentence
    assert len(rows) == 5 and rows.select(range(2)).to_list() == augmented.to_list()  # 3 sentences fill the room
    assert not (folder / ".tmp-killed").exists()
    extra = rows.select(range(2, 5)).to_list()
    assert all(row["source_index"] == -1 and row["is_augmented"] for row in extra)
    assert {tuple(row["tokens"]) for row in extra} == {
        ("the", "actor", "was", "in", "a", "movie", ",", "a", "fun", "story", "!"),
        ("a", "terrible", "plot", "is", "fun"), ("it", "is", "a", "wonderful", "story")}
    assert all(row["label"] == [0] * len(row["tokens"]) for row in extra)
    # Tokenised as the task's rows are: the first piece of every word is scored ("wonderful" is two pieces).
    encoded = spec.type.tokenize(rows.select(range(2, 5)), tiny_tokenizer, spec, 32)
    for row, labels in zip(extra, encoded["labels"]):
        assert sum(label != IGNORE for label in labels) == len(row["tokens"])
    corpus.unlink()  # a rerun reads the rows back: same rows, the corpus not read again
    assert with_unlabelled(augmented, config, spec, folder).to_list() == rows.to_list()
    assert with_unlabelled(augmented, with_overrides(config, {"augment.unlabelled": []}), spec, folder).to_list() \
        == augmented.to_list()


def test_one_text_classification_rows_keep_other_columns_empty_and_a_full_set_gets_none(tmp_path):
    spec = task_spec(TaskConfig(name="sst2"))
    corpus = write_corpus(tmp_path / "reviews.txt", [f"a film of {i} good scenes" for i in range(10)])
    augmented = _augmented({"sentence": ["good", "bad"], "label": [1, 0], "idx": [7, 8]},
                           datasets.Features({"sentence": datasets.Value("string"), "label": datasets.Value("int64"),
                                              "idx": datasets.Value("int32")}))
    config = with_overrides(load_config(None), {"augment.unlabelled": [str(corpus)], "augment.max_rows": 6})
    (tmp_path / "a").mkdir()
    rows = with_unlabelled(augmented, config, spec, tmp_path / "a").to_list()[2:]
    assert len(rows) == 4 and all(r["sentence"].startswith("a film of") and r["idx"] is None for r in rows)
    (tmp_path / "b").mkdir()
    full = with_overrides(config, {"augment.max_rows": 2})
    assert len(with_unlabelled(augmented, full, spec, tmp_path / "b")) == 2


def _sst2(tmp_path, **overrides):
    corpus = write_corpus(tmp_path / "text.txt", ["a sentence of text"] * 3)
    return with_overrides(load_config(None), {"augment.unlabelled": [str(corpus)], "augment.max_rows": 100,
                                              "distill.hard_label_weight": 0.0, **overrides})


def test_preflight_refuses_what_unlabelled_rows_cannot_serve(tmp_path):
    check_unlabelled(_sst2(tmp_path))  # one text a row, a budget, soft targets only: fine
    with pytest.raises(ConfigError, match="augment.unlabelled: mrpc classifies text pairs"):
        check_unlabelled(_sst2(tmp_path, **{"task.name": "mrpc"}))
    with pytest.raises(ConfigError, match="question-answering reader cannot take unlabelled sentences"):
        check_unlabelled(_sst2(tmp_path, **{"task.name": "squad"}))
    with pytest.raises(ConfigError, match="augment.max_rows is not set"):
        check_unlabelled(_sst2(tmp_path, **{"augment.max_rows": None}))
    with pytest.raises(ConfigError, match="distill.hard_label_weight=0.5 would train on their placeholders"):
        check_unlabelled(_sst2(tmp_path, **{"distill.hard_label_weight": 0.5}))
    with pytest.raises(DataError, match="not found"):
        check_unlabelled(_sst2(tmp_path, **{"augment.unlabelled": [str(tmp_path / "missing.txt")]}))
    with pytest.raises(ConfigError, match="augment.enabled is false"):
        preflight(_sst2(tmp_path, **{"augment.enabled": False}))


def test_the_augmented_run_id_reads_the_unlabelled_texts_bytes_and_is_unchanged_without_them(tmp_path):
    augmented = STAGES["augmented"]
    plain = load_config(None)
    config = _sst2(tmp_path)
    before = augmented.run_id(config, {"mlm": "m"})
    assert before != augmented.run_id(plain, {"mlm": "m"})
    write_corpus(tmp_path / "text.txt", ["another sentence of text"] * 3)
    assert augmented.run_id(config, {"mlm": "m"}) != before
    budget = with_overrides(plain, {"augment.max_rows": 100, "distill.hard_label_weight": 0.0})
    assert augmented.run_id(with_overrides(config, {"augment.unlabelled": []}), {"mlm": "m"}) == \
        augmented.run_id(budget, {"mlm": "m"})  # (the default's run ids are pinned in test_config)


def test_the_pipeline_distils_on_unlabelled_rows_and_the_card_says_so(tmp_path, tiny_tokenizer):
    """The tiny every-stage job (general stage off) with unlabelled text: the augmented stage records the rows it
    added, the teacher's logits cover them, the student trains on them and its card names the text."""
    from distill.job.pipeline import run_pipeline
    from tests.conftest import tiny_job_every_stage

    path = Path(tiny_job_every_stage(tmp_path, tiny_tokenizer))
    corpus = write_corpus(tmp_path / "unlabelled.txt", [f"the movie {w} was good" for w in ("plot", "cast", "film")])
    job = yaml.safe_load(path.read_text())
    job["general"]["enabled"] = False
    job["export"]["onnx"] = False
    job["augment"].update(unlabelled=[str(corpus)], max_rows=40)
    job["distill"]["hard_label_weight"] = 0.0
    path.write_text(yaml.safe_dump(job))
    run_pipeline(load_config(str(path)))
    out = tmp_path / "run"
    record = json.loads((out / "augmented" / "stage.json").read_text())
    assert record["num_unlabelled"] == 3 and record["num_rows"] <= 40
    assert json.loads((out / "teacher_logits" / "stage.json").read_text())["num_rows"] == record["num_rows"]
    card = (out / "student" / "README.md").read_text()
    assert (f"{record['num_rows']} training rows, {record['num_augmented']} of them augmented copies, 3 of them "
            "sentences of unlabelled.txt with no label") in card  # the copies counted without the unlabelled rows
    student = (out / "student" / "model.safetensors").read_bytes()
    run_pipeline(load_config(str(path)))  # a rerun reuses every stage, the unlabelled rows read back
    assert json.loads((out / "augmented" / "stage.json").read_text()) == record
    assert (out / "student" / "model.safetensors").read_bytes() == student


def test_unlabelled_text_without_augmented_copies_runs_no_masked_lm(tmp_path, tiny_tokenizer):
    """``augment.num_copies: 0`` with unlabelled text: the set is the training examples and the text's sentences; no
    masked LM is adapted or run (the plan says why), and no example is augmented."""
    from distill.job.pipeline import plan_pipeline, run_pipeline
    from tests.conftest import tiny_job_every_stage

    path = Path(tiny_job_every_stage(tmp_path, tiny_tokenizer))
    corpus = write_corpus(tmp_path / "unlabelled.txt", [f"the movie {w} was good" for w in ("plot", "cast", "film")])
    job = yaml.safe_load(path.read_text())
    job["general"]["enabled"] = False
    job["export"]["onnx"] = False
    job["augment"].update(unlabelled=[str(corpus)], max_rows=40, num_copies=0)
    job["distill"]["hard_label_weight"] = 0.0
    path.write_text(yaml.safe_dump(job))
    config = load_config(str(path))
    plan = {row["stage"]: row for row in plan_pipeline(config)}
    assert plan["mlm"]["action"] == "skip" and plan["mlm"]["why"] == "augment.num_copies is 0"
    run_pipeline(config)
    out = tmp_path / "run"
    assert not (out / "mlm").exists()
    record = json.loads((out / "augmented" / "stage.json").read_text())
    assert record["num_augmented"] == 0 and record["num_unlabelled"] == 3
    train = datasets.load_from_disk(str(next((out / "augmented" / "shards").glob("shard-*"))))
    assert record["num_rows"] == len(train) + 3 and not any(train["is_augmented"])


def test_a_training_set_that_fills_max_rows_runs_no_masked_lm(tmp_path, tiny_tokenizer):
    """``augment.max_rows`` no larger than the training set leaves no room for copies: no masked LM is adapted (the
    plan, which reads the training set, says so), every example is kept unaugmented, and the augmented stage has the
    run id the plan printed."""
    from distill.job.pipeline import plan_markdown, plan_pipeline, run_pipeline
    from tests.conftest import tiny_job_every_stage

    path = Path(tiny_job_every_stage(tmp_path, tiny_tokenizer))
    job = yaml.safe_load(path.read_text())
    job["general"]["enabled"] = False
    job["export"]["onnx"] = False
    job["augment"].update(max_rows=1, num_copies=2)
    path.write_text(yaml.safe_dump(job))
    config = load_config(str(path))
    plan = {row["stage"]: row for row in plan_pipeline(config)}
    assert plan["mlm"]["action"] == "skip" and "no room for copies under augment.max_rows 1" in plan_markdown(
        list(plan.values()))
    run_pipeline(config)
    out = tmp_path / "run"
    assert not (out / "mlm").exists()
    record = json.loads((out / "augmented" / "stage.json").read_text())
    assert record["run_id"] == plan["augmented"]["run_id"]
    train = datasets.load_from_disk(str(next((out / "augmented" / "shards").glob("shard-*"))))
    assert record["num_augmented"] == 0 and record["num_rows"] == len(train) > 1 and not any(train["is_augmented"])
    again = {row["stage"]: row["action"] for row in plan_pipeline(config)}
    assert again["augmented"] == "reuse" and again["student"] == "reuse"
    # Without a row budget only augment.max_examples 0 leaves no copies, and the plan knows it without the data.
    none = dataclasses.replace(config, augment=dataclasses.replace(config.augment, max_rows=None, max_examples=0))
    some = dataclasses.replace(config, augment=dataclasses.replace(config.augment, max_rows=None, max_examples=5))
    assert {row["stage"]: row for row in plan_pipeline(none)}["mlm"]["action"] == "skip"
    assert "note" not in {row["stage"]: row for row in plan_pipeline(some)}["mlm"]


def test_a_masked_lm_budget_too_small_for_one_example_runs_no_masked_lm(tmp_path, tiny_tokenizer, caplog):
    """``augment.max_mlm_words`` below the first example's masked-LM work leaves no example to augment: no masked LM
    is adapted for nothing, every example is kept as it is, and the log says which budget left no room."""
    from distill.job.pipeline import run_pipeline
    from tests.conftest import tiny_job_every_stage

    path = Path(tiny_job_every_stage(tmp_path, tiny_tokenizer))
    job = yaml.safe_load(path.read_text())
    job["general"]["enabled"] = False
    job["export"]["onnx"] = False
    job["augment"].update(max_rows=None, max_mlm_words=1, num_copies=2)
    path.write_text(yaml.safe_dump(job))
    with caplog.at_level("INFO"):
        run_pipeline(load_config(str(path)))
    out = tmp_path / "run"
    assert not (out / "mlm").exists()
    assert json.loads((out / "augmented" / "stage.json").read_text())["num_augmented"] == 0
    assert "augment.max_mlm_words 1); every example is kept as it is and no masked LM is adapted" in caplog.text


def test_the_ner_recipe_ships_its_transfer_set():
    """`augment.unlabelled: [transfer]` names a corpus shipped with the package (50,000 sentences of Brown and movie
    reviews, distill/assets/PROVENANCE.md), so the plain NER command needs no text from the user; it is drawn from
    like any file, the dev sentences left out."""
    from distill.job.corpus import TRANSFER_CORPUS, corpus_sources

    config = load_config("ner_minilm.yaml", {"task.name": "wnut_17"})
    assert config.augment.unlabelled == ["transfer"] and config.augment.max_rows == 50000
    assert config.augment.unlabelled_ranked == 0.33  # the teacher keeps the third of them richest in entities
    assert corpus_sources(["transfer"]) == [str(TRANSFER_CORPUS)]
    with gzip.open(TRANSFER_CORPUS, "rt", encoding="utf-8") as handle:
        lines = handle.read().splitlines()
    assert len(lines) == len(set(lines)) == 50000 and all(len(line.split()) >= 5 for line in lines)
    from distill.job.corpus import BUNDLED_CORPUS

    with gzip.open(BUNDLED_CORPUS, "rt", encoding="utf-8") as handle:
        assert not set(lines) & set(handle.read().splitlines())  # other sentences than the masked LM's sample
    drawn = sample_lines(["transfer"], 100, seed=42)
    again = sample_lines(["transfer"], 100, seed=42, exclude=set(drawn))
    assert len(again) == 100 and not set(again) & set(drawn)  # the dev sentences are left out so
    assert drawn != sample_lines(["transfer"], 100, seed=43)


def test_entity_mass_sums_the_teachers_non_o_probability_over_scored_pieces_only():
    import numpy as np

    from distill.tasks.token_classification import entity_mass

    # Three pieces of three tags (O is index 1 here): the last piece is a word's continuation, not scored.
    logits = np.log(np.array([[0.2, 0.7, 0.1], [0.5, 0.25, 0.25], [0.9, 0.05, 0.05]]))
    labels = np.array([0, 0, IGNORE])
    assert entity_mass([logits], [labels], 1)[0] == pytest.approx(0.3 + 0.75)
    assert entity_mass([logits, logits[:0]], [labels, labels[:0]], None).tolist() == [2.0, 0.0]  # no O: words
    spec = task_spec(TaskConfig(name="wnut_17"))
    assert spec.type.transfer_scores(spec, [], []).shape == (0,)  # the type has a score: preflight asks this way
    assert task_spec(TaskConfig(name="sst2")).type.transfer_scores(spec, [], []) is None


def test_ranked_unlabelled_text_keeps_the_share_the_teacher_scores_highest_in_the_order_drawn(tmp_path,
                                                                                           tiny_tokenizer):
    """``augment.unlabelled_ranked`` r: room / r sentences drawn (here all 6 of the text: the room is 3, r 0.5), the
    fine-tuned teacher in the output folder scores each (the type's transfer score on its own logits), and the r
    share of them it scores highest fills the room, in the order drawn."""
    from functools import partial

    import numpy as np
    import torch

    from distill.job.stage_augment import teacher_ranks
    from distill.tasks.evaluate import predict
    from distill.tasks.token_classification import entity_mass
    from tests.test_token_classification import tiny_ner_teacher

    spec = _ner_spec(tmp_path)
    teacher_dir = tmp_path / "teacher"
    tiny_ner_teacher(seed=3).save_pretrained(teacher_dir)
    tiny_tokenizer.save_pretrained(teacher_dir)
    lines = ["the actor was in a movie", "the cast and the film", "a terrible plot is fun", "it is a wonderful story",
             "the actor and the cast", "a fun movie is a story"]
    corpus = write_corpus(tmp_path / "text.txt", lines)
    augmented = _augmented({"tokens": [["the", "actor"]], "label": [[0, 1]]},
                           datasets.Features({"tokens": datasets.Sequence(datasets.Value("string")),
                                              "label": datasets.Sequence(datasets.Value("int64"))}))
    config = with_overrides(load_config(None), {"augment.unlabelled": [str(corpus)], "augment.max_rows": 4,
                                                "augment.unlabelled_ranked": 0.5})
    rank = partial(teacher_ranks, teacher_dir, spec, 32, device=torch.device("cpu"))
    (tmp_path / "ranked").mkdir()
    rows = with_unlabelled(augmented, config, spec, tmp_path / "ranked", rank=rank)
    drawn = sample_lines([str(corpus)], 6, seed=config.augment.seed)  # what sample_lines gives for room / r
    assert sorted(drawn) == sorted(lines)
    # The same scores by hand: the teacher's logits on the drawn sentences, its non-O mass over scored pieces.
    encoded = spec.type.tokenize(datasets.Dataset.from_dict(spec.type.unlabelled_rows(spec, drawn)), tiny_tokenizer,
                                 spec, 32)
    teacher = tiny_ner_teacher(seed=3)
    scores = entity_mass(predict(teacher, encoded, tiny_tokenizer, task_type=spec.type, device="cpu"),
                         encoded["labels"], 0)
    assert len(set(np.round(scores, 6))) == 6  # no ties: the ranking is decided
    top = sorted(np.argsort(-scores)[:3])
    assert [" ".join(r["tokens"]) for r in rows.to_list()[1:]] == [" ".join(drawn[i].split()) for i in top]
    assert all(r["source_index"] == -1 for r in rows.to_list()[1:])
    # r 0.25 asks for 12 sentences of a text of 6: all 6 are scored and their top quarter (2) kept, short of the room.
    (tmp_path / "short").mkdir()
    short = with_unlabelled(augmented, with_overrides(config, {"augment.unlabelled_ranked": 0.25}), spec,
                            tmp_path / "short", rank=rank)
    assert [" ".join(r["tokens"]) for r in short.to_list()[1:]] == [" ".join(drawn[i].split())
                                                                   for i in sorted(np.argsort(-scores)[:2])]
    # Drawn at random instead (no r): three sentences fill the room, the teacher not asked.
    (tmp_path / "random").mkdir()
    plain = with_overrides(config, {"augment.unlabelled_ranked": None})
    drawn_three = with_unlabelled(augmented, plain, spec, tmp_path / "random", rank=None)
    assert len(drawn_three) == 4


def test_ranking_enters_the_augmented_run_id_with_the_teacher_and_is_refused_where_it_cannot_run(tmp_path):
    from distill.job.stage_augment import augmented_inputs

    spec_config = with_overrides(load_config("ner_minilm"), {"task.data_dir": None, "augment.unlabelled_ranked": None})
    ranked = with_overrides(spec_config, {"augment.unlabelled_ranked": 0.33})
    assert augmented_inputs(spec_config, "t1") == augmented_inputs(spec_config, "t2")  # no ranking: no teacher
    assert augmented_inputs(ranked, "t1") != augmented_inputs(ranked, "t2")
    assert augmented_inputs(ranked, "t1") != augmented_inputs(spec_config, "t1")
    inputs = augmented_inputs(spec_config, "t1")
    assert STAGES["augmented"].run_id(ranked, inputs) != STAGES["augmented"].run_id(spec_config, inputs)
    with pytest.raises(ConfigError, match="augment.unlabelled_ranked: a sequence classifier has no transfer score"):
        check_unlabelled(_sst2(tmp_path, **{"augment.unlabelled_ranked": 0.5}))
    with pytest.raises(ConfigError, match=r"augment.unlabelled_ranked=0.5 ranks the sentences of augment.unlabelled, "
                                          "which names no text"):
        preflight(with_overrides(load_config(None), {"augment.unlabelled_ranked": 0.5}))
    with pytest.raises(ConfigError, match="unlabelled_ranked"):
        with_overrides(load_config(None), {"augment.unlabelled_ranked": 1.5})


def test_the_pipeline_ranks_unlabelled_text_by_its_own_teacher_and_the_plan_knows_the_run_id(tmp_path, tiny_tokenizer,
                                                                                             caplog):
    """A tiny NER job with ``augment.unlabelled_ranked``: the augmented stage keeps the share of the drawn sentences
    its fine-tuned teacher ranks highest, under the run id the dry run printed; a rerun reuses it."""
    from distill.job.pipeline import plan_pipeline, run_pipeline
    from tests.conftest import tiny_job
    from tests.test_token_classification import SENTENCES, TAGS, tiny_ner_teacher

    data = tmp_path / "data"
    data.mkdir()
    write_conll(data / "train.conll", SENTENCES * 2)
    write_conll(data / "dev.conll", SENTENCES)
    corpus = write_corpus(tmp_path / "text.txt", [f"the {w} was a fun story" for w in ("actor", "cast", "film", "plot",
                                                                                        "movie", "story")])
    path = tiny_job(tmp_path, tiny_ner_teacher(), tiny_tokenizer,
                    task={"name": "ner", "task_type": "token_classification", "train_file": str(data / "train.conll"),
                          "dev_file": str(data / "dev.conll"), "label_names": list(TAGS)},
                    student={"num_hidden_layers": 1, "hidden_size": 32, "intermediate_size": 64,
                             "num_attention_heads": 4, "init": "teacher"},
                    export={"onnx": False})
    job = yaml.safe_load(Path(path).read_text())
    job["augment"].update(enabled=True, unlabelled=[str(corpus)], unlabelled_ranked=0.5, num_copies=0)
    job["augment"]["max_rows"] = 8 + 3  # the 8 training sentences and room for 3: 6 drawn, 3 kept
    job["distill"]["hard_label_weight"] = 0.0
    Path(path).write_text(yaml.safe_dump(job))
    config = load_config(str(path))
    planned = {row["stage"]: row for row in plan_pipeline(config)}["augmented"]["run_id"]
    run_pipeline(config)
    out = Path(config.output_dir)
    record = json.loads((out / "augmented" / "stage.json").read_text())
    assert record["run_id"] == planned and record["num_unlabelled"] == 3 and record["num_rows"] == 11
    assert "the teacher kept 3 of 6 sentences drawn" in caplog.text
    assert caplog.text.count("the teacher scores 6 sentences") == 1
    card = (out / "student" / "README.md").read_text()
    assert "3 of them sentences of text.txt with no label (the teacher's logits their targets; the 0.5 share of " \
        "those drawn that the teacher ranked highest)" in card
    run_pipeline(config)  # a rerun reads the rows back: the teacher ranks nothing again
    assert json.loads((out / "augmented" / "stage.json").read_text()) == record
    assert caplog.text.count("the teacher scores") == 1
