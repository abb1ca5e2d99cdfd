"""Augmentation speed, side by side in one process, on the same masked LM, word vectors and SST-2 sentences:

1. the reference procedure: TinyBERT's ``data_augmentation.py`` written plainly (one masked-LM forward per
   single-piece word, one pass over the whole vocabulary per multi-piece word, nothing cached or batched);
2. our augmenter (``augment.augment_examples``: masked rows batched across words and sentences, neighbours by one
   matrix product per batch and cached);
3. nlpaug's ``ContextualWordEmbsAug`` with the same masked LM, if it is installed (it recomputes the masked LM for
   every copy, so it runs on a subset).

Each produces N copies of every sentence. The bench also checks that the reference procedure and ours give the same
candidate list for every replaceable word of the sentences. Both use our filter on masked-LM candidates (alphabetic
words only; the reference keeps punctuation and specials), so that like is compared with like.

Usage:
    python bench/augment_speed.py [--mlm DIR] [--num-sentences 200] [--num-copies 20] [--nlpaug-sentences 20]

``--mlm`` defaults to the masked LM that the default pipeline adapts (runs/sst2_minilm/mlm); any
``...ForMaskedLM`` checkpoint works. The last line printed is a JSON object with ``speedup_vs_reference``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from augment import CandidateGenerator, NeighbourCache, augment_examples, load_stopwords, load_word_vectors  # noqa: E402
from distill.tasks.words import split_words  # noqa: E402
from augment.dataset import EXAMPLES_PER_PASS  # noqa: E402
from distill.config import AugmentConfig  # noqa: E402
from teachers.models import load_masked_lm, load_tokenizer  # noqa: E402


class ReferenceProcedure:
    """TinyBERT's augmentation procedure as its script runs it: batch of one, no cache."""

    def __init__(self, generator: CandidateGenerator, vectors, num_candidates: int, num_copies: int, p: float):
        self.generator, self.tokenizer, self.model = generator, generator.tokenizer, generator.model
        self.normed = vectors.get_normed_vectors()  # the reference normalises the matrix once, then dots per word
        self.vectors, self.k, self.n, self.p = vectors, num_candidates, num_copies, p

    def _masked_lm(self, pieces: list[str], position: int) -> list[str]:
        masked = list(pieces)
        masked[position] = self.tokenizer.mask_token
        tokens = [self.tokenizer.cls_token, *masked, self.tokenizer.sep_token, *pieces, self.tokenizer.sep_token]
        ids = torch.tensor([self.tokenizer.convert_tokens_to_ids(tokens)])
        segments = torch.tensor([[0] * (len(pieces) + 2) + [1] * (len(pieces) + 1)])
        with torch.no_grad():
            logits = self.model(input_ids=ids, token_type_ids=segments).logits[0, position + 1]
        top = torch.argsort(logits, descending=True)[: self.k].tolist()
        return [w for w in (self.generator._decode(t, needs_space=False) for t in top) if w is not None]

    def _neighbours(self, word: str) -> list[str]:
        key = word.lower()
        if key not in self.vectors.key_to_index:
            return []
        index = self.vectors.key_to_index[key]
        scores = self.normed @ self.normed[index]
        scores[index] = -np.inf
        return [self.vectors.index_to_key[i] for i in np.argsort(-scores, kind="stable")[: self.k]]

    def candidates(self, text: str) -> dict[tuple[int, int], list[str]]:
        spans = split_words(text)
        words = [text[s:e] for s, e in spans]
        pieces_per_word = [self.tokenizer.tokenize(w) for w in words]
        pieces = [p for word_pieces in pieces_per_word for p in word_pieces]
        found, offset = {}, 0
        for span, word, word_pieces in zip(spans, words, pieces_per_word):
            if self.generator.is_candidate_word(word):
                if len(word_pieces) == 1:
                    found[span] = self._masked_lm(pieces, offset)
                else:
                    found[span] = self._neighbours(word)
                found[span] = found[span] or [word]
            offset += len(word_pieces)
        return found

    def augment(self, text: str, rng: random.Random) -> list[str]:
        candidates = self.candidates(text)
        words = [text[s:e] for s, e in split_words(text)]
        spans = split_words(text)
        out = [text]
        for _ in range(self.n):
            new = list(words)
            for i, span in enumerate(spans):
                if span in candidates:
                    choice = rng.choice(candidates[span])
                    if rng.random() < self.p:
                        new[i] = choice
            if " ".join(new) not in out:
                out.append(" ".join(new))
        return out


def run_nlpaug(mlm: str, sentences: list[str], num_copies: int, p: float, k: int) -> tuple[float | None, str]:
    """Sentences per second of nlpaug's contextual augmenter, or None and the reason it could not run."""
    try:
        import nlpaug.augmenter.word as naw
    except ImportError:
        return None, "not installed (pip install nlpaug)"
    from transformers import PreTrainedTokenizerBase

    # nlpaug 1.1.11 calls private tokenizer methods that transformers 5 removed; alias them to the public ones.
    if not hasattr(PreTrainedTokenizerBase, "_convert_token_to_id"):
        PreTrainedTokenizerBase._convert_token_to_id = lambda self, token: self.convert_tokens_to_ids(token)
        PreTrainedTokenizerBase._convert_id_to_token = lambda self, i: self.convert_ids_to_tokens(i)
    try:
        augmenter = naw.ContextualWordEmbsAug(model_path=mlm, model_type="bert", action="substitute", aug_p=p,
                                              top_k=k, device="cpu")
        start = time.perf_counter()
        for sentence in sentences:
            augmenter.augment(sentence, n=num_copies)
        return len(sentences) / (time.perf_counter() - start), "ran (with a transformers-5 alias shim)"
    except Exception as error:  # a rival's failure is a result to report, not a crash of the bench
        return None, f"failed: {type(error).__name__}: {error}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mlm", default=str(ROOT / "runs" / "sst2_minilm" / "mlm"))
    parser.add_argument("--sentences", default=str(ROOT / "distill" / "assets" / "sst2" / "dev.tsv"))
    parser.add_argument("--num-sentences", type=int, default=200)
    parser.add_argument("--num-copies", type=int, default=20)
    parser.add_argument("--nlpaug-sentences", type=int, default=20)
    parser.add_argument("--word-vectors", default="glove-6b-50d")
    args = parser.parse_args()
    if args.mlm == parser.get_default("mlm") and not Path(args.mlm).exists():
        sys.exit(f"no masked LM at {args.mlm}: run `python run_distill.py adapt-mlm --output-dir {args.mlm}` "
                 "(about 5 minutes) or pass --mlm with any ...ForMaskedLM checkpoint")
    lines = Path(args.sentences).read_text(encoding="utf-8").splitlines()[1 : args.num_sentences + 1]
    sentences = [line.split("\t")[0] for line in lines]
    config = AugmentConfig(num_copies=args.num_copies, word_vectors=args.word_vectors)
    model, tokenizer = load_masked_lm(args.mlm), load_tokenizer(args.mlm)
    vectors = load_word_vectors(args.word_vectors)
    stopwords = load_stopwords()

    def fresh_generator() -> CandidateGenerator:  # empty caches: every method starts cold
        return CandidateGenerator(model, tokenizer, NeighbourCache(vectors, config.num_candidates), stopwords,
                                  config.num_candidates, config.mlm_context, config.batch_size)

    print(f"{len(sentences)} SST-2 sentences, N={config.num_copies}, p={config.replace_prob}, K={config.num_candidates}, "
          f"masked LM {args.mlm}, {len(vectors.index_to_key)} word vectors, {torch.get_num_threads()} threads")
    reference = ReferenceProcedure(fresh_generator(), vectors, config.num_candidates, config.num_copies,
                                   config.replace_prob)
    start = time.perf_counter()
    reference_candidates = [reference.candidates(s) for s in sentences]
    for i, sentence in enumerate(sentences):
        reference.augment(sentence, random.Random(i))
    reference_s = time.perf_counter() - start

    ours = fresh_generator()
    start = time.perf_counter()
    examples = [{"sentence": s} for s in sentences]
    for first in range(0, len(examples), EXAMPLES_PER_PASS):  # as augment_dataset groups them
        batch = slice(first, first + EXAMPLES_PER_PASS)
        augment_examples(examples[batch], list(range(len(examples)))[batch], ("sentence",), ours, config)
    ours_s = time.perf_counter() - start

    our_candidates = fresh_generator().candidates(sentences)
    pairs = [(r[span], o[span]) for r, o in zip(reference_candidates, our_candidates) for span in r]
    same = sum(a == b for a, b in pairs)
    same_set = sum(set(a) == set(b) for a, b in pairs)
    nlpaug_sps, nlpaug_note = run_nlpaug(args.mlm, sentences[: args.nlpaug_sentences], config.num_copies,
                                         config.replace_prob, config.num_candidates)

    reference_sps, ours_sps = len(sentences) / reference_s, len(sentences) / ours_s
    print(f"reference procedure: {reference_sps:8.2f} sentences/s ({reference_s:.1f} s)")
    print(f"ours:                {ours_sps:8.2f} sentences/s ({ours_s:.1f} s)")
    if nlpaug_sps is None:
        print(f"nlpaug:              {nlpaug_note}")
    else:
        print(f"nlpaug:              {nlpaug_sps:8.2f} sentences/s on {args.nlpaug_sentences} sentences, {nlpaug_note}")
    print(f"candidate lists identical for {same}/{len(pairs)} words ({100 * same / len(pairs):.1f}%), "
          f"same set for {same_set}/{len(pairs)}")
    print(json.dumps({
        "speedup_vs_reference": round(ours_sps / reference_sps, 2),
        "reference_sentences_per_s": round(reference_sps, 3),
        "ours_sentences_per_s": round(ours_sps, 3),
        "nlpaug_sentences_per_s": None if nlpaug_sps is None else round(nlpaug_sps, 3),
        "speedup_vs_nlpaug": None if nlpaug_sps is None else round(ours_sps / nlpaug_sps, 2),
        "candidate_agreement": round(same / len(pairs), 4),
        "num_words_compared": len(pairs),
        "num_sentences": len(sentences),
        "num_copies": config.num_copies,
        "num_threads": torch.get_num_threads(),
    }))


if __name__ == "__main__":
    main()
