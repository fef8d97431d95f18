"""Pretraining: corpus reading, packing, NSP/SOP pairs, exact resume, fill-mask, DDP."""
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from nanobert.cli import main
from nanobert.corpus import (NSP, SOP, PretrainData, StreamingCorpus, corpus_files, holdout,
                             iter_documents, load_corpus, make_pairs, pack)
from nanobert.pretrain import PretrainConfig, run_pretrain

ROOT = Path(__file__).resolve().parents[1]
WORDS = ("cat dog bird fish horse cow sheep goat lion tiger big small red blue happy sad "
         "garden house river forest field city market school sees eats chases likes").split()


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest


def write_corpus(path: Path, n_docs=60, seed=0):
    """Documents of 1-3 paragraphs of random sentences; a blank line ends each."""
    rng = random.Random(seed)
    lines = []
    for _ in range(n_docs):
        for _ in range(rng.randint(1, 3)):
            sents = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 9))) + "."
                     for _ in range(rng.randint(2, 5))]
            lines.append(" ".join(sents))
        lines.append("")
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    write_corpus(d / "a.txt", 40, seed=1)
    (d / "sub").mkdir()
    write_corpus(d / "sub" / "b.txt", 30, seed=2)
    (d / ".hidden").write_text("ignored\n")
    return d


@pytest.fixture(scope="module")
def loaded(corpus_dir, tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    return load_corpus([corpus_dir], None, vocab_size=120, val_fraction=0.1, seed=0,
                       cache_dir=cache, log=lambda *a: None), cache


def args_for(corpus, out, **kw):
    """A small PretrainConfig: flat names reach the trainer's fields (steps = max_steps)."""
    a = dict(corpus=[str(corpus)], out_dir=str(out), preset="tiny", vocab_size=120, max_steps=12,
             batch_size=8, seq_len=32, lr=2e-3, seed=0, eval_every=4, max_eval_rows=64,
             attn_backend="eager", device="cpu", progress=False)
    if "steps" in kw:
        kw["max_steps"] = kw.pop("steps")
    if "no_progress" in kw:
        kw["progress"] = not kw.pop("no_progress")
    a.update(kw)
    return PretrainConfig.create(**a)


def records(out, kind):
    return [json.loads(x) for x in (Path(out) / "metrics.jsonl").read_text().splitlines()
            if x.strip() and json.loads(x)["type"] == kind]


# ---- reading and packing -------------------------------------------------------------

def test_documents_and_files(corpus_dir, tmp_path):
    files = corpus_files([corpus_dir])
    assert [f.name for f in files] == ["a.txt", "b.txt"]      # sorted, recursive, no hidden
    f = tmp_path / "d.txt"
    f.write_text("one\ntwo\n\n  \nthree\n\n\nfour", encoding="utf-8")
    assert list(iter_documents([f])) == [["one", "two"], ["three"], ["four"]]


def test_holdout_is_seeded_and_disjoint():
    tr, va = holdout(50, 0.1, seed=3)
    assert len(va) == 5 and not set(tr) & set(va) and len(tr) + len(va) == 50
    assert np.array_equal(holdout(50, 0.1, seed=3)[1], va)


def test_tokenize_cache_and_pack(loaded):
    (tok, train, val), cache = loaded
    assert train.n_docs + val.n_docs == 70 and val.n_docs == 7
    assert len(list(cache.glob("tokens-*.npz"))) == 1
    spans = pack(train, 30)
    assert (spans[:, 1] - spans[:, 0] <= 30).all() and (spans[:, 1] > spans[:, 0]).all()
    # every token is in exactly one span, and no span crosses a document boundary
    assert spans[0, 0] == 0 and spans[-1, 1] == train.n_tokens
    assert (spans[1:, 0] == spans[:-1, 1]).all()
    ends = train.sents[train.docs[1:]]
    doc_of = np.searchsorted(ends, spans[:, 0], side="right")
    assert (spans[:, 1] <= ends[doc_of]).all()


def test_cache_hit_gives_the_same_corpus(corpus_dir, tmp_path):
    logs = []
    a = load_corpus([corpus_dir], None, 120, 0.1, 0, tmp_path, log=logs.append)
    b = load_corpus([corpus_dir], None, 120, 0.1, 0, tmp_path, log=logs.append)
    assert any("from cache" in m for m in logs)
    assert np.array_equal(a[1].ids, b[1].ids) and a[0].tk.to_str() == b[0].tk.to_str()


def test_mlm_rows(loaded):
    (tok, train, _), _ = loaded
    data = PretrainData(train, tok, seq_len=32)
    b = data.rows(0, [0, 1, 2])
    ids, mask = b["input_ids"], b["attention_mask"]
    assert ids.shape == (3, 32) and (ids[:, 0] == tok.cls_id).all()
    for r in range(3):
        n = int(mask[r].sum())
        assert ids[r, n - 1] == tok.sep_id and (ids[r, n:] == tok.pad_id).all()
    assert sorted(data.order(0)) == list(range(len(data)))
    assert not np.array_equal(data.order(0), data.order(1))


@pytest.mark.parametrize("kind", [NSP, SOP])
def test_pairs_balanced_and_correct(loaded, kind):
    (tok, train, _), _ = loaded
    chunks = pack(train, 29)
    pairs = make_pairs(train, chunks, kind, np.random.default_rng(0))
    assert len(pairs) > 150
    labels = pairs[:, 4]
    assert abs(labels.mean() - 0.5) < 0.1
    ends = train.sents[train.docs[1:]]
    doc = lambda t: int(np.searchsorted(ends, t, side="right"))  # noqa: E731
    for a0, a1, b0, b1, y in pairs.tolist():
        assert a1 > a0 and b1 > b0 and (a1 - a0) + (b1 - b0) <= 29
        if kind == NSP:
            if y == 0:
                assert b0 == a1 and doc(a0) == doc(b0)              # B continues A
            else:
                assert doc(a0) != doc(b0)                           # B from another document
        else:
            assert doc(a0) == doc(b0)
            assert (b0 == a1) if y == 0 else (b1 == a0)            # in order / swapped
    # rows: [CLS] A [SEP] B [SEP], segment 1 on B
    data = PretrainData(train, tok, 32, pairs=kind)
    b = data.rows(0, [0])
    ids, types = b["input_ids"][0], b["token_type_ids"][0]
    a0, a1, b0, b1, y = data.pair_rows(0)[0].tolist()
    la, lb = a1 - a0, b1 - b0
    assert ids[la + 1] == tok.sep_id and ids[la + lb + 2] == tok.sep_id
    assert types[:la + 2].sum() == 0 and (types[la + 2:la + lb + 3] == 1).all()
    assert b["pair_labels"].tolist() == [y]


def test_streaming_corpus_reads_everything_once_per_pass(corpus_dir, loaded):
    (tok, _, _), _ = loaded
    s = StreamingCorpus(corpus_files([corpus_dir]), tok, 32, val_fraction=0.1, seed=0, buffer=16)
    val = s.validation(1000)
    train = list(s._sequences(validation=False))
    it = s.stream()
    first_pass = [next(it) for _ in range(len(train))]
    key = lambda x: x.tobytes()  # noqa: E731
    assert sorted(map(key, first_pass)) == sorted(map(key, train))  # a shuffled full pass
    assert val and all(len(x) <= 30 for x in train + val)


# ---- bad input -------------------------------------------------------------------------

def test_bad_corpus_exits_2_with_file_and_line(tmp_path, capsys):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine line\nanother\nbroken \xff\xfe here\n")
    assert main(["pretrain", "--corpus", str(bad), "--out", str(tmp_path / "o"), "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:3" in err and "UTF-8" in err and "Traceback" not in err
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    assert main(["pretrain", "--corpus", str(empty), "--out", str(tmp_path / "o")]) == 2
    assert "empty file" in capsys.readouterr().err
    assert main(["pretrain", "--corpus", str(tmp_path / "missing"), "--out", str(tmp_path / "o")]) == 2
    assert main(["pretrain", "--corpus", str(bad), "--out", str(tmp_path / "o"),
                 "--mask-split", "80/10"]) == 2
    assert not (tmp_path / "o" / "model.safetensors").exists()


# ---- training, resume -----------------------------------------------------------------

def test_pretrain_writes_a_model_and_metrics(corpus_dir, tmp_path):
    out = tmp_path / "run"
    res = run_pretrain(args_for(corpus_dir, out, objective="mlm+sop", steps=8), log=lambda *a: None)
    for f in ["config.json", "model.safetensors", "vocab.txt", "tokenizer.json",
              "metrics.jsonl", "training_curve.png", "checkpoint/state.json"]:
        assert (out / f).is_file(), f
    ev = records(out, "eval")
    assert len(ev) == 2 and {"loss", "mlm_accuracy", "perplexity", "pair_accuracy"} <= set(ev[0])
    assert ev[-1]["perplexity"] == pytest.approx(np.exp(ev[-1]["loss"]), rel=1e-6)
    assert json.loads((out / "config.json").read_text())["architectures"] == ["BertForPreTraining"]
    assert res["loss"] == min(e["loss"] for e in ev)


def test_resume_after_interrupt_matches_uninterrupted_run(corpus_dir, tmp_path, monkeypatch):
    import nanobert.masking as masking
    # one tokenizer for both runs: WordPiece training in `tokenizers` breaks ties
    # differently from run to run, so the runs share the cache that holds it
    full, cache = tmp_path / "full", str(tmp_path / "cache")
    run_pretrain(args_for(corpus_dir, full, steps=12, eval_every=2, save_every=2, cache_dir=cache),
                 log=lambda *a: None)

    cut = tmp_path / "cut"
    real_mask, calls = masking.Masker.mask, {"n": 0}

    def mask_then_interrupt(self, *a, **kw):      # Ctrl-C while building the 8th batch
        calls["n"] += 1
        if calls["n"] == 8:
            raise KeyboardInterrupt
        return real_mask(self, *a, **kw)
    monkeypatch.setattr(masking.Masker, "mask", mask_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        run_pretrain(args_for(corpus_dir, cut, steps=12, eval_every=2, save_every=2, cache_dir=cache),
                     log=lambda *a: None)
    monkeypatch.setattr(masking.Masker, "mask", real_mask)
    state = json.loads((cut / "checkpoint" / "state.json").read_text())
    assert state["step"] == 6  # (the first call masks the validation rows)
    run_pretrain(args_for(corpus_dir, cut, steps=12, eval_every=2, save_every=2, resume=True,
                          cache_dir=cache), log=lambda *a: None)
    a, b = records(full, "train"), records(cut, "train")
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(2, 13, 2))
    assert [r["loss"] for r in b] == pytest.approx([r["loss"] for r in a], abs=1e-6)
    assert [r["loss"] for r in records(cut, "eval")] == pytest.approx(
        [r["loss"] for r in records(full, "eval")], abs=1e-6)


def test_resume_after_kill(corpus_dir, tmp_path):
    """The process is killed (SIGKILL) mid-run; --resume continues from the last checkpoint."""
    flags = ["--corpus", str(corpus_dir), "--steps", "30", "--batch-size", "8", "--seq-len", "32",
             "--vocab-size", "120", "--eval-every", "5", "--save-every", "5", "--no-progress",
             "--attn-backend", "eager", "--device", "cpu", "--cache-dir", str(tmp_path / "cache")]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    full, cut = tmp_path / "full", tmp_path / "cut"
    subprocess.run([sys.executable, "-m", "nanobert.cli", "pretrain", *flags, "--out", str(full)],
                   check=True, env=env, capture_output=True)
    p = subprocess.Popen([sys.executable, "-m", "nanobert.cli", "pretrain", *flags, "--out", str(cut)],
                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    state = cut / "checkpoint" / "state.json"
    import time
    t0 = time.time()
    while time.time() - t0 < 120 and p.poll() is None:
        if state.is_file() and 10 <= json.loads(state.read_text())["step"] < 30:
            p.kill()
            break
        time.sleep(0.02)
    p.wait()
    killed_at = json.loads(state.read_text())["step"]
    assert killed_at < 30, "the run finished before it could be killed"
    subprocess.run([sys.executable, "-m", "nanobert.cli", "pretrain", *flags, "--out", str(cut),
                    "--resume"], check=True, env=env, capture_output=True)
    a, b = records(full, "train"), records(cut, "train")
    assert [r["step"] for r in a] == [r["step"] for r in b]
    assert [r["loss"] for r in b] == pytest.approx([r["loss"] for r in a], abs=1e-6)


# ---- fill-mask -----------------------------------------------------------------------

FACTS = ["the capital of france is paris.", "the sky is blue today.", "my dog likes to run.",
         "we eat bread with butter.", "the sun rises in the east."]


def test_fill_mask_predicts_a_memorised_word(tmp_path, capsys):
    rng = random.Random(0)
    lines = []
    for _ in range(80):
        lines.append(" ".join(rng.sample(FACTS, 3)))
        lines.append("")
    corpus = tmp_path / "facts.txt"
    corpus.write_text("\n".join(lines))
    out = tmp_path / "facts-model"
    run_pretrain(args_for(corpus, out, steps=300, batch_size=16, seq_len=32, lr=3e-3, dropout=0.0,
                          eval_every=100, vocab_size=80, mask_prob=0.2), log=lambda *a: None)
    assert main(["fill-mask", "--model", str(out), "the capital of france is [MASK].",
                 "-k", "3", "--json"]) == 0
    got = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    top = got["masks"][0]
    assert len(top) == 3 and top[0]["token"] == "paris" and top[0]["p"] > 0.5
    assert main(["fill-mask", "--model", str(out), "no mask here"]) == 2


def test_fill_mask_refuses_a_model_without_mlm_head(minilm_dir, capsys):
    assert main(["fill-mask", "--model", str(minilm_dir), "a [MASK] b"]) == 2
    assert "no masked-language-model head" in capsys.readouterr().err


# ---- the ablation and several processes -------------------------------------------------

def test_ablate_masking_table_and_plot(corpus_dir, tmp_path, capsys):
    out = tmp_path / "abl"
    assert main(["ablate-masking", "--corpus", str(corpus_dir), "--out", str(out), "--steps", "4",
                 "--batch-size", "8", "--seq-len", "32", "--vocab-size", "120", "--eval-every", "2",
                 "--splits", "80/10/10,0/0/100", "--no-progress", "--attn-backend", "eager"]) == 0
    rows = (out / "ablation.csv").read_text().splitlines()
    assert rows[0].startswith("split,") and len(rows) == 3
    assert "| 0/0/100 |" in (out / "ablation.md").read_text()
    assert (out / "ablation.png").stat().st_size > 1000
    curves = [[e["step"] for e in records(out / d, "eval")] for d in ("split-80-10-10", "split-0-0-100")]
    assert curves[0] == curves[1] == [2, 4]


def test_torchrun_two_processes_match_one(corpus_dir, tmp_path):
    flags = ["pretrain", "--corpus", str(corpus_dir), "--steps", "4", "--batch-size", "8",
             "--seq-len", "32", "--vocab-size", "120", "--eval-every", "2", "--dropout", "0",
             "--no-progress", "--attn-backend", "eager", "--cache-dir", str(tmp_path / "cache")]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    subprocess.run([sys.executable, "-m", "nanobert.cli", *flags, "--out", str(tmp_path / "one")],
                   check=True, env=env, capture_output=True)
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                        "--master_port", str(29500 + os.getpid() % 1000), "-m", "nanobert.cli",
                        *flags, "--out", str(tmp_path / "two")], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    one, two = records(tmp_path / "one", "eval"), records(tmp_path / "two", "eval")
    assert [e["loss"] for e in two] == pytest.approx([e["loss"] for e in one], abs=1e-5)
    assert [e["loss"] for e in records(tmp_path / "two", "train")] == pytest.approx(
        [e["loss"] for e in records(tmp_path / "one", "train")], abs=1e-5)
