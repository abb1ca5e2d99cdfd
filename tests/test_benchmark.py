"""The benchmark on tiny models: every column and ratio, int8 and ONNX Runtime rows that load and predict, the plot."""

import csv
import json

import datasets
import pytest
import torch
from transformers import BertTokenizer

from distill.publish.benchmark import pareto_front, run_benchmark
from distill.publish.export import OnnxClassifier, quantize_onnx, quantize_torch
from distill.config import BenchmarkConfig
from distill.tasks import get_task
from tests.conftest import SPECIAL, WORDS, tiny_bert

SENTENCES = ["the movie was good", "a bad film", "the plot was fun", "boring story", "great cast", "not fun"]
# Dev labels on which the two models score differently (the teacher 3 of 6, the small model 5 of 6), so that each
# row's accuracy shows which model it scored.
LABELS = [0, 1, 0, 0, 1, 1]


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench")
    tokenizer = BertTokenizer(vocab={w: i for i, w in enumerate(SPECIAL + WORDS)})
    small = tiny_bert(seed=1, hidden_size=16, intermediate_size=32, initializer_range=0.5)  # predicts both classes
    for name, model in {"teacher": tiny_bert(seed=0, num_hidden_layers=4, hidden_size=64, intermediate_size=128),
                        "small": small}.items():
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    dev = datasets.Dataset.from_dict({"sentence": SENTENCES * 4, "label": LABELS * 4})
    THREADS["before"] = torch.get_num_threads()
    config = BenchmarkConfig(batch_sizes=[1, 4], seq_lengths=[8, 16], num_warmup=1, min_repeats=3, max_repeats=5,
                             num_threads=1 if THREADS["before"] > 1 else 2)  # not the process's own count
    # The tiny teacher scores 3 of 6, the balanced dev set's chance: no retained share would mean anything there
    # (test_a_model_at_chance_gets_no_share); the ratios' arithmetic is checked with no chance level known.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("distill.publish.benchmark.chance", lambda spec, labels: None)
        report = run_benchmark(root / "teacher", {"small": (root / "small", "random")}, get_task("sst2"), dev, config,
                               root / "out", max_seq_length=16)
    THREADS["after"] = torch.get_num_threads()
    return root, report


def test_a_model_at_chance_gets_no_share_as_the_report_says():
    from pathlib import Path

    from distill.publish.benchmark import Row, _report, markdown

    spec, config = get_task("sst2"), BenchmarkConfig(batch_sizes=[4], seq_lengths=[16], memory=False)
    latency = {"b4_t16": {"median_ms": 10.0, "p90_ms": 11.0, "spread": 0.1, "repeats": 3}}

    def row(name, accuracy):
        return Row(name, name, "pytorch", None, Path(name), 1.0, {"num_parameters": 10,
                                                                    "num_parameters_without_embeddings": 5},
                   results={"dev": {"accuracy": accuracy, "report/accuracy": accuracy}, "latency": latency,
                            "samples_per_s": 400.0})

    level = {"metric": "accuracy", "value": 0.5, "basis": "majority class 'negative'"}
    clear = _report([row("teacher", 0.9), row("student", 0.8)], spec, config, "b4_t16", torch.device("cpu"),
                    Path("."), level)
    assert clear["rows"][1]["ratios"]["metric_retained"] == pytest.approx(0.8 / 0.9)
    assert clear["rows"][1]["retained_note"] is None
    at_chance = _report([row("teacher", 0.5), row("student", 0.8)], spec, config, "b4_t16", torch.device("cpu"),
                        Path("."), level)
    for found in at_chance["rows"]:
        assert found["ratios"]["metric_retained"] is None and "teacher at chance" in found["retained_note"]
    assert "| n/a |" in markdown(at_chance) and "n/a — teacher at chance" in markdown(at_chance)
    student_low = _report([row("teacher", 0.9), row("student", 0.52)], spec, config, "b4_t16", torch.device("cpu"),
                          Path("."), level)
    assert student_low["rows"][1]["ratios"]["metric_retained"] is None  # within 0.05 of chance


THREADS: dict[str, int] = {}


def test_the_thread_count_it_timed_at_is_not_left_behind(bench):
    assert THREADS["after"] == THREADS["before"]  # the process's count, not the one the benchmark timed at


def test_p90_and_the_stop_rule_interpolate_as_the_report_does():
    from distill.publish.benchmark import _p90, _spread
    from distill.publish.report import latency_summary

    times = [10.0] * 9 + [30.0]  # one slow run in ten is not the 90th percentile
    assert _p90(times) == pytest.approx(latency_summary(times)["p90"]) == pytest.approx(12.0)
    assert _spread(times) == pytest.approx(0.2)
    assert _p90([5.0]) == 5.0 and _spread([5.0]) == 0.0


def test_every_model_and_variant_is_a_row_with_all_columns(bench):
    root, report = bench
    rows = {row["name"]: row for row in report["rows"]}
    assert list(rows) == ["teacher", "teacher (int8)", "teacher (onnx)", "teacher (onnx-int8)",
                          "small", "small (int8)", "small (onnx)", "small (onnx-int8)"]
    for row in rows.values():
        assert 0 <= row["accuracy"] <= 1
        assert set(row["latency_ms"]) == {"b1_t8", "b1_t16", "b4_t8", "b4_t16"}
        assert all(row["latency_p90_ms"][k] >= row["latency_ms"][k] > 0 for k in row["latency_ms"])
        assert row["samples_per_s"] == pytest.approx(4 / (row["latency_ms"]["b4_t16"] / 1000))
        assert row["peak_memory_mb"] > 0 and row["size_mb"] > 0
    # Each row's accuracy is its own model's, predicted here independently: the saved model, its int8 copy, its ONNX
    # files.
    from transformers import AutoModelForSequenceClassification

    batch = BertTokenizer.from_pretrained(root / "teacher")(SENTENCES, padding=True, return_tensors="pt")
    for name in ("teacher", "small"):
        model = AutoModelForSequenceClassification.from_pretrained(root / name).eval()
        with torch.no_grad():
            logits = {name: model(**batch).logits, f"{name} (int8)": quantize_torch(model)(**batch).logits}
        for variant in ("onnx", "onnx-int8"):
            graph = OnnxClassifier(root / "out" / rows[f"{name} ({variant})"]["path"])
            logits[f"{name} ({variant})"] = graph(**batch).logits
        for row, values in logits.items():
            expected = sum(int(p == y) for p, y in zip(values.argmax(-1).tolist(), LABELS)) / len(LABELS)
            assert rows[row]["accuracy"] == pytest.approx(expected), row
    teacher, small = rows["teacher"], rows["small"]
    assert (teacher["accuracy"], small["accuracy"]) == (pytest.approx(3 / 6), pytest.approx(5 / 6))
    assert small["ratios"]["smaller_by"] == pytest.approx(teacher["num_parameters"] / small["num_parameters"])
    assert small["ratios"]["faster_by"] == pytest.approx(teacher["latency_ms"]["b4_t16"] / small["latency_ms"]["b4_t16"])
    # the share reported is on the dev set's report half; the whole dev set's beside it
    assert report["setup"]["metric"] == "report/accuracy"
    assert small["ratios"]["metric_retained"] == pytest.approx(small["report/accuracy"] / teacher["report/accuracy"])
    assert small["ratios"]["metric_retained_dev"] == pytest.approx(small["accuracy"] / teacher["accuracy"])
    assert teacher["ratios"] == {"smaller_by": 1.0, "smaller_on_disk_by": 1.0, "faster_by": 1.0, "metric_retained": 1.0,
                                 "metric_retained_dev": 1.0}
    assert teacher["retained_note"] is None
    # The embedding table is 34 x 16 plus positions and types: what "without embeddings" leaves out is the word table.
    assert small["num_parameters"] - small["num_parameters_without_embeddings"] == 34 * 16
    assert small["init"] == "random" and teacher["init"] == "fine-tuned"
    # int8 weights take about a quarter of the space of fp32 ones.
    assert rows["teacher (int8)"]["size_mb"] < 0.6 * teacher["size_mb"]
    assert rows["teacher (onnx-int8)"]["size_mb"] < 0.6 * rows["teacher (onnx)"]["size_mb"]


def test_compressed_rows_load_and_predict_like_their_model(bench):
    root, report = bench
    rows = {row["name"]: row for row in report["rows"]}
    tokenizer = BertTokenizer.from_pretrained(root / "teacher")
    batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    model = tiny_bert(seed=0, num_hidden_layers=4, hidden_size=64, intermediate_size=128)
    with torch.no_grad():
        expected = model(**batch).logits
        quantized = quantize_torch(model)(**batch).logits
    onnx = OnnxClassifier(root / "out" / rows["teacher (onnx)"]["path"])(**batch).logits
    onnx_int8 = OnnxClassifier(root / "out" / rows["teacher (onnx-int8)"]["path"])(**batch).logits
    torch.testing.assert_close(onnx, expected, rtol=1e-4, atol=1e-4)  # the exported graph is the model
    for approximate in (quantized, onnx_int8):
        assert not torch.equal(approximate, expected)  # really quantized ...
        assert (approximate - expected).abs().max() < 0.1 * expected.abs().max() + 0.05  # ... and close
    assert rows["teacher (onnx)"]["accuracy"] == rows["teacher"]["accuracy"]
    import onnx as onnx_lib

    graph = onnx_lib.load(root / "out" / rows["teacher (onnx-int8)"]["path"]).graph
    operators = {node.op_type for node in graph.node}
    assert operators & {"MatMulInteger", "DynamicQuantizeLinear", "DynamicQuantizeMatMul"}


def test_int8_quantization_ignores_shape_annotations_that_disagree_with_inference(bench, tmp_path):
    """ONNX Runtime 1.30 stops quantizing a dynamo export whose intermediate shape annotations it infers differently
    (seen with torch 2.11); an annotation made wrong here does the same on any version. The int8 graph is made from
    the weights and the graph, so it still predicts like the model."""
    import onnx as onnx_lib

    root, report = bench
    source = onnx_lib.load(root / "out" / next(r for r in report["rows"] if r["name"] == "teacher (onnx)")["path"])
    hidden = [info for info in source.graph.value_info
              if [d.dim_value for d in info.type.tensor_type.shape.dim][-1:] == [64]]
    assert hidden  # the export annotates intermediate (B, T, 64) tensors
    hidden[0].type.tensor_type.shape.dim[-1].dim_value = 2
    onnx_lib.save(source, str(tmp_path / "annotated.onnx"))
    quantize_onnx(tmp_path / "annotated.onnx", tmp_path / "int8.onnx")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["annotated.onnx", "int8.onnx"]  # no working copy left
    tokenizer = BertTokenizer.from_pretrained(root / "teacher")
    batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = tiny_bert(seed=0, num_hidden_layers=4, hidden_size=64, intermediate_size=128)(**batch).logits
    int8 = OnnxClassifier(tmp_path / "int8.onnx")(**batch).logits
    assert (int8 - expected).abs().max() < 0.1 * expected.abs().max() + 0.05


def test_table_csv_json_and_plot_are_written(bench):
    root, report = bench
    out = root / "out"
    assert json.loads((out / "benchmark.json").read_text()) == json.loads(json.dumps(report))
    with (out / "benchmark.csv").open() as f:
        lines = list(csv.DictReader(f))
    assert [line["name"] for line in lines] == [row["name"] for row in report["rows"]]
    assert {"metric", "num_parameters", "size_mb", "samples_per_s", "peak_memory_mb", "faster_by",
            "latency_b1_t8_ms", "latency_b4_t16_p90_ms"} <= set(lines[0])
    table = (out / "benchmark.md").read_text()
    assert table.count("\n| ") == len(report["rows"]) and "| small (onnx-int8) |" in table
    png = (out / "benchmark.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_the_plot_labels_each_model_once_and_draws_95_percent_of_the_teacher():
    """Variants share their model's colour and label; the dotted line sits at 95% of the teacher's metric, drawn only
    when a point is at or below it."""
    import matplotlib.pyplot as plt

    from distill.publish.benchmark import plot_figure

    def row(model, variant, latency, accuracy):
        return {"name": model if variant == "pytorch" else f"{model} ({variant})", "model": model, "variant": variant,
                "latency_ms": {"b32_t64": latency}, "accuracy": accuracy, "num_parameters": 1000}

    setup = {"metric": "accuracy", "throughput_at": "b32_t64", "num_threads": 2, "task": "sst2"}
    rows = [row("teacher", "pytorch", 200.0, 0.90), row("teacher", "int8", 110.0, 0.88),
            row("small", "pytorch", 30.0, 0.84), row("small", "int8", 20.0, 0.83), row("small", "onnx", 25.0, 0.84)]
    figure = plot_figure({"setup": setup, "rows": rows})
    axes = figure.axes[0]
    assert sorted(text.get_text() for text in axes.texts) == ["small", "teacher"]
    colours = [tuple(collection.get_facecolor()[0][:3]) for collection in axes.collections[:len(rows)]]
    assert colours[0] == colours[1] and colours[2] == colours[3] == colours[4] != colours[0]
    (line,) = [line for line in axes.lines if line.get_label() == "95% of the teacher"]
    assert line.get_ydata()[0] == pytest.approx(0.95 * 0.90)
    figure.canvas.draw()  # the log axis (20-200 ms): minor ticks labelled at 20 and 50 only, not 30, 40, ... 90
    minor = {label.get_text() for label in axes.xaxis.get_minorticklabels()} - {""}
    assert {"20", "50"} <= minor and not minor & {"30", "40", "60", "70", "80", "90"}
    plt.close(figure)
    near = plot_figure({"setup": setup, "rows": rows[:2]})  # 0.88 > 0.855: no point reaches the line
    assert not [line for line in near.axes[0].lines if line.get_label() == "95% of the teacher"]
    plt.close(near)
    close = [row("teacher", "pytorch", 90.0, 0.9), row("small", "onnx", 65.0, 0.9)]
    within = plot_figure({"setup": setup, "rows": close})
    within.canvas.draw()  # 65-90 ms, no power of ten in view: every minor tick labelled, so the axis is still read
    assert {"70", "80"} <= {label.get_text() for label in within.axes[0].xaxis.get_minorticklabels()}
    plt.close(within)


def test_pareto_front_keeps_the_points_nothing_beats():
    # (latency, metric): b is beaten by a (slower and worse), d by c.
    points = [(10.0, 0.9), (20.0, 0.85), (30.0, 0.95), (40.0, 0.94), (5.0, 0.7)]
    assert pareto_front(points) == [4, 0, 2]


def test_repeats_are_scaled_to_the_time_budget_and_the_spread_is_reported():
    """Two rows of 10 ms each, a spread that never gets small: without a budget the cap (40) is reached; with 0.6 s
    for the one setting, about 0.6 / 0.02 rounds, warm-up included, fewer than min_repeats; at least 3 whatever the
    budget. The table gives each row's largest spread, marked above max_spread."""
    import time
    from pathlib import Path

    from distill.publish.benchmark import MIN_TIMED_RUNS, Row, markdown, time_rows
    from tests.conftest import tiny_bert_config

    def sleeper(**inputs):
        time.sleep(0.01)

    rows = [Row(name, name, "pytorch", sleeper, Path(name), 1.0, {}) for name in ("teacher", "student")]
    timed = {}
    for budget in (None, 0.6, 1e-6):
        config = BenchmarkConfig(batch_sizes=[1], seq_lengths=[8], num_warmup=2, min_repeats=30, max_repeats=40,
                                 max_spread=1e-9, time_budget_s=budget)
        start = time.perf_counter()
        result = time_rows(rows, config, get_task("sst2"), tiny_bert_config(vocab_size=30))
        timed[budget] = (time.perf_counter() - start, result["teacher"]["b1_t8"]["repeats"])
        assert result["student"]["b1_t8"]["repeats"] == timed[budget][1]
    assert timed[None][1] == 40 and timed[None][0] >= 40 * 0.02
    seconds, repeats = timed[0.6]
    assert 0.6 <= seconds < 0.6 + 3 * 0.02 + 0.2 and MIN_TIMED_RUNS < repeats < 30
    assert timed[1e-6][1] == MIN_TIMED_RUNS
    with pytest.raises(ValueError, match="time_budget_s: must be > 0 or null"):
        BenchmarkConfig(time_budget_s=0)
    report = {"setup": {"metric": "accuracy", "num_threads": 1, "torch": "x", "repeats": [3, 12], "max_spread": 0.1,
                        "time_budget_s": 60.0, "timing_seconds": 58.2, "throughput_at": "b1_t8"},
              "rows": [{"name": name, "init": "", "accuracy": 0.5, "num_parameters": 1e6,
                        "num_parameters_without_embeddings": 1e6, "size_mb": 1.0, "latency_ms": {"b1_t8": 10.0},
                        "latency_spread": {"b1_t8": spread}, "samples_per_s": 100.0, "peak_memory_mb": None,
                        "variant": "pytorch", "ratios": {"smaller_by": 1.0, "faster_by": 1.0, "metric_retained": 1.0}}
                       for name, spread in (("teacher", 0.04), ("student", 0.25))]}
    table = markdown(report)
    assert "| teacher |  | 0.5000 | 1.0 | 1.0 | 1.0 | 10.0 | 4% |" in table
    assert "| student |  | 0.5000 | 1.0 | 1.0 | 1.0 | 10.0 | 25% (!) |" in table
    assert "[3, 12] repeats in 58 s (until (p90 - median) / median <= 10%, the cap or the time budget of 60 s)" in table
