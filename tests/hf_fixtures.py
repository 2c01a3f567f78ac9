"""Tiny Hugging Face fixtures built on the spot (no network): a random BERT, a WordPiece
tokenizer with a vocabulary written here, and a generated text dataset saved with save_to_disk.

The dataset: sentences of 3-9 words from a 40-word vocabulary; label 1 when "good" outnumbers
"bad" in the sentence (ties and neither: 0); a ``writer`` column (12 writers) for natural-id
partitions; 200 rows in a train split (160) and a test split (40).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

WORDS = ["good", "bad"] + [f"w{k}" for k in range(38)]
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def sentences(count: int, seed: int, long: bool = False) -> tuple[list[str], list[int], list[int]]:
    rng = np.random.default_rng(seed)
    texts, labels, writers = [], [], []
    for _ in range(count):
        words = list(rng.choice(WORDS, size=int(rng.integers(3, 10)) + (80 if long else 0)))
        texts.append(" ".join(words))
        labels.append(int(words.count("good") > words.count("bad")))
        writers.append(int(rng.integers(0, 12)))
    return texts, labels, writers


def text_dataset(folder: Path, rows: int = 200, test: int = 40, seed: int = 0, with_test: bool = True,
                 ids: bool = False, tokenizer=None, long: bool = False) -> Path:
    """A DatasetDict (train, test) or one Dataset saved to ``folder``; ``ids``: a pre-tokenized
    ``input_ids`` column instead of text (needs ``tokenizer``); ``long``: 80 more words a row."""
    import datasets

    texts, labels, writers = sentences(rows, seed, long)
    features = datasets.Features({
        "sentence": datasets.Value("string"),
        "label": datasets.ClassLabel(names=["negative", "positive"]),
        "writer": datasets.Value("int64"),
        "row": datasets.Value("int64"),
    })
    table = datasets.Dataset.from_dict(
        {"sentence": texts, "label": labels, "writer": writers, "row": list(range(rows))}, features=features
    )
    if ids:
        table = table.map(lambda r: {"input_ids": tokenizer(r["sentence"])["input_ids"]}).remove_columns("sentence")
    if with_test:
        table = datasets.DatasetDict({"train": table.select(range(rows - test)), "test": table.select(range(rows - test, rows))})
    table.save_to_disk(str(folder))
    return folder


def tokenizer_folder(folder: Path) -> Path:
    """A BERT WordPiece tokenizer whose vocabulary is SPECIAL + WORDS (45 tokens)."""
    from transformers import BertTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    vocabulary = {token: k for k, token in enumerate(SPECIAL + WORDS)}
    BertTokenizerFast(vocab=vocabulary, do_lower_case=True).save_pretrained(str(folder))
    return folder


def tiny_bert(folder: Path, vocab: int = 100, labels: int | None = None, seed: int = 0) -> Path:
    """A random BERT (hidden 16, 2 layers, 2 heads) saved as safetensors; ``labels``: saved with
    a sequence-classification head of that many labels (else a bare BertModel)."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification, BertModel

    torch.manual_seed(seed)
    config = BertConfig(vocab_size=vocab, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=64)
    if labels:
        config.num_labels = labels
        model = BertForSequenceClassification(config)
    else:
        model = BertModel(config)
    model.save_pretrained(str(folder), safe_serialization=True)
    return folder


def sst2_dataset(folder: Path, rows: int = 96, validation: int = 24, parquet: bool = False) -> Path:
    """An SST-2-shaped dataset (GLUE's glue/sst2 layout): columns sentence, label (ClassLabel
    negative/positive) and idx; splits train, validation and an unlabelled test (label -1).
    ``parquet``: the Hub's parquet files (``train-00000-of-00001.parquet``, ...) instead of
    a save_to_disk folder."""
    import datasets

    texts, labels, _ = sentences(rows + validation + 8, seed=1)
    features = datasets.Features({"sentence": datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=["negative", "positive"]),
                                  "idx": datasets.Value("int32")})

    def split(start: int, stop: int, hidden: bool = False):
        return datasets.Dataset.from_dict({"sentence": texts[start:stop],
                                           "label": [-1 if hidden else y for y in labels[start:stop]],
                                           "idx": list(range(stop - start))}, features=features)

    splits = datasets.DatasetDict({"train": split(0, rows), "validation": split(rows, rows + validation),
                                   "test": split(rows + validation, rows + validation + 8, hidden=True)})
    if not parquet:
        splits.save_to_disk(str(folder))
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    for name, table in splits.items():
        table.to_parquet(str(folder / f"{name}-00000-of-00001.parquet"))
    return folder
