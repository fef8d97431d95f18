"""The Python API's argument checks found by the API probe: Reranker, Encoder.search's
rerank, Encoder.encode's batch types, Predictor's inputs, lone surrogates, the
tokenizer's max_length for pairs, FinetuneConfig's paths, untrained heads. Each wrong
argument is a TypeError/ValueError (NanobertError for a model directory) naming it."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import nanobert
from nanobert.embed import Encoder
from nanobert.files import NanobertError
from nanobert.finetune import FinetuneConfig, Predictor, check_trained_head, finetune
from nanobert.retrieval import Reranker

BAD = "bad \udc80 text"   # a lone surrogate: not valid Unicode


@pytest.fixture(autouse=True)
def _threads(one_thread):
    yield


@pytest.fixture(scope="module")
def dirs(minilm, tmp_path_factory):
    """Tiny random models with minilm's tokenizer: a cross-encoder (one-logit regression
    head), a 2-label classifier and a QA model."""
    _, tok = minilm
    root = tmp_path_factory.mktemp("probe_models")
    out = {}
    for name, head, labels in (("rerank", "regression", 1), ("cls", "classify", 2),
                               ("qa", "qa", 2)):
        torch.manual_seed(0)
        cfg = nanobert.preset("tiny", vocab_size=tok.vocab_size, max_position_embeddings=128,
                              num_labels=labels)
        nanobert.Bert(cfg, head=head).save_pretrained(root / name, tokenizer=tok)
        out[name] = root / name
    return out


@pytest.fixture(scope="module")
def reranker(dirs):
    return Reranker(dirs["rerank"])


DOCS = ["the cat sat", "a dog ran", "paris is big"]


@pytest.mark.parametrize("call, error, words", [
    (lambda r: r.rerank("cat", "the cat sat"), TypeError, "documents must be a list of "
                                                          "strings, got one string"),
    (lambda r: r.rerank("cat", [None]), TypeError, r"documents\[0\] must be a string"),
    (lambda r: r.rerank("cat", None), TypeError, "documents must be a list of strings"),
    (lambda r: r.score("cat", [5]), TypeError, r"documents\[0\] must be a string, got int"),
    (lambda r: r.rerank("cat", DOCS, k=-1), ValueError, "k must be an integer >= 1"),
    (lambda r: r.rerank("cat", DOCS, k=0), ValueError, "k must be"),
    (lambda r: r.rerank("cat", DOCS, k="2"), TypeError, "k must be"),
    (lambda r: r.rerank("cat", DOCS, k=1.5), TypeError, "k must be"),
    (lambda r: r.rerank(None, DOCS), TypeError, "query must be a string"),
    (lambda r: r.rerank(["a", "b"], DOCS), TypeError, "query must be a string"),
    (lambda r: r.rerank("cat", ["ok", BAD]), ValueError, r"documents\[1\] is not valid Unicode"),
    (lambda r: r.rerank_hits("cat", ["a", "b"]), ValueError,
     r"hits\[0\] must be an \(index, score, text\) hit"),
    (lambda r: r.rerank_hits(["q1", "q2"], [[(0, 1.0, "a")]]), ValueError,
     r"one list of \(index, score, text\) hits per query \(2\)"),
])
def test_reranker_names_its_bad_argument(reranker, call, error, words):
    with pytest.raises(error, match=words):
        call(reranker)


def test_reranker_settings_are_checked_and_good_calls_still_work(dirs, reranker):
    for kw, error, words in [({"max_length": 0}, ValueError, "max_length must be"),
                             ({"max_length": 2}, ValueError, "max_length must be a whole "
                                                            "number >= 5"),
                             ({"max_length": "8"}, TypeError, "max_length"),
                             ({"batch_size": 0}, ValueError, "batch_size must be")]:
        with pytest.raises(error, match=words):
            Reranker(dirs["rerank"], **kw)
    assert Reranker(dirs["rerank"], max_length=5).max_length == 5
    with pytest.raises(TypeError, match=r"Reranker\(model_dir\): expected .* got Bert"):
        Reranker(reranker.model, reranker.tokenizer)     # (loaded objects: Encoder's way)
    ranked = reranker.rerank("cat", np.array(DOCS), k=np.int64(2))
    assert len(ranked) == 2 and sorted(i for i, _, _ in reranker.rerank("cat", DOCS)) == [0, 1, 2]
    hits = [(7, 0.5, "a dog ran"), (9, 0.4, "the cat sat")]
    assert sorted(i for i, _, _ in reranker.rerank_hits("cat", hits, k=None)) == [7, 9]


def test_search_rerank_must_be_a_reranker_or_its_directory(minilm, dirs, reranker):
    enc = Encoder(minilm)
    for bad in (enc, 5, object()):
        with pytest.raises(TypeError, match="rerank must be a nanobert.Reranker"):
            enc.search("cat", DOCS, k=2, rerank=bad)
    by_dir = enc.search("cat", DOCS, k=2, rerank=str(dirs["rerank"]))
    assert by_dir == enc.search("cat", DOCS, k=2, rerank=reranker)


def test_a_document_given_as_the_corpus_is_not_quoted_whole(minilm):
    """A 500 kB text passed where a corpus file (or a list) goes was quoted whole in the
    'cannot be read (File name too long)' error: the message is one line of about 1 kB."""
    with pytest.raises(NanobertError, match=r"characters \.\.\.\].*File name too long") as e:
        Encoder(minilm).search("cat", "word " * 100_000)
    assert len(str(e.value)) < 1100


def test_search_says_when_rerank_k_is_raised_to_k(minilm, reranker, capsys):
    """rerank_k under k reranked k entries without a word."""
    enc = Encoder(minilm)
    capsys.readouterr()
    assert len(enc.search("cat", DOCS, k=3, rerank=reranker, rerank_k=1)) == 3
    assert capsys.readouterr().err == ("nanobert: note: rerank_k (--rerank-k) 1 is under k "
                                       "(-k) 3: the 3 nearest entries are reranked\n")
    enc.search("cat", DOCS, k=2, rerank=reranker, rerank_k=2)
    assert capsys.readouterr().err == ""
    assert enc.search([], DOCS, k=3, rerank=reranker, rerank_k=1) == []   # (no query: no hits)
    capsys.readouterr()
    # k over the corpus: all of it is reranked (it said "the 50 nearest" of 5)
    assert len(enc.search("cat", DOCS, k=50, rerank=reranker, rerank_k=1)) == len(DOCS)
    assert capsys.readouterr().err == ("nanobert: note: rerank_k (--rerank-k) 1 is under k "
                                       f"(-k) 50: all {len(DOCS)} entries of the corpus are "
                                       "reranked\n")


def test_encode_refuses_dicts_sets_and_surrogates_and_encoder_names_its_tokenizer(minilm):
    enc = Encoder(minilm)
    for bad, words in [({"first": 1}, "texts must be a list of strings, got a dict"),
                       ({"a", "b"}, "got a set .*no order"),
                       ({"a": 1}.keys(), "got a dict_keys")]:
        with pytest.raises(TypeError, match=words):
            enc.encode(bad)
    with pytest.raises(ValueError, match=r"texts\[1\] is not valid Unicode: a lone surrogate "
                                         r"'\\udc80' at character 4"):
        enc.encode(["ok", BAD])
    with pytest.raises(ValueError, match=r"texts\[0\] is not valid Unicode"):
        enc.encode(BAD)
    with pytest.raises(TypeError, match="tokenizer must be a nanobert Tokenizer"):
        Encoder((minilm[0], "tok"))
    assert enc.encode(["naïve 日本語 😀"]).shape == (1, 384)    # valid non-ASCII still fine


def test_tokenizer_surrogates_and_max_length_of_a_pair(minilm):
    _, tok = minilm
    with pytest.raises(ValueError, match=r"texts\[0\] is not valid Unicode"):
        tok([BAD])
    with pytest.raises(ValueError, match=r"pairs\[0\] is not valid Unicode"):
        tok(["a"], [BAD])
    for n in (2, 3, 4):
        with pytest.raises(ValueError, match="max_length must be a whole number >= 5"):
            tok(["a"], ["b"], max_length=n)
    with pytest.raises(ValueError, match="max_length must be a whole number >= 3"):
        tok(["a"], max_length=2)
    with pytest.raises(TypeError, match="max_length"):
        tok(["a"], max_length=True)
    assert tok(["a"], ["b"], max_length=5)["input_ids"].shape == (1, 5)
    assert tok(["a"], max_length=3)["input_ids"].shape == (1, 3)


@pytest.mark.parametrize("call, error, words", [
    (lambda t: t.decode(None), TypeError, r"decode\(ids\): expected a list of token ids"),
    (lambda t: t.decode(7592), TypeError, r"decode\(ids\): expected a list of token ids"),
    (lambda t: t.decode([7592, -1]), ValueError, r"ids\[1\]: -1 is not a token id of this "
                                                 r"vocabulary \(0 to 30521\)"),
    (lambda t: t.decode(["hello"]), TypeError, r"ids\[0\] must be a token id"),
    (lambda t: t.id_to_token(-1), ValueError, "id: -1 is not a token id"),
    (lambda t: t.id_to_token(30522), ValueError, "id: 30522 is not a token id"),
    (lambda t: t.token_to_id(None), TypeError, "token must be a string"),
    (lambda t: t.encode(None), TypeError, "text must be a string"),
    (lambda t: t.encode("a", 5), TypeError, "pair must be a string"),
    (lambda t: t.encode("a", max_length=2), ValueError, "max_length must be a whole number >= 3"),
    (lambda t: t.pad([]), ValueError, "pad: no encodings"),
    (lambda t: t.with_max_length(-1), ValueError, "max_length must be an integer >= 3, got -1"),
    (lambda t: t.with_max_length(0), ValueError, "max_length must be an integer >= 3, got 0"),
    (lambda t: t.with_max_length(None), TypeError, "max_length must be an integer >= 3"),
    (lambda t: t(["a"], report=3), TypeError, "report must name the inputs"),
])
def test_tokenizer_methods_name_their_bad_argument(minilm, call, error, words):
    """They failed deep inside the tokenizers library ("'NoneType' object is not
    iterable", OverflowError "number too small"), or later (with_max_length(-1) at the
    next call; with_max_length(0) turned truncation off)."""
    with pytest.raises(error, match=words):
        call(minilm[1])


def test_tokenizer_takes_numpy_and_torch_ids_and_lengths(minilm, tmp_path):
    _, tok = minilm
    assert tok.decode(torch.tensor([7592, 2088])) == tok.decode(np.array([7592, 2088])) \
        == "hello world"
    assert tok.id_to_token(torch.tensor(7592)) == tok.id_to_token(np.int64(7592)) == "hello"
    assert tok(["hello world"], max_length=np.int64(3))["input_ids"].shape == (1, 3)
    assert tok.with_max_length(np.int32(64)).model_max_length == 64
    (tmp_path / "afile").write_text("x")
    with pytest.raises(NanobertError, match="afile: is a file, not a folder"):
        tok.save(tmp_path / "afile")


def test_quantize_and_an_int8_encoder_name_their_bad_argument(minilm):
    import copy
    from nanobert.quantize import quantize
    model, tok = minilm
    for outliers, error in [(-1, ValueError), (1.5, TypeError), ("4", TypeError)]:
        with pytest.raises(error, match="outliers must be an integer >= 0"):
            quantize(copy.deepcopy(model), tok, outliers=outliers)
    with pytest.raises(TypeError, match=r"quantize\(tokenizer\): expected the nanobert "
                                        r"Tokenizer .* got str"):
        quantize(copy.deepcopy(model), "minilm")
    q = quantize(copy.deepcopy(model.bert), tok, outliers=0)
    with pytest.raises(ValueError, match=r"Encoder\(dtype='float32'\): the model given is int8"):
        Encoder(q, tok, dtype="float32")          # (it had silently stayed int8)
    got = Encoder(q, tok).encode("hello there")
    assert np.allclose(got, Encoder(q, tok, dtype="int8").encode("hello there"))
    assert not np.allclose(got, Encoder(model, tok).encode("hello there"), atol=1e-5)


def test_predictor_takes_encoders_batch_types_and_names_bad_inputs(dirs):
    cls, qa = Predictor(dirs["cls"]), Predictor(dirs["qa"])
    one = cls.predict("a cat")
    assert cls.predict(np.array(["a cat", "a dog"]))[0] == one
    assert cls.predict(np.array("a cat")) == one     # (one input, as Encoder.encode: api4)
    assert cls.predict(t for t in ["a cat", "a dog"])[0] == one
    assert cls.predict(iter(["a cat"])) == [one]
    with pytest.raises(TypeError, match="inputs must be a list, got a set"):
        cls.predict({"a cat", "a dog"})
    with pytest.raises(ValueError, match="input 1 is not valid Unicode"):
        cls.predict(["ok", BAD])
    with pytest.raises(TypeError, match="input 0: a \\(text, pair\\) tuple's pair must be a "
                                        "string, got NoneType"):
        cls.predict(("a", None))
    good = {"question": "where?", "context": "The cat sat on the mat."}
    assert qa.predict(good)["question"] == "where?"
    assert qa.predict([{**good, "id": "q7", "answers": [], "title": "t"}])[0]["id"] == "q7"
    for bad, error, words in [({**good, "context": None}, TypeError,
                               "input 0: context must be a string, got NoneType"),
                              ({**good, "foo": 1}, ValueError, "input 0: unknown key 'foo'"),
                              ({"question": "q"}, ValueError, "input 0: no 'context'"),
                              ({**good, "question": BAD}, ValueError,
                               "input 0: question is not valid Unicode"),
                              # (answered, where a file's empty question was refused)
                              ({**good, "question": " "}, NanobertError,
                               "input 0: question '0' is empty"),
                              ({**good, "context": ""}, NanobertError,
                               "input 0: question '0': its context is empty"),
                              # (a number or a 3-tuple was told to add a context)
                              ([7], TypeError, "input 0: a QA input is a {'question', "
                               "'context'} dict or a \\(question, context\\) tuple, got int 7"),
                              ([("q", "c", "x")], TypeError, "got tuple"),
                              ("where?", NanobertError, "qa needs a context")]:
        with pytest.raises(error, match=words):
            qa.predict(bad)
    for bad in (None, 5, ["runs/x"]):
        with pytest.raises(TypeError, match=r"Predictor\(model_dir\)"):
            Predictor(bad)
    with pytest.raises(ValueError, match="batch_size"):
        Predictor(dirs["cls"], batch_size=0)


def test_untrained_head_or_missing_labels_are_refused(dirs):
    model, _ = nanobert.load(dirs["cls"])
    from nanobert.finetune import TASKS
    check_trained_head("d", model, TASKS["classify"])          # trained, labelled: fine
    model.new_weights = ["classifier.weight", "classifier.bias"]
    with pytest.raises(NanobertError, match="d: the classify head's weights "
                                            r"\(classifier.weight\) are not in the checkpoint"):
        check_trained_head("d", model, TASKS["classify"])
    model.new_weights = ["bert.pooler.dense.weight"]
    model.config.id2label = None
    with pytest.raises(NanobertError, match="d: config.json has no id2label"):
        check_trained_head("d", model, TASKS["classify"])


def test_finetune_config_names_its_paths(tmp_path):
    base = dict(task="classify", model="minilm", train="t.tsv", dev="d.tsv")
    for field in ("train", "dev", "model"):
        with pytest.raises(TypeError, match=f"FinetuneConfig.{field}: expected"):
            FinetuneConfig(**{**base, field: ["a", "b"]})
    for bad in (None, {"task": "classify"}, 5):
        with pytest.raises(TypeError, match=r"finetune\(config\): expected a FinetuneConfig"):
            finetune(bad)
    with pytest.raises(ValueError, match="FinetuneConfig.train: required"):
        finetune(FinetuneConfig(task="classify", model="minilm").replace(
            out_dir=str(tmp_path / "run")))


def test_a_tokenizer_given_with_a_model_name_is_used():
    """Encoder(("minilm", tok)) dropped `tok` for the name's own tokenizer."""
    mine = nanobert.Tokenizer.train(["the cat sat on a mat"] * 20, vocab_size=40,
                                    min_frequency=1)
    enc = nanobert.Encoder(("minilm", mine))
    assert enc.tokenizer is mine
    assert not torch.allclose(torch.as_tensor(enc.encode("the cat")),
                              torch.as_tensor(nanobert.Encoder("minilm").encode("the cat")))
    with pytest.raises(TypeError, match="tokenizer must be a nanobert Tokenizer"):
        nanobert.Encoder("minilm", tokenizer="minilm")


# ---- a CLI/API probe (2026-11-29) -----------------------------------------------------

def test_a_config_list_field_takes_one_path_as_one_path():
    """PretrainConfig(corpus="wiki.txt") read the string letter by letter ('w: no such
    file')."""
    assert nanobert.PretrainConfig(corpus="wiki.txt").corpus == ["wiki.txt"]
    from pathlib import Path
    assert nanobert.PretrainConfig(corpus=Path("a.txt")).corpus == [Path("a.txt")]
    assert nanobert.PretrainConfig(corpus=["a", "b"]).corpus == ["a", "b"]


def test_a_single_string_for_a_list_of_texts_says_so(minilm):
    from nanobert.embed import encode
    model, tok = minilm
    with pytest.raises(TypeError, match=r"texts must be a list of strings, not one str \(pass "
                                        r"\[text\]\)"):
        encode(model, tok, "abc")


def test_the_inspection_functions_check_their_arguments(minilm, tmp_path):
    """Bad layers, heads, arrays and paths were numpy IndexErrors, AttributeErrors and an
    IsADirectoryError naming a temporary file."""
    from nanobert import inspection as I
    model, tok = minilm
    tokens, probs = I.attention_maps(model, tok, "hello world")
    png = tmp_path / "a.png"
    cases = [(lambda: I.plot_attention(tokens, probs, [6], [0], png), ValueError,
              "layers must be 0-based indices from 0 to 5, got 6"),
             (lambda: I.plot_attention(tokens, probs, [0], [-1], png), ValueError,
              "heads must be 0-based indices from 0 to 11, got -1"),
             (lambda: I.plot_attention(tokens, probs, [0], [0], tmp_path), NanobertError,
              "is a directory"),
             (lambda: I.plot_attention(tokens, probs, [0], [0], tmp_path / "a.txt"),
              NanobertError, "unsupported file type '.txt'"),
             (lambda: I.attention_maps(tok, model, "x"), TypeError, "got a Tokenizer and a Bert"),
             (lambda: I.cls_attention(probs[0]), ValueError, "got shape (12, 4, 4)"),
             (lambda: I.tsne([[1.0, 2.0], [3.0, 4.0]]), NanobertError, "at least 5 examples"),
             (lambda: I.tsne(np.zeros(7)), ValueError, "(n, H) array"),
             (lambda: I.plot_tsne(np.zeros((10, 2)), ["a", "b"], png), ValueError, "2 labels")]
    for call, kind, text in cases:
        with pytest.raises(kind) as e:
            call()
        assert text in str(e.value)
    assert not png.exists()
    I.plot_attention(tokens, probs, [0, 5], [0, 11], png)
    assert png.stat().st_size > 1000


def test_a_trainer_field_given_to_a_job_config_says_where_it_goes():
    """FinetuneConfig(lr=1e-5) was Python's bare 'unexpected keyword argument'."""
    base = dict(task="classify", model="minilm", train="a.tsv", dev="b.tsv")
    with pytest.raises(TypeError, match=r"FinetuneConfig\(\) has no field lr: it is a field of "
                                        r"one of its parts, set with FinetuneConfig.create"):
        FinetuneConfig(**base, lr=1e-5)
    with pytest.raises(TypeError, match=r"^FinetuneConfig\(\) has no field bogus$"):
        FinetuneConfig(**base, bogus=1)
    assert FinetuneConfig.create(**base, lr=1e-5).trainer.lr == 1e-5


def test_encode_takes_a_0d_array_as_one_text_and_checks_show_progress(minilm):
    """np.array("a text") raised numpy's 'iteration over a 0-d array' (np.str_ was one
    text); show_progress took any value where normalize is checked."""
    enc = Encoder(minilm)
    np.testing.assert_array_equal(enc.encode(np.array("a fine film")), enc.encode("a fine film"))
    assert enc.search(np.array("a film"), ["a", "b"], k=1) == enc.search("a film", ["a", "b"], k=1)
    with pytest.raises(TypeError, match="show_progress must be True or False"):
        enc.encode(["a"], show_progress="x")
