"""Attention maps on every backend, [CLS] attention, t-SNE sampling and silhouette,
and the `attention` / `tsne` commands end to end on a tiny model."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import nanobert
from conftest import random_batch
from nanobert.cli import main
from nanobert.files import NanobertError
from nanobert.finetune import read_labelled
from nanobert.inspection import (attention_maps, balanced_sample, cls_attention, parse_selection,
                                 sentence_vectors, silhouette, tsne)

PNG = b"\x89PNG\r\n\x1a\n"
WORDS = ["good", "great", "fun", "bad", "dull", "awful", "film", "story", "plot", "the", "a"]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A tiny random BERT classifier (3 layers, 2 heads) with its own tokenizer."""
    out = tmp_path_factory.mktemp("tiny")
    tok = nanobert.Tokenizer.train([" ".join(WORDS)] * 3, vocab_size=100, min_frequency=1)
    torch.manual_seed(0)
    cfg = nanobert.preset("tiny", vocab_size=tok.vocab_size, num_hidden_layers=3,
                          max_position_embeddings=64, id2label={0: "0", 1: "1"})
    nanobert.Bert(cfg, "classify").eval().save_pretrained(out, tokenizer=tok)
    return out


@pytest.fixture
def labelled_tsv(tmp_path):
    rng = np.random.default_rng(1)
    rows = []
    for i in range(30):
        lab = i % 3 == 0  # 10 of label 1, 20 of label 0
        words = rng.choice(WORDS[:3] if lab else WORDS[3:6], 3).tolist() + ["film"]
        rows.append(f"{' '.join(words)}\t{int(lab)}")
    path = tmp_path / "data.tsv"
    path.write_text("sentence\tlabel\n" + "\n".join(rows) + "\n", encoding="utf-8")
    return path


# ---- the request path gives the eager probabilities ----------------------------------


@pytest.mark.parametrize("backend", ["sdpa", "unpadded"])
def test_requested_probs_equal_eager(tiny_config, backend):
    torch.manual_seed(0)
    model = nanobert.Bert(tiny_config).eval()
    batch = random_batch(B=4, T=12)
    mask = batch["attention_mask"].bool()
    model.config.attn_backend = "eager"
    with torch.no_grad():
        ref = model(**batch, output_attentions=True).hidden
    model.config.attn_backend = backend
    with torch.no_grad():
        got = model(**batch, output_attentions=True).hidden
    assert len(got.attentions) == len(ref.attentions) == tiny_config.num_hidden_layers
    for p_ref, p_got in zip(ref.attentions, got.attentions):
        assert p_got.shape == p_ref.shape                        # (B, nh, T, T)
        for b in range(4):
            n = int(mask[b].sum())
            torch.testing.assert_close(p_got[b, :, :n, :n], p_ref[b, :, :n, :n],
                                       atol=1e-6, rtol=1e-5)
            assert float(p_got[b, :, :n, n:].sum()) == 0.0  # no weight on padding keys
    h_ref = ref.last_hidden_state[mask]
    torch.testing.assert_close(got.last_hidden_state[mask], h_ref, atol=1e-5, rtol=1e-5)


def test_attention_maps_minilm_backends(minilm):
    model, tok = minilm
    text = "The bank of the river was flooded."
    results, before = {}, model.config.attn_backend
    try:
        for backend in ("eager", "sdpa", "unpadded"):
            model.config.attn_backend = backend
            results[backend] = attention_maps(model, tok, text)
    finally:
        model.config.attn_backend = before
    tokens, probs = results["eager"]
    assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]" and "river" in tokens
    assert probs.shape == (6, 12, len(tokens), len(tokens))
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-5)
    for backend in ("sdpa", "unpadded"):
        assert results[backend][0] == tokens
        np.testing.assert_allclose(results[backend][1], probs, atol=1e-5)  # fp32 across 6 layers


def test_cls_attention_and_selection():
    probs = np.random.default_rng(0).random((3, 2, 5, 5))
    cls = cls_attention(probs)
    assert cls.shape == (3, 5)
    np.testing.assert_allclose(cls[1], (probs[1, 0, 0] + probs[1, 1, 0]) / 2)
    assert parse_selection("1,6,12", 12, "layers", []) == [0, 5, 11]
    assert parse_selection("2-4,2", 12, "layers", []) == [1, 2, 3]
    assert parse_selection("all", 3, "heads", []) == [0, 1, 2]
    assert parse_selection(None, 3, "heads", [0]) == [0]
    with pytest.raises(NanobertError, match="--layers: got 7, expected 1 to 6"):
        parse_selection("1,7", 6, "layers", [])
    with pytest.raises(NanobertError, match="--layers: got 'one', expected a list"):
        parse_selection("one", 6, "layers", [])
    with pytest.raises(NanobertError, match="--layers: got '2-1', expected .*low to high"):
        parse_selection("2-1", 6, "layers", [])


def test_attention_cli(tiny_dir, tmp_path, capsys):
    out = tmp_path / "att.png"
    rc = main(["attention", "--model", str(tiny_dir), "--text", "a good film", "--out", str(out),
               "--layers", "1,3", "--heads", "all", "--json"])
    assert rc == 0
    assert out.read_bytes()[:8] == PNG
    said = capsys.readouterr()
    r = json.loads(said.out)              # stdout is the JSON alone (misc5), the line on stderr
    assert said.err.startswith("4 attention map(s), 5 tokens -> ")
    assert r["tokens"] == ["[CLS]", "a", "good", "film", "[SEP]"]
    assert [(m["layer"], m["head"]) for m in r["maps"]] == [(1, 1), (1, 2), (3, 1), (3, 2)]
    model, tok = nanobert.load(tiny_dir)
    _, probs = attention_maps(model, tok, "a good film")
    np.testing.assert_allclose(r["maps"][3]["probs"], probs[2, 1], atol=1e-6)

    out2 = tmp_path / "cls.png"
    assert main(["attention", "--model", str(tiny_dir), "--text", "a good film",
                 "--out", str(out2), "--cls", "--json"]) == 0
    assert out2.read_bytes()[:8] == PNG
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    np.testing.assert_allclose(r["cls_attention"], cls_attention(probs), atol=1e-6)

    bad = tmp_path / "bad.png"
    assert main(["attention", "--model", str(tiny_dir), "--text", "x", "--out", str(bad),
                 "--layers", "9"]) == 2
    assert "--layers: got 9, expected 1 to 3" in capsys.readouterr().err
    assert not bad.exists()


# ---- t-SNE ---------------------------------------------------------------------------


def test_balanced_sample():
    labels = ["a"] * 50 + ["b"] * 10 + ["c"] * 40
    idx = balanced_sample(labels, 30, seed=3)
    assert [labels[i] for i in idx].count("a") == 10
    assert [labels[i] for i in idx].count("b") == 10
    assert idx == sorted(idx) and len(set(idx)) == 30
    assert balanced_sample(labels, 30, seed=3) == idx
    assert balanced_sample(labels, 30, seed=4) != idx
    few = balanced_sample(labels, 60, seed=0)   # 20 each, but b has only 10: 25 of a and c
    assert [labels[i] for i in few].count("b") == 10 and len(few) == 60
    assert [labels[i] for i in few].count("a") == [labels[i] for i in few].count("c") == 25
    odd = [labels[i] for i in balanced_sample(labels, 5, seed=0)]   # (2, 2, 1 spread)
    assert len(odd) == 5 and sorted(map(odd.count, "abc")) == [1, 2, 2]
    assert len(balanced_sample(labels, 500)) == 100                 # all the data has


def test_silhouette_separates_clusters():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(0, 0.1, (20, 8)) + 3, rng.normal(0, 0.1, (20, 8)) - 3])
    labels = ["p"] * 20 + ["n"] * 20
    assert silhouette(x, labels, "euclidean") > 0.9
    assert silhouette(x, labels[::-1][:10] + labels[10:30] + labels[:10], "euclidean") < 0.3
    with pytest.raises(NanobertError, match="two different labels"):
        silhouette(x, ["p"] * 40)
    pts = tsne(x, seed=0)
    assert pts.shape == (40, 2)
    np.testing.assert_allclose(tsne(x, seed=0), pts)  # fixed seed: reproducible


def test_sentence_vectors_kinds(tiny_dir):
    model, tok = nanobert.load(tiny_dir)
    model.train()
    texts = ["a good film", "the plot", "awful awful dull story film"]
    cls = sentence_vectors(model, tok, texts, kind="cls", batch_size=2)
    pooled = sentence_vectors(model, tok, texts, kind="pooled", batch_size=2)
    assert model.training  # left as it was found
    with torch.no_grad():
        model.eval()
        enc = model.bert(**tok(texts))
    np.testing.assert_allclose(cls, enc.last_hidden_state[:, 0].numpy(), atol=1e-5)
    np.testing.assert_allclose(pooled, enc.pooler_output.numpy(), atol=1e-5)


def test_tsne_cli(tiny_dir, labelled_tsv, tmp_path, capsys):
    out = tmp_path / "tsne.png"
    rc = main(["tsne", "--model", str(tiny_dir), "--data", str(labelled_tsv), "--out", str(out),
               "--n", "16", "--json", "--label-names", "0=negative,1=positive"])
    assert rc == 0
    assert out.read_bytes()[:8] == PNG
    said = capsys.readouterr()
    r = json.loads(said.out)              # stdout is the JSON alone (misc5), the lines on stderr
    assert r["n"] == 16 and r["counts"] == {"0": 8, "1": 8}
    assert any(line.startswith("silhouette") for line in said.err.splitlines())
    # the printed score is the silhouette of the sampled vectors in the original space
    ex = read_labelled(labelled_tsv)
    idx = balanced_sample(ex["labels"], 16, 0)
    model, tok = nanobert.load(tiny_dir)
    vecs = sentence_vectors(model, tok, [ex["texts"][i] for i in idx])
    assert r["silhouette"] == pytest.approx(silhouette(vecs, [ex["labels"][i] for i in idx]), abs=1e-6)

    assert main(["tsne", "--model", str(tiny_dir), "--data", str(tmp_path / "none.tsv"),
                 "--out", str(tmp_path / "x.png")]) == 2
    assert "none.tsv" in capsys.readouterr().err


def test_tsne_of_identical_or_nan_vectors_is_refused():
    """scikit-learn's TSNE crashed the interpreter (segmentation fault) on vectors that are
    all the same, what a collapsed model or identical texts give."""
    from nanobert.inspection import tsne
    with pytest.raises(NanobertError, match="all 10 vectors are the same"):
        tsne(np.ones((10, 384)))
    with pytest.raises(NanobertError, match="NaN or infinity"):
        tsne(np.full((10, 4), np.nan))
    assert tsne(np.random.default_rng(0).normal(size=(10, 4)), perplexity=3).shape == (10, 2)


def test_tsne_small_samples_say_why(tiny_dir, tmp_path, capsys):
    # every example its own label, or 2 rows: scikit-learn's ValueError was a traceback
    def error(rows, *flags):
        data = tmp_path / "d.tsv"
        data.write_text("sentence\tlabel\n" + "".join(f"{t}\t{y}\n" for t, y in rows))
        assert main(["tsne", "--model", str(tiny_dir), "--data", str(data), "--out",
                     str(tmp_path / "x.png"), *flags]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and not (tmp_path / "x.png").exists()
        return err.removeprefix(f"nanobert: error: {data}: ")
    assert error([("a", 1), ("b", 0)]) == ("t-SNE needs at least 5 examples, the sample has 2 "
                                           "(of 2 in the file; --n 400)\n")
    assert error([(f"w{i}", f"c{i}") for i in range(6)]).startswith(
        "silhouette needs a label with two examples or more (the sample has 6 examples of 6 labels")


# ---- reading labelled files ----------------------------------------------------------


def test_read_labelled_formats(tmp_path):
    tsv = tmp_path / "a.tsv"
    tsv.write_text("sentence1\tsentence2\tlabel\tidx\nA b.\tC d.\t1\t0\nE.\tF.\t0\t1\n")
    ex = read_labelled(tsv)
    assert ex["texts"] == ["A b.", "E."] and ex["pairs"] == ["C d.", "F."]
    assert ex["labels"] == ["1", "0"]
    jl = tmp_path / "a.jsonl"
    jl.write_text('{"text": "x y", "label": "pos"}\n{"text": "z", "label": "neg"}\n')
    ex = read_labelled(jl)
    assert ex["texts"] == ["x y", "z"] and ex["labels"] == ["pos", "neg"]
    assert ex["pairs"] == [None, None]
    named = tmp_path / "c.jsonl"
    named.write_text('{"review": "fine", "stars": 5}\n{"review": "poor", "stars": 1}\n')
    ex = read_labelled(named, "review", None, "stars")
    assert ex["texts"] == ["fine", "poor"] and ex["labels"] == ["5", "1"]
    bad = tmp_path / "b.tsv"
    bad.write_text("words\tlabel\nx\t1\n")
    with pytest.raises(NanobertError, match="b.tsv"):
        read_labelled(bad)


def test_attention_refuses_text_without_tokens(tiny_dir, tmp_path, capsys):
    """--text '' drew a map of [CLS] and [SEP] alone, and --pair '' a pair with nothing;
    so did a text the tokenizer keeps nothing of (a zero-width space, lone combining
    marks, control characters), which passed the check of empty text: the check counts
    tokens."""
    for flags, flag in ((["--text", " "], "--text"), (["--text", "a", "--pair", ""], "--pair"),
                        (["--text", "\u200b"], "--text"), (["--text", "\u0301\u0308"], "--text"),
                        (["--text", "\x01\x02 \u200b"], "--text"),
                        (["--text", "good", "--pair", "\u200b"], "--pair")):
        rc = main(["attention", "--model", str(tiny_dir), "--out",
                   str(tmp_path / "a.png")] + flags)
        err = capsys.readouterr().err
        assert rc == 2 and err.startswith(f"nanobert: error: {flag}: ") and err.count("\n") == 1
        assert ("[CLS] and [SEP]" if flag == "--text" else "leave --pair out") in err
    assert not (tmp_path / "a.png").exists()
    assert main(["attention", "--model", str(tiny_dir), "--out", str(tmp_path / "a.png"),
                 "--text", "good \u200b film", "--json"]) == 0      # tokens besides: drawn
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["tokens"][1:-1] == ["good", "film"]


def test_attention_on_a_pair_needs_room_for_both_texts(tiny_dir, tmp_path, capsys):
    """--pair with --max-length 4 (enough for one text, not for [CLS] a [SEP] b [SEP])
    ended in the tokenizer's ValueError: a traceback and exit status 1."""
    out = tmp_path / "a.png"
    rc = main(["attention", "--model", str(tiny_dir), "--out", str(out), "--text", "a b",
               "--pair", "c d", "--max-length", "4"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("nanobert: error: --max-length: ") and err.count("\n") == 1
    assert ">= 5" in err and not out.exists()
    assert main(["attention", "--model", str(tiny_dir), "--out", str(out), "--text", "a b",
                 "--pair", "c d", "--max-length", "5"]) == 0 and out.exists()


def test_tsne_says_the_perplexity_it_uses(tiny_dir, labelled_tsv, tmp_path, capsys):
    """--perplexity 100 with --n 20 was capped at (n - 1) / 3 without a word."""
    out = tmp_path / "t.png"
    assert main(["tsne", "--model", str(tiny_dir), "--data", str(labelled_tsv), "--out",
                 str(out), "--n", "20", "--perplexity", "100"]) == 0
    assert capsys.readouterr().err == ("nanobert: note: --perplexity 100: 6.333 used, the most "
                                       "t-SNE takes for 20 examples ((n - 1) / 3)\n")
    assert main(["tsne", "--model", str(tiny_dir), "--data", str(labelled_tsv), "--out",
                 str(out), "--n", "20", "--perplexity", "5"]) == 0
    assert capsys.readouterr().err == ""
    assert main(["tsne", "--model", str(tiny_dir), "--data", str(labelled_tsv), "--out",
                 str(out), "--n", "20"]) == 0        # (not given: said as the default)
    assert capsys.readouterr().err == ("nanobert: note: the default perplexity 30: 6.333 used, "
                                       "the most t-SNE takes for 20 examples ((n - 1) / 3)\n")


@pytest.mark.parametrize("names, said", [
    ("0=a,1=a", "labels '0' and '1' would both be shown as 'a'"),
    ("0=1", "labels '0' and '1' would both be shown as '1'"),   # 1 keeps its own name
])
def test_tsne_refuses_two_labels_of_one_name(tiny_dir, labelled_tsv, tmp_path, capsys, names,
                                            said):
    """--label-names 0=a,1=a drew a legend with two entries 'a'."""
    out = tmp_path / "t.png"
    assert main(["tsne", "--model", str(tiny_dir), "--data", str(labelled_tsv), "--out",
                 str(out), "--n", "10", "--label-names", names]) == 2
    assert capsys.readouterr().err == (f"nanobert: error: --label-names {names}: {said}; give "
                                       "each its own name\n")
    assert not out.exists()


def test_tsne_sample_size_is_said_and_checked(tiny_dir, labelled_tsv, tmp_path, capsys):
    """The balanced sample's size, when it is not --n, is said with the reason; an --n
    below the number of labels is refused (a balanced sample has one of each at least)."""
    from nanobert.inspection import command_sample
    out = tmp_path / "t.png"
    assert main(["tsne", "--model", str(tiny_dir), "--data", str(labelled_tsv), "--out",
                 str(out), "--n", "40", "--perplexity", "5"]) == 0
    assert capsys.readouterr().err == ("nanobert: note: --n 40: 30 examples used, all the data "
                                       "has (20 of '0', 10 of '1')\n")
    assert main(["tsne", "--model", str(tiny_dir), "--data", str(labelled_tsv), "--out",
                 str(out), "--n", "24", "--perplexity", "5"]) == 0
    assert capsys.readouterr().err == ("nanobert: note: --n 24: 24 examples used, 14 of '0', "
                                       "10 of '1': the data has fewer of '1' than an even "
                                       "share\n")
    assert main(["tsne", "--model", str(tiny_dir), "--data", str(labelled_tsv), "--out",
                 str(out), "--n", "5", "--perplexity", "1"]) == 0  # 2 and 3: t-SNE's 5 at least
    assert capsys.readouterr().err == ""
    with pytest.raises(NanobertError, match=r"^--n 2: the sample is balanced over the 3 labels"):
        command_sample(["a", "b", "c", "a"], 2)
    labels = ["a", "b", "c", "a"]
    assert sorted(labels[i] for i in command_sample(labels, 3)) == ["a", "b", "c"]


def test_lengths_stop_at_the_positions_past_robertas_offset(tmp_path, capsys):
    """A RoBERTa's positions start at pad + 1: max_length was capped at
    max_position_embeddings, one or two tokens too many (a ValueError in forward: a
    traceback from `attention`, `embed`, sentence_vectors and Encoder.encode)."""
    from nanobert.embed import Encoder
    tok = nanobert.Tokenizer.train([" ".join(WORDS)] * 3, vocab_size=100, min_frequency=1)
    torch.manual_seed(0)
    cfg = nanobert.preset("roberta-tiny", vocab_size=tok.vocab_size, pad_token_id=tok.pad_id,
                          max_position_embeddings=16)
    assert cfg.usable_positions == 16 < cfg.max_position_embeddings
    model_dir = tmp_path / "rob"
    nanobert.Bert(cfg, "mlm").save_pretrained(model_dir, tokenizer=tok)
    long_text = " ".join(WORDS * 5)
    assert main(["attention", "--model", str(model_dir), "--text", long_text, "--max-length",
                 "1000", "--out", str(tmp_path / "a.png")]) == 0
    assert "16 tokens" in capsys.readouterr().out
    model, loaded = nanobert.load(model_dir)
    assert loaded.model_max_length == 16
    wide = loaded.with_max_length(1000)                        # a tokenizer that reads on
    assert sentence_vectors(model, wide, [long_text, "a"], kind="mean", max_length=None).shape \
        == (2, cfg.hidden_size)
    assert Encoder(model, wide, max_length=1000).encode(long_text).shape == (cfg.hidden_size,)



def test_maps_too_small_to_name_tokens_carry_no_tick_marks(tmp_path, monkeypatch, capsys):
    """72 maps of 128 tokens set 128 unlabelled ticks per axis per map: 60 s of a
    one-minute plot went into tick marks nobody sees. Labelled maps keep one per token."""
    from nanobert import inspection
    seen = []
    monkeypatch.setattr(inspection, "_save", lambda fig, out: seen.append(fig))
    rng = np.random.default_rng(0)
    for T, layers, heads in ((128, range(6), range(12)), (6, [0], [0])):
        probs = rng.random((6, 12, T, T)).astype(np.float32)
        inspection.plot_attention([f"t{i}" for i in range(T)], probs, layers, heads,
                                  tmp_path / "a.png")
    big, small = seen
    assert all(not ax.get_xticks().size and not ax.get_yticks().size
               for ax in big.axes if ax.get_title().startswith("Layer"))
    assert "leave no room to name each token" in capsys.readouterr().err
    assert [t.get_text() for t in small.axes[0].get_xticklabels()] == [f"t{i}" for i in range(6)]


def test_tsne_refuses_an_unknown_label_name_before_embedding(tiny_dir, labelled_tsv, tmp_path,
                                                             capsys, monkeypatch):
    """--label-names naming a label the data lacks was refused only after the sample was
    embedded (14 s on minilm); now before any embedding."""
    import nanobert.inspection as I
    embedded = []
    monkeypatch.setattr(I, "sentence_vectors", lambda *a, **k: embedded.append(1))
    out = tmp_path / "t.png"
    assert main(["tsne", "--model", str(tiny_dir), "--data", str(labelled_tsv), "--out",
                 str(out), "--n", "10", "--label-names", "0=neg,7=other"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("nanobert: error: --label-names: label '7' is not in the data"), err
    assert embedded == [] and not out.exists()


def test_attention_maps_check_max_length(tiny_dir):
    """max_length=0 meant the default and '5' was a TypeError from a comparison."""
    from nanobert.inspection import attention_maps
    model, tok = nanobert.load(tiny_dir)
    for bad in (0, 3):
        with pytest.raises(NanobertError, match=f"max_length: got {bad}, expected an integer >= 4"):
            attention_maps(model, tok, "hello world", max_length=bad)
    with pytest.raises(TypeError, match="max_length must be"):
        attention_maps(model, tok, "hello world", max_length="5")


def test_tsne_tells_twelve_labels_apart_and_lists_them_in_reading_order(tmp_path,
                                                                         monkeypatch):
    """Past 10 labels the colours repeated (label 0 and label 10 both blue), and the
    legend read 0, 10, 11, 1, 2, ..."""
    import matplotlib.axes
    from nanobert.inspection import plot_tsne
    seen = []
    real = matplotlib.axes.Axes.scatter
    monkeypatch.setattr(matplotlib.axes.Axes, "scatter", lambda self, *a, **k: seen.append(
        (k["label"].split(" ")[0], k["color"], k["marker"])) or real(self, *a, **k))
    labels = [f"class_{i % 12}" for i in range(48)]
    plot_tsne(np.random.default_rng(0).normal(size=(48, 2)), labels, tmp_path / "t.png")
    assert [s[0] for s in seen] == [f"class_{i}" for i in range(12)]
    assert len({(c, m) for _, c, m in seen}) == 12 and len({c for _, c, _ in seen}) == 12
    seen.clear()
    plot_tsne(np.zeros((50, 2)) + np.arange(50)[:, None], [str(i) for i in range(25)] * 2,
              tmp_path / "u.png")
    assert [s[0] for s in seen] == [str(i) for i in range(25)]
    assert len({(c, m) for _, c, m in seen}) == 25


def test_attention_maps_names_a_text_that_is_no_string():
    """attention_maps(model, tok, None) said 'texts[0] must be a string' (api4)."""
    import nanobert
    from nanobert.inspection import attention_maps
    model = nanobert.Bert(nanobert.preset("tiny", vocab_size=100))
    tok = nanobert.Tokenizer.train(["a b c"] * 5, vocab_size=40)
    for args, says in (((None,), r"text\): one string, got NoneType"),
                       ((["a"],), r"text\): one string, got list"),
                       (("a", 5), r"pair\): one string, got int")):
        with pytest.raises(TypeError, match=r"^attention_maps\(" + says):
            attention_maps(model, tok, *args)
