"""The regress, embed and rerank tasks end to end through the command line:
finetune -> evaluate -> predict -> search --rerank, on small fixtures."""
from __future__ import annotations

import json
import random

import pytest

import nanobert
from conftest import tiny_model_dir, with_flags
from nanobert import cli
from nanobert import biencoder as E
from nanobert.data import read_beir

pytestmark = pytest.mark.usefixtures("one_thread")

SUBJECTS = ["cat", "dog", "man", "woman", "child", "bird"]
VERBS = ["eats", "runs", "sleeps", "sings", "jumps", "reads"]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A small random BERT (no head) with a vocabulary of the fixture words."""
    d = tmp_path_factory.mktemp("tiny")
    words = SUBJECTS + VERBS + ["a", "the", "which", "about", "every", "day", "now", "market",
                                "fell", "in", "park"]
    return tiny_model_dir(d, words, 120, "? . \" -")


def sts_file(path, n=24, seed=0):
    """The original STS Benchmark layout: no header, literal quotes."""
    rng, lines = random.Random(seed), []
    for i in range(n):
        s, v = rng.choice(SUBJECTS), rng.choice(VERBS)
        s2, v2 = (s, v) if i % 3 == 0 else (rng.choice(SUBJECTS), rng.choice(VERBS))
        score = 5.0 if (s, v) == (s2, v2) else 2.5 if (s == s2 or v == v2) else 0.0
        lines.append(f"main\tfile\t2012\t{i:04d}\t{score}\ta {s} {v}.\tthe {s2} {v2} \"now\".")
    path.write_text("\n".join(lines) + "\n")
    return path


def beir_dir(root):
    (root / "qrels").mkdir(parents=True)
    docs = [(s, v) for s in SUBJECTS for v in VERBS[:3]]
    with open(root / "corpus.jsonl", "w") as c, open(root / "queries.jsonl", "w") as q, \
            open(root / "qrels" / "train.tsv", "w") as r:
        r.write("query-id\tcorpus-id\tscore\r\n")
        for i, (s, v) in enumerate(docs):
            c.write(json.dumps({"_id": f"d{i}", "title": f"about the {s}",
                                "text": f"the {s} {v} every day in the park."}) + "\n")
            q.write(json.dumps({"_id": f"q{i}", "text": f"which {s} {v}?"}) + "\n")
            r.write(f"q{i}\td{i}\t1\r\n")
    return root


def run(capsys, *argv):
    rc = cli.main([str(a) for a in argv])
    captured = capsys.readouterr()
    assert rc == 0, captured.err[-500:]
    return captured.out.strip().splitlines()


def test_embed_learns_sts_and_writes_the_st_layout(tiny_dir, tmp_path, capsys):
    data = sts_file(tmp_path / "sts-train.csv")
    before = json.loads(run(capsys, "evaluate", "--model", tiny_dir, "--data", data, "--json")[-1])
    out = tmp_path / "emb"
    lines = run(capsys, "finetune", "--task", "embed", "--model", tiny_dir, "--train", data,
                "--dev", data, "--out", out, "--epochs", "12", "--batch-size", "8",
                "--max-length", "32", "--lr", "2e-3", "--no-progress")
    # the starting model's score, to compare the kept one with (an embedder already)
    assert f"dev before training: spearman {before['spearman']:.4f}" in lines
    after = json.loads(run(capsys, "evaluate", "--model", out, "--data", data, "--json")[-1])
    assert after["task"] == "embed" and after["spearman"] > before["spearman"] + 0.05
    saved = json.loads((out / "nanobert.json").read_text())
    assert saved["pooling"] == "mean" and saved["loss"] == "cosent"   # (the loss run: not null)
    modules = json.loads((out / "modules.json").read_text())
    assert [m["path"] for m in modules] == ["", "1_Pooling", "2_Normalize"]
    shown = run(capsys, "predict", "--model", out, "--json", "a cat eats")
    assert len(json.loads(shown[-1])["embedding"]) == 128   # the tiny preset's hidden size


def test_embed_keeps_the_pooling_its_checkpoint_declares(tiny_dir, tmp_path, capsys):
    """A sentence-transformers checkpoint of [CLS] pooling was fine-tuned (and saved) by
    its mean unless --pooling cls was given; an explicit --pooling still wins, noted."""
    import nanobert
    model, tok = nanobert.load(tiny_dir, head=None)
    start = tmp_path / "cls-start"
    E.save_embedding_model(model, tok, start, pooling="cls", max_seq_length=32)
    data = sts_file(tmp_path / "sts-train.csv")
    common = ["--task", "embed", "--model", start, "--train", data, "--dev", data,
              "--max-steps", "1", "--batch-size", "8", "--max-length", "32", "--no-progress"]
    out = tmp_path / "emb"
    assert "cls pooling" in "\n".join(run(capsys, "finetune", *common, "--out", out))
    assert json.loads((out / "nanobert.json").read_text())["pooling"] == "cls"
    pooling = json.loads((out / "1_Pooling" / "config.json").read_text())
    assert pooling["pooling_mode_cls_token"] and not pooling["pooling_mode_mean_tokens"]
    mean = tmp_path / "mean"
    rc = cli.main([str(a) for a in ["finetune", *common, "--out", mean, "--pooling", "mean"]])
    err = capsys.readouterr().err
    assert rc == 0 and json.loads((mean / "nanobert.json").read_text())["pooling"] == "mean"
    assert f"note: --pooling mean: {start} declares cls pooling" in err


def test_embed_on_beir_with_holdout_gradient_cache_and_negatives(tmp_path, capsys):
    beir = beir_dir(tmp_path / "beir")
    out = tmp_path / "emb"
    shown = run(capsys, "finetune", "--task", "embed", "--model", "minilm", "--train", beir,
                "--dev", beir, "--holdout", "0.3", "--out", out, "--max-steps", "2",
                "--batch-size", "8", "--max-length", "6", "--mini-batch-size", "3",
                "--hard-negatives", "1", "--no-progress")
    train_q, held = E.query_split(read_beir(beir), 0.3)
    # the queries the run uses, not every judged query twice
    assert f"embed: {len(train_q)} training queries, {len(held)} dev queries," in "\n".join(shown)
    saved = json.loads((out / "nanobert.json").read_text())
    assert saved["holdout"] == 0.3 and saved["mini_batch_size"] == 3
    m = json.loads(run(capsys, "evaluate", "--model", out, "--data", beir, "--json")[-1])
    assert m["split"] == "train" and m["n"] == m["n_queries"] == len(held) > 0
    assert 0 <= m["ndcg_at_10"] <= 1 and m["recall_at_100"] == 1.0   # 18 documents
    # the dev score the run kept the model for is the one evaluate gives the saved model:
    # documents cut at the saved max length (6 here: no verb left) in both (training read
    # them whole: 1.0 against 0.75)
    evals = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()
             if json.loads(x)["type"] == "eval"]
    assert max(e["ndcg_at_10"] for e in evals) == pytest.approx(m["ndcg_at_10"], abs=1e-6)


def test_minilm_zero_shot_on_beir(tmp_path, capsys):
    beir = beir_dir(tmp_path / "beir")
    m = json.loads(run(capsys, "evaluate", "--model", "minilm", "--data", beir, "--json")[-1])
    assert m["n_queries"] == 18 and m["ndcg_at_10"] > 0.6


def test_regress_learns_scores_and_predicts_them(tiny_dir, tmp_path, capsys):
    data = sts_file(tmp_path / "sts.csv")
    out = tmp_path / "reg"
    run(capsys, "finetune", "--task", "regress", "--model", tiny_dir, "--train", data, "--dev", data,
        "--out", out, "--epochs", "15", "--batch-size", "8", "--max-length", "32", "--lr", "2e-3", "--no-progress")
    m = json.loads(run(capsys, "evaluate", "--model", out, "--data", data, "--json")[-1])
    gold = [float(line.split("\t")[4]) for line in data.read_text().splitlines()]
    mean = sum(gold) / len(gold)
    # better than always predicting the mean score
    assert m["task"] == "regress" and m["spearman"] > 0.5
    assert m["mse"] < sum((g - mean) ** 2 for g in gold) / len(gold)
    lines = run(capsys, "predict", "--model", out, "--input", data)
    pred = [float(line.split("\t")[0]) for line in lines]
    from scipy.stats import spearmanr
    assert len(pred) == 24 and spearmanr(gold, pred)[0] == pytest.approx(m["spearman"], abs=1e-4)


def test_rerank_trains_loads_in_transformers_and_reranks_search(tiny_dir, tmp_path, capsys):
    import transformers
    rows = "".join(f"which {s} {v}?\tthe {s} {v} in the park.\t1\nwhich {s} {v}?\tthe market fell.\t0\n"
                   for s in SUBJECTS for v in VERBS[:2])
    data = tmp_path / "rerank.tsv"
    data.write_text("query\tdocument\tlabel\n" + rows)
    out = tmp_path / "ce"
    run(capsys, "finetune", "--task", "rerank", "--model", tiny_dir, "--train", data, "--dev", data,
        "--out", out, "--epochs", "3", "--batch-size", "8", "--max-length", "32", "--lr", "2e-3", "--no-progress")
    m = json.loads(run(capsys, "evaluate", "--model", out, "--data", data, "--json")[-1])
    assert m["mrr_at_10"] > 0.9
    assert "device" not in json.loads((out / "nanobert.json").read_text())   # (mining's only)
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(out)
    assert hf.config.num_labels == 1
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the market fell.\nthe dog runs in the park.\nthe cat eats in the park.\n")
    lines = run(capsys, "search", "--model", tiny_dir, "--corpus", corpus, "--query",
                "which dog runs?", "-k", "2", "--rerank", out, "--json")
    hits = json.loads(lines[-1])[0]["hits"]
    assert len(hits) == 2 and hits[0]["text"] != "the market fell."
    r = nanobert.Reranker(out)
    assert r.rerank("which dog runs?", ["the market fell.", "the dog runs in the park."])[0][0] == 1


@pytest.mark.parametrize("argv, message", [
    (["--task", "embed", "--holdout", "1.5"], "--holdout: got 1.5"),
    (["--task", "embed", "--loss", "mnrl"], "training rows are scored pairs; use cosent"),
    (["--task", "classify", "--label-column", "score"], "--task regress"),
])
def test_bad_values_are_one_line_errors(tiny_dir, tmp_path, capsys, argv, message):
    data = tmp_path / "glue.tsv"
    data.write_text("sentence1\tsentence2\tscore\na cat\tthe cat\t4.5\na dog\tthe bird\t0.5\n")
    try:
        rc = cli.main(["finetune", "--model", str(tiny_dir), "--train", str(data), "--dev",
                       str(data), "--out", str(tmp_path / "x"), "--max-steps", "1",
                       "--max-length", "32", "--no-progress"] + argv)
    except SystemExit as e:  # a flag out of range stops argparse
        rc = e.code
    err = capsys.readouterr().err.strip()
    assert rc == 2 and message in err and len(err.splitlines()) == 1


def test_a_dev_folder_of_other_queries_counts_all_its_queries(tmp_path):
    """With --holdout and --dev on another BEIR folder, evaluation scores that folder
    whole (the holdout is of the training folder), but the run's first line counted the
    hash-held-out share of it as its dev queries."""
    train = read_beir(beir_dir(tmp_path / "train"))
    other = beir_dir(tmp_path / "other")
    with open(other / "queries.jsonl", "a") as q, open(other / "qrels" / "train.tsv", "a") as r:
        q.write(json.dumps({"_id": "q-extra", "text": "which one?"}) + "\n")
        r.write("q-extra\td0\t1\r\n")
    other = read_beir(other)
    settings = {"holdout": 0.3, "holdout_of": E.queries_fingerprint(train)}
    assert E.scored_queries(other, settings) is None              # scored whole
    assert E.queries_used(other, settings, training=False) == len(other.qrels) == 19
    held = E.query_split(train, 0.3)[1]
    assert E.queries_used(train, settings, training=False) == len(held) < len(train.qrels)


def test_flags_a_run_would_not_use_and_outputs_inside_its_data_are_refused(tmp_path, capsys):
    """--out inside the BEIR --train folder: its checkpoint changed the folder's hash, so
    --resume was refused and the training lost; --head-lr-scale on an embed run and
    column flags on BEIR folders changed nothing, silently; --model X --out X (an empty
    X) said to --resume a run that could never start."""
    beir = beir_dir(tmp_path / "beir")
    base = ["finetune", "--task", "embed", "--model", "minilm", "--train", str(beir),
            "--dev", str(beir)]
    (tmp_path / "empty").mkdir()
    for extra, words in (
            (["--out", str(beir / "run")], f"is inside the --train folder {beir}"),
            (["--out", str(tmp_path / "o"), "--text-column", "x"], "--text-column: BEIR folders "
             "have fixed fields"),
            (["--out", str(tmp_path / "o"), "--head-lr-scale", "5"], "--head-lr-scale: an embed "
             "run trains no head"),
            (["--out", str(tmp_path / "empty"), "--model", str(tmp_path / "empty")],
             "is the input " + str(tmp_path / "empty") + " (--model)")):
        assert cli.main(with_flags(base, extra)) == 2, extra
        err = capsys.readouterr().err
        assert words in err and len(err.strip().splitlines()) == 1, err
    assert not (beir / "run").exists() and not (tmp_path / "o").exists()


def test_a_reranker_pooled_by_the_mean_is_refused(tmp_path, capsys):
    """--task rerank --pooling mean trained a cross-encoder that transformers and
    sentence-transformers score on [CLS]: other logits there, against the docs."""
    rows = tmp_path / "rr.tsv"
    rows.write_text("query\tdocument\tlabel\nq one\td one\t1\nq two\td two\t0\n")
    assert cli.main(["finetune", "--task", "rerank", "--model", "minilm", "--train", str(rows),
                     "--dev", str(rows), "--out", str(tmp_path / "o"), "--pooling", "mean"]) == 2
    assert "--pooling mean: a reranker is saved as a cross-encoder" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_a_kept_model_below_the_starting_one_is_said_to_be(capsys):
    """An embed run kept Spearman 0.934 where the starting minilm scored 0.939 on the same
    dev rows, and 'best dev ... model saved' read as a success."""
    from nanobert.finetune import note_below_start
    from nanobert.train import TrainConfig
    higher = TrainConfig(metric="spearman", greater_is_better=True)
    note_below_start(0.939, {"spearman": 0.934, "step": 19}, higher)
    assert capsys.readouterr().err == (
        "nanobert: note: the best dev spearman, 0.9340, is below the starting model's, 0.9390: "
        "this run made the model worse on the dev data; try a lower --lr, fewer epochs or "
        "more training rows\n")
    note_below_start(0.939, {"spearman": 0.95}, higher)
    note_below_start(None, {"spearman": 0.5}, higher)
    note_below_start(0.2, {"mse": 0.1}, TrainConfig(metric="mse", greater_is_better=False))
    assert capsys.readouterr().err == ""
