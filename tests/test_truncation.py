"""No silent truncation, no stale cache (issue 11, class 7): what max_length cuts is
reported (how many inputs, by how much, one example) by every command that cuts, and
an embedding cache that does not fit the model is rebuilt."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import nanobert
from nanobert.cli import main
from nanobert.embed import Encoder, corpus_embeddings_cached
from nanobert.tokenizer import report_truncation, truncation_note

WORDS = "the a movie film was great good bad dull plot acting boring fun".split()


@pytest.fixture(scope="module")
def tok():
    return nanobert.Tokenizer.train([" ".join(WORDS)] * 3, vocab_size=80, min_frequency=1)


def test_nothing_cut_nothing_said(tok):
    texts = ["the movie", "a good plot"]
    assert truncation_note(tok, tok.encode_batch(texts, max_length=16), texts, 16) is None


def test_how_many_by_how_much_and_the_longest(tok):
    texts = ["the movie", "the movie was great good fun", "a b", "the plot was dull dull dull dull"]
    encs = tok.encode_batch(texts, max_length=5)
    note = truncation_note(tok, encs, texts, 5, "sentences")
    # lengths with [CLS] and [SEP], measured without truncation
    lengths = [len(tok.encode(t).ids) for t in texts]
    over = [n - 5 for n in lengths if n > 5]
    assert note == (f"{len(over)} of 4 sentences are longer than 5 tokens and were cut by "
                    f"{min(over)} to {max(over)} tokens (the longest, #4, has {max(lengths)}: "
                    "'the plot was dull dull dull dull'); raise --max-length to keep more")


def test_pairs_and_pre_split_words(tok):
    pairs = [("the movie was great", "a dull plot and boring acting")]
    encs = tok.encode_batch([p[0] for p in pairs], [p[1] for p in pairs], max_length=8)
    note = truncation_note(tok, encs, pairs, 8, "pairs", flag=None)
    assert note.startswith("the pair is longer than 8 tokens and was cut by ") and \
        "'the movie was great | a dull plot and boring acting'" in note and "raise" not in note
    words = [WORDS * 3]
    tok.tk.enable_truncation(10)
    try:
        encs = tok.tk.encode_batch(words, is_pretokenized=True)
    finally:
        tok.tk.no_truncation()
    assert truncation_note(tok, encs, words, 10, "sentences", is_pretokenized=True) \
        .startswith(f"the sentence is longer than 10 tokens and was cut by "
                    f"{len(WORDS) * 3 + 2 - 10} tokens (it has {len(WORDS) * 3 + 2}: ")


def test_report_prints_one_line_on_stderr(tok, capsys):
    texts = ["the movie was great good fun " * 4]
    assert report_truncation(tok, tok.encode_batch(texts, max_length=6), texts, 6) == 1
    err = capsys.readouterr().err
    assert err.startswith("nanobert: note: the input is longer than 6 tokens") and err.count("\n") == 1


def test_a_quiet_tokenizer_counts_but_says_and_keeps_nothing(tok, capsys):
    """What the server sets: a note per request would fill its log, and the notes kept
    (to say each once) would grow with every distinct input."""
    texts = [f"the movie was great good fun {i} " * 4 for i in range(3)]
    said = set(tok.__dict__.get("_notes", ()))
    tok.quiet = True
    try:
        assert report_truncation(tok, tok.encode_batch(texts, max_length=6), texts, 6) == 3
        tok.encode_batch(texts, max_length=6, report="texts")
    finally:
        tok.quiet = False
    assert capsys.readouterr().err == "" and tok.__dict__.get("_notes", set()) == said


# ---- in the commands ------------------------------------------------------------------



@pytest.fixture(scope="module")
def model_dir(tok, tmp_path_factory):
    d = tmp_path_factory.mktemp("trunc") / "tiny"
    torch.manual_seed(0)
    config = nanobert.preset("tiny", vocab_size=tok.vocab_size, pad_token_id=tok.pad_id,
                             max_position_embeddings=32, num_hidden_layers=1)
    nanobert.Bert(config).save_pretrained(d, tokenizer=tok)
    return d


def notes(capsys) -> list:
    return [l for l in capsys.readouterr().err.splitlines() if l.startswith("nanobert: note:")]


@pytest.mark.usefixtures("one_thread")
def test_finetune_evaluate_predict_say_what_they_cut(tok, model_dir, tmp_path, capsys):
    long = "the movie was great good fun and the plot was good"
    rows = [(long if i % 3 == 0 else "good fun", i % 2) for i in range(12)]
    data = tmp_path / "d.tsv"
    data.write_text("sentence\tlabel\n" + "".join(f"{t}\t{y}\n" for t, y in rows))
    out = tmp_path / "m"
    assert main(["finetune", "--task", "classify", "--model", str(model_dir), "--train", str(data),
                 "--dev", str(data), "--out", str(out), "--epochs", "3", "--max-length", "8",
                 "--batch-size", "4", "--no-progress"]) == 0
    got = [n for n in notes(capsys) if "no better than" not in n]   # (a model at chance)
    n_long = len(tok.encode(long).ids)
    assert got == [f"nanobert: note: 4 of 12 texts are longer than 8 tokens and were cut by "
                   f"{n_long - 8} tokens (the longest, #1, has {n_long}: "
                   f"'{long}')"]                      # train and dev alike: said once
    assert main(["predict", "--model", str(out), long, "good"]) == 0
    assert notes(capsys) == [got[0].replace("4 of 12 texts are", "1 of 2 texts is")
                             .replace("were", "was").replace("the longest, #1,", "#1")]


def test_embed_and_attention_say_what_they_cut(model_dir, tmp_path, capsys):
    texts = tmp_path / "t.txt"
    texts.write_text("good fun\nthe movie was great good fun and dull\n")
    assert main(["embed", "--model", str(model_dir), "--input", str(texts), "--out",
                 str(tmp_path / "e.npy"), "--max-length", "6"]) == 0
    assert notes(capsys)[0].startswith("nanobert: note: 1 of 2 texts is longer than 6 tokens")
    assert main(["attention", "--model", str(model_dir), "--text", "the movie was great good fun",
                 "--out", str(tmp_path / "a.png"), "--max-length", "5"]) == 0
    assert notes(capsys)[0].startswith("nanobert: note: the text is longer than 5 tokens")
    assert main(["embed", "--model", str(model_dir), "--input", str(texts), "--out",
                 str(tmp_path / "e.npy"), "--max-length", "16"]) == 0
    assert notes(capsys) == []


@pytest.mark.parametrize("bad", ["width", "rows", "nan", "garbage"])
def test_a_cache_that_does_not_fit_is_rebuilt(model_dir, tmp_path, bad):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("good fun\nthe movie was dull\na boring plot\n")
    enc = Encoder(str(model_dir), max_length=16)
    _, fresh = corpus_embeddings_cached(enc, corpus)
    (cache,) = tmp_path.glob("corpus.txt.nanobert-*.npy")
    broken = {"width": np.zeros((3, 7), np.float32), "rows": np.zeros((2, fresh.shape[1]), np.float32),
              "nan": np.full(fresh.shape, np.nan, np.float32)}.get(bad)
    if broken is None:
        cache.write_bytes(b"\x93NUMPY garbage")
    else:
        np.save(cache, broken)
    _, again = corpus_embeddings_cached(enc, corpus)
    np.testing.assert_array_equal(again, fresh)
    np.testing.assert_array_equal(np.load(cache), fresh)       # and the cache is repaired


def test_cut_lengths_add_up_overflow_and_measure_clipped_texts_and_pairs_again(tok):
    """A single text read whole is measured by its overflowing pieces (encoding every cut
    text again had doubled the time of reading long texts); a pair's sides, and a text
    clipped before it was tokenized, are encoded again, a long one counted only up to a
    bound (a 5 MB row measured whole took 3.0 GB for a note; 16 pairs with a 1 MB side
    2.45 GB): an AtLeast, which the note words "at least"."""
    import random
    from nanobert.tokenizer import AtLeast, cut_lengths
    rnd, bounded = random.Random(0), 0

    def text():
        return " ".join(rnd.choice(WORDS + ["unheardof", "ü", "!"]) for _ in range(rnd.randint(1, 400)))
    for max_length in (6, 16, 40):
        inputs = [text() if rnd.random() < 0.7 else (text(), text()) for _ in range(60)]
        inputs += ["the plot " * 2000, ("a b", "dull fun " * 2000), ("dull " * 3000, "good")]
        encs = [tok.encode_batch([x] if isinstance(x, str) else [x[0]], None if isinstance(x, str)
                                 else [x[1]], max_length=max_length)[0] for x in inputs]
        whole = {i: len(tok.encode(*((x,) if isinstance(x, str) else x), max_length=10 ** 6).ids)
                 for i, x in enumerate(inputs)}
        got = cut_lengths(tok, encs, inputs)
        assert set(got) == {i for i, n in whole.items() if n > max_length}
        clipped = {i for i, x in enumerate(inputs)
                   if isinstance(x, str) and len(x) > 16 * (max_length + 1)}
        assert clipped and clipped < set(got)                    # (each way is checked)
        for i, n in got.items():    # a long text or side: exact, or a bound over 64 x max_length
            if isinstance(n, AtLeast):
                long = [t for t in ([inputs[i]] if i in clipped else inputs[i])
                        if len(t) > 16 * (max_length + 1)]
                assert long and 64 * max_length < n < whole[i]
            else:
                assert n == whole[i]
        bounded += sum(isinstance(n, AtLeast) for n in got.values())
    assert bounded                                               # (both kinds of count)


def test_classification_features_are_made_a_chunk_at_a_time(tok, monkeypatch, capsys):
    """Reading texts to classify kept every encoding until all were made: 25,000 texts
    of 1,300 characters took +1.35 GB. Chunks give the same features and one note."""
    import nanobert.tokenizer as T
    from nanobert.data import Example
    from nanobert.finetune import encode_classification
    tok = tok.with_max_length(12)
    examples = [Example(" ".join(WORDS[: 1 + i % len(WORDS)]) * (1 + i % 3),
                        None if i % 4 else "the plot was dull", str(i % 2)) for i in range(30)]
    whole = encode_classification(tok, examples, 12, {"0": 0, "1": 1})
    note = capsys.readouterr().err
    assert "of 30 inputs are longer than 12 tokens" in note
    tok.__dict__.pop("_notes", None)
    calls = []
    real = tok.encode_batch
    monkeypatch.setattr(tok, "encode_batch", lambda t, *a, **k: calls.append(len(t)) or real(t, *a, **k))
    monkeypatch.setattr(T, "CHUNK_CHARS", 100)
    assert encode_classification(tok, examples, 12, {"0": 0, "1": 1}) == whole
    assert len(calls) > 6 and capsys.readouterr().err == note


def test_a_text_too_long_to_count_is_said_to_have_at_least_its_count(tok):
    from nanobert.tokenizer import truncation_note
    texts = ["the plot " * 30000, "the movie was great good fun"]
    note = truncation_note(tok, tok.encode_batch(texts, max_length=6), texts, 6, "texts")
    assert "were cut by 2 to at least " in note and "(the longest, #1, has at least " in note
