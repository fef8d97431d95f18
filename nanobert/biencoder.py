"""Training embedding models (bi-encoders) and cross-encoder rerankers.

    bi-encoder     text ──► encoder ──► pool (mean or [CLS]) ──► vector; one shared encoder
                   for both sides; similarity = cosine
    cross-encoder  [CLS] query [SEP] document [SEP] ──► encoder ──► one logit (relevance)

The data decide the bi-encoder's loss:

    (anchor, positive[, negative]) rows   MultipleNegativesRanking: for anchor i, its
                                          positive against every other candidate of the
                                          batch (the other positives, all negatives):
                                          cross-entropy over scale * cos(anchor, candidates)
    (text_a, text_b, score) rows          CoSENT: log(1 + sum over pairs (i, j) with
                                          score_i > score_j of exp(scale*(cos_j - cos_i)));
                                          or cosine-MSE: (cos - score / max score)^2
    a BEIR folder                         (query, relevant document) rows of its qrels: MNRL

Large batches on small memory: the in-batch-negatives loss needs every vector of the
batch at once, so plain gradient accumulation (separate micro-batches) would shrink the
set of negatives. Gradient caching (GradCache, Gao et al. 2021) keeps the full batch:
    1. embed the batch in mini-batches without keeping activations (only the vectors)
    2. the loss over all vectors; its backward gives d loss / d vector, exactly
    3. re-run each mini-batch with the same dropout masks and push d loss / d vector
       through it, one mini-batch of activations in memory at a time
Steps 1 and 3 are what non-reentrant activation checkpointing of each mini-batch does
(`torch.utils.checkpoint`, RNG state preserved), so that is how it is written here.

Output: a Hugging Face directory (BertModel) plus the sentence-transformers files
(modules.json, 1_Pooling/config.json, sentence_bert_config.json,
config_sentence_transformers.json), so `SentenceTransformer(dir)` loads it; a reranker
is a BertForSequenceClassification with one label.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from .files import NanobertError

POOLINGS = ("mean", "cls")


# ----------------------------------------------------------------------------------
# Losses: vectors in, a scalar out


def cosine_matrix(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a (n, H), b (m, H) -> (n, m) cosine similarities."""
    return F.normalize(a, dim=-1) @ F.normalize(b, dim=-1).T


def mnrl_loss(anchors, candidates, scale: float = 20.0) -> torch.Tensor:
    """MultipleNegativesRanking. anchors (B, H); candidates (C, H), C >= B, whose row i
    is the positive of anchor i (the others, hard negatives included, are negatives)."""
    logits = scale * cosine_matrix(anchors, candidates)                  # (B, C)
    return F.cross_entropy(logits, torch.arange(len(anchors), device=logits.device))


def cosent_loss(u, v, scores, scale: float = 20.0) -> torch.Tensor:
    """CoSENT: every pair of pairs whose gold order is i above j adds
    exp(scale * (cos_j - cos_i)); the loss is log(1 + their sum)."""
    cos = scale * F.cosine_similarity(u, v, dim=-1)                      # (B,)
    diff = cos[None, :] - cos[:, None]                                   # [i, j] = cos_j - cos_i
    above = scores[:, None] > scores[None, :]                            # i should rank above j
    diff = diff.masked_fill(~above, float("-inf")).flatten()
    return torch.logsumexp(torch.cat([diff.new_zeros(1), diff]), dim=0)  # the 1 is exp(0)


def cosine_mse_loss(u, v, scores, scale: float = 1.0) -> torch.Tensor:
    """Mean squared error between cos(u, v) and the gold score (already in [0, 1])."""
    return F.mse_loss(F.cosine_similarity(u, v, dim=-1), scores)


# loss name -> (function of (first column, other columns, scores, scale), needs scores)
LOSSES = {
    "mnrl": (lambda a, rest, scores, scale: mnrl_loss(a, rest, scale), False),
    "cosent": (lambda a, rest, scores, scale: cosent_loss(a, rest[:len(a)], scores, scale), True),
    "cosine_mse": (lambda a, rest, scores, scale: cosine_mse_loss(a, rest[:len(a)], scores), True),
}


# ----------------------------------------------------------------------------------
# Embedding a batch, with or without gradient caching


def sentence_vectors(model, input_ids, attention_mask, token_type_ids=None,
                     pooling: str = "mean") -> torch.Tensor:
    """(B, T) token ids -> (B, H) pooled, unnormalised vectors, with gradients. The
    encoder's hidden states stay unpadded when the backend allows (no work on padding)."""
    encoder = getattr(model, "bert", model)
    out = encoder(input_ids, attention_mask, token_type_ids, keep_unpadded=True)
    h = out.last_hidden_state
    return out.layout.first_tokens(h) if pooling == "cls" else out.layout.mean_tokens(h)


def cached_vectors(model, input_ids, attention_mask, token_type_ids=None,
                   pooling: str = "mean", mini_batch: Optional[int] = None) -> torch.Tensor:
    """`sentence_vectors` of a large batch, `mini_batch` rows at a time, keeping only the
    vectors; the backward pass re-runs each mini-batch (same dropout masks) to carry the
    vectors' gradients into the weights. Gradients equal those of one big batch."""
    B = input_ids.shape[0]
    if token_type_ids is None:
        token_type_ids = torch.zeros_like(input_ids)
    if not mini_batch or mini_batch >= B or not torch.is_grad_enabled():
        return sentence_vectors(model, input_ids, attention_mask, token_type_ids, pooling)

    def run(ids, mask, types):
        return sentence_vectors(model, ids, mask, types, pooling)
    parts = [checkpoint(run, input_ids[i:i + mini_batch], attention_mask[i:i + mini_batch],
                        token_type_ids[i:i + mini_batch], use_reentrant=False,
                        preserve_rng_state=True)
             for i in range(0, B, mini_batch)]
    return torch.cat(parts)


@dataclass
class EmbedLoss:
    """How a bi-encoder batch becomes a loss."""
    kind: str = "mnrl"                # a key of LOSSES
    pooling: str = "mean"             # mean | cls
    scale: float = 20.0               # inverse temperature of the cosine (MNRL, CoSENT)
    mini_batch: Optional[int] = None  # gradient caching: rows embedded at a time

    def __post_init__(self):
        if self.kind not in LOSSES:
            raise NanobertError(f"unknown loss {self.kind!r} (choose {', '.join(LOSSES)})")
        if self.pooling not in POOLINGS:
            raise NanobertError(f"unknown pooling {self.pooling!r} (choose {', '.join(POOLINGS)})")


def embed_loss_fn(spec: EmbedLoss):
    """loss(model, batch) for the Trainer. The batch holds the first column as
    input_ids/attention_mask (B rows, so the trainer counts pairs) and the other columns
    as rest_input_ids/rest_attention_mask ((k - 1) * B rows), padded alike."""
    fn = LOSSES[spec.kind][0]

    def loss_fn(model, batch):
        B = batch["input_ids"].shape[0]
        ids = torch.cat([batch["input_ids"], batch["rest_input_ids"]])
        mask = torch.cat([batch["attention_mask"], batch["rest_attention_mask"]])
        vecs = cached_vectors(model, ids, mask, None, spec.pooling, spec.mini_batch)
        return fn(vecs[:B], vecs[B:], batch.get("scores"), spec.scale)
    return loss_fn


def rerank_loss_fn():
    """loss(model, batch) for a cross-encoder: binary cross-entropy of the one logit
    against the label scaled into [0, 1] (graded labels give soft targets)."""
    def loss_fn(model, batch):
        logits = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).logits
        return F.binary_cross_entropy_with_logits(logits.squeeze(-1), batch["scores"])
    return loss_fn


# ----------------------------------------------------------------------------------
# Training data: rows -> token ids once -> padded batches


def loss_for_rows(rows: list, scored_loss: str = "cosent") -> str:
    """The loss the data call for: scored pairs -> `scored_loss`; 2-3 texts -> MNRL."""
    width = {len(r.texts) for r in rows}
    if len(width) != 1:
        raise NanobertError("rows must all have the same number of texts")
    if rows[0].score is not None:
        if width != {2}:
            raise NanobertError("scored rows must be pairs (text_a, text_b, score)")
        return scored_loss
    if width == {1}:
        raise NanobertError("a bi-encoder needs pairs (anchor, positive[, negative]) or scored "
                            "pairs; found single texts")
    return "mnrl"


def scaled_scores(rows: list, loss: str) -> list:
    """Gold scores as the loss wants them: cosine-MSE regresses the cosine onto
    score / max score (STS 0-5 -> 0-1); CoSENT only uses their order."""
    scores = [r.score for r in rows]
    if loss != "cosine_mse":
        return scores
    top = max(abs(s) for s in scores) or 1.0
    return [s / top if top > 1 else s for s in scores]


class RowBatches:
    """Tokenized rows, cut into the batches of an epoch. `columns` mode puts each text
    in its own sequence (bi-encoder); `cross` mode joins (query, document) into one
    (cross-encoder)."""

    def __init__(self, tok, rows: list, max_length: int, batch_size: int, seed: int,
                 scores: Optional[list] = None, cross: bool = False):
        self.tok, self.batch_size, self.seed, self.cross = tok, batch_size, seed, cross
        if cross:
            self.cols = [tok.encode_batch([r.texts[0] for r in rows], [r.texts[1] for r in rows],
                                          max_length=max_length, report="training pairs")]
        else:
            self.cols = [tok.encode_batch([r.texts[c] for r in rows], max_length=max_length,
                                          report="training texts")
                         for c in range(len(rows[0].texts))]
        self.scores = scores
        self.n = len(rows)
        self.steps_per_epoch = -(-self.n // batch_size)

    def __call__(self, epoch: int, start: int = 0):
        from .finetune import epoch_order
        order = epoch_order(self.n, self.seed, epoch)
        for b in range(start, self.steps_per_epoch):
            yield self.collate(order[b * self.batch_size:(b + 1) * self.batch_size])

    def collate(self, idx: list) -> dict:
        encs = [col[i] for col in self.cols for i in idx]          # column by column
        batch = self.tok.pad(encs)                                  # one T for all columns
        B = len(idx)
        out = {k: v[:B] for k, v in batch.items()}
        if len(self.cols) > 1:
            out["rest_input_ids"] = batch["input_ids"][B:]
            out["rest_attention_mask"] = batch["attention_mask"][B:]
        if self.scores is not None:
            out["scores"] = torch.tensor([self.scores[i] for i in idx], dtype=torch.float)
        return out


# ----------------------------------------------------------------------------------
# BEIR training data: held-out queries, (query, relevant document) rows, hard negatives


def held_out(query_id: str, fraction: float) -> bool:
    """Is this query in the held-out part? Decided by a hash of its id, so training and
    evaluation agree without sharing a file or a seed."""
    h = int(hashlib.sha1(str(query_id).encode()).hexdigest()[:8], 16)
    return h / 16**8 < fraction


def query_split(beir, holdout: float = 0.0) -> tuple:
    """(training query ids, held-out query ids) among the judged queries."""
    if not 0 <= holdout < 1:
        raise NanobertError(f"--holdout must be in [0, 1), got {holdout}")
    qids = list(beir.qrels)
    held = [q for q in qids if held_out(q, holdout)]
    return [q for q in qids if not held_out(q, holdout)], held


def beir_rows(beir, query_ids: list, negatives: Optional[dict] = None, labelled=False) -> list:
    """TextRows of (query, relevant document[, hard negative]); with `labelled`,
    (query, document) rows scored 1 (relevant) or 0 (each hard negative)."""
    from .data import TextRow
    rows = []
    for q in query_ids:
        for d, rel in beir.qrels[q].items():
            if rel <= 0 or d not in beir.corpus:
                continue
            negs = (negatives or {}).get(q, [])
            if labelled:
                rows.append(TextRow((beir.queries[q], beir.doc_text(d)), 1.0))
                rows += [TextRow((beir.queries[q], beir.doc_text(n)), 0.0) for n in negs]
            elif negs:
                rows.append(TextRow((beir.queries[q], beir.doc_text(d), beir.doc_text(negs[0]))))
            else:
                rows.append(TextRow((beir.queries[q], beir.doc_text(d))))
    if not rows:
        raise NanobertError("no (query, relevant document) pairs in the training queries")
    return rows


def mine_negatives(encode, beir, query_ids: list, n: int, skip: int = 0) -> dict:
    """{query: [doc ids]}: the `n` best-scoring unjudged documents of each query under
    `encode` (an embedding function), after skipping the `skip` best (likely unjudged
    positives)."""
    from .retrieval import dense_run, ranking
    doc_ids = list(beir.corpus)
    run = dense_run(encode([beir.queries[q] for q in query_ids]), query_ids,
                    encode([beir.doc_text(d) for d in doc_ids]), doc_ids, k=n + skip + 10)
    out = {}
    for q in query_ids:
        cands = [d for d in ranking(run[q]) if d not in beir.qrels[q] and d != q]
        out[q] = cands[skip:skip + n]
    return out


# ----------------------------------------------------------------------------------
# The sentence-transformers layout


def st_files(hidden_size: int, pooling: str, max_seq_length: int, normalize: bool = True) -> dict:
    """{relative path: text} of the sentence-transformers files of a bi-encoder: the
    classic layout (Transformer, Pooling, Normalize), which every sentence-transformers
    version from 2 on loads."""
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling",
                "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize",
                        "type": "sentence_transformers.models.Normalize"})
    pool = {"word_embedding_dimension": hidden_size,
            "pooling_mode_cls_token": pooling == "cls",
            "pooling_mode_mean_tokens": pooling == "mean",
            "pooling_mode_max_tokens": False,
            "pooling_mode_mean_sqrt_len_tokens": False}
    st = {"__version__": {"sentence_transformers": "2.2.2", "nanobert": _version()},
          "prompts": {}, "default_prompt_name": None, "similarity_fn_name": "cosine"}

    def dump(obj):
        return json.dumps(obj, indent=2) + "\n"
    return {"modules.json": dump(modules), "1_Pooling/config.json": dump(pool),
            "sentence_bert_config.json": dump({"max_seq_length": max_seq_length,
                                               "do_lower_case": False}),
            "config_sentence_transformers.json": dump(st)}


def _version() -> str:
    from . import __version__
    return __version__


def save_embedding_model(model, tokenizer, out_dir, pooling: str = "mean",
                         max_seq_length: int = 256, normalize: bool = True,
                         extra_files: Optional[dict] = None):
    """Write a bi-encoder (a `Bert` without head) as a BertModel directory in the
    sentence-transformers layout."""
    from .checkpoint import save_model
    if model.head is not None:
        raise NanobertError(f"an embedding model has no task head (this one has {model.head!r})")
    files = st_files(model.config.hidden_size, pooling, max_seq_length, normalize)
    save_model(model, out_dir, tokenizer=tokenizer, extra_files={**files, **(extra_files or {})})
