"""Same flags and seed, same result: the vocabulary, the weights and the loss curve are
bit-identical on CPU in any directory and any process (issue 11, class 2)."""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from nanobert.tokenizer import Tokenizer, train_wordpiece

ROOT = Path(__file__).resolve().parents[1]
WORDS = "cat dog bird fish cow sheep goat lion big small red blue sees eats likes".split()


def write_corpus(path: Path, n_docs: int = 40, seed: int = 0) -> Path:
    """Documents of random sentences over a small alphabet: many pairs tie in count,
    which is where `tokenizers`' trainer gives a different vocabulary in each process."""
    rng = random.Random(seed)
    docs = [" ".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 8))) + "."
                     for _ in range(rng.randint(2, 4))) for _ in range(n_docs)]
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return path


def nanobert_cli(*argv, cwd=None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "nanobert.cli", *map(str, argv)], env=env,
                          cwd=cwd, capture_output=True, text=True, timeout=300)


def test_ties_are_broken_by_text_not_by_insertion_order():
    counts = {"ab": 3, "cd": 3, "ef": 3, "abcd": 1}
    shuffled = dict(sorted(counts.items(), key=lambda kv: random.Random(1).random()))
    vocab = train_wordpiece(counts, vocab_size=100, min_frequency=1)
    assert vocab == train_wordpiece(shuffled, vocab_size=100, min_frequency=1)
    merges = vocab[vocab.index("##f") + 1:]
    assert merges[:3] == ["ab", "cd", "ef"]          # count 4, 3, 3 (ties: by text)
    assert "abcd" in merges                          # ab + ##cd, then kept going
    # min_frequency stops the merges: every pair here occurs at most 4 times
    assert train_wordpiece(counts, vocab_size=100, min_frequency=5) == vocab[:vocab.index("##f") + 1]


def test_vocabulary_is_the_same_in_two_processes(tmp_path):
    corpus = write_corpus(tmp_path / "c.txt")
    code = ("import sys; from nanobert.tokenizer import Tokenizer; "
            "t = Tokenizer.train(open(sys.argv[1]).read().splitlines(), vocab_size=90, "
            "min_frequency=1); print(t.tk.to_str())")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    runs = [subprocess.run([sys.executable, "-c", code, str(corpus)], env=env, check=True,
                           capture_output=True, text=True).stdout for _ in range(2)]
    assert runs[0] == runs[1]
    here = Tokenizer.train(corpus.read_text().splitlines(), vocab_size=90, min_frequency=1)
    assert here.tk.to_str() == runs[0].rstrip("\n")
    assert 60 < here.vocab_size <= 90


def train_losses(out: Path) -> list:
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [(r["step"], r["loss"]) for r in recs if r["type"] in ("train", "eval")]


@pytest.mark.usefixtures("one_thread")
def test_pretrain_twice_gives_identical_vocabulary_weights_and_losses(tmp_path):
    """Two processes, two directories (one of them entered with another cwd), the same
    flags: the same bytes."""
    corpus = write_corpus(tmp_path / "c.txt")
    flags = ["--corpus", corpus, "--preset", "tiny", "--steps", "6", "--batch-size", "8",
             "--seq-len", "32", "--vocab-size", "90", "--eval-every", "3", "--no-progress",
             "--device", "cpu", "--seed", "5"]
    (tmp_path / "elsewhere").mkdir()
    a = nanobert_cli("pretrain", *flags, "--out", tmp_path / "a")
    b = nanobert_cli("pretrain", *flags, "--out", "../b", cwd=tmp_path / "elsewhere")
    assert a.returncode == 0, a.stderr
    assert b.returncode == 0, b.stderr
    A, B = tmp_path / "a", tmp_path / "b"
    for name in ("vocab.txt", "tokenizer.json", "model.safetensors", "config.json"):
        assert (A / name).read_bytes() == (B / name).read_bytes(), name
    assert train_losses(A) == train_losses(B) and len(train_losses(A)) >= 4
