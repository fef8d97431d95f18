"""Bi-encoder losses against reference formulas, gradient caching against one big
batch, and the sentence-transformers / transformers round trips."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import counted_chunks
import nanobert
from nanobert import biencoder as E
from nanobert import retrieval as R
from nanobert.data import Beir, TextRow
from nanobert.files import NanobertError
from test_finetune import tiny_dir  # noqa: F401  (a small random BERT)


@pytest.fixture(autouse=True)
def _threads(one_thread):
    yield


def test_mnrl_matches_the_formula():
    g = torch.Generator().manual_seed(0)
    a, p, n = (torch.randn(3, 5, generator=g) for _ in range(3))
    cands = torch.cat([p, n])
    loss = E.mnrl_loss(a, cands, scale=20.0)
    ref = 0.0
    for i in range(3):
        sims = [20.0 * F.cosine_similarity(a[i], c, dim=0).item() for c in cands]
        ref += -(sims[i] - math.log(sum(math.exp(s) for s in sims)))
    assert loss.item() == pytest.approx(ref / 3, rel=1e-5)


def test_cosent_matches_the_formula():
    g = torch.Generator().manual_seed(1)
    u, v = torch.randn(4, 6, generator=g), torch.randn(4, 6, generator=g)
    scores = torch.tensor([1.0, 3.0, 3.0, 0.5])
    cos = [F.cosine_similarity(u[i], v[i], dim=0).item() for i in range(4)]
    total = 1.0
    for i in range(4):
        for j in range(4):
            if scores[i] > scores[j]:
                total += math.exp(20.0 * (cos[j] - cos[i]))
    assert E.cosent_loss(u, v, scores).item() == pytest.approx(math.log(total), rel=1e-5)
    # equal scores only: no ordered pair, log(1) = 0
    assert E.cosent_loss(u, v, torch.ones(4)).item() == 0.0


def test_cosine_mse():
    u = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    v = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    assert E.cosine_mse_loss(u, v, torch.tensor([1.0, 1.0])).item() == pytest.approx(0.5)


def _tiny(tiny_config, dropout=0.0):
    tiny_config.hidden_dropout_prob = tiny_config.attention_probs_dropout_prob = dropout
    torch.manual_seed(0)
    return nanobert.Bert(tiny_config, None)


def _grads(model, loss_fn, batch, seed=0):
    model.zero_grad()
    torch.manual_seed(seed)
    loss_fn(model, batch).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _pair_batch(B=8, T=10, seed=0):
    from conftest import random_batch
    a, b = random_batch(B, T, seed=seed), random_batch(B, T, seed=seed + 1)
    return {"input_ids": a["input_ids"], "attention_mask": a["attention_mask"],
            "rest_input_ids": b["input_ids"], "rest_attention_mask": b["attention_mask"],
            "scores": torch.linspace(0, 5, B)}


@pytest.mark.parametrize("kind", ["mnrl", "cosent"])
def test_gradient_cache_equals_one_big_batch(tiny_config, kind):
    model = _tiny(tiny_config)
    batch = _pair_batch()
    big = _grads(model, E.embed_loss_fn(E.EmbedLoss(kind)), batch)
    cached = _grads(model, E.embed_loss_fn(E.EmbedLoss(kind, mini_batch=3)), batch)
    assert big.keys() == cached.keys() and len(big) > 10
    for n in big:
        torch.testing.assert_close(cached[n], big[n], atol=1e-6, rtol=1e-4, msg=n)
    # plain accumulation (each micro-batch its own loss) would give other gradients
    half = {k: v[:4] if k != "rest_input_ids" and k != "rest_attention_mask" else v[:4]
            for k, v in batch.items()}
    small = _grads(model, E.embed_loss_fn(E.EmbedLoss(kind)), half)
    assert any(not torch.allclose(small[n], big[n], atol=1e-4) for n in big)


def test_gradient_cache_replays_dropout(tiny_config):
    """With dropout on, the re-run of each mini-batch uses the masks of its first run:
    the gradients equal those of embedding the mini-batches one after another."""
    model = _tiny(tiny_config, dropout=0.3).train()
    batch = _pair_batch()
    spec = E.EmbedLoss("mnrl", mini_batch=4)
    cached = _grads(model, E.embed_loss_fn(spec), batch, seed=7)

    def sequential(m, b):
        ids = torch.cat([b["input_ids"], b["rest_input_ids"]])
        mask = torch.cat([b["attention_mask"], b["rest_attention_mask"]])
        vecs = torch.cat([E.sentence_vectors(m, ids[i:i + 4], mask[i:i + 4])
                          for i in range(0, 16, 4)])
        return E.mnrl_loss(vecs[:8], vecs[8:])
    ref = _grads(model, sequential, batch, seed=7)
    for n in ref:
        torch.testing.assert_close(cached[n], ref[n], atol=1e-6, rtol=1e-4, msg=n)


def test_row_batches_and_loss_choice(minilm):
    _, tok = minilm
    rows = [TextRow((f"anchor {i}", f"positive number {i}", "neg")) for i in range(5)]
    assert E.loss_for_rows(rows) == "mnrl"
    plan = lambda lengths, epoch: [[4, 0], [1, 3], [2]] if epoch == 0 else [[0, 1, 2, 3, 4]]  # noqa: E731
    features = E.RowBatches(tok, rows, 16)
    batches, steps = features.batches(plan)
    got = list(batches(0))
    assert len(features) == 5 and steps == 3 and len(got) == 3 and len(list(batches(1))) == 1
    b = got[0]
    assert b["input_ids"].shape[0] == 2 and b["rest_input_ids"].shape[0] == 4
    assert b["input_ids"].shape[1] == b["rest_input_ids"].shape[1]
    assert tok.decode(b["input_ids"][0]) == "anchor 4" and tok.decode(b["rest_input_ids"][0]) == "positive number 4"
    assert list(batches(0, 2))[0]["input_ids"].tolist() == got[2]["input_ids"].tolist()
    scored = [TextRow(("a", "b"), 4.0), TextRow(("c", "d"), 2.0)]
    assert E.loss_for_rows(scored) == "cosent"
    assert E.scaled_scores(scored, "cosine_mse") == [1.0, 0.5]
    with pytest.raises(NanobertError, match="single texts"):
        E.loss_for_rows([TextRow(("a",))])
    with pytest.raises(NanobertError, match="unknown loss"):
        E.EmbedLoss("triplet")


@pytest.mark.parametrize("cross", [False, True])
def test_training_rows_are_held_as_token_ids_a_chunk_at_a_time(minilm, monkeypatch, capsys,
                                                               cross):
    """RowBatches kept a tokenizers Encoding per text (ids, tokens, offsets, masks): 6.6 kB
    a pair row, 3.45 GB for 400,000 pairs. It keeps flat token ids and types, tokenized
    tokenizer.CHUNK_CHARS at a time: the same batches as padding the encodings, and a
    truncation note per column that names it, counting every chunk."""
    import nanobert.tokenizer as T
    _, tok = minilm
    rows = [TextRow((f"who is {'the very long ' * (i % 5)}anchor {i}",
                     f"the {'second ' * (i % 11)}text {i}")) for i in range(40)]
    scores = [float(i % 3) for i in range(40)] if cross else None
    whole = E.RowBatches(tok, rows, 12, scores, cross=cross)
    notes = capsys.readouterr().err
    what = "training pairs" if cross else "training anchors"
    assert f"of 40 {what} are longer than 12 tokens" in notes
    assert cross or "of 40 training positives are longer" in notes
    monkeypatch.setattr(T, "CHUNK_CHARS", 200)
    tok.__dict__.pop("_notes", None)
    calls, real = [], T.Tokenizer.encode_batch
    monkeypatch.setattr(T.Tokenizer, "encode_batch", lambda self, texts, *a, **k:
                        calls.append(len(texts)) or real(self, texts, *a, **k))
    chunked = E.RowBatches(tok, rows, 12, scores, cross=cross)
    assert len(calls) > 6 and max(calls) < len(rows)
    monkeypatch.undo()
    assert capsys.readouterr().err == notes
    firsts = [(r.texts[0], r.texts[1]) if cross else r.texts[0] for r in rows]
    encs = [tok.encode_batch([a for a, _ in firsts], [b for _, b in firsts], max_length=12)
            if cross else tok.encode_batch(firsts, max_length=12)]
    if not cross:
        encs.append(tok.encode_batch([r.texts[1] for r in rows], max_length=12))
    assert chunked.lengths == whole.lengths == [max(len(c[i].ids) for c in encs)
                                                for i in range(40)]
    idx = [3, 17, 0, 39, 22]
    want = tok.pad([c[i] for c in encs for i in idx])
    got = chunked.collate(idx)
    B = len(idx)
    assert got["input_ids"].tolist() == want["input_ids"][:B].tolist()
    assert got["token_type_ids"].tolist() == want["token_type_ids"][:B].tolist()
    assert (1 in got["token_type_ids"]) == cross
    if not cross:
        assert got["rest_input_ids"].tolist() == want["input_ids"][B:].tolist()


def test_rows_of_several_hard_negatives_name_each_negative_column(minilm, capsys):
    """A BEIR run mining 2 hard negatives gives rows of 4 texts: naming the columns for
    the truncation notes raised IndexError past the third."""
    _, tok = minilm
    rows = [TextRow((f"query {i}", "a relevant document " * 9, "one negative " * 9,
                     "another negative " * 9)) for i in range(6)]
    features = E.RowBatches(tok, rows, 12)
    assert len(features.cols) == 4 and len(features) == 6
    notes = capsys.readouterr().err
    for what in ("training positives", "training negatives #1", "training negatives #2"):
        assert f"6 of 6 {what} are longer than 12 tokens" in notes
    assert "anchors" not in notes
    assert features.collate([0, 1])["rest_input_ids"].shape[0] == 6


def test_mnrl_leaves_out_in_batch_candidates_relevant_to_the_anchor(minilm):
    """A query with two relevant documents (BEIR qrels; a triplet file's anchor with two
    positives) gives two rows: each row's positive had been a negative of the other row,
    pushing the query away from a relevant document. So had a positive repeated as
    another row's hard negative. Those candidates leave that anchor's softmax."""
    _, tok = minilm
    rows = [TextRow(("q", "relevant one", "other")), TextRow(("q", "relevant two", "x")),
            TextRow(("z", "zed", "relevant one"))]
    batch = E.RowBatches(tok, rows, 16).collate([0, 1, 2])
    # candidates: the positives (0, 1, 2), then the hard negatives (3, 4, 5)
    assert batch["exclude"].nonzero().tolist() == [[0, 1], [0, 5], [1, 0]]
    g = torch.Generator().manual_seed(0)
    a, c = torch.randn(3, 4, generator=g), torch.randn(6, 4, generator=g)
    logits = 20.0 * E.cosine_matrix(a, c)
    keep = [[0, 2, 3, 4], [1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 5]]
    ref = sum(-torch.log_softmax(logits[i, keep[i]], 0)[keep[i].index(i)] for i in range(3)) / 3
    loss = E.LOSSES["mnrl"][0](a, c, batch, 20.0)
    assert loss.item() == pytest.approx(ref.item(), rel=1e-5)
    plain = E.RowBatches(tok, [TextRow(("a", "b")), TextRow(("c", "d"))], 16).collate([0, 1])
    assert "exclude" not in plain


def test_reranking_rows_of_graded_qrels_keep_their_grades_and_each_negative_once():
    """A reranker on BEIR qrels trains on labels / max label: grades 2 and 1 had both
    been read 1, and each mined negative had been a row once per relevant document."""
    beir = Beir({"d1": ("", "one"), "d2": ("", "two"), "d3": ("", "three")},
                {"q1": "first"}, {"q1": {"d1": 2, "d2": 1}})
    labelled = E.beir_rows(beir, ["q1"], negatives={"q1": ["d3"]}, labelled=True)
    assert [(r.texts[1], r.score) for r in labelled] == [("one", 2.0), ("two", 1.0),
                                                         ("three", 0.0)]


def test_beir_rows_holdout_and_labels():
    beir = Beir({"d1": ("T", "one"), "d2": ("", "two"), "d3": ("", "three")},
                {"q1": "first", "q2": "second"}, {"q1": {"d1": 1, "d3": 0}, "q2": {"d2": 2}})
    rows = E.beir_rows(beir, ["q1", "q2"], negatives={"q1": ["d2"], "q2": ["d3"]})
    assert rows[0].texts == ("first", "T one", "two") and len(rows) == 2
    # every mined negative is a column of the row (--hard-negatives 2 trained on one)
    rows = E.beir_rows(beir, ["q1", "q2"], negatives={"q1": ["d2", "d3"], "q2": ["d3", "d1"]})
    assert [r.texts for r in rows] == [("first", "T one", "two", "three"),
                                       ("second", "two", "three", "T one")]
    assert E.loss_for_rows(rows) == "mnrl"
    rows = E.beir_rows(beir, ["q1", "q2"], negatives={"q1": ["d2", "d3"], "q2": ["d3"]})
    assert {len(r.texts) for r in rows} == {3}          # one width: the fewest any query has
    labelled = E.beir_rows(beir, ["q1"], negatives={"q1": ["d2", "d3"]}, labelled=True)
    assert [(r.texts[1], r.score) for r in labelled] == [("T one", 1.0), ("two", 0.0), ("three", 0.0)]
    train, held = E.query_split(beir, 0.5)
    assert sorted(train + held) == ["q1", "q2"]
    assert E.query_split(beir, 0.5) == (train, held)          # a function of the ids only
    share = np.mean([E.held_out(str(i), 0.2) for i in range(2000)])
    assert 0.17 < share < 0.23
    with pytest.raises(NanobertError, match="holdout"):
        E.query_split(beir, 1.0)
    # a holdout that leaves no training query, and training queries without a judged
    # document, name the folder (and the flag): "no (query, relevant document) pairs in
    # the training queries" named neither
    beir.root = "/data/beir"
    held_all = next(h for h in (0.9, 0.95, 0.99, 0.999) if not E.query_split(beir, h)[0])
    with pytest.raises(NanobertError, match=f"^/data/beir: --holdout {held_all:g} holds out all 2 "
                                            "judged queries: none is left to train on"):
        E.training_rows(None, beir, {"holdout": held_all}, labelled=False)
    with pytest.raises(NanobertError, match=r"^/data/beir: no \(query, relevant document\) pairs "
                                            "among the 1 training queries"):
        E.beir_rows(Beir(beir.corpus, beir.queries, {"q1": {"d9": 1}}, root="/data/beir"), ["q1"])


def test_more_hard_negatives_than_documents_is_noted(monkeypatch, capsys):
    """--hard-negatives 1000 on a corpus of 81 documents was accepted without a word."""
    beir = Beir({"d1": ("", "one"), "d2": ("", "two"), "d3": ("", "three")},
                {"q1": "first"}, {"q1": {"d1": 1}}, root="/data/beir")
    monkeypatch.setattr(E, "_start_encoder", lambda *a: None)
    monkeypatch.setattr(E, "mine_negatives", lambda enc, b, qs, n: {"q1": ["d2", "d3"]})
    rows = E.training_rows(None, beir, {"hard_negatives": 5, "model": "m", "max_length": 8},
                           labelled=True)
    assert [r.score for r in rows] == [1.0, 0.0, 0.0]
    assert capsys.readouterr().err == ("nanobert: note: --hard-negatives 5: /data/beir has 3 "
                                       "documents, so a query gets fewer (its unjudged ones)\n")
    E.training_rows(None, beir, {"hard_negatives": 2, "model": "m", "max_length": 8}, True)
    assert capsys.readouterr().err == ""
    # a reranker's default (3) is what its nanobert.json records, not the 0 it was given
    settings = {"hard_negatives": 0, "model": "m", "max_length": 8}
    E.training_rows(None, beir, settings, labelled=True)
    assert settings["hard_negatives"] == 3


def test_hard_negatives_are_mined_on_the_runs_device(monkeypatch):
    """Mining ignored --device: a `--device cpu` run mined with the GPU where there was one."""
    import nanobert.embed
    beir = Beir({"d1": ("", "one"), "d2": ("", "two"), "d3": ("", "three")},
                {"q1": "first"}, {"q1": {"d1": 1}}, root="/data/beir")
    made = []

    class Recorder:
        def __init__(self, name, max_length=None, device=None):
            made.append(device)
            self.encode = None
    monkeypatch.setattr(nanobert.embed, "Encoder", Recorder)
    monkeypatch.setattr(E, "mine_negatives", lambda enc, b, qs, n: {"q1": ["d2"]})
    for device, given in (("cpu", "cpu"), ("cuda:1", "cuda:1"), ("auto", None), (None, None)):
        settings = {"hard_negatives": 1, "model": "m", "max_length": 8}
        if device:
            settings["device"] = device
        E.training_rows(None, beir, settings, labelled=True)
        assert made[-1] == given


@pytest.mark.parametrize("labelled", [False, True])   # embed, rerank
def test_a_holdout_that_holds_out_no_query_is_refused_before_mining(monkeypatch, labelled):
    """--holdout 0.001 on a few queries held none out: training mined the hard negatives
    (minutes on a real corpus), trained, and was refused at its first evaluation."""
    beir = Beir({f"d{i}": ("", f"doc {i}") for i in range(4)}, {"q1": "first", "q2": "second"},
                {"q1": {"d1": 1}, "q2": {"d2": 1}}, root="/data/beir")
    assert not E.query_split(beir, 0.001)[1]

    def mining(*args):
        raise AssertionError("mined hard negatives")
    monkeypatch.setattr(E, "_start_encoder", mining)
    settings = {"holdout": 0.001, "hard_negatives": 2, "model": "m", "max_length": 8}
    with pytest.raises(NanobertError, match=r"^/data/beir: --holdout 0.001 holds out none of "
                                            r"its 2 judged queries \(a query is held out by a "
                                            r"hash of its id\); use a larger --holdout$"):
        E.training_rows(None, beir, settings, labelled)
    # the same words as evaluation's, and the count of queries a run uses
    with pytest.raises(NanobertError, match="holds out none of its 2 judged queries"):
        E.scored_queries(beir, settings)
    with pytest.raises(NanobertError, match="holds out none of its 2 judged queries"):
        E.queries_used(beir, settings, training=True)


def test_a_holdout_of_queries_with_nothing_relevant_is_refused():
    """Held-out queries judged only 0 scored every metric 0 (exit 0, no note), and
    training kept its first model; a folder with nothing relevant is refused so."""
    beir = Beir({f"d{i}": ("", f"doc {i}") for i in range(4)},
                {f"q{i}": f"query {i}" for i in range(40)},
                {f"q{i}": {"d1": 1} for i in range(40)}, root="/data/beir")
    held = E.query_split(beir, 0.3)[1]
    assert 0 < len(held) < 40
    E.holdout_split(beir, {"holdout": 0.3})                         # relevant ones: fine
    for q in held:
        beir.qrels[q] = {"d1": 0}
    with pytest.raises(NanobertError, match=rf"^/data/beir: --holdout 0.3 holds out {len(held)} "
                                            r"judged queries with no relevant document \(every "
                                            r"grade 0 or less\): every metric would be 0"):
        E.scored_queries(beir, {"holdout": 0.3})


def test_max_examples_on_a_beir_folder_take_a_seeded_subset_of_its_queries():
    """--max-train-examples / --max-dev-examples on a BEIR folder crashed ("'Beir' object
    is not subscriptable"); they now take n of the queries the run would use: of the
    training queries (after --holdout and --split), and of the scored ones."""
    from nanobert.finetune import select_examples
    beir = Beir({f"d{i}": ("", f"doc {i}") for i in range(4)},
                {f"q{i}": f"query {i}" for i in range(40)},
                {f"q{i}": {f"d{i % 4}": 1} for i in range(40)}, root="/data/beir")
    settings = {"holdout": 0.3, "hard_negatives": 0, "model": "m", "max_length": 8}
    train_q, held = E.query_split(beir, 0.3)
    train = select_examples(beir, 5, seed=3)
    assert train is not beir and train.sample == (5, 3) and beir.sample is None
    rows = E.training_rows(None, train, dict(settings), labelled=False)
    queries = [r.texts[0] for r in rows]
    assert len(rows) == 5 and set(queries) <= {beir.queries[q] for q in train_q}
    again = E.training_rows(None, select_examples(beir, 5, seed=3), dict(settings), False)
    assert [r.texts for r in again] == [r.texts for r in rows]          # seeded
    other = E.training_rows(None, select_examples(beir, 5, seed=4), dict(settings), False)
    assert [r.texts for r in other] != [r.texts for r in rows]
    assert E.queries_used(train, settings, training=True) == 5
    dev = select_examples(beir, 2, seed=3)
    scored = E.scored_queries(dev, settings)
    assert len(scored) == 2 and set(scored) <= set(held)
    assert E.queries_used(dev, settings, training=False) == 2
    assert len(E.scored_queries(dev, {})) == 2                          # no holdout: of all
    assert E.scored_queries(beir, {}) is None                           # no sample: all
    assert select_examples(beir, 99, seed=3).sampled(train_q) == train_q   # n over: all


def test_sentence_transformers_loads_our_layout(minilm, tmp_path):
    import sentence_transformers as st
    from nanobert.embed import encode
    model, tok = minilm
    out = tmp_path / "st"
    E.save_embedding_model(model, tok, out, pooling="mean", max_seq_length=128)
    texts = ["A man is eating food.", "A plane is taking off.", "short", "x " * 200]
    ours = encode(nanobert.load(out, head=None)[0], tok, texts)
    theirs = st.SentenceTransformer(str(out), device="cpu").encode(texts, convert_to_numpy=True)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)
    cls = tmp_path / "cls"
    E.save_embedding_model(model, tok, cls, pooling="cls", max_seq_length=64, normalize=False)
    ours = encode(nanobert.load(cls, head=None)[0], tok, texts, normalize=False)
    theirs = st.SentenceTransformer(str(cls), device="cpu").encode(texts, convert_to_numpy=True)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)


def test_reranker_loads_in_transformers(minilm_dir, tmp_path):
    import transformers
    from nanobert.checkpoint import save_model
    model, tok = nanobert.load(minilm_dir, head="regression")
    torch.manual_seed(0)
    torch.nn.init.normal_(model.classifier.weight, std=0.1)
    save_model(model.eval(), tmp_path / "ce", tokenizer=tok)
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "ce").eval()
    batch = tok(["what is a plane?", "who eats?"], ["A plane is taking off.", "A man eats."])
    with torch.no_grad():
        ours = model(**batch).logits
        theirs = hf(**batch).logits
    assert ours.shape == theirs.shape == (2, 1)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("pairs", [True, False])
def test_regression_rows_are_held_as_token_ids_and_a_cut_is_said(minilm, capsys, pairs):
    """regress_features kept a dict of lists a row (287,000 STS-B pairs: 2.62 GB) and
    cut long rows without a word. It keeps token ids (FeatureRows) with the same
    features, and says what max_length cut."""
    from nanobert.batching import FeatureRows
    _, tok = minilm
    rows = [TextRow((f"a cat {'sits ' * (i % 9)}here",) + ((f"one cat {i}",) if pairs else ()),
                    float(i % 5)) for i in range(30)]
    got = E.regress_features(tok, rows, {"max_length": 10})
    note = capsys.readouterr().err
    assert isinstance(got, FeatureRows) and len(got) == 30
    first = [r.texts[0] for r in rows]
    encs = tok.encode_batch(first, [r.texts[1] for r in rows] if pairs else None, max_length=10)
    assert [got[i] for i in range(30)] == [
        {"input_ids": e.ids, "token_type_ids": e.type_ids, "labels": r.score}
        for e, r in zip(encs, rows)]
    assert f"of 30 training {'pairs' if pairs else 'texts'} are longer than 10 tokens" in note


def test_score_predict_yields_a_chunk_before_reading_the_next(minilm_dir, monkeypatch):
    """A reranker's or regression model's `predict` printed nothing until every pair was
    scored; each chunk's scores now come before the next chunk is tokenized, equal to
    pair_scores'."""
    model, tok = nanobert.load(minilm_dir, head="regression")
    rows = [E.text_input(i, (f"query {i}", "a document " * (i % 5 + 1))) for i in range(13)]
    encoded = counted_chunks(monkeypatch, tok, 4)
    results = E.score_predict(model.eval(), tok, rows, {"max_length": 16}, 3)
    first = next(results)
    assert (first["text"], first["pair"]) == rows[0].texts and len(encoded) == 1
    got = [first] + list(results)
    want = R.pair_scores(model, tok, [r.texts for r in rows], 16, 3)
    assert [r["score"] for r in got] == pytest.approx(want, abs=1e-6)
    assert [r["pair"] for r in got] == [r.texts[1] for r in rows]


def test_embed_predict_yields_a_chunk_before_embedding_the_next(minilm_dir, monkeypatch):
    """`predict` on a bi-encoder printed nothing until every text was embedded (a million
    texts: 1.5 GB of vectors first); each chunk's vectors and cosines now come before the
    next chunk is tokenized, equal to encode's on all the texts."""
    import nanobert.tokenizer as T
    from nanobert.embed import encode
    model, tok = nanobert.load(minilm_dir, head=None)
    texts = [f"text number {i} " + "word " * (i % 7) for i in range(20)]
    monkeypatch.setattr(T, "CHUNK_CHARS", 60)
    encoded = counted_chunks(monkeypatch, tok, 1000)
    results = E.embed_predict(model.eval(), tok, [E.text_input(i, t) for i, t in
                                                  enumerate(texts)], {}, 4)
    first = next(results)
    assert first["text"] == texts[0] and len(encoded) == 1
    got = np.array([first["embedding"]] + [r["embedding"] for r in results])
    assert len(encoded) > 3 and np.abs(got - encode(model, tok, texts)).max() < 2e-6
    pairs = [E.text_input(i, (t, texts[-1 - i])) for i, t in enumerate(texts)]
    cosines = [r["cosine"] for r in E.embed_predict(model, tok, pairs, {}, 4)]
    a, b = encode(model, tok, texts), encode(model, tok, texts[::-1])
    assert cosines == pytest.approx((a * b).sum(-1).tolist(), abs=2e-6)


def test_task_functions_regression_and_rerank(minilm_dir, tmp_path):
    model, tok = nanobert.load(minilm_dir, head="regression")
    rows = [TextRow(("a cat sits", "a cat is sitting"), 4.5, 1), TextRow(("a cat", "stocks fell"), 0.2, 2),
            TextRow(("he runs", "he is running"), 4.0, 3)]
    items = E.regress_features(tok, rows, {"max_length": 16})
    assert items[0]["labels"] == 4.5 and items[0]["token_type_ids"][-1] == 1
    m = E.regress_evaluate(model, tok, rows, {"max_length": 16})
    assert set(m) == {"pearson", "spearman", "mse"} and -1 <= m["spearman"] <= 1
    out = list(E.score_predict(model, tok, [E.text_input(0, ("a", "b")), E.text_input(1, "c")],
                               {"max_length": 16}))
    assert out[0]["pair"] == "b" and "pair" not in out[1] and isinstance(out[1]["score"], float)
    assert E.score_show(out[0]).endswith("\ta\tb")
    with pytest.raises(NanobertError, match="input 2"):
        E.text_input(2, ["a", "b", "c"])
    # a reranker that scores by the regression head: per-query ranking metrics
    labelled = [TextRow(("q", "relevant text"), 1.0), TextRow(("q", "other"), 0.0),
                TextRow(("r", "x"), 1.0)]
    m = E.rerank_evaluate(model, tok, labelled, {"max_length": 16})
    assert 0 <= m["ndcg_at_10"] <= 1 and m["recall_at_100"] == 1.0
    lines = tmp_path / "in.txt"
    lines.write_text("first text\nsecond\n")
    assert [r.texts for r in E.text_rows_input(lines)] == [("first text",), ("second",)]


def test_embed_evaluate_sts_and_pairs(minilm):
    model, tok = minilm
    sts = [TextRow(("A man is eating food.", "A man eats something."), 4.2),
           TextRow(("A man is eating food.", "The stock market fell."), 0.1),
           TextRow(("A plane takes off.", "An airplane is taking off."), 4.9)]
    m = E.embed_evaluate(model, tok, sts, {})
    assert m["spearman"] == pytest.approx(1.0) and E.embed_metric(sts) == "spearman"
    pairs = [TextRow(("what do cats eat", "Cats eat fish and meat.")),
             TextRow(("when did the plane leave", "The plane took off at noon."))]
    m = E.embed_evaluate(model, tok, pairs, {})
    assert m["mrr_at_10"] == 1.0 and E.embed_metric(pairs) == "ndcg_at_10"


def test_pairs_of_one_anchor_are_one_query_with_every_positive_relevant():
    """Rows (q, p1), (q, p2) had been two queries of one relevant document each: a model
    that ranks p1 and p2 first scored nDCG@10 below 1 (the other positive a miss)."""
    rows = [TextRow(("q", "p1")), TextRow(("q", "p2")), TextRow(("r", "p3", "n"))]
    beir = E.rows_as_beir(rows)
    assert beir.qrels == {"q0": {"p1": 1, "p2": 1}, "q1": {"p3": 1}}
    assert set(beir.corpus) == {"p1", "p2", "p3", "n"}
    def encode(texts):   # q and its positives alike, r and p3 alike, n elsewhere
        where = {"q": 0, "p1": 0, "p2": 0, "r": 1, "p3": 1, "n": 2}
        return np.eye(3, dtype=np.float32)[[where[t] for t in texts]]
    assert E.R.evaluate_beir(encode, beir)["ndcg_at_10"] == pytest.approx(1.0)
    # reranked: the retriever's own nDCG@10 beside the reranker's, what it is to beat (it
    # was not said); a reranker putting "n" first does worse than the retriever
    def rerank(pairs):
        return [1.0 if d == "n" else 0.0 for _, d in pairs]
    got = E.R.evaluate_beir(encode, beir, rerank=rerank)
    assert got["retriever_ndcg_at_10"] == pytest.approx(1.0) and got["ndcg_at_10"] < 0.9


def test_a_saved_holdout_applies_to_the_training_folder_only(tmp_path, capsys):
    """A model trained with --holdout on one BEIR folder, evaluated on another, had been
    scored on that other folder's hash-held-out queries alone, silently."""
    docs = {f"d{i}": ("", f"doc {i}") for i in range(40)}
    train = Beir(docs, {f"q{i}": f"query {i}" for i in range(40)},
                 {f"q{i}": {f"d{i}": 1} for i in range(40)}, "test", tmp_path)
    (tmp_path / "qrels").mkdir()
    other = Beir(docs, {f"x{i}": f"query {i}" for i in range(40)},
                 {f"x{i}": {f"d{i}": 1} for i in range(40)}, "test")
    settings = {"holdout": 0.5, "hard_negatives": 0, "model": "minilm", "max_length": 16}
    rows = E.training_rows(None, train, settings, labelled=False)
    assert settings["holdout_of"] == E.queries_fingerprint(train)   # saved in nanobert.json
    held = E.scored_queries(train, settings)
    assert held and len(rows) + len(held) == 40
    assert E.scored_queries(other, settings) is None                  # every query scored
    assert "not the folder the model was trained on" in capsys.readouterr().err
    assert E.scored_queries(other, {**settings, "holdout_of": None})  # --holdout given


def test_evaluation_scores_that_never_vary_are_refused_before_training(tmp_path):
    # the correlations of a dev file scored all 1.0 failed at the first evaluation, after
    # training, naming no file
    from nanobert.biencoder import read_scored, scores_vary_check
    from nanobert.finetune import get_task
    dev = tmp_path / "dev.tsv"
    dev.write_text("sentence1\tsentence2\tscore\na\tb\t1\nc\td\t1.0\n")
    with pytest.raises(NanobertError, match=f"{dev}: every score is 1: the correlations"):
        scores_vary_check(read_scored(dev), None, dev)
    dev.write_text("anchor\tpositive\nq\td\n")
    scores_vary_check(read_scored(dev, require=False), None, dev)   # pairs: no score
    assert get_task("regress").check is get_task("embed").check is scores_vary_check


def test_training_data_whose_scores_never_vary_is_refused(tmp_path):
    """Scored pairs for an embedding model (a CoSENT loss of 0 at every step) and a
    reranker's rows all graded alike trained nothing, and said so nowhere."""
    f = tmp_path / "t.tsv"
    f.write_text("sentence1\tsentence2\tscore\na\tb\t1\nc\td\t1\ne\tf\t1\n")
    with pytest.raises(NanobertError, match=f"{f}: every score is 1: training compares pairs by their scores"):
        E.read_embed_data(f)
    f.write_text("sentence1\tsentence2\tscore\na\tb\t-1\nc\td\t-1.0\n")   # glue/stsb's test
    with pytest.raises(NanobertError, match=f"{f}: every score is -1, the datasets library's "
                                            "mark of a split without labels"):
        E.read_embed_data(f)
    f.write_text("query\tdocument\tlabel\nq\ta\t1\nq\tb\t1\n")
    with pytest.raises(NanobertError, match=f"{f}: every label is 1: nothing tells"):
        E.read_rerank_data(f)
    f.write_text("query\tdocument\tlabel\nq\ta\t1\nq\tb\t0\n")
    assert len(E.read_rerank_data(f)) == 2
    f.write_text("anchor\tpositive\nq\td\nr\te\n")      # (anchor, positive): no scores
    assert len(E.read_embed_data(f)) == 2
    # a regression training file of one score trained a constant (it was accepted)
    f.write_text("sentence1\tsentence2\tscore\na\tb\t3\nc\td\t3\n")
    with pytest.raises(NanobertError, match=f"{f}: every score is 3: the correlations .* and a "
                                            "regression model learns nothing from one target"):
        E.read_scored(f)
    assert len(E.read_scored(f, require=False)) == 2       # (inputs to predict)


@pytest.mark.parametrize("label", ["positive", "1"])
def test_single_texts_are_refused_as_such_by_pair_models(tmp_path, label):
    """A classification file (text, label) given to a bi-encoder or a reranker is named as
    single texts, whatever its labels: with word labels it was "score 'positive' is not
    a finite number", the label column read as a score before the shape was checked."""
    f = tmp_path / "single.csv"
    f.write_text(f"text,label\ngood movie,{label}\nbad movie,{label}x\n")
    with pytest.raises(NanobertError, match=f"{f}:2: a bi-encoder needs pairs .* found single texts"):
        E.read_embed_data(f)
    with pytest.raises(NanobertError, match=f"{f}:2: a reranker needs .* found single texts"):
        E.read_rerank_data(f)


def test_a_word_label_in_a_reranking_table_is_named_as_not_a_grade(tmp_path):
    """A word in a reranking table's label column was described as a similarity file's
    fault ("(an NLI or classification file?), not similarity scores")."""
    f = tmp_path / "r.tsv"
    f.write_text("query\tdocument\tlabel\nq1\td1\t1\nq1\td2\trelevant\n")
    with pytest.raises(NanobertError, match=f"{f}:3: score 'relevant' is not a finite number: "
                       r"the 'label' column holds class labels, not relevance grades") as err:
        E.read_rerank_data(f)
    assert "similarity" not in str(err.value)


def test_reranking_dev_rows_must_rank_something(tmp_path, capsys, monkeypatch):
    """STS pairs as reranking data: each pair its own query with one document, so every
    evaluation scored nDCG 1.0 and the first was kept as the best."""
    from nanobert.finetune import get_task
    check = get_task("rerank").check
    f = tmp_path / "d.tsv"
    f.write_text("query\tdocument\tlabel\nq1\ta\t1\nq2\tb\t0\nq3\tc\t1\nq3\td\t1\n")
    with pytest.raises(NanobertError, match=f"^{f}: no query has documents of two relevance "
                                            r"grades \(3 queries, 4 rows\): every ranking would "
                                            "score 1.0"):
        check(E.read_rerank_data(f), None, f)
    f.write_text("query\tdocument\tlabel\nq1\ta\t1\nq2\tb\t0\nq2\tc\t0.5\n")
    check(E.read_rerank_data(f), None, f)          # q2 has a relevant and an irrelevant one
    assert capsys.readouterr().err == (f"nanobert: note: {f}: 1 of 2 queries have documents of "
                                       "one relevance grade only (nothing to rank): the metrics "
                                       "are over the other 1\n")
    # ... and only q2 is scored: q1's one document is first whatever the model gives it
    seen = []

    def scores(model, tok, pairs, *a):
        seen.extend(pairs)
        return [0.1 * i for i in range(len(pairs))]     # c above b: q2 in the right order
    monkeypatch.setattr(E.R, "pair_scores", scores)
    got = E.rerank_evaluate(None, None, E.read_rerank_data(f), {"max_length": 16})
    assert seen == [("q2", "b"), ("q2", "c")] and got["ndcg_at_10"] == pytest.approx(1.0)
    # a pair listed twice with other labels: the last counts, said (as qrels say it); the
    # metric had depended on the rows' order (badinputs3)
    capsys.readouterr()
    f.write_text("query\tdocument\tlabel\nq2\tb\t1\nq2\tc\t0.5\nq2\tb\t0\n")
    seen.clear()
    got = E.rerank_evaluate(None, None, E.read_rerank_data(f), {"max_length": 16})
    assert seen == [("q2", "b"), ("q2", "c")] and got["ndcg_at_10"] == pytest.approx(1.0)
    assert capsys.readouterr().err == (f"nanobert: note: {f}: 1 (query, document) pair(s) "
                                       "judged twice with different grades (e.g. 'q2', 'b' on "
                                       "lines 2 and 4); the last grade counts\n")
    f.write_text("query\tdocument\tlabel\nq1\ta\t2\nq1\tb\t3\n")
    check(E.read_rerank_data(f), None, f)          # grades 2 and 3


def test_reranking_rows_keep_soft_labels_and_rank_ties_in_file_order(tmp_path, monkeypatch):
    """Row labels are nDCG's gains as they are: soft labels (0.9, 0.5, 0.1) had all been
    read 1 and refused as "every ranking would score 1.0", and 4.8 and 4.1 had been one
    grade. Tied scores rank in file order: with ids d9, d10 the string order had ranked
    row 10 above row 9, so the metrics changed when the rows were reordered."""
    from sklearn.metrics import ndcg_score
    from nanobert.finetune import get_task
    f = tmp_path / "soft.tsv"
    f.write_text("query\tdocument\tlabel\nv\ta\t0.9\nv\tb\t0.5\nv\tc\t0.1\n")
    get_task("rerank").check(E.read_rerank_data(f), None, f)           # not refused
    given = [0.2, 0.7, 0.1]                                               # b, a, c
    monkeypatch.setattr(E.R, "pair_scores", lambda model, tok, pairs, *a: given[:len(pairs)])
    got = E.rerank_evaluate(None, None, E.read_rerank_data(f), {"max_length": 16})
    assert got["ndcg_at_10"] == pytest.approx(ndcg_score([[0.9, 0.5, 0.1]], [given], k=10))
    f.write_text("query\tdocument\tlabel\nv\ta\t4.8\nv\tb\t4.1\nv\tc\t0\n")
    got = E.rerank_evaluate(None, None, E.read_rerank_data(f), {"max_length": 16})
    assert got["ndcg_at_10"] == pytest.approx(ndcg_score([[4.8, 4.1, 0]], [given], k=10))
    assert E.relevance_grade(2.0) == 2 and E.relevance_grade(-1) == 0
    # eleven rows, the last two tied: the earlier row ranks first, whichever it is
    rows = "".join(f"q\tdoc {i}\t0\n" for i in range(9))
    for relevant_first, want in ((True, 1.0), (False, 0.5)):
        tied = ("q\tyes\t1\nq\tno\t0\n" if relevant_first else "q\tno\t0\nq\tyes\t1\n")
        f.write_text("query\tdocument\tlabel\n" + rows + tied)
        monkeypatch.setattr(E.R, "pair_scores",
                            lambda model, tok, pairs, *a: [0.0] * 9 + [1.0, 1.0])
        got = E.rerank_evaluate(None, None, E.read_rerank_data(f), {"max_length": 16})
        assert got["mrr_at_10"] == want
    assert [E.row_id(i, 11) for i in (0, 9, 10)] == ["d10", "d01", "d00"]


def test_pair_scores_say_what_max_length_cut(minilm_dir, capsys):
    """evaluate of a regression model or a reranker, and search --rerank, cut pairs at
    the model's length without a word (classify and embed evaluation said it)."""
    model, tok = nanobert.load(minilm_dir, head="regression")
    long = " ".join(["word"] * 40)
    E.R.pair_scores(model, tok, [("short", "pair"), (long, long)], 16)
    err = capsys.readouterr().err
    assert "1 of 2 pairs is longer than 16 tokens and was cut" in err
    E.R.pair_scores(model, tok, [(long, None)], 16)                  # once per tokenizer
    assert capsys.readouterr().err == ""


def test_mnrl_with_one_row_a_batch_is_refused(tiny_dir, tmp_path, capsys):
    """--batch-size 1 (or a single training row) on (anchor, positive) pairs: MNRL's
    negatives are the batch's other rows, so the loss was 0 at every step and the run
    reported success. A hard negative per row gives each row its own negative."""
    from nanobert.cli import main
    model = tiny_dir
    pairs = tmp_path / "p.tsv"
    pairs.write_text("anchor\tpositive\nthe cat\ta cat\nthe dog\ta dog\nthe bird\ta bird\n")
    one = tmp_path / "one.tsv"
    one.write_text("anchor\tpositive\nthe cat\ta cat\n")
    for train, flags, why in ((pairs, ["--batch-size", "1"], "--batch-size 1: "),
                              (one, [], f"{one} has one training row: ")):
        out = tmp_path / "out"
        rc = main(["finetune", "--task", "embed", "--model", str(model), "--train", str(train),
                   "--dev", str(pairs), "--out", str(out), "--epochs", "1", "--max-length", "32",
                   *flags])
        err = capsys.readouterr().err
        assert rc == 2 and err.startswith(f"nanobert: error: {why}the mnrl loss"), err
        assert not out.exists()
    triplets = tmp_path / "t.tsv"
    triplets.write_text("anchor\tpositive\tnegative\nthe cat\ta cat\ta dog\n"
                        "the dog\ta dog\ta bird\n")
    assert main(["finetune", "--task", "embed", "--model", str(model), "--train", str(triplets),
                 "--dev", str(pairs), "--out", str(tmp_path / "ok"), "--epochs", "1",
                 "--max-length", "32", "--batch-size", "1"]) == 0


def test_regression_records_pairs_and_a_single_text_model_is_no_cross_encoder(tmp_path, capsys):
    """A regression model records whether it learnt pairs (STS) or single texts: a pair
    model refuses single texts and the reverse; a single-text model is refused as a
    reranker, which would score (query, document) pairs with it."""
    from conftest import tiny_model_dir
    from nanobert import cli
    words = "a man dog cat eats runs sleeps food park the is".split()
    tiny = tiny_model_dir(tmp_path / "tiny", words, 60, "? .")
    single, pairs = tmp_path / "single.tsv", tmp_path / "pairs.tsv"
    single.write_text("text\tscore\na man eats\t1\na dog runs\t2\nthe cat sleeps\t3\n")
    pairs.write_text("sentence1\tsentence2\tscore\na man eats\tthe man eats food\t4\n"
                     "a dog runs\tthe cat sleeps\t0.5\nthe park\ta park\t3\n")

    def run(*argv):
        rc = cli.main(list(map(str, argv)))
        return rc, capsys.readouterr().err

    for name, data in (("s", single), ("p", pairs)):
        assert run("finetune", "--task", "regress", "--model", tiny, "--train", data, "--dev",
                   data, "--out", tmp_path / name, "--max-steps", "1", "--max-length", "16",
                   "--no-progress")[0] == 0
    assert json.loads((tmp_path / "s" / "nanobert.json").read_text())["pairs"] is False
    assert json.loads((tmp_path / "p" / "nanobert.json").read_text())["pairs"] is True
    rc, err = run("evaluate", "--model", tmp_path / "p", "--data", single)
    assert rc == 2 and f"{single}: single texts, but the model {tmp_path / 'p'} was trained " \
                      "on text pairs" in err
    rc, err = run("predict", "--model", tmp_path / "s", "a man", "--context", "a dog")
    assert rc == 2 and "was trained on single texts: --context" in err
    assert run("predict", "--model", tmp_path / "p", "a man", "--context", "a dog")[0] == 0
    with pytest.raises(NanobertError, match="trained on single texts .* not a cross-encoder"):
        nanobert.Reranker(tmp_path / "s")
    assert len(nanobert.Reranker(tmp_path / "p").score("a man", ["a dog", "food"])) == 2


def test_a_fine_tuning_run_picks_its_best_model_by_dev_judgments_not_test(tmp_path, capsys):
    """A BEIR --dev folder of train/dev/test judgments: the best model had been chosen by
    the test scores (BEIR's default split for `evaluate`), with dev.tsv there. A folder
    without train.tsv trained on its test judgments and scored them as dev, silently."""
    from nanobert.data import read_beir
    root = tmp_path / "b"
    (root / "qrels").mkdir(parents=True)
    (root / "corpus.jsonl").write_text("".join(
        json.dumps({"_id": f"d{i}", "text": f"doc {i}"}) + "\n" for i in range(6)))
    (root / "queries.jsonl").write_text("".join(
        json.dumps({"_id": f"q{i}", "text": f"query {i}"}) + "\n" for i in range(6)))
    for split, qs in (("train", (0, 1)), ("dev", (2, 3)), ("test", (4, 5))):
        (root / "qrels" / f"{split}.tsv").write_text("".join(f"q{i}\td{i}\t1\n" for i in qs))
    beir = read_beir(root)
    assert beir.split == "test"                                   # evaluate's default
    settings = {}
    assert E.dev_judgments(beir, beir, settings).split == "dev"
    assert E.dev_judgments(beir, beir, {"split": "test"}) is beir  # --split: as given
    assert E.dev_judgments(beir, beir, {"holdout": 0.5}) is beir   # held-out train queries
    rows = [TextRow(("q", "p"))]
    assert E.dev_judgments(rows, rows, settings) is rows           # tables as they are
    assert capsys.readouterr().err == ""
    (root / "qrels" / "dev.tsv").rename(root / "qrels" / "validation.tsv")
    assert E.dev_judgments(beir, read_beir(root), settings).split == "validation"
    for name in ("train", "validation"):
        (root / "qrels" / f"{name}.tsv").unlink()
    only_test = read_beir(root)
    assert E.dev_judgments(only_test, only_test, settings).split == "test"
    err = capsys.readouterr().err
    assert "no qrels/train.tsv, so the run trains on qrels/test.tsv" in err
    assert "the dev evaluation scores qrels/test.tsv, the judgments the run trains on" in err


def test_a_column_flag_on_plain_text_is_refused_for_embedding_inputs(tmp_path, capsys):
    """predict --model minilm --input plain.txt --text-column nosuch ran, the flag
    ignored, as read_inputs had done for classifiers."""
    from nanobert.cli import main
    from nanobert.files import NanobertError
    plain = tmp_path / "plain.txt"
    plain.write_text("a man eats\nthe sky is blue\n")
    with pytest.raises(NanobertError, match=r"^--text-pair-column b: .* is plain text, one "):
        E.text_rows_input(plain, {"pair_column": "b"})
    assert len(E.text_rows_input(plain, {})) == 2
    assert main(["predict", "--model", "minilm", "--input", str(plain), "--text-column",
                 "nosuch"]) == 2
    assert capsys.readouterr().err.startswith("nanobert: error: --text-column nosuch: ")
