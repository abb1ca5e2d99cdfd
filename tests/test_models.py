"""Bad models give clear errors: not a classifier, wrong label count or order, no MLM head, other vocabulary."""

from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import BertConfig, BertForMaskedLM, BertModel, BertTokenizer

from distill.tasks.data import ASSETS
from distill.tasks.sequence_classification import GLUE_TASKS, read_glue_tsv
from distill.tasks import get_task
from distill.tasks.evaluate import compute_metrics
from students import build_student, student_shape
from students.build import init_embeddings_from_teacher
from distill.config import StudentConfig
from teachers import ModelError, check_same_vocabulary, check_teacher_quality, load_masked_lm, load_teacher
from teachers.finetune import chance_level
from tests.conftest import SPECIAL, WORDS, shared_data, tiny_bert, tiny_bert_config


def test_encoder_without_classifier_is_not_a_teacher(tmp_path):
    BertModel(tiny_bert_config()).save_pretrained(tmp_path)
    with pytest.raises(ModelError, match="not a fine-tuned sequence classifier .* omit --teacher"):
        load_teacher(str(tmp_path), get_task("sst2"))


def test_teacher_label_count_must_match_the_task(tmp_path):
    tiny_bert(num_labels=3).save_pretrained(tmp_path)
    with pytest.raises(ModelError, match="has 3 labels but task sst2 has 2"):
        load_teacher(str(tmp_path), get_task("sst2"))


def test_teacher_label_order_must_match_the_task(tmp_path):
    model = tiny_bert(id2label={0: "positive", 1: "negative"}, label2id={"positive": 0, "negative": 1})
    model.save_pretrained(tmp_path)
    with pytest.raises(ModelError, match=r"labels are \['positive', 'negative'\] but task sst2 expects \['negative', 'positive'\]"):
        load_teacher(str(tmp_path), get_task("sst2"))


def test_fine_tuned_teacher_loads_frozen(tmp_path):
    tiny_bert().save_pretrained(tmp_path)
    teacher = load_teacher(str(tmp_path), get_task("sst2"))
    assert not teacher.training and not any(p.requires_grad for p in teacher.parameters())


def test_missing_teacher_folder(tmp_path):
    with pytest.raises(ModelError, match="cannot load model"):
        load_teacher(str(tmp_path / "missing"), get_task("sst2"))


def test_masked_lm_without_head_points_to_adapt_mlm(tmp_path):
    BertModel(tiny_bert_config()).save_pretrained(tmp_path / "encoder")
    with pytest.raises(ModelError, match="has no masked-LM head .* adapt-mlm"):
        load_masked_lm(str(tmp_path / "encoder"))
    BertForMaskedLM(tiny_bert_config()).save_pretrained(tmp_path / "mlm")
    assert load_masked_lm(str(tmp_path / "mlm")).config.vocab_size == len(SPECIAL) + len(WORDS)


def test_student_vocabulary_must_equal_the_teachers(tiny_tokenizer):
    other = BertTokenizer(vocab={w: i for i, w in enumerate(SPECIAL + WORDS[::-1])})
    with pytest.raises(ModelError, match="distillation needs the same tokenizer"):
        check_same_vocabulary(tiny_tokenizer, other, "other-student")
    check_same_vocabulary(tiny_tokenizer, tiny_tokenizer, "same")


def test_teacher_near_chance_is_refused():
    labels = [0] * 50 + [1] * 50
    with pytest.raises(ModelError, match="below 0.5500 .* not fine-tuned"):
        check_teacher_quality({"accuracy": 0.51}, get_task("sst2"), None, "t", labels)
    check_teacher_quality({"accuracy": 0.51}, get_task("sst2"), 0.5, "t")
    # Far below chance: the mark of a teacher whose classes are in another order; the message says so.
    with pytest.raises(ModelError, match=r"Far below chance: a teacher whose classes are in another order"):
        check_teacher_quality({"accuracy": 0.08}, get_task("sst2"), None, "swapped", labels)


# Class counts of each GLUE task's dev set (the hub's validation split, MNLI's validation_matched), in label id order.
GLUE_DEV_COUNTS = {"cola": [322, 721], "sst2": [428, 444], "mrpc": [129, 279], "qqp": [25545, 14885],
                   "mnli": [3479, 3123, 3213], "qnli": [2702, 2761], "rte": [146, 131], "wnli": [40, 31]}
# Chance on each task's primary metric: the best constant guess on that dev set (the majority rate for accuracy).
CHANCE = {"cola": 0.0, "sst2": 444 / 872, "mrpc": 279 / 408, "stsb": 0.0, "qqp": 25545 / 40430,
          "mnli": 3479 / 9815, "qnli": 2761 / 5463, "rte": 146 / 277, "wnli": 40 / 71}


def _glue_dev_labels(task: str) -> np.ndarray:
    """(N,) labels with the class balance of the task's GLUE dev set (STS-B: 1500 scores spread over 0..5)."""
    if task == "stsb":
        return np.linspace(0.0, 5.0, 1500)
    counts = GLUE_DEV_COUNTS[task]
    return np.repeat(np.arange(len(counts)), counts)


def _outputs(spec, labels: np.ndarray, predictions: np.ndarray) -> np.ndarray:
    """Model outputs that predict ``predictions``: (N, C) one-hot logits, or (N, 1) scores for regression."""
    if spec.is_regression:
        return predictions.reshape(-1, 1).astype(float)
    return np.eye(spec.num_labels)[predictions]


@pytest.mark.parametrize("task", sorted(GLUE_TASKS))
def test_a_teacher_that_always_predicts_the_majority_class_is_refused_on_every_glue_task(task):
    """A collapsed teacher (one constant answer: the dev set's majority class, or a constant score) scores chance on
    the primary metric and is refused; a teacher right on 6 of 7 dev examples passes."""
    spec = get_task(task)
    labels = _glue_dev_labels(task)
    if spec.is_regression:
        constant, good = np.full(len(labels), 2.5), labels + np.random.default_rng(0).normal(0, 0.5, len(labels))
    else:
        constant = np.full(len(labels), np.bincount(labels).argmax())
        good = labels.copy()
        good[::7] = (good[::7] + 1) % spec.num_labels
    collapsed = compute_metrics(spec, _outputs(spec, labels, constant), labels)
    assert collapsed[spec.metrics[0]] == pytest.approx(CHANCE[task])
    with pytest.raises(ModelError, match=f"has dev {spec.metrics[0]} .* below {CHANCE[task] + 0.05:.4f}"):
        check_teacher_quality(collapsed, spec, None, "collapsed", labels)
    check_teacher_quality(compute_metrics(spec, _outputs(spec, labels, good), labels), spec, None, "good", labels)


@pytest.mark.parametrize("task", sorted(CHANCE))
def test_the_refusal_bar_is_chance_on_the_tasks_primary_metric_plus_005(task):
    spec = get_task(task)
    labels = _glue_dev_labels(task)
    assert chance_level(spec, labels) == pytest.approx(CHANCE[task])
    metric = spec.metrics[0]
    with pytest.raises(ModelError, match=f"has dev {metric} .* below {CHANCE[task] + 0.05:.4f}"):
        check_teacher_quality({metric: CHANCE[task] + 0.049}, spec, None, "just below", labels)
    check_teacher_quality({metric: CHANCE[task] + 0.051}, spec, None, "just above", labels)


def test_a_collapsed_mrpc_teacher_is_refused_and_the_message_names_the_majority_class():
    """Finding 2 of issue 27: an MRPC teacher that always says "equivalent" scores 0.684; 1/C = 0.5 let it pass."""
    labels = _glue_dev_labels("mrpc")
    with pytest.raises(ModelError, match=r"dev accuracy 0.6838, below 0.7338 \(chance is 0.6838, majority class "
                                         r"'equivalent'\)"):
        check_teacher_quality({"accuracy": 279 / 408, "f1": 2 * 279 / 687}, get_task("mrpc"), None, "t", labels)


def test_chance_on_accuracy_needs_the_dev_labels():
    with pytest.raises(ValueError, match="needs the dev labels"):
        chance_level(get_task("mrpc"))
    assert chance_level(get_task("cola")) == 0.0 and chance_level(get_task("stsb")) == 0.0


@pytest.mark.parametrize("task, folder", [("sst2", ASSETS / "sst2"), ("mrpc", "glue/MRPC")])
def test_the_glue_dev_class_counts_are_those_of_the_real_dev_files(task, folder):
    """The counts above against the real dev files (the bundled SST-2 dev set is GLUE's; MRPC's is in the shared
    data)."""
    folder = folder if isinstance(folder, Path) else shared_data(folder)
    labels = read_glue_tsv(folder / "dev.tsv", get_task(task))["label"]
    assert np.bincount(labels).tolist() == GLUE_DEV_COUNTS[task]


def test_a_matthews_teacher_of_04_is_accepted_and_a_constant_one_refused():
    """MCC 0.0 is a constant predictor; chance on MCC is 0, not 1/C, so a good teacher (0.4) passes."""
    check_teacher_quality({"matthews_corrcoef": 0.40}, get_task("cola"), None, "good")
    with pytest.raises(ModelError, match="chance is 0.0000, constant guess"):
        check_teacher_quality({"matthews_corrcoef": 0.0}, get_task("cola"), None, "constant")


def test_an_f1_primary_metric_has_the_best_constant_guess_as_chance():
    import dataclasses

    spec = dataclasses.replace(get_task("mrpc"), metrics=("f1", "accuracy"))
    labels = [1] * 68 + [0] * 32  # always "positive" scores F1 = 2 · 0.68 / 1.68
    assert chance_level(spec, labels) == pytest.approx(2 * 0.68 / 1.68)
    with pytest.raises(ModelError, match="below 0.8595"):
        check_teacher_quality({"f1": 0.85, "accuracy": 0.8}, spec, None, "t", labels)


def test_student_presets_and_teacher_init():
    assert student_shape(StudentConfig()) == {"num_hidden_layers": 4, "hidden_size": 312, "intermediate_size": 1200,
                                              "num_attention_heads": 12}
    # The refusal names the nearest shapes: hidden sizes 28 or 32 with 4 heads, or the head count nearest 4 dividing 30.
    with pytest.raises(ValueError, match=r"not divisible by num_attention_heads 4: nearest hidden_size 28 or 32 \(4 "
                                         r"heads of 7 or 8\), or num_attention_heads 3 \(head size 10\)"):
        student_shape(StudentConfig(preset=None, num_hidden_layers=2, hidden_size=30, intermediate_size=8,
                                    num_attention_heads=4))
    # Beside a teacher, the head count named divides the teacher's heads too (the attention loss groups them).
    with pytest.raises(ValueError, match=r"nearest hidden_size 96 or 108 \(12 heads of 8 or 9\), or "
                                         r"num_attention_heads 4 \(head size 25\)"):
        student_shape(StudentConfig(preset=None, num_hidden_layers=2, hidden_size=100, intermediate_size=8,
                                    num_attention_heads=12), BertConfig(num_attention_heads=12))
    teacher = tiny_bert()
    student = build_student(teacher, StudentConfig(preset=None, num_hidden_layers=1, hidden_size=32,
                                                   intermediate_size=64, num_attention_heads=4, init="teacher"), [2])
    assert student.config.vocab_size == teacher.config.vocab_size and student.config.num_labels == 2
    s, t = student.state_dict(), teacher.state_dict()
    assert (s["bert.encoder.layer.0.attention.self.query.weight"] == t["bert.encoder.layer.1.attention.self.query.weight"]).all()
    assert (s["bert.embeddings.word_embeddings.weight"] == t["bert.embeddings.word_embeddings.weight"]).all()
    with pytest.raises(ValueError, match="needs the teacher's hidden_size"):
        build_student(teacher, StudentConfig(preset=None, num_hidden_layers=1, hidden_size=16, intermediate_size=64,
                                             num_attention_heads=4, init="teacher"), [2])
    # Same sizes, other heads: the copied Q/K/V split into 2 heads would not compute the teacher's layer.
    with pytest.raises(ValueError, match="needs the teacher's num_attention_heads"):
        build_student(teacher, StudentConfig(preset=None, num_hidden_layers=1, hidden_size=32, intermediate_size=64,
                                             num_attention_heads=2, init="teacher"), [2])


def test_teacher_embeddings_align_positions_between_families_that_count_them_differently():
    """A RoBERTa-style family's first token has position id pad_token_id + 1, BERT's 0: position p of one is
    position p + 2 of the other, in either direction; equal widths copy the tables as they are."""
    from transformers import BertConfig, BertModel, RobertaConfig, RobertaModel

    torch.manual_seed(0)
    sizes = dict(vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
                 max_position_embeddings=20, type_vocab_size=1)
    bert, roberta = BertModel(BertConfig(**sizes, pad_token_id=0)), RobertaModel(RobertaConfig(**sizes, pad_token_id=1))
    for teacher, student, shift in [(roberta, BertModel(BertConfig(**sizes, pad_token_id=0)), 2),
                                    (bert, RobertaModel(RobertaConfig(**sizes, pad_token_id=1)), -2)]:
        untouched = student.embeddings.position_embeddings.weight.detach().clone()
        init_embeddings_from_teacher(student, teacher)
        mine, theirs = student.embeddings.position_embeddings.weight, teacher.embeddings.position_embeddings.weight
        if shift > 0:  # the BERT student's position p is the RoBERTa teacher's p + 2; its last 2 rows have no source
            assert torch.equal(mine[:18], theirs[2:]) and torch.equal(mine[18:], untouched[18:])
        else:  # the RoBERTa student's p + 2 is the BERT teacher's p; its first 2 rows (padding) have no source
            assert torch.equal(mine[2:], theirs[:18]) and torch.equal(mine[:2], untouched[:2])


def test_the_teacher_half_preset_is_the_teachers_width_at_half_its_depth():
    from transformers import AutoConfig

    from tests.conftest import tiny_bert_config

    half = StudentConfig(preset="teacher-half", init="teacher")
    for layers, expected in [(2, 1), (5, 3), (6, 3), (12, 6)]:
        assert student_shape(half, tiny_bert_config(num_hidden_layers=layers)) == {
            "num_hidden_layers": expected, "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4}
    distilbert = AutoConfig.for_model("distilbert", n_layers=6, dim=48, hidden_dim=96, n_heads=4)
    assert student_shape(half, distilbert) == {"num_hidden_layers": 3, "hidden_size": 48, "intermediate_size": 96,
                                               "num_attention_heads": 4}
    with pytest.raises(ValueError, match="'teacher-half' takes its sizes from the teacher's config"):
        student_shape(half)
    # Built from a 4-layer teacher with the uniform map [2, 4]: its layers 2 and 4 become the student's 1 and 2.
    teacher = tiny_bert(num_hidden_layers=4)
    student = build_student(teacher, half, [2, 4])
    assert student.config.num_hidden_layers == 2 and student.config.hidden_size == 32
    s, t = student.state_dict(), teacher.state_dict()
    for mine, theirs in [(0, 1), (1, 3)]:
        assert (s[f"bert.encoder.layer.{mine}.output.dense.weight"] == t[f"bert.encoder.layer.{theirs}.output.dense.weight"]).all()


def test_the_adapt_mlm_command_counts_its_corpus_by_bytes_and_shares_the_pipelines_run_id(tmp_path, capsys):
    """Its id named the corpus by path, so an edited corpus (or an encoder trained again in place) reused the old
    masked LM; it is now the pipeline's mlm stage id, so the folder is also one a pipeline would reuse."""
    import json

    import run_distill
    from distill.config import load_config
    from distill.job.stages import STAGES

    encoder, corpus, out = tmp_path / "encoder", tmp_path / "corpus.txt", tmp_path / "mlm"
    tiny_bert(seed=0).save_pretrained(encoder)
    BertTokenizer(vocab={w: i for i, w in enumerate(SPECIAL + WORDS)}).save_pretrained(encoder)
    corpus.write_text("the movie was good\na bad film\nthe plot was fun\n" * 4)
    args = ["adapt-mlm", "--model", str(encoder), "--corpus", str(corpus), "--output-dir", str(out), "--max-steps", "2",
            "--set", "mlm.train.batch_size=4", "--set", "mlm.train.save_steps=1"]
    assert run_distill.main(args) == 0
    first = json.loads((out / "stage.json").read_text())["run_id"]
    config = load_config(None, {"mlm.base_model": str(encoder), "mlm.corpus": [str(corpus)], "mlm.train.max_steps": 2,
                                "mlm.train.batch_size": 4, "mlm.train.save_steps": 1})
    assert first == STAGES["mlm"].run_id(config, {})
    corpus.write_text("a great cast and a fun story\n" * 12)  # same path, other text: not the old masked LM
    assert run_distill.main(args) == 2
    assert f"holds the output of another run (run id {first}" in capsys.readouterr().err
    assert json.loads((out / "stage.json").read_text())["run_id"] == first  # kept until the user says otherwise
    assert run_distill.main(args[:6] + [str(tmp_path / "mlm2")] + args[7:]) == 0
