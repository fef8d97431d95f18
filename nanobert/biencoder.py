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
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from . import retrieval as R
from .config import Config, at_least, fraction, param, temperature
from .files import NanobertError, note, noting_as, with_article

POOLINGS = ("mean", "cls")


# ----------------------------------------------------------------------------------
# Losses: vectors in, a scalar out


def cosine_matrix(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a (n, H), b (m, H) -> (n, m) cosine similarities."""
    return F.normalize(a, dim=-1) @ F.normalize(b, dim=-1).T


def mnrl_loss(anchors, candidates, scale: float = 20.0,
              exclude: Optional[torch.Tensor] = None) -> torch.Tensor:
    """MultipleNegativesRanking. anchors (B, H); candidates (C, H), C >= B, whose row i
    is the positive of anchor i (the others, hard negatives included, are negatives).
    `exclude` (B, C) bool: candidates that are no negative of that anchor (left out)."""
    logits = scale * cosine_matrix(anchors, candidates)                  # (B, C)
    if exclude is not None:
        logits = logits.masked_fill(exclude, float("-inf"))
    return F.cross_entropy(logits, torch.arange(len(anchors), device=logits.device))


def false_negatives(anchors: list, candidates: list) -> torch.Tensor:
    """(B, C) bool: candidate j is no negative of anchor i (j != i) when it is the same
    text as i's positive, or the positive of a row with i's anchor (a query with two
    relevant documents; a triplet file's anchor with two positives). Keys: token ids."""
    codes: dict = {}
    a = torch.tensor([codes.setdefault(("a", t), len(codes)) for t in anchors])
    c = torch.tensor([codes.setdefault(("c", t), len(codes)) for t in candidates])
    B = len(anchors)
    out = c[None, :] == c[:B, None]                                      # i's positive again
    out[:, :B] |= a[None, :] == a[:, None]                               # a row of i's anchor
    return out & (torch.arange(len(candidates))[None, :] != torch.arange(B)[:, None])


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


# loss name -> (function of (first column, other columns, the batch, scale), needs scores)
LOSSES = {
    "mnrl": (lambda a, rest, batch, scale: mnrl_loss(a, rest, scale, batch.get("exclude")),
             False),
    "cosent": (lambda a, rest, batch, scale: cosent_loss(a, rest[:len(a)], batch["scores"], scale),
               True),
    "cosine_mse": (lambda a, rest, batch, scale: cosine_mse_loss(a, rest[:len(a)],
                                                                 batch["scores"]), True),
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
        return fn(vecs[:B], vecs[B:], batch, spec.scale)
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


def token_column(tok, inputs: list, max_length: int, what: str):
    """One column of texts (or of (query, document) pairs) as token ids (`TokenRows`),
    tokenized a chunk at a time (`encode_chunks`, one truncation note naming `what`)."""
    from .batching import TokenRows
    from .tokenizer import encode_chunks
    return TokenRows.of([(e.ids, e.type_ids) for e in encs]
                        for _, encs in encode_chunks(tok, inputs, None, max_length, what))


class RowBatches:
    """Tokenized rows (the features of the embed and rerank tasks), cut into an epoch's
    batches by a plan(lengths, epoch) -> [[row index, ...], ...] (the fine-tuning plan:
    a seeded shuffle, optionally grouped by length). Bi-encoder rows keep each text in
    its own sequence; `cross` joins (query, document) into one (cross-encoder)."""

    def __init__(self, tok, rows: list, max_length: int, scores: Optional[list] = None,
                 cross: bool = False):
        self.tok = tok
        if cross:
            self.cols = [token_column(tok, [(r.texts[0], r.texts[1]) for r in rows], max_length,
                                      "training pairs")]
        else:
            n = len(rows[0].texts)
            self.cols = [token_column(tok, [r.texts[c] for r in rows], max_length,
                                      f"training {column_name(c, n, scores is not None)}")
                         for c in range(n)]
        self.lengths = [max(n) for n in zip(*(col.lengths() for col in self.cols))]
        self.scores, self.cross = scores, cross

    def __len__(self) -> int:
        return len(self.lengths)

    def batches(self, plan) -> tuple:
        """(batches(epoch, start) for the Trainer, batches per epoch)."""
        def batches(epoch, start=0):
            for idx in plan(self.lengths, epoch)[start:]:
                yield self.collate(idx)
        return batches, len(plan(self.lengths, 0))

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
        elif len(self.cols) > 1 and not self.cross:   # MNRL: in-batch false negatives
            exclude = false_negatives([e.ids.tobytes() for e in encs[:B]],
                                      [e.ids.tobytes() for e in encs[B:]])
            if exclude.any():
                out["exclude"] = exclude
        return out


def column_name(c: int, n: int, scored: bool) -> str:
    """What the truncation notes call column c (of n) of training rows: anchors,
    positives, negatives (numbered where a BEIR run mines several); first and second
    texts of scored pairs."""
    if scored:
        return ("first texts", "second texts")[c]
    if c < 2:
        return ("anchors", "positives")[c]
    return "negatives" if n == 3 else f"negatives #{c - 1}"


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


def holdout_split(beir, settings: dict) -> tuple:
    """`query_split` by a run's `holdout`. A holdout that holds out none is refused: every
    query, the training ones too, was scored as if none were asked (and training found
    out only at its first evaluation, after mining hard negatives)."""
    holdout = settings.get("holdout") or 0.0
    train_q, held = query_split(beir, holdout)
    if holdout and not held:
        raise NanobertError(f"{getattr(beir, 'root', None) or 'the BEIR folder'}: --holdout "
                            f"{holdout:g} holds out none of its {len(beir.qrels)} judged queries "
                            "(a query is held out by a hash of its id); use a larger --holdout")
    if holdout and not any(g > 0 for q in held for g in beir.qrels[q].values()):
        # (as a folder with nothing relevant is refused: every metric would be 0)
        raise NanobertError(f"{getattr(beir, 'root', None) or 'the BEIR folder'}: --holdout "
                            f"{holdout:g} holds out {len(held)} judged quer"
                            f"{'ies' if len(held) != 1 else 'y'} with no relevant document "
                            "(every grade 0 or less): every metric would be 0; use a larger "
                            "--holdout")
    return train_q, held


def queries_fingerprint(beir) -> str:
    """Which BEIR folder a run held queries out of: a hash of its query ids (saved as
    `holdout_of`; a copy of the folder elsewhere is the same one)."""
    return hashlib.sha1("\n".join(sorted(beir.queries)).encode()).hexdigest()[:16]


def holdout_applies(beir, settings: dict) -> bool:
    """A holdout saved with the model is of the folder it was trained on: another folder
    is scored whole (its hash-held-out part had been scored, silently)."""
    saved = settings.get("holdout_of")
    return bool(settings.get("holdout")) and not (saved and saved != queries_fingerprint(beir))


def scored_queries(beir, settings: dict) -> Optional[list]:
    """The queries evaluation scores: the held-out ones with `holdout` (of this folder),
    else None (all)."""
    if settings.get("holdout") and not holdout_applies(beir, settings):
        note(f"{beir.root or 'the BEIR folder'}: not the folder the model was trained on, so "
             f"its holdout {settings['holdout']:g} does not apply: every judged query is scored")
        held = []
    else:
        held = holdout_split(beir, settings)[1]
    if beir.sample:        # (--max-dev-examples: n of them)
        return beir.sampled(held or list(beir.qrels))
    return held or None


def queries_used(beir, settings: dict, training: bool) -> int:
    """How many judged queries of a BEIR folder a run trains on (`training`) or scores:
    with `holdout`, the held-out ones are scored and the rest trained on; a --dev folder
    other than the training one is scored whole."""
    beir = beir_split(beir, settings, training)
    if not training and not holdout_applies(beir, settings):
        return len(beir.sampled(query_split(beir)[0]))
    train_q, held = holdout_split(beir, settings)
    return len(beir.sampled(train_q if training else held))


def beir_rows(beir, query_ids: list, negatives: Optional[dict] = None, labelled=False) -> list:
    """TextRows of (query, relevant document[, its hard negatives]); with `labelled`,
    (query, document) rows scored by the judged grade (relevant) or 0 (each hard negative,
    once a query: it had been repeated for each relevant document, and every grade read 1)."""
    from .data import TextRow
    rows, negatives = [], negatives or {}
    # unlabelled rows are (query, relevant, negative 1, ..., negative k), one width for all
    # (MNRL reads every column after the first as candidates): k is the fewest any query
    # has; --hard-negatives 3 had trained on the first negative alone
    counts = {q: len(negatives.get(q, [])) for q in query_ids}
    few = min(counts, key=counts.get, default=None)
    k = counts[few] if few is not None else 0
    if not labelled and k < max(counts.values(), default=0):
        note(f"{k} hard negative(s) per training row: query {few!r} has no more unjudged "
             "documents")
    for q in query_ids:
        negs = negatives.get(q, [])
        relevant = [(d, rel) for d, rel in beir.qrels[q].items() if rel > 0 and d in beir.corpus]
        for d, rel in relevant:
            if labelled:
                rows.append(TextRow((beir.queries[q], beir.doc_text(d)), float(rel)))
            else:
                rows.append(TextRow((beir.queries[q], beir.doc_text(d),
                                     *(beir.doc_text(n) for n in negs[:k]))))
        if labelled and relevant:
            rows += [TextRow((beir.queries[q], beir.doc_text(n)), 0.0) for n in negs]
    if not rows:
        raise NanobertError(f"{beir.root or 'the BEIR folder'}: no (query, relevant document) "
                            f"pairs among the {len(query_ids)} training queries (every judged "
                            "document missing from corpus.jsonl, or graded 0)")
    return rows


def mine_negatives(encode, beir, query_ids: list, n: int, skip: int = 0) -> dict:
    """{query: [doc ids]}: the `n` best-scoring unjudged documents of each query under
    `encode` (an embedding function), after skipping the `skip` best (likely unjudged
    positives)."""
    doc_ids = list(beir.corpus)
    run = R.dense_run(encode([beir.queries[q] for q in query_ids]), query_ids,
                    encode([beir.doc_text(d) for d in doc_ids]), doc_ids, k=n + skip + 10)
    out = {}
    for q in query_ids:
        cands = [d for d in R.ranking(run[q]) if d not in beir.qrels[q] and d != q]
        out[q] = cands[skip:skip + n]
    return out


# ----------------------------------------------------------------------------------
# The sentence-transformers layout


def st_files(hidden_size: int, pooling: str, max_seq_length: int, normalize: bool = True,
             prompts: Optional[dict] = None, include_prompt: bool = True) -> dict:
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
    if not include_prompt:
        pool["include_prompt"] = False     # (instructor-style: the prompt is not pooled)
    st = {"__version__": {"sentence_transformers": "2.2.2", "nanobert": _version()},
          "prompts": {}, "default_prompt_name": None, "similarity_fn_name": "cosine",
          **(prompts or {})}

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
    from .checkpoint import save_model, st_prompts   # (the starting model's prompts kept,
    if model.head is not None:                         # as sentence-transformers keeps them)
        raise NanobertError(f"an embedding model has no task head (this one has {model.head!r})")
    from .embed import declared_include_prompt
    source = getattr(model, "source_dir", None)
    prompts = st_prompts(source)
    files = st_files(model.config.hidden_size, pooling, max_seq_length, normalize, prompts,
                     include_prompt=not prompts or declared_include_prompt(source))
    save_model(model, out_dir, tokenizer=tokenizer, extra_files={**files, **(extra_files or {})})


# ----------------------------------------------------------------------------------
# Training through the one Trainer: what the `embed` and `rerank` tasks hand to it


@dataclass
class RetrievalConfig(Config):
    """The settings of the embed and rerank tasks (flags of `nanobert finetune`; the
    BEIR ones also of `nanobert evaluate`)."""
    loss: Optional[str] = param(None, "embed: the loss (default: from the data: mnrl for "
                                "pairs, triplets and BEIR folders, cosent for scored pairs)",
                                choices=("mnrl", "cosent", "cosine_mse"))
    pooling: Optional[str] = param(
        None, "how token vectors become the one vector of a text (pair): embed: mean or "
        "cls (default: the starting checkpoint's sentence-transformers pooling, else mean); "
        "classify, regress: cls (BERT's [CLS], the vector transformers' "
        "classifiers read; ModernBERT: the pooling the checkpoint declares) or mean; rerank: cls",
        choices=POOLINGS)
    scale: float = param(20.0, "embed: inverse temperature of the cosine (MNRL, CoSENT)",
                         temperature())
    mini_batch_size: Optional[int] = param(
        None, "embed: gradient caching, rows embedded at a time (the loss still sees the "
        "whole --batch-size, in-batch negatives included)", at_least(1))
    hard_negatives: int = param(0, "BEIR training: hard negatives per query, mined with the "
                                "starting model (rerank: 3 when 0)", at_least(0))
    holdout: float = param(0.0, "BEIR: fraction of the judged queries held out (by a hash of "
                           "the query id): not trained on, the only ones evaluated",
                           fraction(open_hi=True))
    split: Optional[str] = param(None, "BEIR: the qrels split (default: train for training; "
                                 "for --dev: dev, validation, test, train, the first that "
                                 "exists)")
    retriever: str = param("minilm", "rerank on a BEIR folder: the embedding model that "
                           "retrieves the candidates")
    rerank_k: int = param(100, "rerank on a BEIR folder: candidates reranked per query",
                          at_least(1))


def embed_features(tok, data, settings: dict, label2id=None) -> RowBatches:
    """The rows of a bi-encoder run, tokenized; an explicit --loss must fit them."""
    rows = training_rows(tok, data, settings, labelled=False)
    kind = settings.get("loss") or loss_for_rows(rows)
    if LOSSES[kind][1] != (rows[0].score is not None):
        raise NanobertError(f"--loss {kind}: the training rows are "
                            f"{'scored pairs' if rows[0].score is not None else 'unscored'}; "
                            f"use {loss_for_rows(rows)}")
    settings["loss"] = kind       # (nanobert.json says the loss run, not the flag's None)
    print(f"embed: {len(rows)} training rows of {len(rows[0].texts)} text(s), loss {kind}, "
          f"{settings.get('pooling') or 'mean'} pooling", flush=True)
    scores = scaled_scores(rows, kind) if rows[0].score is not None else None
    return RowBatches(tok, rows, settings["max_length"], scores)


def embed_loss(cfg):
    """loss(model, batch) of a bi-encoder run (cfg: the FinetuneConfig): scored batches
    take --loss (CoSENT by default), the others MNRL."""
    r = cfg.retrieval
    scored = r.loss if r.loss in ("cosent", "cosine_mse") else "cosent"
    by_kind = {kind: embed_loss_fn(EmbedLoss(kind, r.pooling or "mean", r.scale, r.mini_batch_size))
               for kind in ("mnrl", scored)}
    return lambda model, batch: by_kind[scored if "scores" in batch else "mnrl"](model, batch)


def rerank_features(tok, data, settings: dict, label2id=None) -> RowBatches:
    """(query, document) rows with labels scaled into [0, 1], or a BEIR folder's qrels
    with hard negatives mined by the starting model."""
    rows = training_rows(tok, data, settings, labelled=True)
    if any(len(r.texts) != 2 or r.score is None for r in rows):
        raise NanobertError("a reranker trains on (query, document, label) rows")
    top = max(r.score for r in rows)
    if min(r.score for r in rows) < 0 or top <= 0:
        raise NanobertError("reranking labels must be >= 0, some > 0 (relevance grades)")
    return RowBatches(tok, rows, settings["max_length"], [r.score / top for r in rows], cross=True)


def embedding_writer(tok, settings: dict):
    """save(model, out_dir) of a bi-encoder: HF + sentence-transformers layout + settings."""
    def save(model, out_dir):
        save_embedding_model(model, tok, out_dir, settings.get("pooling") or "mean",
                             settings["max_length"], extra_files={
                                 "nanobert.json": json.dumps(settings, indent=2) + "\n"})
    return save


# ----------------------------------------------------------------------------------
# The fine-tuning tasks' functions (their `Task` records live in nanobert.finetune)


def _columns(cols: dict) -> dict:
    """--text-column / --text-pair-column / --label-column as read_text_rows roles."""
    names = {"text_column": "text", "pair_column": "pair", "label_column": "score"}
    return {names[k]: v for k, v in (cols or {}).items() if k in names and v}


def read_scored(path, cols=None, require=True) -> list:
    """Scored texts or pairs (regression): STS files, tables with a score column."""
    from .data import read_text_rows
    rows = read_text_rows(path, require_score=require, columns=_columns(cols))
    if any(len(r.texts) > 2 for r in rows):
        raise NanobertError(f"{path}: regression takes one text or a pair per row, "
                            "not triplets")
    if require:   # (training and evaluation data; not inputs to predict)
        scores_vary_check(rows, None, path)
    return rows


def read_pairs_or_beir(path, cols=None, require=True):
    """Training / evaluation data of a bi-encoder: a BEIR folder (a `Beir`) or a table
    of rows. Rows without a score are (query, positive[, negative]) rows, so STS/NLI
    pairs (sentence1/sentence2) without their scores are refused: an STS-B test file
    was evaluated as retrieval, every pair, unrelated ones too, counted a match."""
    from .data import read_beir, read_text_rows
    if Path(path).is_dir():  # a BEIR folder, or one that says what it lacks (checked when
        return read_beir(path, check=False)   # its split is chosen: beir_split)
    return read_text_rows(path, columns=_columns(cols), pairs_need_score=True,
                          min_texts=(2, "a bi-encoder needs pairs (anchor, positive[, negative]) "
                                     "or scored pairs; found single texts"))


def read_embed_data(path, cols=None, require=True):
    """Data of a bi-encoder: a BEIR folder, or rows of 2-3 texts (anchor, positive[,
    negative]) or scored pairs. Rows of another shape are refused here, naming the file,
    before any training (a file of single texts would fail at the first evaluation)."""
    from .data import data_error
    data = read_pairs_or_beir(path, cols, require)
    if isinstance(data, list):
        first = data[0]
        if first.score is not None and len(first.texts) != 2:
            raise data_error(path, first.line, "scored rows must be pairs (text_a, text_b, "
                             "score), not triplets")
        if first.score is not None:
            _scores_differ(data, path, "score", "training compares pairs by their scores (a "
                           "loss of 0 when none differ), and evaluation's correlation with "
                           "scores that never vary is undefined (rows without scores are "
                           "(anchor, positive) pairs)")
    return data


def read_rerank_data(path, cols=None, require=True):
    """Data of a cross-encoder reranker: a BEIR folder, or (query, document, label) rows
    whose labels are relevance grades (>= 0, some > 0); refused here, naming the file
    and line, before any training."""
    from .data import data_error, read_beir, read_text_rows
    if Path(path).is_dir():
        return read_beir(path, check=False)
    rows = read_text_rows(path, require_score=True, columns=_columns(cols),
                          min_texts=(2, "a reranker needs (query, document, label) rows; "
                                     "found single texts"),
                          score_kind="relevance grades (numbers >= 0)")
    if len(rows[0].texts) != 2:
        raise data_error(path, rows[0].line, "a reranker needs (query, document, label) rows; "
                         f"found {len(rows[0].texts)} text column(s)")
    negative = next((r for r in rows if r.score < 0), None)
    if negative is not None:
        raise data_error(path, negative.line, f"label {negative.score:g} is negative (reranking "
                         "labels are relevance grades: >= 0, some > 0)")
    if all(r.score == 0 for r in rows):
        raise data_error(path, None, "every label is 0: no relevant document (reranking labels "
                         "are relevance grades: >= 0, some > 0)")
    _scores_differ(rows, path, "label", "nothing tells a relevant document from another "
                   "(reranking needs documents graded differently)")
    return rows


def _scores_differ(rows, path, what: str, why: str):
    """Scored rows whose scores are all one value train nothing (a loss of 0 at every
    step, or one that only pushes every score one way): refused, naming the file."""
    scores = {r.score for r in rows if r.score is not None}
    if scores == {-1}:   # (glue/stsb's test split, as the datasets library writes it)
        raise NanobertError(f"{path}: every {what} is -1, the datasets library's mark of a "
                            "split without labels (a test split): nothing to train on or "
                            "evaluate; embed its texts with `nanobert embed` or `predict`")
    if len(scores) == 1:
        raise NanobertError(f"{path}: every {what} is {next(iter(scores)):g}: {why}")


def beir_split(beir, settings: dict, training: bool):
    """The judgements a run uses: `split` when given; else the train split for training,
    and for evaluation when queries are held out of it; else the folder's default."""
    from .data import beir_splits
    split = settings.get("split")
    if not split and (training or settings.get("holdout")) and "train" in beir_splits(beir.root):
        split = "train"
    return beir.select(split)


# the judgments a fine-tuning run picks its best model by, first found (without --split)
DEV_SPLITS = ("dev", "validation")


def dev_judgments(train, dev, settings: dict):
    """The BEIR --dev folder of a fine-tuning run at the judgments its best model is
    chosen by: `split` when given; the training split when queries are held out of it
    (--holdout); else the folder's dev (or validation) judgments before its test ones (a
    model chosen by the test scores is no longer tested by them: BEIR's default for
    `evaluate` is test). Notes say when the run trains on test judgments, or scores
    the judgments it trains on. Tables are returned as they are."""
    from .data import beir_splits
    if not hasattr(dev, "qrels") or settings.get("split"):
        return dev
    trained = beir_split(train, settings, training=True) if hasattr(train, "qrels") else None
    same = trained is not None and Path(trained.root or ".").resolve() == \
        Path(dev.root or ".").resolve()
    if trained is not None and trained.split == "test":
        note(f"{trained.root}: no qrels/train.tsv, so the run trains on qrels/test.tsv, "
             "BEIR's evaluation judgments: scores on them afterwards are not held out "
             "(give --split to choose)")
    if same and holdout_applies(dev, settings):
        return dev
    split = next((s for s in DEV_SPLITS if s in beir_splits(dev.root)), None)
    chosen = dev.select(split)
    if same and chosen.split == trained.split:
        note(f"{dev.root}: the dev evaluation scores qrels/{chosen.split}.tsv, the judgments "
             "the run trains on, so its scores are not held out; hold queries out with "
             "--holdout 0.2 (or give a --dev folder of other queries)")
    return chosen


def scores_vary_check(rows, model, path, source=None):
    """Evaluation data scored by correlation needs two scores or more that differ (else
    the run failed at its first evaluation, naming no file)."""
    if not isinstance(rows, list):  # a BEIR folder: judged by relevance, not scores
        return
    _scores_differ(rows, path, "score", "the correlations (Pearson, Spearman) need scores "
                   "that vary, and a regression model learns nothing from one target")


def regress_features(tok, rows, settings, label2id=None):
    """Token features of scored texts / pairs, the float score as `labels`: tokenized a
    chunk at a time, with one truncation note (`token_column`), and held as token ids
    (`FeatureRows`): 287,000 STS-B pairs held as lists took 2.62 GB, and a cut pair went
    unsaid."""
    from .batching import FeatureRows
    pairs = len(rows[0].texts) == 2
    inputs = [(r.texts[0], r.texts[1]) if pairs else r.texts[0] for r in rows]
    tokens = token_column(tok, inputs, settings["max_length"],
                          "training pairs" if pairs else "training texts")
    return FeatureRows(tokens, {"labels": [None if r.score is None else float(r.score)
                                           for r in rows]})


def is_pair(row) -> bool:
    """Is this row (of a regress or rerank task) a text pair, not one text?"""
    return len(row.texts) == 2


def _row_pairs(rows) -> list:
    return [(r.texts[0], r.texts[1] if len(r.texts) > 1 else None) for r in rows]


def regress_evaluate(model, tok, rows, settings, batch_size=64, progress=False) -> dict:
    pred = R.pair_scores(model, tok, _row_pairs(rows), settings["max_length"], batch_size,
                         progress)
    gold = [r.score for r in rows]
    mse = sum((p - g) ** 2 for p, g in zip(pred, gold)) / len(gold)
    try:
        return {**R.row_correlations(rows, pred, "score"), "mse": mse}
    except R.UndefinedCorrelation as e:
        e.defined = {"mse": mse}         # (a dev evaluation keeps it beside the NaNs)
        raise


def score_predict(model, tok, rows, settings, batch_size=64, progress=False):
    """Yield {"text"[, "pair"], "score"} per row: the regression output or the reranker's
    logit."""
    pairs = _row_pairs(rows)
    for chunk, logits in R.pair_logit_chunks(model, tok, pairs, settings["max_length"],
                                             batch_size, progress):
        for i, s in zip(chunk, logits[:, 0].tolist()):
            a, b = pairs[i]
            yield {"text": a, **({"pair": b} if b is not None else {}), "score": s}


def score_show(r: dict) -> str:
    return f"{r['score']:.4f}\t{r['text']}" + (f"\t{r['pair']}" if "pair" in r else "")


def text_input(i, value):
    """One Python input of `Predictor.predict`: a text or a (text, pair) tuple."""
    from .data import TextRow
    texts = (value,) if isinstance(value, str) else tuple(value)
    if not texts or len(texts) > 2 or not all(isinstance(t, str) for t in texts):
        raise NanobertError(f"input {i}: expected a text or a (text, text_pair) pair")
    return TextRow(texts)


def text_rows_input(path, cols=None) -> list:
    """`predict --input`: a JSON Lines file, an STS file, or a table (a .tsv/.csv file,
    or another whose header names a text column: `data.reads_as_table`; scores ignored),
    else plain text, one input a line."""
    from .data import ANCHOR_COLUMNS, TextRow, detect_format, is_sts_original, \
        read_text_lines, read_text_rows, reads_as_table, refuse_columns, tabs_noted
    fmt = detect_format(path, plain_text=True)
    given = _columns(cols)
    table = fmt in ("tsv", "csv", "msrp") and (is_sts_original(path, tuple(given.values())) or
                                       reads_as_table(path, fmt, ANCHOR_COLUMNS, given.values()))
    if fmt == "jsonl" or table:
        return read_text_rows(path, require_score=False, columns=given)
    refuse_columns(path, cols)
    return [TextRow((e.text_a,), line=e.line) for e in tabs_noted(read_text_lines(path), path)]


def rows_as_beir(rows: list):
    """A retrieval set made of (query, positive[, negative]) rows: each distinct anchor is
    a query whose relevant documents are the positives of its rows (one query a row had
    scored a perfect model below 1: an anchor's other positives counted as misses); every
    text of the second and third columns is in the corpus. Used to evaluate on held-out
    pairs."""
    from .data import Beir
    docs, queries, qrels, ids = {}, {}, {}, {}
    for r in rows:
        for t in r.texts[1:]:
            docs.setdefault(t, ("", t))
        q = ids.setdefault(r.texts[0], f"q{len(ids)}")
        queries[q] = r.texts[0]
        qrels.setdefault(q, {})[r.texts[1]] = 1
    return Beir(docs, queries, qrels, "rows")


def embed_evaluate(model, tok, data, settings, batch_size=64, progress=False) -> dict:
    """Scored pairs: Spearman/Pearson of the cosine. A BEIR folder (its held-out
    queries when `holdout` is set) or (query, positive) rows: nDCG@10, MRR@10, Recall."""
    from .embed import encode

    def vectors(texts):
        # at the length the model is saved with (sentence_bert_config.json's max_seq_length):
        # during training the model still declared its starting checkpoint's (minilm: 256),
        # and the dev scores in metrics.jsonl differed from `evaluate` on the saved model
        return encode(model, tok, texts, settings.get("pooling"), batch_size=batch_size,
                      max_length=settings.get("max_length"), progress=progress)
    if isinstance(data, list) and data[0].score is not None:
        return R.evaluate_sts(vectors, data)
    if isinstance(data, list):
        return R.evaluate_beir(vectors, rows_as_beir(data))
    beir = beir_split(data, settings, training=False)
    return R.evaluate_beir(vectors, beir, query_ids=scored_queries(beir, settings))


# what evaluate/predict need later (saved in nanobert.json); `model` is the starting model
EMBED_SETTINGS = ("pooling", "loss", "scale", "mini_batch_size", "hard_negatives", "holdout",
                  "split", "model")
RERANK_SETTINGS = ("hard_negatives", "holdout", "split", "retriever", "rerank_k", "model")


def embed_predict(model, tok, rows, settings, batch_size=64, progress=False):
    """Yield per row, for pairs: {"text", "pair", "cosine"}; for single texts: {"text",
    "embedding"} (a list of floats, 30 bytes a dimension: made as it is printed), a
    chunk of rows at a time (`predict` prints each as it comes: a million texts had all
    been embedded, 1.5 GB of vectors, before the first line)."""
    from .batching import size_runs
    from .embed import encode
    from .files import progress_bar
    from .tokenizer import CHUNK_CHARS
    single = all(len(r.texts) == 1 for r in rows)
    if not single and any(len(r.texts) != 2 for r in rows):
        raise NanobertError("give all inputs as single texts, or all as (text, text_pair)")
    with progress_bar(progress, len(rows), "predicting", "text") as bar:
        for idx in size_runs([sum(len(t) for t in r.texts) for r in rows], CHUNK_CHARS):
            chunk = [rows[i] for i in idx]
            vectors = [encode(model, tok, [r.texts[k] for r in chunk], settings.get("pooling"),
                              batch_size=batch_size) for k in range(len(chunk[0].texts))]
            bar.update(len(idx))
            for j, r in enumerate(chunk):
                if single:
                    yield {"text": r.texts[0],
                           "embedding": [round(x, 6) for x in vectors[0][j].tolist()]}
                else:
                    yield {"text": r.texts[0], "pair": r.texts[1],
                           "cosine": round(float(vectors[0][j] @ vectors[1][j]), 6)}


def embed_show(r: dict) -> str:
    if "cosine" in r:
        return f"{r['cosine']:.4f}\t{r['text']}\t{r['pair']}"
    shown = " ".join(f"{x:.4f}" for x in r["embedding"][:4])
    return f"[{shown} ... ({len(r['embedding'])} dims)]\t{r['text']}"


def embed_metric(dev) -> str:
    """The dev metric that picks the best bi-encoder: Spearman on STS, else nDCG@10."""
    return "spearman" if isinstance(dev, list) and dev[0].score is not None else "ndcg_at_10"


def embed_pooling(model_name, given: Optional[str] = None) -> str:
    """The pooling a bi-encoder run trains and saves: --pooling (`given`), else the one
    the starting checkpoint declares (its sentence-transformers Pooling module, as
    `nanobert embed` reads it: a [CLS] model had been trained by its mean), else mean.
    A --pooling other than the declared one, or a declared one training cannot do
    (max, mean_sqrt_len), is noted."""
    from .checkpoint import resolve
    from .embed import declared_pooling
    declared = declared_pooling(resolve(model_name))
    if given:
        if declared is not None and declared != given:
            note(f"--pooling {given}: {model_name} declares {declared} pooling (its "
                 f"sentence-transformers Pooling module); the run trains with {given}")
        return given
    if declared is not None and declared not in POOLINGS:
        note(f"{model_name} declares {declared} pooling, which embed training does not do "
             f"({' or '.join(POOLINGS)}): the run trains with mean (choose with --pooling)")
        return "mean"
    return declared or "mean"


def _start_encoder(name, max_length, device=None):
    """The embedding function of the starting model (to mine hard negatives with), on
    the run's --device ("auto" or None: a GPU where there is one)."""
    from .embed import Encoder
    device = None if device in (None, "auto") else device
    encoder = Encoder(name, max_length=max_length, device=device)

    def encode(texts):
        with noting_as(f"mining with {name}"):
            return encoder.encode(texts, show_progress=True)   # (a bar, or log lines)
    return encode


def training_rows(tok, data, settings, labelled: bool) -> list:
    """Rows of a table as they are; a BEIR folder becomes (query, relevant document) rows
    of its training queries (not the held-out ones), with hard negatives mined by the
    starting model when asked (`hard_negatives`; a reranker always gets some)."""
    if isinstance(data, list):
        return data
    data = beir_split(data, settings, training=True)
    holdout = settings.get("holdout") or 0.0
    if holdout:   # (saved in nanobert.json: evaluate holds out of this folder only)
        settings["holdout_of"] = queries_fingerprint(data)
    train_q, held = holdout_split(data, settings)   # (refused here, before any mining)
    if not train_q:
        raise NanobertError(f"{data.root or 'the BEIR folder'}: --holdout {holdout:g} holds out "
                            f"all {len(held)} judged queries: none is left to train on; use a "
                            "smaller --holdout")
    train_q = data.sampled(train_q)       # (--max-train-examples: n of them)
    n = settings["hard_negatives"] = settings.get("hard_negatives") or (3 if labelled else 0)
    negatives = None
    if n >= len(data.corpus):   # (each query has one judged document or more)
        note(f"--hard-negatives {n}: {data.root or 'the corpus'} has {len(data.corpus)} "
             "documents, so a query gets fewer (its unjudged ones)")
    if n:
        print(f"mining {n} hard negative(s) per query with the starting model", flush=True)
        negatives = mine_negatives(_start_encoder(settings["model"], settings["max_length"],
                                                  settings.get("device")),
                                   data, train_q, n)
    return beir_rows(data, train_q, negatives, labelled=labelled)


def relevance_grade(label: float):
    """A (query, document) row's label as its relevance, nDCG's (linear) gain: the label
    as it is (0, 1, 2, 3; soft labels such as 0.9 and 0.5 too, as scikit-learn's
    ndcg_score takes them: they had been cut to integers, 4.8 and 4.1 one grade and 0.9,
    0.5, 0.1 all 1); 0 or less is not relevant."""
    return 0 if label <= 0 else int(label) if float(label).is_integer() else float(label)


def rerank_check(rows, model, path, source=None):
    """Reranking evaluation rows must rank something: a query with documents of two
    grades or more. Each STS pair its own query (one document) scored nDCG, MRR and
    recall 1.0 at every evaluation, whatever the model."""
    if not isinstance(rows, list):   # a BEIR folder: the retriever's candidates are ranked
        return
    from .data import last_grades    # (as evaluation reads them: a pair listed twice, once)
    rows = last_grades(rows, quiet=True)
    queries, ranked = len({r.texts[0] for r in rows}), _ranked_queries(rows)
    if not ranked:
        raise NanobertError(f"{path}: no query has documents of two relevance grades ({queries} "
                            f"queries, {len(rows)} rows): every ranking would score 1.0; "
                            "reranking is evaluated on queries with several documents, some "
                            "more relevant than others")
    if len(ranked) < queries:
        note(f"{path}: {queries - len(ranked)} of {queries} queries have documents of one "
             "relevance grade only (nothing to rank): the metrics are over the other "
             f"{len(ranked)}")


def _ranked_queries(rows) -> set:
    """The queries of (query, document, label) rows whose documents the labels put in
    an order: two relevance grades or more. Any ranking scores the others alike (one
    document: nDCG 1 or 0), so they only dilute the model's metrics."""
    grades = {}
    for r in rows:
        grades.setdefault(r.texts[0], set()).add(relevance_grade(r.score))
    return {q for q, g in grades.items() if len(g) > 1}


def row_id(i: int, n: int) -> str:
    """The document id of row i of n id-less rows, for the ranking's tie rule (ids
    descending, trec_eval's): rows of equal scores rank in file order. Ids "d9" and
    "d10" had ranked by their strings (d9 first), so the metrics changed with the order
    of the rows when two documents scored alike (two texts equal up to --max-length)."""
    return f"d{n - 1 - i:0{len(str(n))}d}"


def rerank_evaluate(model, tok, data, settings, batch_size=64, progress=False) -> dict:
    """(query, document, label) rows: the documents of each query ranked by the model,
    nDCG@10 / MRR@10 against the labels. A BEIR folder: the retriever's top
    `rerank_k` per (held-out) query, reranked, then the retrieval metrics."""

    def scores(pairs):
        with noting_as("reranking"):
            return R.pair_scores(model, tok, pairs, settings["max_length"], batch_size,
                                 progress)
    if isinstance(data, list):
        if data[0].score is None or len(data[0].texts) != 2:
            raise NanobertError("reranker evaluation needs (query, document, label) rows")
        from .data import last_grades
        data = last_grades(data)
        ranked = _ranked_queries(data)
        data = [r for r in data if r.texts[0] in ranked]
        pred = scores([tuple(r.texts) for r in data])
        qids = {}
        run, qrels = {}, {}
        for i, (r, s) in enumerate(zip(data, pred)):
            q = qids.setdefault(r.texts[0], f"q{len(qids)}")
            d = row_id(i, len(data))
            run.setdefault(q, {})[d] = s
            qrels.setdefault(q, {})[d] = relevance_grade(r.score)
        return {"n_queries": len(qrels), **R.retrieval_metrics(qrels, run)}
    from .embed import Encoder
    device = str(next(model.parameters()).device)   # (the reranker's: a --device cpu run's)
    name = settings.get("retriever") or "minilm"
    retriever = Encoder.from_pretrained(name, batch_size=batch_size, device=device)
    data = beir_split(data, settings, training=False)

    def retrieve(texts):
        with noting_as(f"the retriever {name}"):
            return retriever.encode(texts, show_progress=progress)
    return R.evaluate_beir(retrieve, data, query_ids=scored_queries(data, settings),
                           rerank=scores, rerank_k=settings.get("rerank_k") or 100)


EVALUATE_FLAGS = ("holdout", "split", "retriever", "rerank_k")


def evaluate_flags(p):
    """`nanobert evaluate`'s BEIR flags; unset ones keep what the model was trained with."""
    from .config import add_flags
    skip = [n for n in RetrievalConfig.__dataclass_fields__ if n not in EVALUATE_FLAGS]
    add_flags(p, RetrievalConfig, skip=skip, **dict.fromkeys(EVALUATE_FLAGS))
    unset = "unset: what the model was trained with"     # (not finetune's defaults)
    for action in p._actions:
        if action.dest == "split":
            action.help = ("BEIR: the qrels split (default: the model's --split when it was "
                           "trained with one; train when it held queries out; else test, dev, "
                           "validation, train, the first that exists)")
        elif action.dest in EVALUATE_FLAGS:
            action.help = f"{action.help} ({unset})"


RERANK_ONLY = ("retriever", "rerank_k")   # (of EVALUATE_FLAGS: a reranker's first stage)


def evaluate_overrides(args, task: str) -> dict:
    """The BEIR flags given; refused for other data, or (a reranker's first stage) for
    a model of another `task`, which they would not change."""
    from .data import is_beir_dir
    given = {k: getattr(args, k) for k in EVALUATE_FLAGS if getattr(args, k, None) is not None}
    if "holdout" in given:   # asked for this folder, whichever the model was trained on
        given["holdout_of"] = None
    if given and not is_beir_dir(args.data):
        flag = "--" + next(iter(given)).replace("_", "-")
        raise NanobertError(f"{flag}: only for a BEIR folder (corpus.jsonl, queries.jsonl, "
                            f"qrels/), and {args.data} is not one")
    odd = next((k for k in RERANK_ONLY if k in given and task != "rerank"), None)
    if odd is not None:
        raise NanobertError(f"--{odd.replace('_', '-')}: only for a reranker (it sets the "
                            f"candidates a reranker orders), and {args.model} is "
                            f"{with_article(task)} model")
    return given
