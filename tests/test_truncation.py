"""No silent truncation, no stale cache (issue 11, class 7): what max_length cuts is
reported (how many inputs, by how much, one example)."""
from __future__ import annotations

import pytest

import nanobert
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
    assert note.startswith("1 of 1 pairs are longer than 8 tokens") and \
        "'the movie was great | a dull plot and boring acting'" in note and "raise" not in note
    words = [WORDS * 3]
    tok.tk.enable_truncation(10)
    try:
        encs = tok.tk.encode_batch(words, is_pretokenized=True)
    finally:
        tok.tk.no_truncation()
    assert truncation_note(tok, encs, words, 10, "sentences", is_pretokenized=True) \
        .startswith(f"1 of 1 sentences are longer than 10 tokens and were cut by {len(WORDS) * 3 + 2 - 10} to")


def test_report_prints_one_line_on_stderr(tok, capsys):
    texts = ["the movie was great good fun " * 4]
    assert report_truncation(tok, tok.encode_batch(texts, max_length=6), texts, 6) == 1
    err = capsys.readouterr().err
    assert err.startswith("nanobert: note: 1 of 1 inputs are longer than 6 tokens") and err.count("\n") == 1
