"""Sentence embeddings (distill/tasks/sentence_embedding.py): pooling as sentence-transformers pools, read from the
teacher's folder; the embedding term by hand; the two metrics on planted embeddings; a tiny sentence encoder distilled
end to end into a folder that SentenceTransformer loads and encodes with as the report scored it."""

import json

import numpy as np
import pytest
import torch

from distill.tasks import get_task
from distill.tasks.sentence_embedding import (ProjectedEncoder, SentenceEncoder, cosine, pool, pool_rows,
                                              read_dense, read_pooling, retrieval_metrics, similarity_metrics,
                                              write_sentence_transformers)

SPEC = get_task("stsb_embedding")


def test_pooling_is_over_real_tokens_as_sentence_transformers_pools():
    hidden = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]], [[5.0, 6.0], [7.0, 8.0], [9.0, 10.0]]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    torch.testing.assert_close(pool(hidden, mask, "mean"), torch.tensor([[2.0, 3.0], [7.0, 8.0]]))
    torch.testing.assert_close(pool(hidden, mask, "cls"), torch.tensor([[1.0, 2.0], [5.0, 6.0]]))
    torch.testing.assert_close(pool(hidden, mask, "max"), torch.tensor([[3.0, 4.0], [9.0, 10.0]]))  # padding not max
    normalized = pool(hidden, mask, "mean", normalize=True)
    torch.testing.assert_close(normalized.norm(dim=-1), torch.ones(2))
    rows = [hidden[0, :2].numpy(), hidden[1].numpy()]  # padding removed, as evaluation keeps them
    np.testing.assert_allclose(pool_rows(rows, "mean"), pool(hidden, mask, "mean").numpy())


def test_the_pooling_is_read_from_a_sentence_transformers_folder(tmp_path):
    from teachers.models import resolve_model

    assert read_pooling(resolve_model("minilm")) == {"pooling": "mean", "normalize": True}  # all-MiniLM-L6-v2's own
    write_sentence_transformers(tmp_path, 16, "cls", False, 64)
    assert read_pooling(tmp_path) == {"pooling": "cls", "normalize": False}
    assert json.loads((tmp_path / "sentence_bert_config.json").read_text())["max_seq_length"] == 64
    assert read_pooling(tmp_path / "nowhere") is None


def test_similarity_metrics_are_the_correlations_of_the_pairs_cosines_with_the_scores():
    first = np.array([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [1.0, 0.0]])
    angles = np.array([0.0, 0.5, 1.0, 1.5])  # cosine falls as the angle grows
    second = np.stack([np.cos(angles), np.sin(angles)], axis=1)
    metrics = similarity_metrics(first, second, np.array([5.0, 3.0, 2.0, 0.0]))
    assert metrics["spearman"] == pytest.approx(1.0)
    assert metrics["pearson"] == pytest.approx(np.corrcoef(np.cos(angles), [5.0, 3.0, 2.0, 0.0])[0, 1])
    assert similarity_metrics(first, first, np.array([1.0, 2.0, 3.0, 4.0])) == {"spearman": 0.0, "pearson": 0.0}


def test_retrieval_is_scored_by_the_rank_of_each_querys_passage():
    passages = np.eye(4)
    queries = np.array([[1.0, 0.0, 0.0, 0.0],      # its passage first
                        [0.9, 0.5, 0.0, 0.0],      # passage 0 first, its own (1) second
                        [0.1, 0.2, 0.0, 1.0]])     # passages 3, 1, 0 first, its own (2) last of 4
    metrics = retrieval_metrics(queries, passages, np.array([0, 1, 2]), k=3)
    assert metrics["recall@1"] == pytest.approx(1 / 3)
    assert metrics["mrr@3"] == pytest.approx((1 + 1 / 2 + 0) / 3)  # rank 4 is past the cut-off


def test_the_embedding_term_is_the_mse_of_pooled_embeddings_or_of_their_similarities_across_widths():
    kind = SPEC.type
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]])
    generator = torch.Generator().manual_seed(0)
    teacher = torch.randn(3, 3, 8, generator=generator)
    student = torch.randn(3, 3, 8, generator=generator)
    batch = {"attention_mask": mask}
    loss = kind.prediction_loss(SPEC, student, teacher, batch, temperature=1.0, temperature_squared=False,
                                hard_label_weight=0.0)
    expected = ((pool(student, mask, normalize=True) - pool(teacher, mask, normalize=True)) ** 2).mean()
    torch.testing.assert_close(loss, expected)
    # a student of another width with the teacher's geometry (its embeddings a rotation of the teacher's, padded with
    # zeros to 12 dimensions) loses nothing; one without it does
    rotation = torch.linalg.qr(torch.randn(8, 8, generator=generator))[0]
    same_geometry = torch.cat([teacher @ rotation, torch.zeros(3, 3, 4)], dim=-1)
    assert kind.prediction_loss(SPEC, same_geometry, teacher, batch, temperature=1.0, temperature_squared=False,
                                hard_label_weight=0.0) < 1e-10
    other = torch.randn(3, 3, 12, generator=generator)
    assert kind.prediction_loss(SPEC, other, teacher, batch, temperature=1.0, temperature_squared=False,
                                hard_label_weight=0.0) > 1e-3


def test_scoring_pairs_two_rows_an_example_with_the_halves_following_the_pairs():
    from distill.tasks.split import HalfScorer
    from distill.tasks.evaluate import compute_metrics
    import datasets

    kind = SPEC.type
    labels = [{"example": i // 2, "score": float(i // 2)} for i in range(8)]  # 4 pairs, scores 0..3
    rows = []
    for pair in range(4):  # the first sentence along x, the second at an angle that grows as the score falls
        angle = (3 - pair) * 0.4
        rows += [np.array([[1.0, 0.0]]), np.array([[np.cos(angle), np.sin(angle)]])]
    metrics = kind.compute_metrics(SPEC, rows, labels)
    assert metrics["spearman"] == pytest.approx(1.0)
    assert kind.row_examples(labels) == [0, 0, 1, 1, 2, 2, 3, 3]
    data = datasets.DatasetDict({"dev": datasets.Dataset.from_dict(
        {"sentence1": [f"a {i}" for i in range(4)], "sentence2": [f"b {i}" for i in range(4)],
         "label": [0.0, 1.0, 2.0, 3.0]})})
    scorer = HalfScorer(SPEC, data, "dev", labels, None, 32)
    assert sum(len(rows) for rows in scorer.rows.values()) == 8
    assert all(len(rows) % 2 == 0 for rows in scorer.rows.values())  # a pair's two rows fall in one half
    assert cosine(np.array([[1.0, 0.0]]), np.array([[0.0, 2.0]]))[0] == pytest.approx(0.0)
    assert compute_metrics  # the evaluation entry the pipeline calls


@pytest.mark.slow
def test_a_sentence_encoder_distils_into_a_folder_sentence_transformers_loads(tmp_path):
    from sentence_transformers import SentenceTransformer
    from transformers import BertModel, BertTokenizer

    from distill.config import load_config
    from distill.job.pipeline import run_pipeline
    from tests.conftest import SPECIAL, WORDS, tiny_bert_config, tiny_job
    from tests.glue_fixtures import write_glue_folder

    tokenizer = BertTokenizer(vocab={w: i for i, w in enumerate(SPECIAL + WORDS)})
    torch.manual_seed(0)
    teacher = BertModel(tiny_bert_config(num_hidden_layers=4), add_pooling_layer=False).eval()
    data = write_glue_folder(tmp_path, "stsb")
    path = tiny_job(tmp_path, teacher, tokenizer, task={"name": "stsb_embedding", "data_dir": str(data)},
                    student={"preset": "teacher-half", "init": "teacher", "num_hidden_layers": None,
                             "hidden_size": None, "intermediate_size": None, "num_attention_heads": None},
                    export={"onnx": False})
    write_sentence_transformers(tmp_path / "teacher_model", 32, "mean", True, 32)  # the teacher is an ST folder
    report = run_pipeline(load_config(path))
    out = tmp_path / "run"
    student = report["models"]["student"]["dev"]
    assert {"spearman", "pearson", "report/spearman", "tuning/spearman"} <= set(student)
    encoder = SentenceTransformer(str(out / "student"), device="cpu")
    assert encoder.get_embedding_dimension() == 32
    texts = ["the movie was good", "a bad film"]
    found = encoder.encode(texts, convert_to_tensor=True)
    from transformers import AutoModel

    model = AutoModel.from_pretrained(out / "student").eval()
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = pool(model(**batch).last_hidden_state, batch["attention_mask"], "mean", normalize=True)
    torch.testing.assert_close(found.float(), expected, rtol=1e-4, atol=1e-5)  # the pooling the report scored with
    card = (out / "student" / "README.md").read_text()
    assert "SentenceTransformer(" in card and "pipeline_tag: sentence-similarity" in card


def test_your_own_sentences_and_scored_pairs_make_a_task(tmp_path):
    from distill.config import TaskConfig
    from distill.tasks.data import load_task_data, task_spec

    (tmp_path / "sentences.txt").write_text("A man plays a guitar.\n\nA cat sleeps.\n", encoding="utf-8")
    (tmp_path / "pairs.tsv").write_text("sentence1\tsentence2\tscore\na man\ta person\t4.5\na cat\ta car\t0.5\n",
                                        encoding="utf-8")
    config = TaskConfig(name="mine", task_type="sentence_embedding", train_file=str(tmp_path / "sentences.txt"),
                        dev_file=str(tmp_path / "pairs.tsv"))
    spec = task_spec(config)
    data = load_task_data(config, spec)
    assert data["train"]["sentence1"] == ["A man plays a guitar.", "A cat sleeps."]  # blank lines left out
    assert data["dev"]["label"] == [4.5, 0.5]
    from transformers import BertTokenizer

    from tests.conftest import SPECIAL, WORDS

    tokenizer = BertTokenizer(vocab={w: i for i, w in enumerate(SPECIAL + WORDS)})
    assert len(spec.type.tokenize(data["train"], tokenizer, spec, 16)) == 2  # one row a sentence, no empty rows
    assert len(spec.type.tokenize(data["dev"], tokenizer, spec, 16)) == 4  # a pair's two sentences


def test_retrieval_scores_each_question_against_the_passages_of_the_set(tmp_path):
    from distill.config import TaskConfig
    from distill.tasks.data import load_task_data
    from tests.test_question_answering import write_squad

    spec = get_task("squad_retrieval")
    write_squad(tmp_path / "train.json")
    write_squad(tmp_path / "dev.json")
    dev = load_task_data(TaskConfig(name="squad_retrieval", data_dir=str(tmp_path)), spec)["dev"]
    assert set(dev.column_names) == {"question", "context", "label"}  # the label: the paragraph's index
    # three questions, two of the first paragraph, one of the second; each question's embedding near its paragraph's
    labels = [{"example": e, "score": p} for e, p in ((0, 0.0), (0, 0.0), (1, 0.0), (1, 0.0), (2, 1.0), (2, 1.0))]
    rows = [np.array([[1.0, 0.1]]), np.array([[1.0, 0.0]]),     # question 0, paragraph 0
            np.array([[0.2, 1.0]]), np.array([[1.0, 0.0]]),     # question 1 points at paragraph 1: rank 2
            np.array([[0.0, 1.0]]), np.array([[0.0, 1.0]])]     # question 2, paragraph 1
    metrics = spec.type.compute_metrics(spec, rows, labels)
    assert metrics == {"mrr@10": pytest.approx((1 + 0.5 + 1) / 3), "recall@1": pytest.approx(2 / 3)}


def _spec(**options):
    from dataclasses import replace

    return replace(SPEC, options={**SPEC.options, **options})


def test_the_map_to_the_teachers_width_is_the_dense_module_after_the_pooling_and_ships_as_one(tmp_path):
    """Mapping every token's embedding and then pooling (what the student runs) equals pooling and then sentence-
    transformers' Dense module (what the saved folder runs), for the mean and the first token; the folder loads back
    with the same map, and SentenceTransformer encodes with it."""
    from sentence_transformers import SentenceTransformer
    from transformers import BertModel, BertTokenizer

    from tests.conftest import SPECIAL, WORDS, tiny_bert_config

    torch.manual_seed(0)
    encoder = BertModel(tiny_bert_config(hidden_size=16, num_attention_heads=2, intermediate_size=32),
                        add_pooling_layer=False).eval()
    model = ProjectedEncoder(encoder, torch.nn.Linear(16, 32)).eval()
    tokenizer = BertTokenizer(vocab={w: i for i, w in enumerate(SPECIAL + WORDS)})
    texts = ["the movie was good", "a bad film was fun the plot"]
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    assert batch["attention_mask"].min() == 0  # a padded row: the mean must leave padding out
    with torch.no_grad():
        tokens = encoder(**batch).last_hidden_state
        for mode in ("mean", "cls"):
            torch.testing.assert_close(pool(model(**batch).last_hidden_state, batch["attention_mask"], mode),
                                       model.projection(pool(tokens, batch["attention_mask"], mode)))
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    write_sentence_transformers(tmp_path, 16, "mean", True, 32)
    modules = [m["type"].rsplit(".", 1)[1] for m in json.loads((tmp_path / "modules.json").read_text())]
    assert modules == ["Transformer", "Pooling", "Dense", "Normalize"]
    loaded = SentenceEncoder.from_pretrained(tmp_path)
    assert isinstance(loaded, ProjectedEncoder)
    torch.testing.assert_close(loaded.projection.weight, model.projection.weight)
    found = SentenceTransformer(str(tmp_path), device="cpu").encode(texts, convert_to_tensor=True)
    assert found.shape == (2, 32)
    with torch.no_grad():
        expected = pool(model(**batch).last_hidden_state, batch["attention_mask"], "mean", normalize=True)
    torch.testing.assert_close(found.float(), expected, rtol=1e-4, atol=1e-5)
    from distill.tasks import ModelError
    from teachers.models import load_teacher

    with pytest.raises(ModelError, match="cannot be distilled layer by layer"):  # a mapped student as a teacher
        load_teacher(str(tmp_path), SPEC)
    # a folder without a Dense module loads as the bare encoder
    encoder.save_pretrained(tmp_path / "bare")
    assert read_dense(tmp_path / "bare") is None
    assert not isinstance(SentenceEncoder.from_pretrained(tmp_path / "bare"), ProjectedEncoder)


def test_the_prediction_step_maps_a_narrower_student_only_when_the_teachers_space_is_kept(tmp_path):
    from transformers import BertModel

    from distill.job.stage_distill import hidden_projection
    from distill.tasks import DataError
    from tests.conftest import tiny_bert_config

    teacher = BertModel(tiny_bert_config(hidden_size=32), add_pooling_layer=False)
    student = BertModel(tiny_bert_config(hidden_size=16, num_attention_heads=2, intermediate_size=32),
                        add_pooling_layer=False)
    kind = SPEC.type
    assert kind.prediction_model(SPEC, student, teacher) is student  # the default: its own space
    same = BertModel(tiny_bert_config(hidden_size=32), add_pooling_layer=False)
    assert kind.prediction_model(_spec(teacher_space=True), same, teacher) is same  # already the teacher's width
    from safetensors.torch import save_file

    w_h = torch.nn.Linear(16, 32)
    save_file({"hidden.weight": w_h.weight.detach(), "hidden.bias": w_h.bias.detach(),
               "embedding.weight": torch.zeros(32, 16), "embedding.bias": torch.zeros(32)},
              tmp_path / "projections.safetensors")
    projection = hidden_projection(tmp_path)
    torch.testing.assert_close(projection.weight, w_h.weight)  # W_h, not W_e
    mapped = kind.prediction_model(_spec(teacher_space=True), student, teacher, projection)
    assert isinstance(mapped, ProjectedEncoder) and mapped.encoder is student
    torch.testing.assert_close(mapped.projection.bias, w_h.bias)  # starts as the intermediate step's W_h
    assert hidden_projection(tmp_path / "nowhere") is None
    with pytest.raises(DataError, match="mean or cls pooling"):
        kind.prediction_model(_spec(teacher_space=True, pooling="max"), student, teacher)


@pytest.mark.slow
def test_a_narrower_student_keeps_the_teachers_space_end_to_end(tmp_path):
    """teacher_space: the 16-wide student is trained, scored and shipped with its map to the teacher's 32: the folder
    SentenceTransformer loads embeds in 32 dimensions, as the report scored it."""
    from sentence_transformers import SentenceTransformer
    from transformers import BertModel, BertTokenizer

    from distill.config import load_config
    from distill.job.pipeline import run_pipeline
    from tests.conftest import SPECIAL, WORDS, tiny_bert_config, tiny_job
    from tests.glue_fixtures import write_glue_folder

    tokenizer = BertTokenizer(vocab={w: i for i, w in enumerate(SPECIAL + WORDS)})
    torch.manual_seed(0)
    teacher = BertModel(tiny_bert_config(num_hidden_layers=4), add_pooling_layer=False).eval()
    data = write_glue_folder(tmp_path, "stsb")
    path = tiny_job(tmp_path, teacher, tokenizer,
                    task={"name": "stsb_embedding", "data_dir": str(data), "options": {"teacher_space": True}},
                    export={"onnx": True})
    write_sentence_transformers(tmp_path / "teacher_model", 32, "mean", True, 32)
    report = run_pipeline(load_config(path))
    out = tmp_path / "run"
    # scored in its own space and, its embeddings being the teacher's width, against the teacher's (each half too)
    assert {"spearman", "report/spearman", "teacher_index/spearman", "report/teacher_index/spearman",
            "tuning/teacher_index/spearman"} <= set(report["models"]["student"]["dev"])
    modules = [m["type"].rsplit(".", 1)[1] for m in json.loads((out / "student" / "modules.json").read_text())]
    assert modules == ["Transformer", "Pooling", "Dense", "Normalize"]
    encoder = SentenceTransformer(str(out / "student"), device="cpu")
    assert encoder.get_embedding_dimension() == 32  # the teacher's width
    texts = ["the movie was good", "a bad film"]
    model = SentenceEncoder.from_pretrained(out / "student").eval()
    assert model.config.hidden_size == 16
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = pool(model(**batch).last_hidden_state, batch["attention_mask"], "mean", normalize=True)
    torch.testing.assert_close(encoder.encode(texts, convert_to_tensor=True).float(), expected, rtol=1e-4, atol=1e-5)
    export = json.loads((out / "student" / "onnx" / "export.json").read_text())
    assert export["files"]["model.onnx"]["same_prediction"] == 1.0  # the graph maps to the teacher's width too
    # the map was trained in the prediction step, from the intermediate step's W_h
    from distill.job.stage_distill import hidden_projection

    start = hidden_projection(out / "student_intermediate")
    assert start is not None and start.weight.shape == model.projection.weight.shape
    assert not torch.equal(start.weight, model.projection.weight)


def test_the_students_embeddings_are_read_against_the_teachers_where_they_share_its_width():
    """Retrieval: the student's queries against the teacher's passages; scored pairs: each pair's cosine between the
    student's embedding of one sentence and the teacher's of the other, both ways."""
    spec = get_task("squad_retrieval")
    labels = [{"example": e, "score": p} for e, p in ((0, 0.0), (0, 0.0), (1, 1.0), (1, 1.0))]
    student = [np.array([[1.0, 0.0]]), np.array([[0.0, 1.0]]),   # question 0, (its passage as the student embeds it)
               np.array([[0.0, 1.0]]), np.array([[1.0, 0.0]])]   # question 1
    teacher = [np.array([[0.0, 1.0]]), np.array([[1.0, 0.0]]),   # the teacher's passage 0 is where the student's
               np.array([[1.0, 0.0]]), np.array([[0.0, 1.0]])]   # question 0 points; passage 1 where question 1 does
    assert spec.type.compute_metrics(spec, student, labels) == {"mrr@10": 0.5, "recall@1": 0.0}  # its own index
    assert spec.type.paired_metrics(spec, student, teacher, labels) == {"mrr@10": 1.0, "recall@1": 1.0}
    pairs = [{"example": e, "score": s} for e, s in ((0, 1.0), (0, 1.0), (1, 5.0), (1, 5.0), (2, 3.0), (2, 3.0))]
    ours = [np.array([[1.0, 0.0]]), np.array([[0.0, 1.0]]), np.array([[1.0, 0.0]]), np.array([[0.0, 1.0]]),
            np.array([[1.0, 0.0]]), np.array([[1.0, 0.0]])]
    theirs = [np.array([[1.0, 0.0]]), np.array([[0.0, 1.0]]), np.array([[0.0, 1.0]]), np.array([[1.0, 0.0]]),
              np.array([[1.0, 1.0]]), np.array([[1.0, 1.0]])]
    # cosines across, both ways: pair 0 (0 + 0) / 2, pair 1 (1 + 1) / 2, pair 2 (0.707 + 0.707) / 2, ranked as the
    # scores 1, 5, 3; the student's own: 0, 0, 1
    found = SPEC.type.paired_metrics(SPEC, ours, theirs, pairs)
    assert found["spearman"] == pytest.approx(1.0)
    assert SPEC.type.compute_metrics(SPEC, ours, pairs)["spearman"] == pytest.approx(0.0)
    from transformers import BertModel

    from tests.conftest import tiny_bert_config

    wide = BertModel(tiny_bert_config(hidden_size=32), add_pooling_layer=False)
    narrow = BertModel(tiny_bert_config(hidden_size=16, num_attention_heads=2, intermediate_size=32),
                       add_pooling_layer=False)
    assert SPEC.type.against_teacher(SPEC, wide, wide)
    assert not SPEC.type.against_teacher(SPEC, narrow, wide)
    assert SPEC.type.against_teacher(SPEC, ProjectedEncoder(narrow, torch.nn.Linear(16, 32)), wide)


def test_teacher_space_is_checked_before_any_stage_and_moves_only_the_prediction_steps_run_id():
    from distill.config import load_config
    from distill.job.stages import STAGES
    from distill.tasks import DataError

    with pytest.raises(DataError, match="true or false"):
        SPEC.type.check_options(_spec(teacher_space="false"))
    with pytest.raises(DataError, match="mean or cls pooling"):
        SPEC.type.check_options(_spec(teacher_space=True, pooling="max"))
    inputs = {"mlm": "m", "teacher": "t", "student_intermediate": "s", "teacher_logits": "l"}

    def ids(**overrides):
        config = load_config("embedding_minilm.yaml", {"task.name": "stsb_embedding", **overrides})
        return {name: STAGES[name].run_id(config, {k: inputs[k] for k in STAGES[name].inputs})
                for name in ("teacher", "augmented", "pruned", "student")}

    unset = ids()
    assert ids(**{"task.options": {"teacher_space": False}}) == unset  # false as unset: no run id moves
    kept = ids(**{"task.options": {"teacher_space": True}})
    assert {name for name in unset if kept[name] != unset[name]} == {"student"}
    pooled = ids(**{"task.options": {"pooling": "cls"}})  # another option still moves the stages that read it
    assert pooled["teacher"] != unset["teacher"]


def test_a_folder_with_a_dense_module_of_another_make_is_refused(tmp_path):
    from transformers import BertModel

    from distill.tasks import ModelError
    from distill.tasks.sentence_embedding import write_dense
    from tests.conftest import tiny_bert_config

    BertModel(tiny_bert_config(), add_pooling_layer=False).save_pretrained(tmp_path)
    write_dense(tmp_path / "2_Dense", torch.nn.Linear(32, 8))
    write_sentence_transformers(tmp_path, 32, "mean", True, 32)  # e.g. a teacher whose embeddings are its Dense's
    with pytest.raises(ModelError, match="Dense module"):
        SentenceEncoder.from_pretrained(tmp_path)
