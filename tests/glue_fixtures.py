"""Tiny GLUE-format folders, one per task, in the layout of the GLUE download script (headers, label spellings,
CoLA without a header line, MNLI with two dev files). Words come from the tiny WordPiece vocabulary of conftest."""

from __future__ import annotations

from pathlib import Path

SENTENCES = ["the movie was good .", "a bad film", "the plot was fun !", "not a boring story", "the cast was great",
             "it is very bad", "a wonderful actor", "the story is fine", "a terrible film", "the movie is fun"]


def _pairs(n: int) -> list[tuple[str, str]]:
    return [(SENTENCES[i % len(SENTENCES)], SENTENCES[(3 * i + 1) % len(SENTENCES)]) for i in range(n)]


def _rows(task: str, n: int, offset: int) -> tuple[list[str] | None, list[list[str]]]:
    """(header or None, rows) of one file."""
    pairs = _pairs(n + offset)[offset:]
    if task == "cola":
        return None, [[f"gj0{i}", str(i % 2), "" if i % 2 else "*", a] for i, (a, _) in enumerate(pairs)]
    if task == "sst2":
        return ["sentence", "label"], [[a, str(i % 2)] for i, (a, _) in enumerate(pairs)]
    if task == "mrpc":
        return (["\ufeffQuality", "#1 ID", "#2 ID", "#1 String", "#2 String"],
                [[str(i % 2), str(100 + i), str(200 + i), a, b] for i, (a, b) in enumerate(pairs)])
    if task == "stsb":
        return (["index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1", "sentence2",
                 "score"], [[str(i), "main-captions", "MSRvid", "2012test", f"{i:04d}", "none", "none", a, b,
                             f"{(i * 1.3) % 5:.3f}"] for i, (a, b) in enumerate(pairs)])
    if task == "qqp":
        return (["id", "qid1", "qid2", "question1", "question2", "is_duplicate"],
                [[str(i), str(2 * i), str(2 * i + 1), a, b, str(i % 2)] for i, (a, b) in enumerate(pairs)])
    if task == "mnli":
        names = ["entailment", "neutral", "contradiction"]
        return (["index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse",
                 "sentence1_parse", "sentence2_parse", "sentence1", "sentence2", "label1", "gold_label"],
                [[str(i), str(i), f"{i}e", "fiction", f"( {a} )", f"( {b} )", f"(ROOT {a})", f"(ROOT {b})", a, b,
                  names[i % 3], names[i % 3]] for i, (a, b) in enumerate(pairs)])
    if task in ("qnli", "rte"):
        first = "question" if task == "qnli" else "sentence1"
        second = "sentence" if task == "qnli" else "sentence2"
        return (["index", first, second, "label"],
                [[str(i), a, b, ("entailment", "not_entailment")[i % 2]] for i, (a, b) in enumerate(pairs)])
    if task == "wnli":
        return ["index", "sentence1", "sentence2", "label"], [[str(i), a, b, str(i % 2)] for i, (a, b) in enumerate(pairs)]
    raise ValueError(task)


FILES = {"mnli": ("train.tsv", "dev_matched.tsv", "dev_mismatched.tsv")}


def write_glue_folder(root: Path, task: str, num_train: int = 12, num_dev: int = 6) -> Path:
    """Write ``root/<task>/`` with train and dev file(s); returns the folder."""
    folder = root / task
    folder.mkdir(parents=True, exist_ok=True)
    for k, name in enumerate(FILES.get(task, ("train.tsv", "dev.tsv"))):
        header, rows = _rows(task, num_train if k == 0 else num_dev, offset=0 if k == 0 else 3 * k)
        lines = ([] if header is None else ["\t".join(header)]) + ["\t".join(r) for r in rows]
        (folder / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder
