"""Chapter 15's summarization data, shipped with the library: the standard library's docstring pairs and the BPE
tokenizer, written from the running Python's standard library (it must be the book's, DOCSTRING_PYTHON: another
Python's library has other docstrings).

    .venv/bin/python experiments/docstring_data.py

Writes transformer_lib/datasets/docstring_pairs.json.gz (extract_pairs(), gzip without a time stamp, so the same
library gives the same bytes) and transformer_lib/datasets/docstring_bpe.json (train_docstring_bpe on the
pre-training texts: the sources of every module that is not a test module). Chapter 15 extracts the pairs and
trains the tokenizer again when it runs on DOCSTRING_PYTHON and asserts both equal the shipped files; on any other
Python it reads the shipped files."""

import gzip
import json
import platform
from pathlib import Path

from transformer_lib.applications import (
    DOCSTRING_PYTHON,
    extract_pairs,
    pretraining_texts,
    train_docstring_bpe,
)

FOLDER = Path(__file__).resolve().parent.parent / "transformer_lib" / "datasets"
VOCAB_SIZE = 2048


def main():
    if platform.python_version() != DOCSTRING_PYTHON:
        raise SystemExit(f"run this with Python {DOCSTRING_PYTHON} (the book's), not {platform.python_version()}")
    FOLDER.mkdir(exist_ok=True)
    pairs = extract_pairs()
    data = json.dumps(pairs, ensure_ascii=False, indent=0).encode("utf-8")
    (FOLDER / "docstring_pairs.json.gz").write_bytes(gzip.compress(data, compresslevel=9, mtime=0))
    bpe = train_docstring_bpe(pretraining_texts(), VOCAB_SIZE)
    (FOLDER / "docstring_bpe.json").write_text(bpe.to_str(), encoding="utf-8")
    print(f"{len(pairs):,} pairs, a tokenizer of {bpe.get_vocab_size():,} tokens, in {FOLDER}")


if __name__ == "__main__":
    main()
