"""Rebuild the small data files bundled under distill/assets/ from ../shared/data (run once, output committed).

The default pipeline must run on a fresh machine with no network and no ../shared, so it ships:
- sst2/train.tsv: a label-stratified random sample of GLUE SST-2 train (seed 0),
- sst2/dev.tsv: the full GLUE SST-2 dev set, unchanged,
- corpus/mlm_sample.txt.gz: a sample of movie-review and Brown sentences for `adapt-mlm`,
- corpus/transfer_sample.txt.gz: a larger sample of the same two corpora (`augment.unlabelled: [transfer]`), the
  transfer set the NER recipe's student learns the teacher's tagging from (distinct sentences, none of the
  first's; seed 1),
- stopwords/english: the NLTK English stop word list, unchanged.

Usage: python scripts/make_assets.py [--shared ../shared/data] [--train-size 10000] [--corpus-lines 12000]
       [--transfer-lines 50000]
"""

import argparse
import gzip
import random
import shutil
from pathlib import Path


def stratified_sample(rows: list[list[str]], size: int, seed: int) -> list[list[str]]:
    by_label: dict[str, list[list[str]]] = {}
    for row in rows:
        by_label.setdefault(row[-1], []).append(row)
    rng = random.Random(seed)
    picked = []
    for label in sorted(by_label):
        group = by_label[label]
        picked += rng.sample(group, round(size * len(group) / len(rows)))
    rng.shuffle(picked)
    return picked


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shared", default="../shared/data")
    parser.add_argument("--train-size", type=int, default=10000)
    parser.add_argument("--corpus-lines", type=int, default=12000)
    parser.add_argument("--transfer-lines", type=int, default=50000)
    parser.add_argument("--out", default="distill/assets")
    args = parser.parse_args()
    shared, out = Path(args.shared), Path(args.out)
    (out / "sst2").mkdir(parents=True, exist_ok=True)

    lines = (shared / "glue/SST-2/train.tsv").read_text(encoding="utf-8").splitlines()
    rows = [line.split("\t") for line in lines[1:]]
    sample = stratified_sample(rows, args.train_size, seed=0)
    (out / "sst2/train.tsv").write_text(lines[0] + "\n" + "".join("\t".join(r) + "\n" for r in sample), "utf-8")
    shutil.copyfile(shared / "glue/SST-2/dev.tsv", out / "sst2/dev.tsv")

    rng = random.Random(0)
    corpus = []
    for name in ("movie_reviews_plain.txt.gz", "brown_plain.txt.gz"):
        with gzip.open(shared / "corpus" / name, "rt", encoding="utf-8") as f:
            sentences = [s.strip() for s in f if len(s.split()) >= 5]
        corpus += rng.sample(sentences, args.corpus_lines // 2)
    rng.shuffle(corpus)
    (out / "corpus").mkdir(exist_ok=True)
    with gzip.GzipFile(out / "corpus/mlm_sample.txt.gz", "wb", mtime=0) as f:  # mtime 0: same bytes every build
        f.write(("\n".join(corpus) + "\n").encode("utf-8"))

    rng = random.Random(1)
    transfer, taken = [], set(corpus)  # other sentences than the masked LM's sample, each once
    for name in ("movie_reviews_plain.txt.gz", "brown_plain.txt.gz"):
        with gzip.open(shared / "corpus" / name, "rt", encoding="utf-8") as f:
            sentences = [s.strip() for s in f if len(s.split()) >= 5]
        sentences = [s for s in dict.fromkeys(sentences) if s not in taken]
        transfer += rng.sample(sentences, args.transfer_lines // 2)
        taken.update(transfer)
    rng.shuffle(transfer)
    with gzip.GzipFile(out / "corpus/transfer_sample.txt.gz", "wb", mtime=0) as f:
        f.write(("\n".join(transfer) + "\n").encode("utf-8"))

    (out / "stopwords").mkdir(exist_ok=True)
    shutil.copyfile(shared / "stopwords/english", out / "stopwords/english")


if __name__ == "__main__":
    main()
