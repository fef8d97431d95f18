"""Shared fixtures: small models and the offline `minilm` checkpoint."""
from __future__ import annotations

import random
import signal
from pathlib import Path

import pytest
import torch

import nanobert
from nanobert.checkpoint import resolve

# A test run started in the background by a shell (`make test &`, nohup) inherits SIGINT
# ignored, and so would every command the tests start: the Ctrl-C tests then saw a command
# run to the end. The tests are about nanobert's handling of Ctrl-C, so they get Python's
# own handler back (a command started from here then gets the default disposition).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def one_thread():
    """Tiny models gain nothing from a second thread, and on a busy machine idle-spinning
    worker threads make them many times slower. Test modules of tiny models use it."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def minilm_dir():
    return resolve("minilm")


@pytest.fixture(scope="session")
def minilm(minilm_dir):
    """(model, tokenizer) for all-MiniLM-L6-v2, in eval mode."""
    model, tok = nanobert.load(minilm_dir)
    return model.eval(), tok


@pytest.fixture
def tiny_config():
    """A small random BERT config (vocabulary of the minilm tokenizer)."""
    return nanobert.preset("tiny", vocab_size=30522, hidden_dropout_prob=0.0,
                           attention_probs_dropout_prob=0.0, max_position_embeddings=128)


def tiny_model_dir(d, words, vocab_size, punctuation):
    """Save into `d` a small random BERT (no head, dropout off) whose WordPiece vocabulary is
    trained on seeded 8-word sentences of `words` (plus one line of `punctuation`)."""
    import random
    from nanobert.checkpoint import save_model
    corpus = [" ".join(random.Random(i).sample(words, 8)) for i in range(300)] + [punctuation] * 5
    tok = nanobert.Tokenizer.train(corpus, vocab_size=vocab_size, min_frequency=1)
    torch.manual_seed(0)
    cfg = nanobert.preset("tiny", vocab_size=tok.vocab_size, max_position_embeddings=64,
                          hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    save_model(nanobert.Bert(cfg), d, tokenizer=tok)
    return d


def tiny_classify_task(d: Path, rows: list, vocab_size: int, positions: int, layers: int):
    """Into `d`: train.tsv of (sentence, label) rows, and base/, a tiny random BERT with
    a WordPiece vocabulary trained on the sentences. Returns `d`."""
    (d / "train.tsv").write_text("sentence\tlabel\n" + "".join(f"{t}\t{y}\n" for t, y in rows))
    tok = nanobert.Tokenizer.train([t for t, _ in rows], vocab_size=vocab_size, min_frequency=1)
    torch.manual_seed(0)
    config = nanobert.preset("tiny", vocab_size=tok.vocab_size, pad_token_id=tok.pad_id,
                             max_position_embeddings=positions, num_hidden_layers=layers)
    nanobert.Bert(config).save_pretrained(d / "base", tokenizer=tok)
    return d


def counted_chunks(monkeypatch, tok, chunk_texts: int) -> list:
    """Tokenize `chunk_texts` inputs a chunk at a time (tokenizer.CHUNK_TEXTS), and count
    the calls of tok.encode_batch in the list returned: how far a generator has read."""
    import nanobert.tokenizer as T
    monkeypatch.setattr(T, "CHUNK_TEXTS", chunk_texts)
    calls, batch = [], type(tok).encode_batch    # (the class's: see test_embed's chunk test)
    monkeypatch.setattr(type(tok), "encode_batch", lambda self, *a, **k: calls.append(1) or
                        batch(self, *a, **k))
    return calls


def random_batch(B=4, T=12, vocab=1000, seed=0, min_len=3):
    """ids/mask/types of B sequences with mixed lengths, right-padded to T."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_len, T + 1, (B,), generator=g)
    lengths[0] = T
    ids = torch.randint(5, vocab, (B, T), generator=g)
    mask = (torch.arange(T)[None] < lengths[:, None]).long()
    ids = ids * mask
    types = (torch.arange(T)[None] >= (lengths[:, None] // 2)).long() * mask
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


# ---- a small pretraining corpus (test_corpus, test_pretrain) ---------------------------

WORDS = ("cat dog bird fish horse cow sheep goat lion tiger big small red blue happy sad "
         "garden house river forest field city market school sees eats chases likes").split()


def write_corpus(path: Path, n_docs=60, seed=0):
    """Documents of 1-3 paragraphs of random sentences; a blank line ends each."""
    rng = random.Random(seed)
    lines = []
    for _ in range(n_docs):
        for _ in range(rng.randint(1, 3)):
            sents = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 9))) + "."
                     for _ in range(rng.randint(2, 5))]
            lines.append(" ".join(sents))
        lines.append("")
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    write_corpus(d / "a.txt", 40, seed=1)
    (d / "sub").mkdir()
    write_corpus(d / "sub" / "b.txt", 30, seed=2)
    (d / ".hidden").write_text("ignored\n")
    return d


@pytest.fixture(scope="module")
def loaded_corpus(corpus_dir, tmp_path_factory):
    """(tokenizer, train, validation) of `corpus_dir` via load_corpus, and its cache dir."""
    from nanobert.corpus import load_corpus
    cache = tmp_path_factory.mktemp("cache")
    return load_corpus([corpus_dir], None, vocab_size=120, val_fraction=0.1,
                       cache_dir=cache, log=lambda *a: None), cache




def with_flags(argv: list, extra: list) -> list:
    """`argv` with the flags of `extra` put in: a flag already in `argv` takes the new
    value where it was (a command line given a flag twice says so in a note), others are
    added at the end. A flag followed by no value is a switch."""
    argv, extra = list(argv), [str(x) for x in extra]
    while extra:
        flag = extra.pop(0)
        value = [extra.pop(0)] if extra and not extra[0].startswith("--") else []
        if flag in argv and value:
            argv[argv.index(flag) + 1] = value[0]
        else:
            argv += [flag, *value]
    return argv
