"""The tokenizer gives the ids, type ids and masks of transformers' BertTokenizerFast."""
from __future__ import annotations

import pytest
import transformers as hf

from nanobert import Tokenizer

TEXTS = [
    "Hello, world!",
    "Café déjà-vu: naïve résumé coöperation.",          # accents (stripped when uncased)
    "Punctuation!!! (nested [brackets]) -- and \"quotes\"; 3.14% of $5...",
    "東京タワーは高い。北京欢迎你",                         # CJK characters split one by one
    "antidisestablishmentarianism pneumonoultramicroscopicsilicovolcanoconiosis",  # many pieces
    "   leading and trailing   whitespace\tand\ttabs  ",
    "emoji 🙂 and control\u200bchars",
]
PAIRS = [("Who wrote it?", "It was written by a café owner in Zürich."),
         ("東京", "Tokyo is the capital."), ("short", "a " * 40 + "long second segment")]


@pytest.fixture(scope="module", params=["tokenizer.json", "vocab.txt"])
def both(request, minilm_dir, tmp_path_factory):
    """Ours loaded from tokenizer.json, or from a directory with only vocab.txt; the
    reference is transformers' BertTokenizerFast built from vocab.txt alone."""
    d = tmp_path_factory.mktemp("vocab_only")
    (d / "vocab.txt").write_bytes((minilm_dir / "vocab.txt").read_bytes())
    ref = hf.BertTokenizerFast.from_pretrained(d, do_lower_case=True)
    ours = Tokenizer.from_dir(d if request.param == "vocab.txt" else minilm_dir)
    return ours, ref


def test_single_texts_match(both):
    ours, ref = both
    mine = ours(TEXTS)
    theirs = ref(TEXTS, padding=True, return_tensors="pt")
    for k in ("input_ids", "token_type_ids", "attention_mask"):
        assert mine[k].tolist() == theirs[k].tolist(), k
    assert mine["input_ids"].shape[1] == max(len(ref(t)["input_ids"]) for t in TEXTS)  # dynamic


def test_pairs_and_truncation_match(both):
    ours, ref = both
    a, b = zip(*PAIRS)
    for max_length in (None, 16):
        mine = ours(list(a), list(b), max_length=max_length)
        theirs = ref(list(a), list(b), padding=True, truncation=max_length is not None,
                     max_length=max_length, return_tensors="pt")
        for k in ("input_ids", "token_type_ids", "attention_mask"):
            assert mine[k].tolist() == theirs[k].tolist(), (k, max_length)


def test_pair_layout_and_offsets(both):
    ours, _ = both
    e = ours.encode("The Cat", "sat down")
    assert e.tokens == ["[CLS]", "the", "cat", "[SEP]", "sat", "down", "[SEP]"]
    assert e.type_ids == [0, 0, 0, 0, 1, 1, 1]
    assert e.offsets[2] == (4, 7)          # "Cat" in the first text
    assert e.offsets[5] == (4, 8)          # "down" in the second text
    long = ours.encode("antidisestablishmentarianism")
    assert len(long.tokens) > 5 and all(t.startswith("##") for t in long.tokens[2:-1])
    assert set(long.word_ids[1:-1]) == {0}


def test_train_new_vocabulary(tmp_path):
    corpus = ["the quick brown fox jumps over the lazy dog"] * 50 + ["hello there friend"] * 50
    tok = Tokenizer.train(corpus, vocab_size=120)
    assert tok.vocab_size <= 120
    assert [tok.token_to_id(t) for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")] == [0, 1, 2, 3, 4]
    enc = tok.encode("the lazy fox")
    assert enc.tokens[0] == "[CLS]" and enc.tokens[-1] == "[SEP]" and "[UNK]" not in enc.tokens
    tok.save(tmp_path)
    again = Tokenizer.from_dir(tmp_path)
    assert again.encode("the lazy fox").ids == enc.ids
    ref = hf.AutoTokenizer.from_pretrained(tmp_path)
    assert ref("the lazy fox")["input_ids"] == enc.ids
