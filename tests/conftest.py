"""Shared fixtures: tiny randomly initialised BERT/RoBERTa models and a tiny WordPiece tokenizer."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from transformers import BertConfig, BertForSequenceClassification, BertTokenizer, RobertaConfig, RobertaForSequenceClassification

# A WordPiece vocabulary small enough to reason about: "movie", "good" ... are single pieces;
# "wonderful" splits into "wonder" + "##ful".
WORDS = [
    "the", "a", "and", "was", "is", "it", "movie", "film", "good", "bad", "great", "fine", "plot", "story",
    "wonder", "##ful", "terri", "##ble", "actor", "cast", "boring", "fun", "very", "not", ".", ",", "!", "'", "s",
]
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]

# The suite checks the device plumbing with a stand-in device and compares resumed runs bit for bit, which holds on
# the CPU; on a GPU machine accelerate would pick the GPU, so it is pinned to the CPU here (before accelerate makes its
# process state). tests/test_accelerator.py runs the pipeline and the fp16 loop on the real GPU in child processes
# that set TINYDISTILL_TEST_ACCELERATOR=1, which leaves accelerate's choice alone.
if os.environ.get("TINYDISTILL_TEST_ACCELERATOR") != "1":
    os.environ["ACCELERATE_USE_CPU"] = "1"


# The shared data set folder (PROVENANCE.md there): ../shared/data beside the checkout, as CI links it.
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def shared_data(relative: str) -> Path:
    """``SHARED_DATA / relative``; a test that needs it fails when it is missing, never skips: a checkout without the
    data would otherwise pass without running the tests that read it (CI runs with ../shared linked)."""
    path = SHARED_DATA / relative
    if not path.exists():
        pytest.fail(f"the shared data {path} is missing: link the shared data folder beside the checkout "
                    f"({SHARED_DATA.parent}), as CI does", pytrace=False)
    return path


@pytest.fixture(autouse=True, scope="session")
def _private_asset_cache(tmp_path_factory):
    """Point ``TINYDISTILL_CACHE`` (extracted assets, general-distilled students, timings) at a folder of this test
    session, so the suite never writes into the user's ``~/.cache/tinydistill``; the CLI subprocesses inherit it."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TINYDISTILL_CACHE", str(tmp_path_factory.mktemp("tinydistill_cache")))
        # Dry runs without their estimate, which times model shapes (tests/test_estimate.py checks it on its own)
        patch.setenv("TINYDISTILL_ESTIMATE", "off")
        yield


@pytest.fixture
def tiny_tokenizer():
    return BertTokenizer(vocab={w: i for i, w in enumerate(SPECIAL + WORDS)}, do_lower_case=True)


def tiny_bert_config(**overrides) -> BertConfig:
    values = dict(vocab_size=len(SPECIAL) + len(WORDS), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=64, max_position_embeddings=64, num_labels=2)
    values.update(overrides)
    return BertConfig(**values)


def tiny_bert(seed: int = 0, **overrides) -> BertForSequenceClassification:
    torch.manual_seed(seed)
    return BertForSequenceClassification(tiny_bert_config(**overrides)).eval()


def tiny_roberta(seed: int = 0, **overrides) -> RobertaForSequenceClassification:
    torch.manual_seed(seed)
    values = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                  max_position_embeddings=70, num_labels=2, type_vocab_size=1, pad_token_id=1)
    values.update(overrides)
    return RobertaForSequenceClassification(RobertaConfig(**values)).eval()


def padded_batch(seed: int = 0, batch: int = 3, length: int = 7, vocab: int = 30) -> dict:
    """Random ids with a ragged attention mask (row i has length - 2*i real tokens)."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (batch, length), generator=generator)
    mask = torch.ones(batch, length, dtype=torch.long)
    for row in range(batch):
        mask[row, length - 2 * row :] = 0
    ids[mask == 0] = 0
    return {"input_ids": ids, "attention_mask": mask}


BPE_CORPUS = ["the movie was good and the plot was fun", "a wonderful film with a terrible story",
              "the cast was great", "not a boring movie"]


@pytest.fixture(scope="session")
def tiny_roberta_tokenizer():
    """A byte-level BPE tokenizer trained here on four sentences: " movie" is one token, "movie" (no space) two."""
    from tokenizers import AddedToken, ByteLevelBPETokenizer
    from transformers import RobertaTokenizer

    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(BPE_CORPUS * 20, vocab_size=400, min_frequency=1, special_tokens=specials,
                            show_progress=False)
    model = json.loads(bpe.to_str())["model"]
    merges = [tuple(m.split()) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    return RobertaTokenizer(vocab=model["vocab"], merges=merges, mask_token=AddedToken("<mask>", lstrip=True))


def tiny_vectors():
    """Six 3-d word vectors: wonderful ~ marvellous ~ superb, terrible ~ awful, table apart."""
    from gensim.models import KeyedVectors

    kv = KeyedVectors(vector_size=3)
    kv.add_vectors(
        ["wonderful", "marvellous", "superb", "terrible", "awful", "table"],
        np.array([[1, 0, 0], [0.9, 0.1, 0], [0.8, 0.3, 0], [-1, 0, 0], [-0.9, -0.1, 0], [0, 0, 1]], dtype=np.float32),
    )
    return kv


def tiny_masked_lm(seed: int = 0):
    from transformers import BertForMaskedLM

    torch.manual_seed(seed)
    return BertForMaskedLM(tiny_bert_config()).eval()


def tiny_generator(batch_size: int = 4):
    """A CandidateGenerator on the tiny WordPiece vocabulary (a module-level factory: worker processes import it)."""
    from augment import CandidateGenerator, NeighbourCache, load_stopwords

    tokenizer = BertTokenizer(vocab={w: i for i, w in enumerate(SPECIAL + WORDS)}, do_lower_case=True)
    return CandidateGenerator(tiny_masked_lm(), tokenizer, NeighbourCache(tiny_vectors(), 2), load_stopwords(),
                              num_candidates=8, mlm_context="pair", batch_size=batch_size)


def tiny_job(tmp_path, teacher_model, tokenizer, **sections) -> str:
    """A config file for the real pipeline on tiny models: the given teacher (saved with its tokenizer), a tiny
    student, two steps a stage, no augmentation; ``sections`` update the config's sections key by key."""
    teacher_dir = tmp_path / "teacher_model"
    teacher_model.save_pretrained(teacher_dir)
    tokenizer.save_pretrained(teacher_dir)
    steps = {"max_steps": 2, "batch_size": 4, "learning_rate": 1.0e-3, "save_steps": 1, "log_steps": 1}
    config = {
        "output_dir": str(tmp_path / "run"),
        "task": {"max_seq_length": 32},
        "teacher": {"model": str(teacher_dir), "min_dev_metric": -1.0},
        "augment": {"enabled": False},
        "student": {"preset": None, "num_hidden_layers": 2, "hidden_size": 16, "intermediate_size": 32,
                    "num_attention_heads": 2, "init": "teacher_embeddings"},
        "distill": {"intermediate": steps, "prediction": steps},
        "report": {"batch_sizes": [1], "seq_length": 16, "num_warmup": 1, "num_repeats": 1},
        "general": {"enabled": False},
        "export": {"onnx": False},
    }
    for key, value in sections.items():
        config[key] = {**config.get(key, {}), **value}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def tiny_job_every_stage(tmp_path, tokenizer) -> str:
    """The tiny pipeline job of the other tests with every stage on: a teacher fine-tuned from a tiny encoder,
    adapt-mlm on a tiny corpus, augmentation (tiny word vectors), general distillation (cached in tmp_path/cache),
    both distillation steps, the report."""
    encoder = tmp_path / "encoder"
    tiny_bert(seed=0).save_pretrained(encoder)
    tokenizer.save_pretrained(encoder)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the movie was good\na bad film\nthe plot was fun\n" * 4)
    vectors = tmp_path / "vectors.kv"
    tiny_vectors().save(str(vectors))
    from tests.glue_fixtures import write_glue_folder

    data = write_glue_folder(tmp_path, "sst2")
    steps = {"max_steps": 2, "batch_size": 4, "save_steps": 1, "log_steps": 1}
    path = tiny_job(tmp_path, tiny_bert(seed=0), tokenizer, task={"name": "sst2", "data_dir": str(data)},
                    teacher={"model": None, "base_model": str(encoder), "train": steps},
                    mlm={"base_model": str(encoder), "corpus": [str(corpus)], "train": steps},
                    augment={"enabled": True, "num_copies": 2, "max_examples": 4, "word_vectors": str(vectors),
                             "shard_size": 2},
                    general={"enabled": True, "cache_dir": str(tmp_path / "cache"), "corpus": [str(corpus)],
                             "max_seq_length": 16, "train": steps},
                    export={"onnx": True})
    return path


def folder_identity(path) -> tuple[int, int]:
    """A folder's inode and modification time: a folder deleted and written again does not keep both."""
    stat = path.stat()
    return stat.st_ino, stat.st_mtime_ns
