"""Retrieval metrics against hand-computed values, dense search, reranking, STS."""
from __future__ import annotations

import math

import numpy as np
import pytest

from nanobert import retrieval as R
from nanobert.data import Beir, TextRow
from nanobert.files import NanobertError
from test_finetune import head_dir, tiny_dir  # noqa: F401  (a small random BERT, a head on it)


def test_ndcg_mrr_recall_by_hand():
    judged = {"d1": 2, "d2": 1, "d3": 0}
    run = {"d3": 4.0, "d1": 3.0, "d4": 2.0, "d2": 1.0}
    ranked = R.ranking(run)
    assert ranked == ["d3", "d1", "d4", "d2"]
    # DCG = 2/log2(3) + 1/log2(5) = 1.6925361; ideal = 2/log2(2) + 1/log2(3) = 2.6309298
    assert R.ndcg_at(ranked, judged, 10) == pytest.approx(0.6433224, abs=1e-6)
    # at 2 only d1 counts; the ideal top 2 is still (2, 1)
    assert R.ndcg_at(ranked, judged, 2) == pytest.approx(1.2618595 / 2.6309298, abs=1e-6)
    assert R.mrr_at(ranked, judged, 10) == 0.5
    assert R.mrr_at(ranked, judged, 1) == 0.0          # d3 is judged but not relevant
    assert R.recall_at(ranked, judged, 2) == 0.5
    assert R.recall_at(ranked, judged, 100) == 1.0


def test_linear_gain_not_exponential():
    # trec_eval's nDCG uses the relevance itself as the gain: a single document of
    # relevance 3 at rank 2 scores 3/log2(3) / 3 whatever the exponent would say
    assert R.ndcg_at(["x", "a"], {"a": 3}, 10) == pytest.approx(1 / math.log2(3))


def test_ties_by_doc_id_descending():
    assert R.ranking({"a": 1.0, "b": 1.0, "c": 0.5, "d": 1.0}) == ["d", "b", "a", "c"]


def test_retrieval_metrics_mean_over_judged_queries():
    qrels = {"q1": {"a": 1}, "q2": {"b": 1}, "q3": {"c": 1}}
    run = {"q1": {"a": 0.9, "x": 0.1},      # perfect
           "q2": {"x": 0.9, "b": 0.1},      # relevant at rank 2
           "q3": {"q3": 0.99, "c": 0.5}}   # its own id is dropped, then c is first
    m = R.retrieval_metrics(qrels, run)
    assert m["mrr_at_10"] == pytest.approx((1 + 0.5 + 1) / 3)
    assert m["ndcg_at_10"] == pytest.approx((1 + 1 / math.log2(3) + 1) / 3)
    assert m["recall_at_100"] == 1.0
    # a judged query missing from the run scores zero
    assert R.retrieval_metrics({**qrels, "q4": {"d": 1}}, run)["recall_at_100"] == 0.75
    with pytest.raises(NanobertError):
        R.retrieval_metrics({}, run)


def test_dense_run_top_k_and_rerank():
    docs = np.array([[1, 0], [0, 1], [1, 1]], dtype=np.float32)
    queries = np.array([[1, 0.1], [0, 1]], dtype=np.float32)
    run = R.dense_run(queries, ["q1", "q2"], docs, ["a", "b", "c"], k=1)
    assert R.ranking(run["q1"])[:2] == ["a", "c"]     # k + 1 kept for the identical-id rule
    assert run["q2"]["b"] == pytest.approx(1.0)
    # a reranker that prefers longer documents reverses q1's order
    texts = {"a": "x", "b": "yy", "c": "zzz"}
    reranked = R.rerank_run(run, lambda pairs: [len(d) for _, d in pairs],
                            {"q1": "?", "q2": "?"}, texts.get, top_k=2)
    assert R.ranking(reranked["q1"]) == ["c", "a"]


def test_dense_run_cuts_ties_by_the_ranking_rule():
    """Documents tied at the top-k cut were kept by whichever topk returned, not by the
    ranking's rule (ties by id descending, as trec_eval): recall@100 0.0 where the rule
    gives 1.0 (300 duplicates, the relevant one 70th by id)."""
    ids = [f"{i:04d}" for i in range(300)]
    docs = np.zeros((300, 4), dtype=np.float32)
    docs[:, :2] = 1
    docs[:5, 1] = 0                                     # five better documents: not tied
    queries = np.zeros((2, 4), dtype=np.float32)
    queries[:, 0] = 1
    run = R.dense_run(queries, ["q", "r"], docs, ids, 100)
    assert R.ranking(run["q"])[:5] == ["0004", "0003", "0002", "0001", "0000"]
    assert R.ranking(run["q"])[5:100] == [f"{i:04d}" for i in range(299, 204, -1)]
    qrels = {"q": {"0230": 1}, "r": {"0200": 1}}
    assert R.retrieval_metrics({"q": qrels["q"]}, run)["recall_at_100"] == 1.0
    assert R.retrieval_metrics({"r": qrels["r"]}, run)["recall_at_100"] == 0.0


def test_evaluate_beir_with_a_toy_encoder():
    # bag-of-letters vectors: a query retrieves the document sharing its letters
    def encode(texts):
        return np.array([[t.count(ch) for ch in "abcxyz"] for t in texts], dtype=np.float32) + 1e-3
    beir = Beir({"d1": ("", "aaa"), "d2": ("", "bbb"), "d3": ("t", "ccc")},
                {"q1": "aa", "q2": "cc", "q3": "zz"}, {"q1": {"d1": 1}, "q2": {"d3": 1}}, "test")
    m = R.evaluate_beir(encode, beir)
    assert m["n_queries"] == 2 and m["ndcg_at_10"] == pytest.approx(1.0)
    assert R.evaluate_beir(encode, beir, query_ids=["q2"])["n_queries"] == 1


def test_a_rerank_k_over_the_metrics_cutoff_reranks_that_many():
    """--rerank-k over 100 reranked the dense top 100 (k): the candidates are
    max(k, rerank_k). A reranker that finds the one relevant document wherever the
    retriever put it: with k=1 and rerank_k=3 it is found."""
    def encode(texts):   # every document alike to the query: the dense order is by id,
        return np.ones((len(texts), 3), dtype=np.float32)   # descending: d2, d1, d0
    beir = Beir({"d1": ("", "x"), "d2": ("", "y"), "d0": ("", "gold")}, {"q": "?"},
                {"q": {"d0": 1}}, "test")
    def relevant(pairs):
        return [1.0 if d == "gold" else 0.0 for _, d in pairs]
    few = R.evaluate_beir(encode, beir, k=1, rerank=relevant, rerank_k=1)
    many = R.evaluate_beir(encode, beir, k=1, rerank=relevant, rerank_k=3)
    assert many["mrr_at_10"] == 1.0 and many["rerank_k"] == 3
    assert few["mrr_at_10"] < 1.0


def test_the_querys_own_document_takes_no_rerank_place():
    """ArguAna/Quora: a query's id is a document's id, and that document (its own text)
    is the dense top 1. BEIR's search drops it before reranking; it had taken one of the
    rerank_k places and been dropped after, so rerank_k 2 reranked one candidate."""
    def encode(texts):   # the query's own text first, then the other documents by id
        return np.array([[1.0, 0.0] if t == "same" else [1.0, 1.0] for t in texts],
                        dtype=np.float32)
    beir = Beir({"q": ("", "same"), "d1": ("", "x"), "a": ("", "gold")}, {"q": "same"},
                {"q": {"a": 1}}, "test")   # dense order: q, d1, a (ties: id descending)
    def relevant(pairs):
        return [1.0 if d == "gold" else 0.0 for _, d in pairs]
    m = R.evaluate_beir(encode, beir, rerank=relevant, rerank_k=2)
    assert m["mrr_at_10"] == 1.0 and m["recall_at_100"] == 1.0


def test_evaluate_sts_correlations():
    rows = [TextRow(("a", "a"), 5.0), TextRow(("a", "b"), 0.0), TextRow(("a", "ab"), 3.0)]

    def encode(texts):
        return np.array([[t.count("a"), t.count("b")] for t in texts], dtype=np.float32)
    m = R.evaluate_sts(encode, rows)
    assert m["spearman"] == pytest.approx(1.0) and m["n"] == 3
    with pytest.raises(NanobertError, match="scored pairs"):
        R.evaluate_sts(encode, [TextRow(("a",), 1.0)])
    with pytest.raises(NanobertError, match="vary"):
        R.correlations([1, 1], [0, 1])


def _trec_reference(qrels: dict, run: dict) -> dict:
    """trec_eval's ndcg_cut.10, recip_rank at 10, recall.100, written independently: sort
    by (score, doc id) descending, gains are the grades, ideal over every judged document
    (those missing from the corpus too), mean over every judged query."""
    out = {"ndcg_at_10": 0.0, "mrr_at_10": 0.0, "recall_at_100": 0.0}
    for q, judged in qrels.items():
        docs = sorted(((s, d) for d, s in run.get(q, {}).items() if d != q), reverse=True)
        grades = [judged.get(d, 0) for _, d in docs]
        gains = sorted((g for g in judged.values() if g > 0), reverse=True)
        ideal = sum(g / math.log2(i + 2) for i, g in enumerate(gains[:10]))
        dcg = sum(g / math.log2(i + 2) for i, g in enumerate(grades[:10]) if g > 0)
        out["ndcg_at_10"] += dcg / ideal if ideal else 0.0
        out["mrr_at_10"] += next((1 / (i + 1) for i, g in enumerate(grades[:10]) if g > 0), 0.0)
        out["recall_at_100"] += sum(g > 0 for g in grades[:100]) / len(gains) if gains else 0.0
    return {k: v / len(qrels) for k, v in out.items()}


def test_retrieval_metrics_equal_an_independent_trec_eval():
    """Graded qrels, a query with no relevant document, heavy score ties, judged documents
    missing from the corpus, a query missing from the run, more than 100 results."""
    rng = np.random.default_rng(0)
    corpus = [f"d{i}" for i in range(150)]
    qrels, run = {}, {}
    for q in range(12):
        judged = {str(d): int(rng.integers(0, 4)) for d in rng.choice(corpus, 6, replace=False)}
        if q % 4 == 0:
            judged["not-in-corpus"] = 2
        qrels[f"q{q}"] = judged
        if q != 5:
            run[f"q{q}"] = {d: float(rng.integers(0, 4)) for d in corpus[:120]}
    qrels["q12"] = {"d1": 0, "d2": 0}
    run["q12"] = {"d1": 1.0, "d2": 0.5}
    got = R.retrieval_metrics(qrels, run)
    for name, value in _trec_reference(qrels, run).items():
        assert got[name] == pytest.approx(value, abs=1e-12), name


# ----------------------------------------------------------------------------------
# Reranker: the models the server's /rerank serves, scored as it scores them

QUERY = "where does alice live"
DOCS_TO_RANK = ["alice lives in paris", "the movie was boring", "bob met carol",
                "the plot was really quite a story " * 4, "", "alice"]


@pytest.mark.parametrize("head, id2label, settings", [
    ("classify", {0: "not_equivalent", 1: "equivalent"},                # MRPC-like, two labels
     {"task": "classify", "max_length": 32, "pairs": True}),
    ("classify", {0: "no", 1: "yes"}, None),                             # two labels, no record
    # a classifier of one output is a regression, as transformers reads it (no problem_type)
    ("classify", {0: "relevant"}, {"task": "regress", "max_length": 24, "pairs": True}),
    ("regression", None, {"task": "rerank", "max_length": 16}),          # a cross-encoder
])
def test_reranker_scores_what_the_servers_rerank_scores(tiny_dir, tmp_path, one_thread, head,
                                                        id2label, settings):
    """Reranker refused a two-label pair classifier that the server's /rerank serves,
    ranking by the positive class's probability: the same models rerank offline now,
    with the server's numbers (its scoring code, called in-process)."""
    from nanobert.serve_models import load_served
    path = head_dir(tiny_dir, tmp_path / "m", head, settings, id2label)
    served = load_served(str(path))
    assert "rerank" in served.routes
    logits = served.runner("logits")([(QUERY, d) for d in DOCS_TO_RANK])
    server = [served.relevance(row) for row in logits]
    reranker = R.Reranker(path)
    offline = reranker.score(QUERY, DOCS_TO_RANK)
    assert np.allclose(offline, server, rtol=0, atol=1e-6)
    if id2label is not None and len(id2label) == 2:
        assert all(0 < s < 1 for s in offline)                       # probabilities
    ranked = reranker.rerank(QUERY, DOCS_TO_RANK)
    assert [i for i, _, _ in ranked] == sorted(range(len(server)), key=lambda i: -server[i])


@pytest.mark.parametrize("id2label, noted", [
    ({0: "entailment", 1: "not_entailment"}, True),      # QNLI/RTE: the relevant label first
    ({0: "match", 1: "mismatch"}, True),
    ({0: "not_equivalent", 1: "equivalent"}, False),     # MRPC: the relevant label second
    ({0: "no", 1: "yes"}, False),
])
def test_a_pair_classifier_whose_second_label_is_the_negative_one_is_noted(
        tiny_dir, tmp_path, capsys, id2label, noted):
    """A two-label classifier reranks by its second label's probability; a QNLI-style
    model (entailment, not_entailment) ranked the least relevant first without a word.
    Reranker and the server (which serves it on /rerank) say so."""
    from nanobert.serve_models import load_served
    path = head_dir(tiny_dir, tmp_path / "m", "classify",
                    {"task": "classify", "max_length": 32, "pairs": True}, id2label)
    capsys.readouterr()
    R.Reranker(path)
    offline = capsys.readouterr().err
    load_served(str(path))
    served = capsys.readouterr().err
    says = f"its second label is {id2label[1]!r} (its first {id2label[0]!r})"
    assert (says in offline and says in served) == noted, (offline, served)


def test_scoring_reads_a_chunk_of_pairs_at_a_time_with_the_same_scores(tiny_dir, tmp_path,
                                                                        capsys, monkeypatch):
    """A cross-encoder tokenized every pair before scoring any (20,000 documents of 50 kB
    held every encoding: each token of a cut text). It reads tokenizer.CHUNK_CHARS at a
    time: the same scores, in order, and one truncation note counting every chunk."""
    import nanobert.tokenizer as T
    path = head_dir(tiny_dir, tmp_path / "m", "regression", {"task": "rerank", "max_length": 16})
    docs = [" ".join(["word"] * (1 + (7 * i) % 40)) + f" doc {i}" for i in range(60)]
    whole = R.Reranker(path).score(QUERY, docs)
    notes = capsys.readouterr().err
    monkeypatch.setattr(T, "CHUNK_CHARS", 300)
    calls, real = [], T.Tokenizer.encode_batch

    def spy(self, texts, *a, **k):
        calls.append(len(texts))
        return real(self, texts, *a, **k)
    monkeypatch.setattr(T.Tokenizer, "encode_batch", spy)
    chunked = R.Reranker(path).score(QUERY, docs)
    assert len([n for n in calls if n > 1]) > 5 and max(calls) < len(docs)
    assert np.allclose(chunked, whole, rtol=0, atol=1e-5)
    assert "pairs are longer than 16 tokens" in notes and capsys.readouterr().err == notes


def test_a_cut_candidate_is_named_by_its_corpus_entry(tiny_dir, tmp_path, capsys):
    """`search --rerank`: the embedding note named a long document #51 (its corpus entry)
    and the reranker's note #101 (its rank among the candidates), the same document
    under two numbers, the second of which maps to nothing in the file."""
    path = head_dir(tiny_dir, tmp_path / "m", "regression", {"task": "rerank", "max_length": 16})
    hits = [(40, 0.9, "bob met carol"), (7, 0.8, "alice lives in paris " * 10),
            (12, 0.7, "who met carol")]
    R.Reranker(path).rerank_hits(QUERY, hits, 2)
    assert "the pair is" not in (err := capsys.readouterr().err) and "(#8 has" in err
    reranked = R.Reranker(path).rerank_hits([QUERY], [hits], 2)[0]
    assert {i for i, _, _ in reranked} <= {40, 7, 12} and len(reranked) == 2
    assert "(#8 has" in capsys.readouterr().err


def test_reranker_and_predictor_take_dtype_and_device(tiny_dir, tmp_path, one_thread):
    """Reranker had no dtype (search --rerank --dtype int8 left the cross-encoder fp32)
    and Predictor no device, where Encoder has both."""
    from nanobert.finetune import Predictor
    from nanobert.quantize import Int8Linear
    path = head_dir(tiny_dir, tmp_path / "m", "regression", {"task": "rerank", "max_length": 16})
    fp32 = R.Reranker(path, device="cpu").score(QUERY, DOCS_TO_RANK)
    int8 = R.Reranker(path, dtype="int8")
    assert isinstance(int8.model.bert.blocks[0].up, Int8Linear)
    scores = int8.score(QUERY, DOCS_TO_RANK)
    assert scores != fp32 and np.allclose(scores, fp32, atol=0.2)
    p = Predictor(path, device="cpu")
    assert next(p.model.parameters()).device.type == "cpu"
    with pytest.raises(TypeError, match="device must be a string"):
        Predictor(path, device=3)


def test_an_int8_reranker_scores_as_the_server_runs_it(tiny_dir, tmp_path, one_thread):
    """The server's logits (run_batches: the last block on [CLS] rows only) differed from
    Reranker's and predict's under int8 by 1e-4 (the last block's scales came from other
    rows); every path now runs the same rows."""
    from nanobert.data import Example
    from nanobert.finetune import encode_classification, run_batches
    path = head_dir(tiny_dir, tmp_path / "m", "regression", {"task": "rerank", "max_length": 16})
    int8 = R.Reranker(path, dtype="int8")
    features = encode_classification(int8.tokenizer, [Example(QUERY, d) for d in DOCS_TO_RANK],
                                     16)
    served = [t[0].item() for t in run_batches(int8.model, features, len(features))]
    assert np.allclose(int8.score(QUERY, DOCS_TO_RANK), served, atol=1e-6, rtol=0)


def test_reranker_refuses_what_the_server_does_not_rerank(tiny_dir, tmp_path):
    """Single-text classifiers and classifiers of more than two labels rank nothing on
    the server (no /rerank route); Reranker refuses them with a clear message."""
    from nanobert.serve_models import load_served
    three = head_dir(tiny_dir, tmp_path / "three", "classify",
                     {"task": "classify", "max_length": 32, "pairs": True},
                     {0: "a", 1: "b", 2: "c"})
    single = head_dir(tiny_dir, tmp_path / "single", "classify",
                      {"task": "classify", "max_length": 32, "pairs": False}, {0: "neg", 1: "pos"})
    tagger = head_dir(tiny_dir, tmp_path / "tagger", "token", {"task": "ner", "max_length": 32},
                      {0: "O", 1: "B-X"})
    for path, words in [(three, r"a classifier of 3 labels \(a, b, c\), not a reranker"),
                        (single, "trained on single texts .* not a cross-encoder"),
                        (tagger, "not a cross-encoder .* this model's head is token")]:
        assert "rerank" not in load_served(str(path)).routes
        with pytest.raises(NanobertError, match=words):
            R.Reranker(path)


# ----------------------------------------------------------------------------------
# A directory sentence-transformers' CrossEncoder saved: its window, its task


@pytest.fixture(scope="module")
def st_cross_encoder(tiny_dir, tmp_path_factory):
    """A CrossEncoder of one label sentence-transformers saved with max_length=64, on a
    random transformers BERT of 128 positions (tiny_dir's vocabulary)."""
    import torch
    import transformers
    from sentence_transformers import CrossEncoder
    root = tmp_path_factory.mktemp("st_ce")
    tok = transformers.AutoTokenizer.from_pretrained(str(tiny_dir))
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=64,
                                     max_position_embeddings=128, num_labels=1,
                                     initializer_range=0.2)
    transformers.BertForSequenceClassification(config).save_pretrained(root / "hf")
    tok.save_pretrained(root / "hf")
    CrossEncoder(str(root / "hf"), num_labels=1, max_length=64, device="cpu").save(str(root / "ce"))
    return root / "ce"


LONG_PAIR = (QUERY, "alice lives in paris and " * 30)   # far over 64 tokens


def test_a_cross_encoder_scores_at_the_window_sentence_transformers_reads(st_cross_encoder):
    """Reranker read 512 tokens of a CrossEncoder whose tokenizer_config.json says 64
    (max_length=64 when it was made): scores differed from CrossEncoder.predict's (by
    0.099 on the long pair; 1e-7 now)."""
    import torch
    from sentence_transformers import CrossEncoder
    from nanobert.checkpoint import read_settings
    ce = CrossEncoder(str(st_cross_encoder), device="cpu")
    assert ce.max_seq_length == 64
    reranker = R.Reranker(st_cross_encoder)
    assert reranker.max_length == 64
    pairs = [LONG_PAIR, ("who met carol", "bob met carol")]
    ours = [reranker.score(q, [d])[0] for q, d in pairs]
    theirs = ce.predict(pairs, activation_fn=torch.nn.Identity())
    np.testing.assert_allclose(theirs, ours, atol=1e-5)
    # predict applies the activation the directory declares (a sigmoid): the same order
    np.testing.assert_allclose(ce.predict(pairs), 1 / (1 + np.exp(-np.array(ours))), atol=1e-5)
    assert read_settings(st_cross_encoder) == {"max_length": 64, "task": "rerank"}


def test_a_cross_encoder_of_one_label_is_evaluated_as_a_reranker(st_cross_encoder, tmp_path,
                                                                  capsys):
    """evaluate read it as a regression model (Pearson/Spearman of its scores against the
    relevance labels) where nanobert's own rerankers rank (nDCG@10)."""
    import json
    from nanobert import cli
    rows = tmp_path / "rr.tsv"
    rows.write_text("query\tdocument\tlabel\n" + "".join(
        f"{q}\t{d}\t{y}\n" for q in ("where does alice live", "who met carol")
        for d, y in (("alice lives in paris", 1), ("bob met carol", 1), ("the movie", 0))))
    assert cli.main(["evaluate", "--model", str(st_cross_encoder), "--data", str(rows),
                     "--json"]) == 0
    result = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert result["task"] == "rerank" and result["n_queries"] == 2 and "ndcg_at_10" in result


@pytest.mark.parametrize("marks, task", [
    ({"sentence_transformers": {"activation_fn": "torch.nn.modules.activation.Sigmoid",
                                "version": "5.1.0"}}, "rerank"),         # written by 4 and 5
    ({"sbert_ce_default_activation_function": "torch.nn.modules.linear.Identity"},
     "rerank"),                                                           # before 4
    ({}, None),                                                           # a plain HF model
])
def test_each_cross_encoder_version_is_read_as_one(st_cross_encoder, tmp_path, marks, task):
    """sentence-transformers 4 and 5 wrote no config_sentence_transformers.json, and
    earlier versions no modules.json: their config.json says what saved them. nanobert's
    own regression heads carry an activation for CrossEncoder, not a version: a
    regression model saved without nanobert.json stays one."""
    import json
    import shutil
    from nanobert.checkpoint import read_settings
    d = tmp_path / "ce"
    shutil.copytree(st_cross_encoder, d)
    for name in ("config_sentence_transformers.json", "modules.json",
                 "sentence_bert_config.json"):
        (d / name).unlink()
    config = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**config, **marks}))
    assert read_settings(d).get("task") == task
    assert read_settings(d).get("max_length") == (64 if task else None)
    assert R.Reranker(d).max_length == 64                  # the tokenizer's, either way


def test_our_regression_head_without_settings_is_no_cross_encoder(tiny_dir, tmp_path):
    from nanobert.checkpoint import read_settings
    path = head_dir(tiny_dir, tmp_path / "reg", "regression", None)
    assert "sentence_transformers" in (path / "config.json").read_text()
    assert read_settings(path) == {}


def test_a_plain_pair_classifier_is_read_at_one_window_everywhere(tiny_dir, tmp_path):
    """A transformers pair classifier without nanobert.json: Reranker read the tokenizer's
    window (300) while evaluate, predict and serve read min(128, 300), so a long document
    scored two ways. All now read it as transformers does, truncating at the tokenizer's."""
    import torch
    import transformers
    from nanobert.finetune import load_finetuned
    from nanobert.serve_models import load_served
    tok = transformers.AutoTokenizer.from_pretrained(str(tiny_dir), model_max_length=300)
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=64,
                                     max_position_embeddings=512, num_labels=2,
                                     initializer_range=0.2)
    hf = transformers.BertForSequenceClassification(config).eval()
    hf.save_pretrained(tmp_path / "pc")
    tok.save_pretrained(tmp_path / "pc")
    doc = "alice lives in paris and " * 60                        # 300+ tokens with the query
    reranker = R.Reranker(tmp_path / "pc")
    assert reranker.max_length == load_finetuned(tmp_path / "pc")[2]["max_length"] == 300
    assert load_served(str(tmp_path / "pc")).max_length == 300
    enc = tok(QUERY, doc, truncation=True, return_tensors="pt")
    assert enc["input_ids"].shape[1] == 300
    with torch.no_grad():
        want = hf(**enc).logits.softmax(-1)[0, 1].item()
    assert reranker.score(QUERY, [doc])[0] == pytest.approx(want, abs=1e-5)
