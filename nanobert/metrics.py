"""Task metrics: classification, NER (entity level), SQuAD v1.1, regression.

    classification  accuracy, F1 (binary: of the positive class; else macro), MCC
    NER             entity precision / recall / F1 as seqeval computes them (0-1)
    QA              exact match and F1 after the official SQuAD v1.1 answer
                    normalisation, max over the gold answers, 0-100
    regression      Pearson and Spearman correlation
"""
from __future__ import annotations

import collections
import re
import string
import warnings

import numpy as np

from .files import NanobertError


def classification_metrics(gold, pred, num_labels=None, positive: int = 1) -> dict:
    """gold, pred: sequences of label ids. F1 is the positive class's (id `positive`) for two labels
    (as GLUE reports MRPC/QQP), the macro average otherwise; `f1_macro` is always there.
    The macro average is scikit-learn's: over the classes that occur in gold or pred (a
    class of the model that a test file never mentions is not a zero in the average)."""
    from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef
    gold, pred = np.asarray(gold), np.asarray(pred)
    n = num_labels or int(max(gold.max(initial=0), pred.max(initial=0)) + 1)
    with warnings.catch_warnings():
        # one class in gold and pred (a small or one-sided test file): scikit-learn warns,
        # with a source line, that its confusion matrix has one row; MCC is then 0
        warnings.simplefilter("ignore", UserWarning)
        macro = f1_score(gold, pred, average="macro", zero_division=0)
        f1 = f1_score(gold, pred, pos_label=positive, average="binary", zero_division=0) \
            if n == 2 else macro
        mcc = matthews_corrcoef(gold, pred)
    return {"accuracy": float(accuracy_score(gold, pred)), "f1": float(f1),
            "f1_macro": float(macro), "mcc": float(mcc)}


def ner_metrics(gold_tags, pred_tags) -> dict:
    """gold_tags, pred_tags: lists of sentences of IOB2 tags. Entity-level, seqeval."""
    from seqeval.metrics import f1_score, precision_score, recall_score
    return {"precision": float(precision_score(gold_tags, pred_tags, zero_division=0)),
            "recall": float(recall_score(gold_tags, pred_tags, zero_division=0)),
            "f1": float(f1_score(gold_tags, pred_tags, zero_division=0))}


# ---- SQuAD v1.1 ---------------------------------------------------------------------

_PUNCT = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(s: str) -> str:
    """Lower-case, drop punctuation, drop the articles a/an/the, collapse whitespace."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def squad_f1(prediction: str, gold: str) -> float:
    p, g = normalize_answer(prediction).split(), normalize_answer(gold).split()
    common = collections.Counter(p) & collections.Counter(g)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(p), same / len(g)
    return 2 * precision * recall / (precision + recall)


def squad_exact(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def squad_metrics(predictions: dict, golds: dict) -> dict:
    """predictions: {id: answer text}; golds: {id: [gold answer texts]}. Every gold
    question counts (a missing prediction scores 0). Returns 0-100 like the official script."""
    em = f1 = 0.0
    for qid, answers in golds.items():
        if qid not in predictions:  # unanswered: 0, even for a gold that normalises to ""
            continue
        pred = predictions[qid]
        em += max(squad_exact(pred, a) for a in answers)
        f1 += max(squad_f1(pred, a) for a in answers)
    n = max(1, len(golds))
    return {"exact_match": 100.0 * em / n, "f1": 100.0 * f1 / n}


# ---- regression ---------------------------------------------------------------------

def correlations(gold, pred) -> dict:
    """Pearson and Spearman correlation of two equal-length score lists (STS, regression)."""
    from scipy.stats import pearsonr, spearmanr
    gold, pred = np.asarray(gold, dtype=float), np.asarray(pred, dtype=float)
    if len(gold) < 2 or np.ptp(gold) == 0 or np.ptp(pred) == 0:
        raise NanobertError("correlation needs at least two examples and scores that vary")
    return {"pearson": float(pearsonr(gold, pred)[0]),
            "spearman": float(spearmanr(gold, float_ties(pred))[0])}


def float_ties(scores: np.ndarray, tol: float = 1e-6) -> np.ndarray:
    """`scores` with values within float32 noise of each other made equal, so that they
    tie in a ranking: walking up the sorted values, each joins the tie of the first value
    of its run while it is within a relative `tol` of it (never a chain of small steps:
    ordered scores 1e-7 apart stay ordered over any span). The cosines of the many
    identical pairs of an STS file came out as 1.0 or 1.0000001 by batch, and their order
    then moved Spearman by up to 0.04 with --batch-size (and the best checkpoint with
    it). Scores that are not all finite are given back as they are."""
    if not np.isfinite(scores).all():
        return scores
    order = np.argsort(scores, kind="stable")
    ranked = scores[order].copy()
    first = ranked[0] if len(ranked) else 0.0
    for i in range(1, len(ranked)):
        if ranked[i] - first <= tol * max(1.0, abs(first)):
            ranked[i] = first
        else:
            first = ranked[i]
    out = np.empty_like(scores)
    out[order] = ranked
    return out


def regression_metrics(gold, pred) -> dict:
    """The correlations and the mean squared error (for a regression task's dev set)."""
    gold, pred = np.asarray(gold, dtype=float), np.asarray(pred, dtype=float)
    return {**correlations(gold, pred), "mse": float(np.mean((gold - pred) ** 2))}
