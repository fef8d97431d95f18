"""Metrics on small hand-computed examples."""
import math

import pytest

from nanobert.metrics import (classification_metrics, ner_metrics, normalize_answer,
                              regression_metrics, squad_exact, squad_f1, squad_metrics)


def test_classification_binary():
    gold = [1, 1, 1, 0, 0, 0, 1, 0]
    pred = [1, 1, 0, 0, 0, 1, 1, 0]
    m = classification_metrics(gold, pred, 2)
    assert m["accuracy"] == pytest.approx(6 / 8)
    # positive class: tp 3, fp 1, fn 1 -> P = R = 3/4
    assert m["f1"] == pytest.approx(0.75)
    # MCC = (tp*tn - fp*fn) / sqrt((tp+fp)(tp+fn)(tn+fp)(tn+fn)) = (9 - 1) / 16
    assert m["mcc"] == pytest.approx(0.5)


def test_classification_macro_f1_three_classes():
    gold = [0, 0, 1, 1, 2, 2]
    pred = [0, 1, 1, 1, 2, 0]
    m = classification_metrics(gold, pred, 3)
    # class 0: P 1/2 R 1/2 F 1/2; class 1: P 2/3 R 1 F 4/5; class 2: P 1 R 1/2 F 2/3
    assert m["f1"] == pytest.approx((0.5 + 0.8 + 2 / 3) / 3)
    assert m["f1"] == m["f1_macro"] and m["accuracy"] == pytest.approx(4 / 6)


def test_ner_entity_level():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O"]]
    pred = [["B-PER", "I-PER", "O", "B-ORG"], ["B-ORG", "O"]]
    # gold entities: PER(0-1), LOC(3), ORG; predicted: PER(0-1) ok, ORG(3) wrong, ORG ok
    m = ner_metrics(gold, pred)
    assert m["precision"] == pytest.approx(2 / 3) and m["recall"] == pytest.approx(2 / 3)
    assert m["f1"] == pytest.approx(2 / 3)
    # a partially found entity counts as wrong (no partial credit)
    m = ner_metrics([["B-PER", "I-PER"]], [["B-PER", "O"]])
    assert m == {"precision": 0.0, "recall": 0.0, "f1": 0.0}


def test_squad_normalisation():
    assert normalize_answer("The  Denver Broncos!") == "denver broncos"
    assert normalize_answer("an apple, a pear") == "apple pear"
    assert normalize_answer("theatre") == "theatre"  # 'the' only as a whole word
    assert squad_exact("the Broncos.", "Broncos") == 1.0
    # pred tokens {denver, broncos, team}; gold {broncos}: P 1/3, R 1 -> F1 1/2
    assert squad_f1("Denver Broncos team", "the Broncos") == pytest.approx(0.5)
    assert squad_f1("", "x") == 0.0


def test_squad_metrics_max_over_golds():
    preds = {"a": "Denver Broncos", "b": "in 1990", "c": "nothing"}
    golds = {"a": ["Broncos", "Denver Broncos"], "b": ["1990", "the year 1990"], "c": ["else"]}
    m = squad_metrics(preds, golds)
    # a: EM 1; b: EM 0, F1 max(2/3, 1/2) = 2/3 (gold "1990": P 1/2, R 1); c: 0
    assert m["exact_match"] == pytest.approx(100 / 3)
    assert m["f1"] == pytest.approx(100 * (1 + 2 / 3) / 3)


def test_regression():
    m = regression_metrics([1, 2, 3, 4], [2, 4, 6, 9])
    assert m["spearman"] == pytest.approx(1.0) and 0.98 < m["pearson"] < 1.0
    assert math.isclose(m["mse"], (1 + 4 + 9 + 25) / 4)


def test_macro_f1_is_sklearns_when_a_class_never_occurs():
    """A class of the model that neither gold nor pred mention is left out of the macro
    average, as scikit-learn's f1_score(average="macro") does; it is not a zero."""
    from sklearn.metrics import f1_score
    gold, pred = [0, 0, 1, 1, 2, 2], [0, 1, 1, 1, 2, 0]
    m = classification_metrics(gold, pred, num_labels=5)   # classes 3 and 4 never occur
    assert m["f1"] == pytest.approx(f1_score(gold, pred, average="macro"))
    assert m["f1"] == pytest.approx((0.5 + 0.8 + 2 / 3) / 3)


def test_ner_iob1_file_scores_as_seqeval_on_its_own_tags():
    """Gold tags are read as IOB2 (an I- that starts an entity becomes B-); the scores equal
    seqeval's default mode on the file's own IOB1 tags: B- after O, I- without B-, an I-
    after another type, hyphenated types."""
    from seqeval.metrics import f1_score, precision_score, recall_score
    from nanobert.data import iob1_to_iob2
    gold = [["I-PER", "I-PER", "B-PER", "O", "B-MISC", "I-MISC"],
            ["O", "I-ORG-X", "I-LOC", "I-LOC", "O"], ["I-MISC", "O", "I-MISC", "B-MISC"]]
    pred = [["B-PER", "I-PER", "B-PER", "O", "I-MISC", "I-MISC"],
            ["O", "B-ORG-X", "B-LOC", "I-LOC", "I-LOC"], ["B-MISC", "O", "O", "B-MISC"]]
    m = ner_metrics([iob1_to_iob2(s) for s in gold], pred)
    assert m["precision"] == pytest.approx(precision_score(gold, pred))
    assert m["recall"] == pytest.approx(recall_score(gold, pred))
    assert m["f1"] == pytest.approx(f1_score(gold, pred))
    # by hand: gold PER x2, MISC, ORG-X, LOC, MISC x3 = 8 entities; predicted 7, all right
    # but the LOC that runs one word too far: P 6/7, R 6/8, F1 12/15
    assert (m["precision"], m["recall"], m["f1"]) == pytest.approx((6 / 7, 6 / 8, 12 / 15))


def _squad_reference(predictions: dict, dataset: list) -> dict:
    """SQuAD v1.1's evaluate-v1.1.py, rewritten: normalise (lower, drop punctuation, drop
    articles, squeeze spaces), token F1 and exact match, max over golds, mean x 100."""
    import collections
    import re
    import string

    def norm(s):
        s = "".join(c for c in s.lower() if c not in set(string.punctuation))
        return " ".join(re.sub(r"\b(a|an|the)\b", " ", s).split())

    def f1(p, g):
        p, g = norm(p).split(), norm(g).split()
        same = sum((collections.Counter(p) & collections.Counter(g)).values())
        return 0.0 if same == 0 else 2 * same / (len(p) + len(g))
    em = f = 0.0
    for qid, golds in dataset:
        if qid in predictions:
            em += max(float(norm(predictions[qid]) == norm(g)) for g in golds)
            f += max(f1(predictions[qid], g) for g in golds)
    return {"exact_match": 100 * em / len(dataset), "f1": 100 * f / len(dataset)}


def test_squad_metrics_equal_the_official_logic():
    golds = {"a": ["The Eiffel Tower", "Eiffel Tower"], "b": ["in 1889", "1889"],
             "c": ["Gustave Eiffel's firm"], "d": ["an apple a day"], "e": ["x"],
             "f": ["Ünïcode—dash"], "g": ["the the"]}
    preds = {"a": "eiffel tower.", "b": "built in 1889 ,", "c": "Gustave   Eiffels firm!",
             "d": "apple day apple", "f": "ünïcode—dash", "g": "a"}   # "e" unanswered
    assert squad_metrics(preds, golds) == pytest.approx(
        _squad_reference(preds, list(golds.items())))


def test_metrics_equal_the_references_on_random_predictions():
    """Seeded random predictions: scikit-learn (accuracy, F1 of class 1 or macro, MCC),
    scipy (Pearson, Spearman), seqeval (entity P/R/F1 on IOB2 and on IOB1 gold) and the
    official SQuAD v1.1 logic give the numbers nanobert reports."""
    import random
    from scipy.stats import pearsonr, spearmanr
    from seqeval.metrics import f1_score as seq_f1, precision_score, recall_score
    from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef
    from nanobert.data import iob1_to_iob2
    rng = random.Random(7)
    for n_labels in (2, 3, 5):
        gold = [rng.randrange(n_labels) for _ in range(200)]
        pred = [g if rng.random() < 0.6 else rng.randrange(n_labels) for g in gold]
        m = classification_metrics(gold, pred, n_labels)
        assert m["accuracy"] == pytest.approx(accuracy_score(gold, pred))
        avg = {"average": "binary", "pos_label": 1} if n_labels == 2 else {"average": "macro"}
        assert m["f1"] == pytest.approx(f1_score(gold, pred, **avg))
        assert m["f1_macro"] == pytest.approx(f1_score(gold, pred, average="macro"))
        assert m["mcc"] == pytest.approx(matthews_corrcoef(gold, pred))
    g = [rng.uniform(0, 5) for _ in range(100)]
    p = [x + rng.gauss(0, 2) for x in g]
    r = regression_metrics(g, p)
    assert r["pearson"] == pytest.approx(pearsonr(g, p)[0], abs=1e-12)
    assert r["spearman"] == pytest.approx(spearmanr(g, p)[0], abs=1e-12)
    tags = ["O", "O", "B-PER", "I-PER", "B-LOC", "I-LOC", "I-ORG", "B-MISC"]
    gold1 = [[rng.choice(tags).replace("B-", "I-") if rng.random() < 0.5 else rng.choice(tags)
              for _ in range(rng.randrange(1, 12))] for _ in range(60)]
    pred = [[rng.choice(tags) for _ in s] for s in gold1]
    m = ner_metrics([iob1_to_iob2(s) for s in gold1], pred)
    for k, f in (("precision", precision_score), ("recall", recall_score), ("f1", seq_f1)):
        assert m[k] == pytest.approx(f(gold1, pred))                     # IOB1 gold, as is
        assert m[k] == pytest.approx(f([iob1_to_iob2(s) for s in gold1], pred))
    words = ["The", "a", "an", "Eiffel", "tower", ",", "1889", "Paris!", "the.", "(x)", "Ünï"]
    golds = {str(i): [" ".join(rng.choice(words) for _ in range(rng.randrange(1, 5)))
                      for _ in range(rng.randrange(1, 4))] for i in range(80)}
    preds = {q: " ".join(rng.choice(words) for _ in range(rng.randrange(0, 5)))
             for q in golds if rng.random() < 0.9}
    assert squad_metrics(preds, golds) == pytest.approx(
        _squad_reference(preds, list(golds.items())))


def test_squad_an_unanswered_question_scores_zero_even_against_an_empty_gold():
    """The official script gives an unanswered question 0; before, a missing prediction
    was read as "" and matched a gold answer that normalises to "" ("the", "a.")."""
    golds = {"x": ["the"], "y": ["A."]}
    assert squad_metrics({}, golds) == {"exact_match": 0.0, "f1": 0.0}
    assert squad_metrics({"x": "", "y": "an"}, golds)["exact_match"] == 100.0   # answered


@pytest.mark.parametrize("names, positive", [
    (["0", "1"], "1"), (["negative", "positive"], "positive"), (["False", "True"], "True"),
    (["no", "yes"], "yes"), (["not_duplicate", "duplicate"], "duplicate"),
    (["equivalent", "not_equivalent"], "equivalent"), (["non_irony", "irony"], "irony"),
    (["non-hate", "hate"], "hate"), (["unacceptable", "acceptable"], "acceptable"),
    (["ham", "spam"], "spam"), (["correct", "incorrect"], "correct"),
    (["agree", "disagree"], "agree"), (["appropriate", "inappropriate"], "appropriate"),
    (["legal", "illegal"], "legal"), (["relevant", "irrelevant"], "relevant"),
    (["not", "note"], "note")])
def test_the_binary_f1_is_of_the_class_the_other_negates_else_the_second(names, positive):
    """f1 was the F1 of the label sorting last: with the names Hugging Face gives GLUE's
    QQP and MRPC or TweetEval (not_duplicate, non-hate), the F1 of the negative class."""
    from nanobert.data import positive_label
    assert positive_label(names) == positive == positive_label(names[::-1])


def test_evaluate_reports_the_f1_of_duplicate_and_names_it(monkeypatch):
    """A QQP-style model (labels duplicate / not_duplicate): f1 is duplicate's, as GLUE
    reports it, and `f1_label` says so."""
    import sys
    import types
    import torch
    from nanobert.data import Example
    from nanobert.finetune import classify_evaluate
    F = sys.modules["nanobert.finetune"]    # (nanobert.finetune, the name, is the function)
    from sklearn.metrics import f1_score
    model = types.SimpleNamespace(config=types.SimpleNamespace(
        id2label={0: "duplicate", 1: "not_duplicate"}))
    gold = ["duplicate", "not_duplicate", "duplicate", "not_duplicate", "not_duplicate"]
    pred = [0, 1, 1, 0, 1]                     # ids the stand-in model predicts
    monkeypatch.setattr(F, "predict_classify", lambda *a, **k: torch.nn.functional.one_hot(
        torch.tensor(pred), 2).float())
    m = classify_evaluate(model, None, [Example(t, label=g) for t, g in zip("abcde", gold)],
                          {"max_length": 8})
    names = [["duplicate", "not_duplicate"][i] for i in pred]
    assert m["f1_label"] == "duplicate"
    assert m["f1"] == pytest.approx(f1_score(gold, names, pos_label="duplicate"))
    assert m["f1"] != pytest.approx(f1_score(gold, names, pos_label="not_duplicate"))


def test_spearman_ties_scores_within_float_noise():
    """Identical STS pairs embed to cosines of 1.0 or 1.0000001 depending on the batch:
    ranked apart, their order moved Spearman by up to 0.04 with --batch-size."""
    import numpy as np
    from nanobert.metrics import correlations
    gold = [5, 5, 5, 4, 2, 1]
    exact = [1.0, 1.0, 1.0, 0.8, 0.4, 0.1]
    noisy = np.array([1.0, 1.0000001, 0.9999999, 0.8, 0.4, 0.1], dtype=np.float32)
    flipped = np.array([1.0000001, 0.9999999, 1.0, 0.8, 0.4, 0.1], dtype=np.float32)
    want = correlations(gold, exact)["spearman"]
    assert correlations(gold, noisy)["spearman"] == pytest.approx(want, abs=1e-12)
    assert correlations(gold, flipped)["spearman"] == pytest.approx(want, abs=1e-12)
    # scores that differ by more than the noise still rank apart, and a long run of
    # scores each within the noise of the next is not one tie (it had been: NaN)
    assert correlations([1, 2, 3], [0.5, 0.50001, 0.50002])["spearman"] == pytest.approx(1.0)
    dense = 0.5 + 4e-7 * np.arange(5000)
    assert correlations(np.arange(5000), dense)["spearman"] > 0.99
