"""The tokenizer gives the ids, type ids and masks of transformers' BertTokenizerFast."""
from __future__ import annotations

import json
from collections import Counter

import pytest
import transformers as hf

from nanobert import NanobertError, Tokenizer

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


# ---- clipping long texts before tokenizing (the server's guard, tokenizer.clip_text) ----

PIECES = ["word", "Zürich", "東京タワー", "3.14%", "!!!", "\u200b", "\u0301", "\x1c", "a\u200bb",
          "🙂", "--", "naïve", "\t", "\n", "  ", "x" * 120, "\u00a0", "ﬁne", "Ⅻ", "٣"]


def _hard_text(seed: int, n: int = 600) -> str:
    """Words, CJK, punctuation, zero-width and combining marks, controls, odd spaces."""
    import random
    rnd = random.Random(seed)
    return "".join(rnd.choice(PIECES) + rnd.choice([" ", " ", "", "  ", "\t"]) for _ in range(n))


def _tokenizers(minilm_dir, tmp_path):
    """WordPiece (minilm), byte-level BPE and a SentencePiece-style unigram, all offline."""
    from tokenizers import ByteLevelBPETokenizer, SentencePieceUnigramTokenizer
    from tokenizers import Tokenizer as HFTokenizer
    corpus = [_hard_text(s, 80) for s in range(30)] + ["the cat sat on the mat"] * 20
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(corpus, vocab_size=400, min_frequency=1)
    uni = SentencePieceUnigramTokenizer()
    uni.train_from_iterator(corpus, vocab_size=200, special_tokens=["<unk>"], unk_token="<unk>")
    return {"wordpiece": HFTokenizer.from_file(str(minilm_dir / "tokenizer.json")),
            "byte-level bpe": bpe, "unigram": uni}


def test_clip_keeps_the_tokens_a_truncated_text_gives(minilm_dir, tmp_path):
    from nanobert.tokenizer import clip_text
    # runs that give no token (zero-width, lone accents: dropped), and a control that
    # Python calls whitespace but WordPiece deletes ("a\x1cb" is one word, "ab")
    traps = ["\u200b " * 3000 + "word " * 3000, "\u0301 " * 3000 + "x " * 3000, "a\x1cb " * 3000]
    cases = [(_hard_text(100 + seed), 20 + 7 * seed) for seed in range(12)]
    cases += [(t, keep) for t in traps for keep in (21, 64)]
    for name, tk in _tokenizers(minilm_dir, tmp_path).items():
        for seed, (text, keep) in enumerate(cases):
            clipped = clip_text(text, keep)
            assert text.startswith(clipped) and len(clipped) < len(text), (name, seed)
            whole = tk.encode(text, add_special_tokens=False)
            cut = tk.encode(clipped, add_special_tokens=False)
            assert len(cut.ids) >= keep, (name, seed)
            assert cut.ids[:keep] == whole.ids[:keep], (name, seed)
            assert cut.offsets[:keep] == whole.offsets[:keep], (name, seed)
    import time
    huge, start = "word, " * 350_000, time.perf_counter()           # 2 MB: seconds to tokenize
    assert len(clip_text(huge, 257)) < 2000 and time.perf_counter() - start < 0.5
    assert clip_text("short text", 5) == "short text"           # short: left whole
    spaceless = "東" * 5000                                        # nowhere safe to cut
    assert clip_text(spaceless, 10) == spaceless


def test_clip_pair_gives_the_same_truncated_pairs(minilm_dir):
    """A pair cut to max_length tokens, longest first: the clipped pair encodes the same,
    one side long or both."""
    tok = Tokenizer.from_dir(minilm_dir)
    cases = [(_hard_text(1), "a short query?"), ("who?", _hard_text(2)),
             (_hard_text(3, 300), "x " * 200), (_hard_text(4), _hard_text(5)),
             ("!" * 60, "!" * 3000), ("中文" * 900, "?" * 40)]
    for max_length in (16, 31, 128):
        a, b = zip(*cases)
        cut = [tok.clip_pair(x, y, max_length) for x, y in cases]
        assert all(x.startswith(c) and y.startswith(d) for (x, y), (c, d) in zip(cases, cut))
        assert max_length > 16 or sum(map(len, a + b)) > 4 * sum(map(len, sum(cut, ())))
        with tok.truncating(max_length) as tk:
            whole = tk.encode_batch(list(zip(a, b)))
            clipped = tk.encode_batch(cut)
        for w, c in zip(whole, clipped):
            assert c.ids == w.ids and c.offsets == w.offsets and bool(c.overflowing)
    assert len(tok.clip_pair(_hard_text(6), None, 16)[0]) < len(_hard_text(6))


def test_a_repeated_first_text_no_cut_shortens_is_squeezed_to_the_same_ids(minilm_dir,
                                                                            tmp_path):
    """One word of megabytes is one WordPiece [UNK] and has no word start to cut at: a
    /rerank query of it was tokenized whole again for each document (1.6 MB: 3.5 s a
    document). Squeezed (the middles of runs that make one token or none cut out), it
    gives the same ids, pair by pair, for every tokenizer; where it cannot, it is kept."""
    texts = ["a" * 60_000, "a" * 60_000 + " tail words", "x" + " " * 60_000 + "y z",
             ("b" * 3000 + ". ") * 20, "\u200b" * 20_000 + "word " + "\x1c" * 20_000,
             _hard_text(7, 400)]
    docs = ["short doc", "", _hard_text(8, 50), "the cat " * 400]
    for name, tk in _tokenizers(minilm_dir, tmp_path).items():
        tok = Tokenizer(tk)
        for text in texts:
            short = tok.squeezed(text)
            assert tk.encode(short, add_special_tokens=False).ids == \
                tk.encode(text, add_special_tokens=False).ids, (name, text[:8])
            if name != "wordpiece":    # (a long BPE word is many tokens: clip cuts it)
                continue
            assert text[0] == "-" or len(short) < 20_000, text[:8]
            for max_length in (16, 128):
                # (the whole texts truncated by tokenizers pair every overflowing piece:
                # gigabytes; clip_pairs's cut is shown equal to them in the test above)
                cut = tok.clip_pairs([text] * len(docs), docs, max_length, ids_only=True)
                ref = tok.clip_pairs([text] * len(docs), docs, max_length)
                with tok.truncating(max_length) as t:    # (holds the tokenizer's lock)
                    whole, clipped = t.encode_batch(ref), t.encode_batch(cut)
                assert [c.ids for c in clipped] == [w.ids for w in whole], (name, text[:8])
                assert [c.type_ids for c in clipped] == [w.type_ids for w in whole]


def test_clip_cuts_texts_without_spaces_at_a_cost_in_the_tokens_kept(minilm_dir, tmp_path):
    """A text with no plain space (CJK, punctuation, words between newlines or tabs) is
    cut after tokenizing a prefix of it, not all of it: 2 MB of "!" cost the tokenizer 4 s
    and 1 GB before the cut. The cut keeps the whole text's first tokens."""
    rnd = __import__("random").Random(3)
    texts = ["!" * 40_000, "中文字" * 6_000, "hello\n" * 6_000, "word\t" * 6_000,
             "".join(rnd.choice(PIECES).replace(" ", "") for _ in range(6_000)),
             "a\u00a0" * 10_000, "x" * 30_000 + " end"]     # (one huge word: whole)
    for name, tk in _tokenizers(minilm_dir, tmp_path).items():
        tok = Tokenizer(tk)
        calls = []
        plain = tok.plain
        tok.plain = lambda t, **kw: calls.append(sum(map(len, t))) or plain(t, **kw)
        for text in texts:
            for keep in (9, 130):
                calls.clear()
                cut = tok.clip(text, keep)
                whole = tk.encode(text, add_special_tokens=False)
                got = tk.encode(cut, add_special_tokens=False)
                assert got.ids[:keep] == whole.ids[:keep], (name, text[:8], keep)
                assert len(got.ids) >= min(keep, len(whole.ids)), (name, text[:8], keep)
                # one huge word (BPE: a run of letters or of punctuation; unigram: all
                # but spaces) has nowhere known to be safe: it is tokenized whole, as before
                cheap = len(set(whole.word_ids)) > 2
                assert cheap or name != "wordpiece" or text[0] == "x", text[:8]
                if cheap:
                    assert len(cut) < 100 * keep and max(calls) < 1000 * keep, (name, text[:8])
        for text in texts:       # a lower bound over `least`, or the exact count
            n, whole = tok.least_tokens(text, 130), len(tk.encode(text, add_special_tokens=False).ids)
            assert n == whole or 130 < n <= whole, (name, text[:8])
        prefix, n = tok.head("!." * 20_000, 300)
        assert n == len(tk.encode(prefix, add_special_tokens=False).ids) >= 300
        assert tok.head("short", 300) == ("short", len(tk.encode("short", add_special_tokens=False).ids))


def test_encode_batch_checks_the_shape_of_its_arguments(minilm_dir):
    """encode_batch(['a', 'b'], ['c']) gave one encoding (zip), a str one text per
    character, and max_length=-1 an OverflowError from inside the tokenizers library."""
    tok = Tokenizer.from_dir(minilm_dir)
    with pytest.raises(ValueError, match=r"encode_batch\(pairs\): 1 for 2 texts"):
        tok.encode_batch(["a", "b"], ["c"])
    for texts, pairs in (("abc", None), (["a"], "b")):
        with pytest.raises(TypeError, match="a list of texts, got a str"):
            tok.encode_batch(texts, pairs)
    with pytest.raises(ValueError, match="max_length must be a whole number >= 3"):
        tok.encode_batch(["a"], max_length=-1)
    assert [e.ids for e in tok.encode_batch(iter(["a b"]), (p for p in ["c"]))] == \
        [tok.encode("a b", "c").ids]


def test_truncation_is_measured_a_distinct_text_at_a_time_and_singles_are_clipped(minilm_dir):
    """The truncation note measured every cut input whole and all at once: a 130 kB
    query in 1,000 reranked pairs took 21 GB. Each distinct text (a pair's sides apart)
    is now measured once, 16 at a time. And a long single text is clipped before it is
    tokenized (a 5 MB row took 4.7 GB), with the same tokens kept."""
    from nanobert.tokenizer import cut_lengths
    tok = Tokenizer.from_dir(minilm_dir)
    query, docs = "what " * 3000, [f"doc {i} " * (20 + i) for i in range(40)]
    pairs = [(query, d) for d in docs] + [("a", "b")]
    encs = tok.encode_batch([q for q, _ in pairs], [d for _, d in pairs], max_length=32)
    sizes, plain = [], tok.plain
    tok.plain = lambda t, **kw: sizes.append([len(x) for x in t]) or plain(t, **kw)
    got = cut_lengths(tok, encs, pairs)
    tok.plain = plain
    assert got == {i: len(e.ids) for i, e in enumerate(tok.plain(pairs)) if i < 40}
    assert all(len(s) <= 16 for s in sizes) and sum(n == len(query) for s in sizes for n in s) == 1
    long = "!" * 300_000 + " the end"
    calls = []
    tok.plain = lambda t, **kw: calls.append(sum(map(len, t))) or plain(t, **kw)
    (e,) = tok.encode_batch([long], max_length=64)
    tok.plain = plain
    assert e.ids == plain([long])[0].ids[:63] + [tok.sep_id] and e.overflowing
    assert max(calls) < 10_000


def test_long_pairs_truncate_as_the_tokenizer_does_without_the_quadratic_cost(minilm_dir,
                                                                               tmp_path):
    """Two long texts cut longest first: the tokenizers library pairs every overflowing
    piece of one side with every piece of the other (two 4,000-word texts at 32 tokens:
    76,000 pieces, seconds). encode_batch clips such pairs first (clip_long_pair) and must
    still give exactly the tokens, types, offsets and truncation flag of the plain cut:
    equal lengths, either side longer, odd and even budgets, three tokenizer kinds."""
    import random
    from tokenizers import processors
    rnd = random.Random(0)
    kinds = _tokenizers(minilm_dir, tmp_path)
    for name, tk in kinds.items():
        if name != "wordpiece":      # give the others a [CLS] a [SEP] b [SEP]-style layout
            tk.post_processor = processors.TemplateProcessing(
                single="$0 </s>", pair="$A </s> $B:1 </s>:1", special_tokens=[("</s>", 0)])
        tok = Tokenizer(tk)
        for trial in range(40):
            max_length = rnd.choice([16, 17, 32, 45])
            def text():         # hard text, one token per word (cuts at the margin), or
                n = rnd.randrange(5, 400)   # many characters and few tokens (spaces)
                r = rnd.random()
                return (_hard_text(rnd.randrange(10_000), n) if r < 0.4 else
                        " ".join(rnd.choices("the cat sat on mat".split(), k=n)) if r < 0.8
                        else " " * 50 * n + " ".join(["mat"] * rnd.randrange(1, 8)))
            a = text()
            b = a if trial % 4 == 0 else text()
            ours = tok.encode_batch([a], [b], max_length=max_length)[0]
            tk.enable_truncation(max_length)
            plain = tk.encode(a, b)
            tk.no_truncation()
            assert (ours.ids, ours.type_ids, ours.offsets) == \
                (plain.ids, plain.type_ids, plain.offsets), (name, trial)
            assert bool(ours.overflowing) == bool(plain.overflowing), (name, trial)
    tok = Tokenizer.from_dir(minilm_dir)
    long = "word " * 4000
    e = tok.encode_batch([long], [long + "end"], max_length=32)[0]
    assert len(e.ids) == 32 and e.ids.count(tok.token_to_id("word")) == 29
    assert len(e.overflowing) < 100          # the plain cut keeps 76,361 pieces


CASED_VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "Hello", "hello", "World", "world",
               "café", "cafe", "Café", "中", "##文", "文", "!"]
CASED_TEXTS = ["Hello World!", "Café café cafe", "中文 world"]


def _cased_dir(path, tokenizer_config=None):
    path.mkdir()
    (path / "vocab.txt").write_text("\n".join(CASED_VOCAB) + "\n", encoding="utf-8")
    (path / "config.json").write_text('{"model_type": "bert"}')
    if tokenizer_config is not None:
        conf = dict(tokenizer_config, tokenizer_class="BertTokenizer")
        (path / "tokenizer_config.json").write_text(json.dumps(conf))
    return path


@pytest.mark.parametrize("conf", [None, {"do_lower_case": False},
                                  {"do_lower_case": True, "strip_accents": False},
                                  {"do_lower_case": False, "strip_accents": True},
                                  {"do_lower_case": False, "tokenize_chinese_chars": False}])
def test_tokenizer_config_settings_as_transformers_reads_them(tmp_path, conf):
    """Casing, accent stripping and CJK splitting come from tokenizer_config.json, for a
    vocab.txt and for a tokenizer.json whose own normaliser says otherwise (transformers'
    BertTokenizer rebuilds it from the config); a saved copy reads the same in both."""
    d = _cased_dir(tmp_path / "vocab", conf)
    ref = hf.AutoTokenizer.from_pretrained(d)
    contrary = _cased_dir(tmp_path / "json", dict(conf or {}, do_lower_case=False))
    Tokenizer.from_dir(contrary).save(contrary)      # a tokenizer.json that does not lower-case
    (contrary / "vocab.txt").unlink()
    (contrary / "tokenizer_config.json").unlink()
    if conf is not None:
        (contrary / "tokenizer_config.json").write_text(json.dumps(dict(conf)))
    for ours in (Tokenizer.from_dir(d), Tokenizer.from_dir(contrary)):
        assert [ours.encode(t).ids for t in CASED_TEXTS] == [ref(t)["input_ids"] for t in CASED_TEXTS]
        ours.save(tmp_path / "saved")
        again = hf.AutoTokenizer.from_pretrained(tmp_path / "saved")
        assert [ours.encode(t).ids for t in CASED_TEXTS] == [again(t)["input_ids"] for t in CASED_TEXTS]


def test_calling_the_tokenizer_names_what_is_wrong(minilm_dir):
    """tok(None), tok([3]), tok([]) failed inside the tokenizers library or in `pad`
    (max() of an empty sequence); max_length=0 was silently ignored."""
    tok = Tokenizer.from_dir(minilm_dir)
    for bad, kind, message in [(None, TypeError, "texts must be a list of strings, got NoneType"),
                               ([3], TypeError, r"texts\[0\] must be a string, got int"),
                               (["a", None], TypeError, r"texts\[1\] must be a string"),
                               ([], ValueError, "texts is empty")]:
        with pytest.raises(kind, match=message):
            tok(bad)
    with pytest.raises(ValueError, match="max_length must be a whole number"):
        tok("a", max_length=0)
    with pytest.raises(ValueError, match="pairs: 1 for 2 texts"):
        tok(["a", "b"], ["c"])
    assert tok(("a b", "c"))["input_ids"].shape == (2, 4)


@pytest.mark.parametrize("conf", [None, {"do_lower_case": False, "model_max_length": 64}])
def test_a_tokenizer_file_loads_with_the_settings_beside_it(tmp_path, conf):
    """--tokenizer PATH takes a vocab.txt or a tokenizer.json (the spec says so), read with
    the tokenizer_config.json beside it, as the directory is; it was refused ('is a file;
    give the directory that holds it')."""
    d = _cased_dir(tmp_path / "tok", conf)
    whole = Tokenizer.from_dir(d)
    whole.save(tmp_path / "saved")
    (tmp_path / "saved" / "vocab.txt").unlink()
    expected = [whole.encode(t).ids for t in CASED_TEXTS]
    for file in (d / "vocab.txt", tmp_path / "saved" / "tokenizer.json"):
        ours = Tokenizer.from_dir(file)
        assert [ours.encode(t).ids for t in CASED_TEXTS] == expected, file
        assert (ours.lowercase, ours.model_max_length) == (whole.lowercase, whole.model_max_length)
    assert whole.lowercase == (conf is None)
    with pytest.raises(NanobertError, match="config.json: not a tokenizer file; give a "
                                            "tokenizer.json or a vocab.txt, or the directory"):
        Tokenizer.from_dir(d / "config.json")
    with pytest.raises(NanobertError, match="nope: no such directory"):
        Tokenizer.from_dir(d / "nope")


MASK_TEXTS = ["the cat <mask> on the mat", "the cat<mask> on", "<mask>the", "a <mask>  <mask> b",
              " <mask>", "paris <mask>.", "\t<mask>\n<mask>", "x <s> y </s> <pad> <unk>",
              "Café <mask>! 東京", "hello <ent> world<ent>"]


def _roberta_vocab_files(d, mask_lstrip=True):
    """RoBERTa as many hub checkpoints ship it: vocab.json + merges.txt, the special tokens
    in special_tokens_map.json (<mask> taking the spaces before it), no tokenizer.json;
    and an added token, <ent>, in added_tokens.json."""
    from tokenizers import ByteLevelBPETokenizer
    bpe = ByteLevelBPETokenizer()
    text = ["the quick brown fox jumps over the lazy cat on the mat", "hello paris world"] * 30
    bpe.train_from_iterator(text, vocab_size=300, min_frequency=1,
                            special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    d.mkdir()
    bpe.save_model(str(d))
    mask = {"content": "<mask>", "lstrip": mask_lstrip, "rstrip": False, "normalized": False,
            "single_word": False}
    (d / "special_tokens_map.json").write_text(json.dumps({
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "sep_token": "</s>",
        "pad_token": "<pad>", "cls_token": "<s>", "mask_token": mask}))
    (d / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "RobertaTokenizer", "model_max_length": 512, "mask_token": "<mask>"}))
    n = len(json.loads((d / "vocab.json").read_text()))
    (d / "added_tokens.json").write_text(json.dumps({"<ent>": n}))
    return d


@pytest.mark.parametrize("lstrip", [True, False])
def test_vocab_json_tokenizer_matches_special_tokens_in_text(tmp_path, lstrip):
    """A RoBERTa vocab.json + merges.txt read "<mask>" in a text as "Ġ<", "mask", ">" (so
    fill-mask never saw a mask) where transformers reads one <mask> token, and with
    lstrip the spaces before it too; the tokenizer's special and added tokens are now
    registered from its configuration files, as transformers registers them."""
    d = _roberta_vocab_files(tmp_path / "rob", lstrip)
    ours = Tokenizer.from_dir(d)
    for ref in (hf.RobertaTokenizerFast.from_pretrained(d), hf.AutoTokenizer.from_pretrained(d)):
        assert [ours.encode(t).ids for t in MASK_TEXTS] == [ref(t)["input_ids"] for t in MASK_TEXTS]
        a, b = MASK_TEXTS[:4], MASK_TEXTS[4:8]
        assert ours(a, b)["input_ids"].tolist() == \
            ref(a, b, padding=True, return_tensors="pt")["input_ids"].tolist()
    assert ours.encode("the cat <mask> on").ids.count(ours.mask_id) == 1
    assert len(ours.encode(" <mask>").ids) == (3 if lstrip else 4)   # <s> (Ġ) <mask> </s>
    ours.save(tmp_path / "saved")                  # a tokenizer.json keeps the settings
    again = Tokenizer.from_dir(tmp_path / "saved")
    ref = hf.AutoTokenizer.from_pretrained(tmp_path / "saved")
    assert [again.encode(t).ids for t in MASK_TEXTS] == [ours.encode(t).ids for t in MASK_TEXTS] \
        == [ref(t)["input_ids"] for t in MASK_TEXTS]


def test_vocab_txt_tokenizer_registers_its_configured_tokens(minilm_dir, tmp_path):
    """A BERT vocab.txt still reads [MASK] in a text as the mask token, and now takes the
    settings and added tokens of tokenizer_config.json's added_tokens_decoder as well."""
    d = tmp_path / "bert"
    d.mkdir()
    for name in ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
        (d / name).write_bytes((minilm_dir / name).read_bytes())
    texts = ["the cat [MASK] on the mat", "The Cat [mask] [CLS] [SEP] [PAD] [UNK] ok",
             "x[MASK]y", " [MASK] ", "[MASK][MASK]", "an <ent> here", "AN <ENT>here"]
    ours, ref = Tokenizer.from_dir(d), hf.AutoTokenizer.from_pretrained(d)
    assert [ours.encode(t).ids for t in texts] == [ref(t)["input_ids"] for t in texts]
    assert ours.encode("the [MASK]").ids.count(ours.mask_id) == 1
    conf = json.loads((d / "tokenizer_config.json").read_text())
    token = {"special": True, "normalized": False, "lstrip": False, "rstrip": False,
             "single_word": False}
    conf["added_tokens_decoder"] = {
        "0": dict(token, content="[PAD]"), "103": dict(token, content="[MASK]", lstrip=True),
        "30522": dict(token, content="<ent>", special=False, normalized=True)}
    (d / "tokenizer_config.json").write_text(json.dumps(conf))
    ours, ref = Tokenizer.from_dir(d), hf.AutoTokenizer.from_pretrained(d)
    assert [ours.encode(t).ids for t in texts] == [ref(t)["input_ids"] for t in texts]
    assert ours.token_to_id("<ent>") == 30522 and ours.encode(" [MASK] ").ids[1] == 103
    conf["added_tokens_decoder"]["30600"] = dict(token, content="<far>")
    (d / "tokenizer_config.json").write_text(json.dumps(conf))
    with pytest.raises(NanobertError, match="added token '<far>' has id 30600, but the "
                                            "vocabulary gives it 30523"):
        Tokenizer.from_dir(d)


def test_a_tokenizer_that_keeps_case_is_not_said_to_lower_case(tmp_path):
    """A SentencePiece or byte-level BPE tokenizer.json (XLM-R, CamemBERT, RoBERTa) was
    'lower-cased' in `info` and saved do_lower_case: true; what its normaliser does
    decides, a Lowercase step included."""
    import json
    from tokenizers import Tokenizer as Tk, models as M, normalizers as N, pre_tokenizers as P
    from nanobert.tokenizer import Tokenizer
    for normalizer, lower in ((None, False), (N.NFKC(), False),
                              (N.Sequence([N.NFKC(), N.Lowercase()]), True)):
        tk = Tk(M.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
        tk.pre_tokenizer = P.Whitespace()
        if normalizer is not None:
            tk.normalizer = normalizer
        d = tmp_path / f"t{int(lower)}{normalizer is None}"
        d.mkdir()
        tk.save(str(d / "tokenizer.json"))
        tok = Tokenizer.from_dir(d)
        assert tok.lowercase is lower
        tok.save(d / "out")
        assert json.loads((d / "out" / "tokenizer_config.json").read_text())["do_lower_case"] is lower


def test_a_long_pair_is_cut_the_same_while_another_thread_truncates(minilm_dir):
    """The clip of a pair far over the limit encoded with the shared tokenizer outside its
    lock: while another thread's call had truncation on, it was worked out from truncated
    encodings and the pair was cut at other tokens (a reranker's scores 7.8e-3 off)."""
    import threading
    tok = Tokenizer.from_dir(minilm_dir)
    a = "the film is long and slow " * 60
    b = "a gorgeous witty film with great acting " * 40
    alone = tok.encode_batch([a], [b], max_length=128)[0].ids
    got = {}
    with tok.truncating(128):        # another thread's call under way
        t = threading.Thread(target=lambda: got.update(
            ids=tok.encode_batch([a], [b], max_length=128)[0].ids))
        t.start()
        t.join(0.3)
        assert t.is_alive()          # it waits for that call to end
    t.join(30)
    assert got["ids"] == alone


def test_training_skips_pairs_of_words_the_tokenizer_reads_as_unk():
    """A word over 100 characters is one [UNK] whatever the vocabulary: it adds its
    characters but no merges. Merging through it cost time in its length times the
    merges that touch it: a 50,000-character word (DNA, base64, Thai) took 105 s."""
    import random
    import time
    rnd = random.Random(0)
    corpus = ["the cat sat on a mat and a dog at the gate", "a great tact cast"] * 30
    dna = "".join(rnd.choice("acgt") for _ in range(60_000))
    start = time.perf_counter()
    tok = Tokenizer.train(corpus + [dna, dna[:101]], vocab_size=400)
    assert time.perf_counter() - start < 5
    assert tok.tk.get_vocab() == Tokenizer.train(corpus, vocab_size=400).tk.get_vocab()
    assert tok.encode(dna[:101]).tokens[1:-1] == ["[UNK]"]
    edge = "".join(rnd.choice("acgt") for _ in range(100))    # 100: still a word it reads
    assert Tokenizer.train(corpus + [edge] * 3, vocab_size=400).vocab_size > tok.vocab_size


def _naive_wordpiece(counts: dict, vocab_size: int, min_frequency: int) -> list:
    """train_wordpiece's rule written plainly: recount every pair before each merge."""
    from nanobert.tokenizer import SPECIALS, MAX_WORD_CHARS
    ordered = sorted(counts)
    vocab = list(SPECIALS) + sorted({c for w in ordered for c in w} - set(SPECIALS))
    vocab += sorted({"##" + c for w in ordered for c in w[1:]})
    words = {w: [w[0]] + ["##" + c for c in w[1:]] for w in ordered if len(w) <= MAX_WORD_CHARS}
    while len(vocab) < vocab_size:
        pairs = Counter()
        for w, pieces in words.items():
            for p in zip(pieces, pieces[1:]):
                pairs[p] += counts[w]
        if not pairs:
            break
        (a, b), n = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))
        if n < min_frequency:
            break
        if a + b[2:] not in vocab:
            vocab.append(a + b[2:])
        for w, pieces in words.items():
            out, j = [], 0
            while j < len(pieces):
                if pieces[j:j + 2] == [a, b]:
                    out.append(a + b[2:])
                    j += 2
                else:
                    out.append(pieces[j])
                    j += 1
            words[w] = out
    return vocab


def test_wordpiece_training_follows_its_rule_and_is_not_slowed_by_many_distinct_words():
    """train_wordpiece recounts only the pairs beside each merge: the same vocabulary as
    recounting every pair each time (repeats like 'abab', ties, min_frequency), and 8,000
    distinct hex hashes (IDs, k-mers) no longer take minutes (178 s; now about 10 s)."""
    import hashlib
    import random
    import time
    from nanobert.tokenizer import train_wordpiece
    for seed in range(6):
        rnd = random.Random(seed)
        alphabet = ("ab", "abcdé中", "abcdefghij")[seed % 3]
        counts = Counter({"".join(rnd.choice(alphabet) for _ in range(rnd.randint(1, 14))):
                          rnd.randint(1, 5) for _ in range(150)})
        size, least = rnd.choice([60, 300, 2000]), rnd.choice([1, 2, 3])
        assert train_wordpiece(counts, size, least) == _naive_wordpiece(counts, size, least)
    hashes = Counter(hashlib.sha1(str(i).encode()).hexdigest() for i in range(2000))
    start = time.process_time()
    train_wordpiece(hashes, 8000, 1)
    assert time.process_time() - start < 10      # (29 s before)


def test_train_refuses_what_it_cannot_train_on():
    """A str was iterated one character a text (every word then [UNK]); an empty corpus
    gave a vocabulary of the special tokens; vocab_size '100' or 0, a None text: deep
    errors or none."""
    from nanobert import Tokenizer
    with pytest.raises(TypeError, match="texts must be an iterable of strings"):
        Tokenizer.train("the cat sat on the mat", vocab_size=50)
    with pytest.raises(TypeError, match=r"texts\[1\] must be a string"):
        Tokenizer.train(["a", None], vocab_size=50)
    with pytest.raises(ValueError, match="no words"):
        Tokenizer.train([], vocab_size=100)
    with pytest.raises(TypeError, match="vocab_size must be an integer"):
        Tokenizer.train(["the cat"], vocab_size="100")
    with pytest.raises(ValueError, match="vocab_size must be at least"):
        Tokenizer.train(["the cat"], vocab_size=0)
    tok = Tokenizer.train(["the cat sat"] * 3, vocab_size=40, min_frequency=1)
    assert tok.token_to_id("[UNK]") not in tok(["the cat"])["input_ids"][0].tolist()


def test_a_long_text_of_each_call_is_noted_once(minilm_dir, capsys):
    """A truncation note was said once per text of the note, which quotes the input: a
    web app's Predictor printed (and kept in a set, for good) one note per long request,
    3,000 of them in 5,000 calls. It is said once per kind of call: what was read, how
    many inputs, how many were cut."""
    from nanobert.tokenizer import encode_chunks
    tok = Tokenizer.from_dir(minilm_dir)
    for i in range(5):
        list(encode_chunks(tok, [f"request {i} " + "word " * 40], None, 16))
    assert capsys.readouterr().err.count("note:") == 1 and len(tok._notes) == 1
    list(encode_chunks(tok, ["short", "word " * 40], None, 16))     # another kind: said
    assert "1 of 2 texts is longer than 16 tokens" in capsys.readouterr().err


def test_a_tokenizer_is_named_as_models_are_and_a_string_is_not_one():
    """Tokenizer.from_dir('minilm') said 'no such directory' where every other part of
    the API takes the name, and Tokenizer('minilm') was an AttributeError."""
    from nanobert import Tokenizer
    assert Tokenizer.from_dir("minilm").vocab_size == 30522
    with pytest.raises(TypeError, match=r"wraps a tokenizers\.Tokenizer, got str; .*"
                                        r"Tokenizer\.from_dir\('minilm'\)"):
        Tokenizer("minilm")


def test_a_token_is_shown_as_read_without_a_decoder(minilm_dir, tmp_path):
    """fill-mask showed 'Ġlove' and '▁love' for a tokenizer.json that has no decoder
    (some byte-level and SentencePiece exports): the word marker names the decoding."""
    tks = _tokenizers(minilm_dir, tmp_path)
    for name in ("byte-level bpe", "unigram"):
        conf = json.loads(tks[name].to_str())
        for decoder in (conf["decoder"], None):
            conf["decoder"] = decoder
            (tmp_path / "tokenizer.json").write_text(json.dumps(conf))
            tok = Tokenizer.from_dir(tmp_path)
            mark = "\u0120" if name == "byte-level bpe" else "\u2581"
            word = next(t for t in sorted(conf["model"]["vocab"] if name != "unigram" else
                                          (p for p, _ in conf["model"]["vocab"]))
                        if t[0] == mark and t[1:].isalpha())
            assert tok.display_token(tok.token_to_id(word)) == word[1:], (name, decoder)


def test_vocab_size_counts_the_rows_ids_need(tmp_path):
    """A vocab.txt with a line twice has 7 tokens and ids up to 7: pretrain sized its
    model by the count and the masker indexed past it (an IndexError, badinputs3)."""
    d = tmp_path / "v"
    d.mkdir()
    (d / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\nthe\ncat\n")
    tok = Tokenizer.from_dir(d)
    assert tok.tk.get_vocab_size() == 7 and tok.vocab_size == 8
    assert max(tok.encode("the cat").ids) < tok.vocab_size
    # the last line of a token gives its id, as transformers reads the file; saved and read
    # again, every id stays (the gap's line kept: the ids after it had shifted) (regress5)
    assert tok.encode("the cat").ids == [2, 6, 7, 3]
    tok.save(tmp_path / "saved")
    (tmp_path / "saved" / "tokenizer.json").unlink()          # (read from vocab.txt alone)
    assert Tokenizer.from_dir(tmp_path / "saved").encode("the cat").ids == [2, 6, 7, 3]


def test_from_dir_names_a_path_that_is_none():
    with pytest.raises(TypeError, match=r"^Tokenizer.from_dir\(path\): a directory or file "
                                        "path, got NoneType"):
        Tokenizer.from_dir(None)
