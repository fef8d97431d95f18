"""Evaluating embedding models and rerankers: STS correlation and BEIR retrieval.

    STS     pairs ──► embed both sides ──► cosine ──► Pearson / Spearman against the gold
    BEIR    queries, corpus ──► embed ──► cosine top-100 per query (a run) ──► metrics
            (optionally: a cross-encoder re-scores each query's top-k and re-sorts it)

The retrieval metrics are those of trec_eval as pytrec_eval (and so BEIR and MTEB)
computes them, so published figures can be compared:

    nDCG@k     gain = the judged relevance (linear, not 2^rel - 1), discount log2(rank + 1);
               divided by the DCG of the ideal ranking of all judged documents
    MRR@k      1 / rank of the first relevant document in the top k (0 if none)
    Recall@k   relevant documents in the top k / all relevant documents of the query
    ties       equal scores are ordered by document id, descending (trec_eval's rule)
    "relevant" means a judgement > 0; every judged query counts, a query with no
               results scores 0; a document whose id equals the query's is dropped
               from that query's results (BEIR's ignore_identical_ids), unless the
               qrels judge it relevant to that query: then queries and documents are
               numbered apart (1, 2, 3 each), and dropping it would score a right answer
               as a miss (kept, with a note)
"""
from __future__ import annotations

import math
import numbers
import re
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch

from .batching import to_inference_device
from .config import check_count
from .files import NanobertError, note, progress_bar
from .metrics import correlations
from .threads import map_on_cores
from .tokenizer import check_text, check_texts

RETRIEVAL_METRICS = ("ndcg_at_10", "mrr_at_10", "recall_at_10", "recall_at_100")


# ----------------------------------------------------------------------------------
# Metrics


def ranking(scores: dict) -> list:
    """Document ids of one query's run {doc id: score}, best first; ties by id descending."""
    return [d for d, _ in sorted(scores.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)]


def ndcg_at(ranked: list, judged: dict, k: int) -> float:
    dcg = sum(judged.get(d, 0) / math.log2(i + 2) for i, d in enumerate(ranked[:k])
              if judged.get(d, 0) > 0)
    ideal = sorted((r for r in judged.values() if r > 0), reverse=True)[:k]
    idcg = sum(r / math.log2(i + 2) for i, r in enumerate(ideal))
    return dcg / idcg if idcg > 0 else 0.0


def mrr_at(ranked: list, judged: dict, k: int) -> float:
    for i, d in enumerate(ranked[:k]):
        if judged.get(d, 0) > 0:
            return 1.0 / (i + 1)
    return 0.0


def recall_at(ranked: list, judged: dict, k: int) -> float:
    relevant = {d for d, r in judged.items() if r > 0}
    return len(relevant.intersection(ranked[:k])) / len(relevant) if relevant else 0.0


def without_identical(scores: dict, query_id, judged: dict) -> dict:
    """One query's run {doc id: score} without the document of the query's own id (BEIR's
    ignore_identical_ids), unless the qrels judge it relevant to that query."""
    return {d: s for d, s in scores.items() if d != query_id or judged.get(d, 0) > 0}


# metric name -> (function, cut-off); the table behind RETRIEVAL_METRICS
_METRICS = {"ndcg_at_10": (ndcg_at, 10), "mrr_at_10": (mrr_at, 10),
            "recall_at_10": (recall_at, 10), "recall_at_100": (recall_at, 100)}


def retrieval_metrics(qrels: dict, run: dict) -> dict:
    """Mean of each metric over the judged queries, as fractions. qrels
    {query: {doc: relevance}}, run {query: {doc: score}}."""
    if not qrels:
        raise NanobertError("no judged queries to evaluate")
    totals = dict.fromkeys(_METRICS, 0.0)
    for q, judged in qrels.items():
        ranked = ranking(without_identical(run.get(q, {}), q, judged))
        for name, (fn, k) in _METRICS.items():
            totals[name] += fn(ranked, judged, k)
    return {name: v / len(qrels) for name, v in totals.items()}


# ----------------------------------------------------------------------------------
# Retrieval with an embedding model, reranking with a cross-encoder


def dense_run(query_vecs: np.ndarray, query_ids: list, doc_vecs: np.ndarray, doc_ids: list,
              k: int = 100, chunk: int = 256) -> dict:
    """Cosine top-k (k + 1, so that dropping a document with the query's own id leaves
    k) for each query: {query id: {doc id: score}}, and every document tied with the
    last one kept: `ranking` orders ties by id, and the cut must be made after that
    order, not by which of the tied documents topk happened to keep."""
    docs = torch.nn.functional.normalize(torch.from_numpy(doc_vecs).float(), dim=-1)
    queries = torch.nn.functional.normalize(torch.from_numpy(query_vecs).float(), dim=-1)
    k = min(k + 1, len(doc_ids))
    run = {}
    for start in range(0, len(query_ids), chunk):
        sims = queries[start:start + chunk] @ docs.T                      # (q, N)
        scores, idx = sims.topk(k, dim=-1)                                # (q, k)
        tied = (sims >= scores[:, -1:]).sum(-1) > k                       # (q,) more at the cut
        for row, qid in enumerate(query_ids[start:start + chunk]):
            if tied[row]:
                kept = (sims[row] >= scores[row, -1]).nonzero().squeeze(-1)
                run[qid] = {doc_ids[i]: s for i, s in zip(kept.tolist(), sims[row, kept].tolist())}
            else:
                run[qid] = {doc_ids[i]: s for i, s in zip(idx[row].tolist(), scores[row].tolist())}
    return run


def rerank_run(run: dict, score_pairs: Callable, queries: dict, doc_text: Callable,
               top_k: int = 100) -> dict:
    """Re-score each query's `top_k` best documents with `score_pairs([(query, doc)])`
    (a cross-encoder); the rest of the run is dropped, as BEIR's reranking does."""
    pairs, keys = [], []
    for q, scores in run.items():
        for d in ranking(scores)[:top_k]:
            pairs.append((queries[q], doc_text(d)))
            keys.append((q, d))
    new = score_pairs(pairs) if pairs else []
    out = {q: {} for q in run}
    for (q, d), s in zip(keys, new):
        out[q][d] = float(s)
    return out


def evaluate_beir(encode: Callable, beir, k: int = 100, rerank: Optional[Callable] = None,
                  rerank_k: int = 100, query_ids: Optional[list] = None) -> dict:
    """Retrieval metrics of an embedding function `encode(texts) -> (n, H)` on a `Beir`
    set, over its judged queries (or `query_ids`), optionally reranked."""
    qids = [q for q in (query_ids or beir.qrels) if q in beir.qrels]
    doc_ids = list(beir.corpus)
    doc_vecs = encode([beir.doc_text(d) for d in doc_ids])
    query_vecs = encode([beir.queries[q] for q in qids])
    # the reranker gets `rerank_k` candidates, more than the metrics' `k` if asked (a
    # --rerank-k over 100 reranked 100); what it leaves out is dropped, as BEIR does, so
    # under 100 recall_at_100 counts the reranked ones (said by "rerank_k")
    run = dense_run(query_vecs, qids, doc_vecs, doc_ids,
                    max(k, rerank_k) if rerank is not None else k)
    qrels = {q: beir.qrels[q] for q in qids}
    first = {}
    if rerank is not None:
        # the query's own document leaves before reranking, as BEIR's search drops it: it
        # had taken one of the `rerank_k` places (ArguAna, Quora), and then been dropped
        run = {q: without_identical(run[q], q, qrels[q]) for q in qids}
        # the retriever's own nDCG@10 on the same queries: what the reranker is to beat
        first = {"retriever_ndcg_at_10": retrieval_metrics(qrels, run)["ndcg_at_10"]}
        run = rerank_run(run, rerank, beir.queries, beir.doc_text, rerank_k)
    same = [q for q in qids if qrels[q].get(q, 0) > 0]
    if same:
        note(f"the qrels judge {len(same)} document(s) relevant to the query of the same id "
             f"(query {same[0]!r}): the ids are numbered apart, so such documents are kept "
             "in the rankings (BEIR's ignore_identical_ids drops them)")
    return {"split": beir.split, "n_queries": len(qids), "n_docs": len(doc_ids),
            **({"rerank_k": rerank_k} if rerank is not None else {}),
            **retrieval_metrics(qrels, run), **first}


def evaluate_sts(encode: Callable, rows: list) -> dict:
    """Pearson/Spearman of the cosine of each pair against its gold score."""
    if any(len(r.texts) < 2 or r.score is None for r in rows):
        raise NanobertError("STS evaluation needs scored pairs (two texts and a score per row)")
    a = encode([r.texts[0] for r in rows])
    b = encode([r.texts[1] for r in rows])
    a = a / np.linalg.norm(a, axis=-1, keepdims=True).clip(1e-12)
    b = b / np.linalg.norm(b, axis=-1, keepdims=True).clip(1e-12)
    cos = (a * b).sum(-1)
    return {"n": len(rows), **row_correlations(rows, cos, "similarity")}


SAME_PREDICTION = 1e-6   # a relative spread within float32 rounding noise: one value


class UndefinedCorrelation(NanobertError):
    """The model scored every row alike: an error for `nanobert evaluate`; a dev
    evaluation while training counts it as NaN (never the best) and trains on."""
    METRICS = ("pearson", "spearman")


def row_correlations(rows: list, pred, what: str) -> dict:
    """Pearson/Spearman of the model's `pred` for scored rows against their gold scores.
    Predictions that are all one value (identical pairs, a collapsed model) leave the
    correlation undefined: that is said of the model, naming the file the rows came
    from (the error blamed the scores, and named no file)."""
    pred = np.asarray(pred, dtype=float)
    if len(pred) > 1 and np.ptp(pred) <= SAME_PREDICTION * max(1.0, float(np.abs(pred).max())):
        where = rows[0].path or "the evaluation data"
        kind = "pair" if len(rows[0].texts) == 2 else "text"
        raise UndefinedCorrelation(f"{where}: the model gives every {kind} the same {what} "
                                   f"({float(pred[0]):.4f}); correlation is undefined")
    return correlations([r.score for r in rows], pred)


# ----------------------------------------------------------------------------------
# Cross-encoders: scoring (query, document) pairs


def pair_scores(model, tok, pairs: list, max_length: int = 256, batch_size: int = 64,
                progress: bool = False) -> list:
    """The one logit of a cross-encoder / regression model for each (text, text_pair)
    (text_pair may be None), in input order."""
    return [s for _, logits in pair_logit_chunks(model, tok, pairs, max_length, batch_size,
                                                 progress) for s in logits[:, 0].tolist()]


def pair_logits(model, tok, pairs: list, max_length: int = 256, batch_size: int = 64,
                progress: bool = False, numbers=None):
    """The logits of a sequence head for each (text, text_pair) (text_pair may be None):
    a float32 tensor (n, outputs), in input order. `numbers`: what the truncation note
    calls each pair (`encode_chunks`)."""
    out = torch.zeros(len(pairs), model.config.num_labels)
    for chunk, logits in pair_logit_chunks(model, tok, pairs, max_length, batch_size, progress,
                                           numbers):
        out[chunk] = logits
    return out


@torch.inference_mode()
def pair_logit_chunks(model, tok, pairs: list, max_length: int = 256, batch_size: int = 64,
                      progress: bool = False, numbers=None):
    """Yield (indices, their logits (n, outputs)) of (text, text_pair) inputs a chunk at a
    time, in input order: tokenized and run a chunk at a time (`encode_chunks`: 20,000
    documents of 50 kB held every encoding at once), so that `predict` prints as it goes."""
    from .tokenizer import encode_chunks
    if not pairs:
        return
    single = all(p is None for _, p in pairs)
    inputs = [a for a, _ in pairs] if single else [(a, p or "") for a, p in pairs]
    was_training = model.training
    model.eval()
    bar = progress_bar(progress, len(pairs), "scoring", "pair")
    try:
        # (the note once per tokenizer: search --rerank calls this for each query)
        for chunk, encs in encode_chunks(tok, inputs, None, max_length,
                                         "texts" if single else "pairs", key="pair_logits",
                                         numbers=numbers):
            yield chunk, _encoded_logits(model, tok, encs, batch_size, bar)
    finally:
        model.train(was_training)
        bar.close()


def _encoded_logits(model, tok, encs, batch_size: int, bar) -> torch.Tensor:
    """pair_logits of one chunk's encodings, in their order."""
    from .batching import forward_tokens, logits_only, restore_order, sorted_batches
    device = next(model.parameters()).device
    groups = sorted_batches([len(e.ids) for e in encs], batch_size,
                            max_tokens=forward_tokens(device))

    def forward(idx):
        batch = {k: v.to(device) for k, v in tok.pad([encs[i] for i in idx]).items()}
        return model(**batch, **logits_only(model)).logits.float().cpu()
    out = []
    for idx, logits in zip(groups, map_on_cores(forward, groups, cpu=device.type == "cpu")):
        out.append(logits)
        bar.update(len(idx))
    return restore_order(groups, torch.cat(out))


def relevance(logits: torch.Tensor) -> list:
    """The relevance of each pair from a pair model's logits (n, outputs): the logit of
    a one-output model (a cross-encoder, a regression head), the probability of the
    second label (the positive class) of a two-label classifier. The server's /rerank
    scores the same way (serve_models.Served.relevance)."""
    if logits.shape[-1] == 1:
        return logits[:, 0].tolist()
    return torch.softmax(logits, -1)[:, 1].tolist()


class Reranker:
    """A cross-encoder, ready to score and re-order documents for a query:

        r = Reranker("runs/reranker")
        r.score("who wrote it?", ["Ada wrote it.", "It rained."])      # [3.1, -4.2]
        r.rerank("who wrote it?", ["Ada wrote it.", "It rained."])     # [(0, 3.1, 'Ada...'), ...]

    Any model of (query, document) pairs with a sequence head of one output (a `finetune
    --task rerank` output, a regression model, a sentence-transformers CrossEncoder
    directory) scores by its logit; a pair classifier of two labels (MRPC's, say) by
    the probability of its second label, as the server's /rerank does. Refused: other
    heads, classifiers of more than two labels, models trained on single texts.
    `device` and `dtype` ("int8": CPU) as for Encoder and Predictor."""

    def __init__(self, model_dir, batch_size: int = 64, max_length: Optional[int] = None,
                 device: Optional[str] = None, dtype: str = "float32"):
        import nanobert
        from .checkpoint import read_settings, resolve
        if not isinstance(model_dir, (str, Path)):   # (its settings live beside its weights)
            raise TypeError("Reranker(model_dir): expected a cross-encoder's directory or name "
                            f"(str or path), got {type(model_dir).__name__}")
        self.batch_size = check_count(batch_size, "batch_size")
        check_count(max_length, "max_length", none_ok=True)
        self.model, self.tokenizer = nanobert.load(model_dir, dtype=dtype)
        _check_pair_head(model_dir, self.model)
        note_negative_second_label(model_dir, self.model)
        to_inference_device(self.model, dtype, device)   # (the GPU where there is one)
        saved = read_settings(resolve(model_dir), self.model.config.usable_positions)
        if saved.get("pairs") is False:   # what finetune records; a pair's second text unread
            raise NanobertError(f"{model_dir}: trained on single texts (nanobert.json), not a "
                                "cross-encoder of (query, document) pairs")
        self.tokenizer.check_max_length(max_length, pair=True)   # [CLS] q [SEP] d [SEP]
        # the window it was trained with (nanobert.json), the one a sentence-transformers
        # CrossEncoder declares (read_settings), else its tokenizer's model_max_length, as
        # transformers reads the directory (512 was read where that said 64)
        self.max_length = max_length or saved.get("max_length") or self.tokenizer.model_max_length
        self.max_length = min(self.max_length, self.model.config.usable_positions)
        self.model.eval()

    def score(self, query: str, documents) -> list:
        """The relevance of each document for `query`, in document order: the logit of a
        one-output model, the second label's probability for a two-label classifier."""
        return self._scores(*_query_and_documents(query, documents))

    def _scores(self, query: str, documents: list, numbers=None) -> list:
        return relevance(pair_logits(self.model, self.tokenizer,
                                     [(query, d) for d in documents], self.max_length,
                                     self.batch_size, numbers=numbers))

    def rerank_hits(self, query, hits: list, k: Optional[int] = None) -> list:
        """Search results [(index, score, text)] (of one query, or a list of such lists
        for several queries) re-scored and re-sorted: the same shape, top k."""
        k = check_count(k, "k", none_ok=True)
        if isinstance(query, str):
            hits = _check_hits(hits, "hits")
            query, texts = _query_and_documents(query, [t for _, _, t in hits])
            # (a note names a cut document by its entry of the corpus, not its rank)
            scores = self._scores(query, texts, [i + 1 if isinstance(i, numbers.Integral)
                                                 and not isinstance(i, bool) else i
                                                 for i, _, _ in hits])
            return [(hits[j][0], scores[j], texts[j]) for j in _top(scores, k)]
        queries = check_texts(query, "query")
        if isinstance(hits, (str, bytes)) or not hasattr(hits, "__len__") \
                or len(hits) != len(queries):
            raise ValueError(f"hits: expected one list of (index, score, text) hits per query "
                             f"({len(queries)}), got {type(hits).__name__}")
        return [self.rerank_hits(q, _check_hits(h, f"hits[{i}]"), k)
                for i, (q, h) in enumerate(zip(queries, hits))]

    def rerank(self, query: str, documents, k: Optional[int] = None) -> list:
        """[(index, score, text)] of the documents, most relevant first (top k; None: all)."""
        k = check_count(k, "k", none_ok=True)
        query, documents = _query_and_documents(query, documents)
        scores = self.score(query, documents)
        return [(i, scores[i], documents[i]) for i in _top(scores, k)]


def _top(scores: list, k: Optional[int]) -> list:
    """The indices of the k highest scores (None: all), highest first."""
    return sorted(range(len(scores)), key=lambda i: -scores[i])[:k]


# label names that read as "not relevant": a two-label classifier whose second label is
# one (QNLI's not_entailment, a match/mismatch pair) ranks the least relevant first
NEGATIVE_LABEL = re.compile(r"^(not|non|no)([-_ ]|$)|neg|mismatch|contradict|irrelevant|"
                            r"unrelated|^false$|^wrong$", re.I)


def note_negative_second_label(model_dir, model) -> None:
    """A note where a two-label classifier, which reranks by its second label's
    probability, names that label as the negative class and its first one not."""
    labels = model.config.id2label or {}
    if model.head != "classify" or model.config.num_labels != 2 or len(labels) != 2:
        return
    first, second = (str(labels[i]) for i in sorted(labels))
    if NEGATIVE_LABEL.search(second) and not NEGATIVE_LABEL.search(first):
        note(f"{model_dir}: a two-label classifier reranks by its second label's probability, "
             f"and its second label is {second!r} (its first {first!r}): the least relevant "
             "documents would rank first; fine-tune it with the relevant label second")


def _check_pair_head(model_dir, model) -> None:
    """A head that scores a pair: one output (regression, a one-label classifier) or a
    classifier of two labels (what the server's /rerank serves); else an error naming
    what the model is."""
    n = model.config.num_labels
    if model.head == "regression" and n == 1 or model.head == "classify" and n in (1, 2):
        return
    if model.head == "classify":
        labels = ", ".join(str(model.config.id2label[i]) for i in sorted(model.config.id2label))
        raise NanobertError(f"{model_dir}: a classifier of {n} labels ({labels[:80]}), not a "
                            "reranker (one output, or two labels: the second one's probability "
                            "is the relevance)")
    raise NanobertError(f"{model_dir}: not a cross-encoder (needs a sequence head with one "
                        f"output, or a classifier of two labels; this model's head is "
                        f"{model.head or 'none'})")


def _query_and_documents(query, documents) -> tuple:
    """(query, list of documents), checked: one query string, documents a list of strings
    (one string would be read as its characters)."""
    check_text(query, "query")
    if isinstance(documents, str):
        raise TypeError("documents must be a list of strings, got one string (pass "
                        "[document] to score one)")
    if not hasattr(documents, "__iter__"):
        raise TypeError(f"documents must be a list of strings, got {type(documents).__name__}")
    return query, check_texts(documents, "documents")


def _check_hits(hits, name: str) -> list:
    """One query's search results: a list of (index, score, text) hits."""
    if isinstance(hits, (str, bytes)) or not hasattr(hits, "__iter__"):
        raise TypeError(f"{name} must be a list of (index, score, text) hits, got "
                        f"{type(hits).__name__}")
    hits = list(hits)
    for i, h in enumerate(hits):
        if not (isinstance(h, (tuple, list)) and len(h) == 3 and isinstance(h[2], str)):
            raise ValueError(f"{name}[{i}] must be an (index, score, text) hit, as "
                             f"Encoder.search gives, got {h!r}"[:200])
    return hits
