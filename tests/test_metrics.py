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
