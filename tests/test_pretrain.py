"""Pretraining: the run, exact resume, fill-mask, the masking ablation, DDP (the corpus,
packing and pairs are in test_corpus.py)."""
import json
import os
import random
import signal
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from nanobert.cli import main
from nanobert.files import NanobertError
from nanobert.pretrain import PretrainConfig, run_pretrain


ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest


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
    assert "no text to pretrain on (only blank lines)" in capsys.readouterr().err
    assert main(["pretrain", "--corpus", str(tmp_path / "missing"), "--out", str(tmp_path / "o")]) == 2
    assert main(["pretrain", "--corpus", str(bad), "--out", str(tmp_path / "o"),
                 "--mask-split", "80/10"]) == 2
    assert not (tmp_path / "o" / "model.safetensors").exists()



def test_bad_model_choice_fails_before_the_corpus_is_read(tmp_path, capsys, monkeypatch):
    """--preset, --config and distill's --student-preset are checked first: a typo must
    not cost a tokenizer training (the corpus reader is never reached)."""
    import nanobert.pretrain as pt

    def never(*a, **k):
        raise AssertionError("the corpus was read before the flags were checked")
    monkeypatch.setattr(pt, "_load_data", never)
    corpus = tmp_path / "c.txt"
    corpus.write_text("one two three\n\nfour five six\n")
    not_json, array, a_dir = tmp_path / "n.json", tmp_path / "a.json", tmp_path / "d"
    not_json.write_text("{broken")
    array.write_text("[1, 2]")
    a_dir.mkdir()
    fifo = tmp_path / "config.fifo"   # (reading one waited for a writer for good)
    os.mkfifo(fifo)
    loop = tmp_path / "loop.json"
    loop.symlink_to(loop)
    def hung(*_):
        raise AssertionError("reading --config waited for good")
    was = signal.signal(signal.SIGALRM, hung)   # (a hang fails the test, not the suite)
    signal.alarm(60)
    electra, roberta = tmp_path / "electra.json", tmp_path / "roberta.json"
    small = {"vocab_size": 99, "hidden_size": 16, "num_hidden_layers": 1,
             "num_attention_heads": 2, "intermediate_size": 32, "max_position_embeddings": 600}
    electra.write_text(json.dumps(dict(small, model_type="funnel")))   # a family not read
    roberta.write_text(json.dumps(dict(small, model_type="roberta")))
    base = ["--corpus", str(corpus), "--out", str(tmp_path / "o"), "--steps", "1"]
    for extra, words in ((["--preset", "gigantic"], ["--preset", "'gigantic'", "tiny"]),
                         (["--config", str(not_json)], [str(not_json), "not valid JSON"]),
                         (["--config", str(array)], [str(array), "JSON object"]),
                         (["--config", str(a_dir)], [str(a_dir), "directory"]),
                         (["--config", str(tmp_path / "missing.json")], ["no such file"]),
                         (["--config", str(fifo)], [str(fifo), "not a regular file"]),
                         (["--config", str(loop)], [f"--config {loop}: cannot be read"]),
                         (["--config", str(electra)], ["--config", "model_type 'funnel'",
                                                       "cannot be pretrained"]),
                         (["--config", str(roberta), "--objective", "mlm+sop"],
                          ["--objective mlm+sop", "roberta"]),
                         (["--preset", "roberta-tiny", "--objective", "mlm+nsp"],
                          ["--objective mlm+nsp", "roberta"])):
        assert main(["pretrain", *base, *extra]) == 2, extra
        err = capsys.readouterr().err
        assert all(w in err for w in words) and "Traceback" not in err, (extra, err)
        assert len(err.strip().splitlines()) == 1, err
    assert main(["distill", *base, "--teacher", str(a_dir), "--student-preset", "huge"]) == 2
    assert "--student-preset: unknown preset 'huge'" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
    signal.alarm(0)
    signal.signal(signal.SIGALRM, was)

# ---- training, resume -----------------------------------------------------------------

def test_pretrain_writes_a_model_and_metrics(corpus_dir, tmp_path):
    """... and leaves the caller's random generators as they were (it seeds them: the
    caller's next draws had depended on whether it had trained; finetune and distill
    keep them the same way, train.keeps_random_state)."""
    import random
    import numpy as np
    import torch
    from nanobert import distill, finetune

    def draws():
        return torch.rand(2).tolist(), random.random(), np.random.rand()
    out = tmp_path / "run"
    torch.manual_seed(11), random.seed(11), np.random.seed(11)
    res = run_pretrain(args_for(corpus_dir, out, objective="mlm+sop", steps=8), log=lambda *a: None)
    after = draws()
    torch.manual_seed(11), random.seed(11), np.random.seed(11)
    assert after == draws()
    assert all(hasattr(f, "__wrapped__") for f in (finetune, distill.distill))
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


def test_an_interrupt_before_the_first_step_leaves_nothing(corpus_dir, tmp_path, monkeypatch,
                                                            capsys):
    """Ctrl-C before the first step saved a checkpoint of step 0 (87 MB for minilm), and the
    directory then held 'an unfinished run': there is nothing to keep, so the run takes
    its directory back, as one stopped before training does."""
    import nanobert.masking as masking
    real_mask, calls = masking.Masker.mask, {"n": 0}

    def interrupt_the_first_batch(self, *a, **kw):   # (the first call masks the validation rows)
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real_mask(self, *a, **kw)
    monkeypatch.setattr(masking.Masker, "mask", interrupt_the_first_batch)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        run_pretrain(args_for(corpus_dir, out, steps=12, eval_every=2, save_every=2,
                              cache_dir=str(tmp_path / "cache")))
    assert "interrupted before the first step: nothing to keep" in capsys.readouterr().err
    assert not out.exists()


def subprocess_env(tmp_path: Path) -> dict:
    """One thread per process, this checkout importable, and scratch folders (torchrun's
    torchelastic_*) under tmp_path rather than left behind in /tmp."""
    (tmp_path / "tmp").mkdir(exist_ok=True)
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), TMPDIR=str(tmp_path / "tmp"))


def test_resume_after_kill(corpus_dir, tmp_path):
    """The process is killed (SIGKILL) mid-run; --resume continues from the last checkpoint."""
    flags = ["--corpus", str(corpus_dir), "--steps", "30", "--batch-size", "8", "--seq-len", "32",
             "--vocab-size", "120", "--eval-every", "5", "--save-every", "5", "--no-progress",
             "--attn-backend", "eager", "--device", "cpu", "--cache-dir", str(tmp_path / "cache")]
    env = subprocess_env(tmp_path)
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


def test_fill_mask_never_offers_a_special_token(minilm, tiny_config):
    """A model that puts most of its mass on [MASK] (an untrained head, or one trained
    where the 80/10/10 split leaves [MASK] in place) answered "[MASK]" for a mask; the
    candidates are words, with the model's own probabilities."""
    import torch
    import nanobert
    from nanobert.pretrain import fill_mask
    tok = minilm[1]
    torch.manual_seed(0)
    model = nanobert.Bert(tiny_config, "mlm").eval()                # vocabulary 30,522
    with torch.no_grad():
        model.mlm.bias[tok.special_ids] = 30.0          # the specials dominate
    got = fill_mask(model, tok, "the [MASK] sat", k=4)[0]
    assert len(got) == 4 and not {t for t, _ in got} & {tok.id_to_token(i) for i in tok.special_ids}
    assert all(p < 1e-6 for _, p in got)                # the model's mass is on the specials
    # a vocabulary padded past the tokenizer's (ModernBERT: 50,368 rows for 50,280 tokens):
    # a padded row answered None ('null' in --json)
    import dataclasses
    padded = nanobert.Bert(dataclasses.replace(tiny_config, vocab_size=tok.vocab_size + 6),
                           "mlm").eval()
    with torch.no_grad():
        padded.mlm.bias[tok.vocab_size + 2] = 30.0
    got = fill_mask(padded, tok, "the [MASK] sat", k=3)[0]
    assert len(got) == 3 and all(isinstance(t, str) for t, _ in got)


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
    # each number with its column's decimals (an accuracy of 0 was written '0.0': misc5)
    import re
    for row in rows[1:]:
        cells = row.split(",")
        assert all(re.fullmatch(r"\d+\.\d{4}", c) for c in cells[1:4]), row
        assert re.fullmatch(r"\d+\.\d{2}", cells[4]), row
    assert (out / "ablation.png").stat().st_size > 1000
    curves = [[e["step"] for e in records(out / d, "eval")] for d in ("split-80-10-10", "split-0-0-100")]
    assert curves[0] == curves[1] == [2, 4]


def test_a_pair_loss_beside_mlm_takes_one_batchs_step_in_micro_batches(corpus_dir, tmp_path):
    """NSP's loss is a mean over rows, MLM's over masked tokens, and the trainer weighs
    each micro-batch by its masked tokens: --grad-accum 2 (and N processes) took another
    step than one batch (8e-3 apart in 12 steps). train.term_weight gives the pair loss
    its rows' part of the step."""
    from safetensors.torch import load_file
    flags = ["pretrain", "--corpus", str(corpus_dir), "--steps", "6", "--batch-size", "8",
             "--seq-len", "32", "--vocab-size", "120", "--dropout", "0", "--no-progress",
             "--objective", "mlm+nsp", "--cache-dir", str(tmp_path / "cache")]
    for accum in ("1", "2"):
        assert main([*flags, "--grad-accum", accum, "--out", str(tmp_path / accum)]) == 0
    a, b = (load_file(tmp_path / d / "model.safetensors") for d in ("1", "2"))
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-5


def free_port() -> int:
    """A loopback port nothing listens on now (a fixed one can be taken by another run)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def failed_ranks(stderr: str) -> str:
    """What a failed torchrun said: each rank's own lines (its error comes first, before
    torchrun's summary) and the summary's end."""
    own = [line for line in stderr.splitlines() if "torch/distributed" not in line]
    return "\n".join(own[:40]) + "\n...\n" + stderr[-1500:]


def test_torchrun_two_processes_match_one(corpus_dir, tmp_path):
    flags = ["pretrain", "--corpus", str(corpus_dir), "--steps", "4", "--batch-size", "8",
             "--seq-len", "32", "--vocab-size", "120", "--eval-every", "2", "--dropout", "0",
             "--no-progress", "--attn-backend", "eager", "--cache-dir", str(tmp_path / "cache")]
    env = subprocess_env(tmp_path)
    subprocess.run([sys.executable, "-m", "nanobert.cli", *flags, "--out", str(tmp_path / "one")],
                   check=True, env=env, capture_output=True)
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                        "--master_port", str(free_port()), "-m", "nanobert.cli",
                        *flags, "--out", str(tmp_path / "two")], env=env, capture_output=True, text=True)
    assert r.returncode == 0, failed_ranks(r.stderr)
    one, two = records(tmp_path / "one", "eval"), records(tmp_path / "two", "eval")
    assert [e["loss"] for e in two] == pytest.approx([e["loss"] for e in one], abs=1e-5)
    assert [e["loss"] for e in records(tmp_path / "two", "train")] == pytest.approx(
        [e["loss"] for e in records(tmp_path / "one", "train")], abs=1e-5)
    # with --grad-accum 2 too, alone and under torchrun: each micro-batch's loss weighs by
    # its share of the masked tokens (of all ranks), so the step is the same (it had
    # differed by about 1e-3: each micro-batch's mean counted alike)
    subprocess.run([sys.executable, "-m", "nanobert.cli", *flags, "--grad-accum", "2",
                    "--out", str(tmp_path / "accum")], check=True, env=env, capture_output=True)
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                        "--master_port", str(free_port()), "-m", "nanobert.cli", *flags,
                        "--grad-accum", "2", "--out", str(tmp_path / "two-accum")], env=env,
                       capture_output=True, text=True)
    assert r.returncode == 0, failed_ranks(r.stderr)
    for run in ("accum", "two-accum"):
        assert [e["loss"] for e in records(tmp_path / run, "eval")] == pytest.approx(
            [e["loss"] for e in one], abs=1e-5), run


def kill_all(text: str):
    """SIGKILL to every process whose command line holds `text` (torchrun and workers)."""
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and text in (proc / "cmdline").read_text():
                os.kill(int(proc.name), signal.SIGKILL)
        except OSError:   # (gone already)
            pass


def killed_between(argv: list, out: Path, low: int, high: int, env: dict) -> int:
    """Run torchrun `argv` writing `out`, SIGKILL it all once its checkpoint holds a step
    from `low` to `high`; the step the checkpoint holds."""
    import time
    p = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    state, t0 = out / "checkpoint" / "state.json", time.time()
    while time.time() - t0 < 240 and p.poll() is None:
        if state.is_file() and low <= json.loads(state.read_text())["step"] <= high:
            kill_all(str(out))      # (torchrun's workers run in sessions of their own)
            break
        time.sleep(0.02)
    p.wait()
    return json.loads(state.read_text())["step"]


def test_torchrun_fsdp_trains_as_one_process_and_resumes_after_a_kill(corpus_dir, tmp_path):
    """--fsdp: each block's weights, gradients and AdamW moments are split over the two
    processes. The model is the one a single process trains (dropout off), its
    checkpoint holds whole tensors (as one process writes them), and a run killed half
    way resumes to the same losses and weights as one never stopped."""
    from safetensors.torch import load_file
    flags = ["pretrain", "--corpus", str(corpus_dir), "--steps", "150", "--batch-size", "8",
             "--seq-len", "32", "--vocab-size", "120", "--eval-every", "15", "--dropout", "0",
             "--no-progress", "--attn-backend", "eager", "--cache-dir", str(tmp_path / "cache")]
    env = subprocess_env(tmp_path)

    def fsdp(out, *more):
        return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                "--master_port", str(free_port()), "-m", "nanobert.cli", *flags, "--fsdp",
                "--out", str(out), *more]
    subprocess.run([sys.executable, "-m", "nanobert.cli", *flags, "--out", str(tmp_path / "one")],
                   check=True, env=env, capture_output=True)
    r = subprocess.run(fsdp(tmp_path / "two"), env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, failed_ranks(r.stderr)
    assert r.stdout.count("best validation") == 1
    one, two = records(tmp_path / "one", "eval"), records(tmp_path / "two", "eval")
    assert [e["loss"] for e in two] == pytest.approx([e["loss"] for e in one], abs=1e-5)
    a, b = (load_file(tmp_path / d / "model.safetensors") for d in ("one", "two"))
    assert a.keys() == b.keys() and max((a[k] - b[k]).abs().max().item() for k in a) < 1e-4
    moments = load_file(tmp_path / "two" / "checkpoint" / "optimizer.safetensors")
    alone = load_file(tmp_path / "one" / "checkpoint" / "optimizer.safetensors")
    assert all(moments[k].shape == alone[k].shape for k in alone)      # whole, not a half
    cut = tmp_path / "cut"
    killed_at = killed_between(fsdp(cut), cut, 15, 105, env)
    assert killed_at < 150, "the run finished before it could be killed"
    r = subprocess.run(fsdp(cut, "--resume"), env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, failed_ranks(r.stderr)
    assert r.stdout.count(f"resuming from {cut / 'checkpoint'} at step {killed_at}/150") == 1
    assert [e["loss"] for e in records(cut, "train")] == pytest.approx(
        [e["loss"] for e in records(tmp_path / "two", "train")], abs=1e-6)
    c = load_file(cut / "model.safetensors")
    assert max((b[k] - c[k]).abs().max().item() for k in b) < 1e-6


def test_torchrun_with_dropout_resumes_to_the_uninterrupted_run(corpus_dir, tmp_path):
    """Dropout on, 2 processes, killed after a checkpoint and resumed: the run ends as
    one never stopped. The checkpoint holds rank 0's random state; rank 1 had resumed
    with it and drawn other dropout masks where its rows took other numbers of draws
    (unpadded: real tokens; weights 0.04 apart). A later rank's masks are now a function
    of the seed, the step and the rank."""
    from safetensors.torch import load_file
    flags = ["pretrain", "--corpus", str(corpus_dir), "--steps", "40", "--batch-size", "8",
             "--seq-len", "32", "--vocab-size", "120", "--eval-every", "10", "--save-every", "5",
             "--dropout", "0.1", "--no-progress", "--cache-dir",
             str(tmp_path / "cache")]
    env = subprocess_env(tmp_path)

    def ddp(out, *more):
        return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                "--master_port", str(free_port()), "-m", "nanobert.cli", *flags,
                "--out", str(out), *more]
    r = subprocess.run(ddp(tmp_path / "whole"), env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, failed_ranks(r.stderr)
    cut = tmp_path / "cut"
    assert killed_between(ddp(cut), cut, 5, 30, env) < 40, "the run finished unkilled"
    r = subprocess.run(ddp(cut, "--resume"), env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, failed_ranks(r.stderr)
    assert [e["loss"] for e in records(cut, "eval")] == \
        [e["loss"] for e in records(tmp_path / "whole", "eval")]
    a, b = (load_file(d / "model.safetensors") for d in (tmp_path / "whole", cut))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_torchrun_fsdp_without_validation_saves_the_last_model(corpus_dir, tmp_path):
    """--val-fraction 0 under --fsdp: the last model is gathered by every process (rank 1,
    which holds no validation rows, had gathered alone: a collective mismatch, and the
    run ended in SIGABRT after training)."""
    from safetensors.torch import load_file
    flags = ["pretrain", "--corpus", str(corpus_dir), "--steps", "3", "--batch-size", "8",
             "--seq-len", "32", "--vocab-size", "120", "--val-fraction", "0", "--dropout",
             "0", "--no-progress", "--cache-dir", str(tmp_path / "cache")]
    env = subprocess_env(tmp_path)
    subprocess.run([sys.executable, "-m", "nanobert.cli", *flags, "--out", str(tmp_path / "one")],
                   check=True, env=env, capture_output=True)
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                        "--master_port", str(free_port()), "-m", "nanobert.cli", *flags,
                        "--fsdp", "--out", str(tmp_path / "two")], env=env, capture_output=True,
                       text=True, timeout=240)
    assert r.returncode == 0, failed_ranks(r.stderr)
    assert r.stdout.count("is the one saved") == 1
    a, b = (load_file(tmp_path / d / "model.safetensors") for d in ("one", "two"))
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-5


def test_torchrun_streaming_ranks_read_their_own_runs_tokenizer(corpus_dir, tmp_path):
    """--streaming under torchrun: rank 0 saved its vocabulary as 'tokenizer-streaming' in
    --cache-dir for the other ranks to read, one name for every run sharing the folder;
    a rank could read another run's vocabulary (of the same size: nothing failed). Each
    run writes its own now (cleared once read), and the ranks check they hold the same
    one."""
    from nanobert.tokenizer import Tokenizer
    cache = tmp_path / "cache"
    other = Tokenizer.train(["zebra quokka " * 20] * 50, vocab_size=120)
    other.save(cache / "tokenizer-streaming")            # what another run left there
    flags = ["pretrain", "--corpus", str(corpus_dir), "--steps", "2", "--batch-size", "8",
             "--seq-len", "32", "--vocab-size", "120", "--no-progress", "--attn-backend",
             "eager", "--streaming", "--cache-dir", str(cache), "--out", str(tmp_path / "run")]
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                        "--master_port", str(free_port()), "-m", "nanobert.cli", *flags],
                       env=subprocess_env(tmp_path), capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, failed_ranks(r.stderr)
    saved = Tokenizer.from_dir(tmp_path / "run")
    assert saved.tk.to_str() != other.tk.to_str()
    assert Tokenizer.from_dir(cache / "tokenizer-streaming").tk.to_str() == other.tk.to_str()
    assert not list(cache.glob("tokenizer-streaming-*"))       # (its own: read, then cleared)


def test_torchrun_an_error_every_rank_meets_is_said_once(corpus_dir, tmp_path):
    """A missing corpus or a bad flag value is met by each process on its own (no
    collective between them): one line for the job, not one a process, and every rank
    ends with status 2."""
    env = subprocess_env(tmp_path)
    for flags, said in ((["--corpus", str(tmp_path / "missing")], "nanobert: error: "),
                        (["--corpus", str(corpus_dir), "--steps", "x"], "nanobert: error: --steps")):
        r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                            "--master_port", str(free_port()), "-m", "nanobert.cli", "pretrain",
                            *flags, "--out", str(tmp_path / "run")],
                           env=env, capture_output=True, text=True, timeout=240)
        assert r.stderr.count(said) == 1, r.stderr[-2000:]
        assert r.stderr.count("exitcode  : 2") == 2, r.stderr[-2000:]


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGINT])
def test_torchrun_a_killed_rank_ends_the_other_in_one_line(corpus_dir, tmp_path, signum):
    """One worker is killed (SIGKILL: the OOM killer's way) in the middle of training: the
    other stops with one line saying so and how to go on, not gloo's page of traceback.
    A worker sent SIGINT alone said nothing, while that line said to read its own."""
    import time
    out = tmp_path / "run"
    p = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                          "--master_port", str(free_port()), "-m", "nanobert.cli", "pretrain",
                          "--corpus", str(corpus_dir), "--steps", "100000", "--batch-size", "8",
                          "--seq-len", "32", "--vocab-size", "120", "--save-every", "5",
                          "--no-progress", "--attn-backend", "eager", "--out", str(out)],
                         env=subprocess_env(tmp_path), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    t0 = time.time()
    while not (out / "checkpoint" / "state.json").is_file() and time.time() - t0 < 200:
        time.sleep(0.05)
    killed = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and str(out) in (proc / "cmdline").read_text() and \
                    b"RANK=1\0" in (proc / "environ").read_bytes() and \
                    b"torch.distributed.run" not in (proc / "cmdline").read_bytes():
                os.kill(int(proc.name), signum)
                killed.append(proc.name)
        except OSError:   # (gone already)
            pass
    try:
        _, err = p.communicate(timeout=120)
    finally:
        kill_all(str(out))
    assert killed, "no rank 1 to kill"
    assert p.returncode != 0
    assert err.count("nanobert: error: another process of this torchrun job stopped") == 1, \
        err[-3000:]
    assert "[rank0]: Traceback" not in err, err[-3000:]
    assert err.count("nanobert: interrupted") == (signum == signal.SIGINT), err[-3000:]


def test_torchrun_refusal_on_rank0_ends_every_rank(corpus_dir, tmp_path):
    """Rank 0 alone checks the output directory; when it refuses (another run's model is
    there), the other rank must stop with the same message, not wait at a barrier (before
    the fix only rank 0 said why, and torchrun killed the waiting rank), and the line is
    said once."""
    flags = ["pretrain", "--corpus", str(corpus_dir), "--steps", "2", "--batch-size", "8",
             "--seq-len", "32", "--vocab-size", "120", "--no-progress", "--attn-backend", "eager",
             "--out", str(tmp_path / "run")]
    env = subprocess_env(tmp_path)
    subprocess.run([sys.executable, "-m", "nanobert.cli", *flags], check=True, env=env,
                   capture_output=True)
    before = sorted(p.name for p in (tmp_path / "run").iterdir())
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                        "--master_port", str(free_port()), "-m", "nanobert.cli",
                        *flags[:-2], "--steps", "3", "--out", str(tmp_path / "run")],
                       env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode != 0
    # both ranks stop with status 2; the one that refused says why, once (each rank
    # had printed the same line)
    assert r.stderr.count("nanobert: error: --out") == 1, r.stderr[-2000:]
    assert r.stderr.count("exitcode  : 2") == 2, r.stderr[-2000:]
    assert "--overwrite" in r.stderr
    assert "nanobert/" not in "".join(line for line in r.stderr.splitlines()
                                      if line.strip().startswith("File "))  # (torchrun's own report aside)
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == before


# ---- probing the command line: refusals before work, output directories ------------------

def cli_refusal(capsys, argv) -> str:
    """The one line `nanobert argv` prints when it refuses (status 2, no traceback)."""
    try:
        rc = main(argv)
    except SystemExit as e:   # refused while parsing
        rc = e.code
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.count("\n") == 0 and "Traceback" not in err, err
    return err.removeprefix("nanobert: error: ")


def test_outputs_inside_the_corpus_directory_are_refused(corpus_dir, tmp_path, capsys):
    """--out (or --cache-dir) inside a --corpus directory: the run's own record was read
    back as corpus ('nanobert-run.json:1: JSON, not plain text'), blaming the wrong file;
    a --cache-dir that is a file was a FileExistsError traceback."""
    base = ["pretrain", "--corpus", str(corpus_dir), "--steps", "1", "--no-progress"]
    for out in (corpus_dir / "run", corpus_dir):
        assert "the --corpus directory" in cli_refusal(capsys, base + ["--out", str(out)])
    assert not (corpus_dir / "run").exists() and not (corpus_dir / "nanobert-run.json").exists()
    assert "the --corpus directory" in cli_refusal(
        capsys, base + ["--out", str(tmp_path / "o"), "--cache-dir", str(corpus_dir / "cache")])
    a_file = tmp_path / "notes.txt"
    a_file.write_text("x\n")
    for cache in (a_file, a_file / "sub"):
        assert cli_refusal(capsys, base + ["--out", str(tmp_path / "o"), "--cache-dir",
                                           str(cache)]).startswith(f"--cache-dir {cache}")
    assert not (tmp_path / "o").exists()


def test_empty_huge_and_missing_values_are_refused_while_parsing(tmp_path, capsys):
    """An empty string was taken as 'unset' (--tokenizer ''), as the current directory
    (--model '' -> 'config.json: missing') or crashed late (--preset '': ValueError
    traceback after the corpus was read); a huge --seq-len was an allocation traceback and
    a huge --steps a run that never ends."""
    base = ["pretrain", "--corpus", str(tmp_path / "c.txt"), "--out", str(tmp_path / "o")]
    for flag in ("--preset", "--tokenizer", "--config", "--cache-dir"):
        assert cli_refusal(capsys, base + [flag, ""]).startswith(f"{flag}: got ''")
    assert cli_refusal(capsys, ["fill-mask", "--model", "", "a [MASK]"]).startswith("--model: got ''")
    assert cli_refusal(capsys, base + ["--seq-len", "1000000000"]).startswith(
        "--seq-len: got 1000000000, expected an integer >= 8 and <= 131072")
    assert cli_refusal(capsys, base + ["--steps", "99999999999999999999"]).startswith("--steps: got")
    with pytest.raises(NanobertError, match="--preset"):
        PretrainConfig(corpus=["c"], preset=None)
    # both a preset and a config: the config was used, the preset recorded as if it counted
    assert cli_refusal(capsys, base + ["--steps", "2", "--preset", "mini", "--config",
                                       str(tmp_path / "config.json")]).startswith(
        "--preset mini: --config ")
    assert not (tmp_path / "o").exists()


def test_help_of_a_negated_flag_says_what_it_turns_off(capsys):
    """'--no-progress  a progress bar with loss and throughput (default: True)' read as if
    the flag turned the bar on."""
    with pytest.raises(SystemExit):
        main(["pretrain", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--no-progress turn off (on by default): a progress bar" in out
    assert "(default: True)" not in out


def test_fill_mask_says_when_the_mask_is_past_the_length(tmp_path, capsys):
    """A [MASK] beyond the model's length was 'no [MASK] token in <the whole text>'."""
    import nanobert
    from conftest import WORDS, tiny_model_dir
    d = tiny_model_dir(tmp_path / "m", WORDS, 60, ".")
    tok = nanobert.Tokenizer.from_dir(d)
    model = nanobert.Bert(nanobert.preset("tiny", vocab_size=tok.vocab_size,
                                          max_position_embeddings=64), "mlm")
    model.save_pretrained(d, tokenizer=tok)
    err = cli_refusal(capsys, ["fill-mask", "--model", str(d), "cat " * 600 + "[MASK]"])
    assert "past the" in err and "[MASK]" in err and len(err) < 300
    assert len(cli_refusal(capsys, ["fill-mask", "--model", str(d), "cat " * 600])) < 200
    # every text is checked before any is filled: the first one's answers were printed
    # before the second was refused; a mask written otherwise gets a hint
    assert main(["fill-mask", "--model", str(d), "the [MASK] sat", "the [mask] sat"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == ("nanobert: error: no [MASK] token in 'the [mask] sat' (this "
                                 "model's mask token is [MASK], written exactly so)\n")


def test_ablation_refuses_a_model_directory_and_no_validation(corpus_dir, tmp_path, capsys):
    """ablate-masking --out <a pretraining run> wrote its split runs and table into the
    model's directory; --val-fraction 0 was an IndexError traceback after training."""
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text("{}")
    base = ["ablate-masking", "--corpus", str(corpus_dir), "--steps", "1", "--no-progress"]
    assert "is a model directory" in cli_refusal(capsys, base + ["--out", str(model_dir)])
    assert sorted(p.name for p in model_dir.iterdir()) == ["config.json"]
    assert cli_refusal(capsys, base + ["--out", str(tmp_path / "a"), "--val-fraction", "0"]
                       ).startswith("--val-fraction")
    assert not (tmp_path / "a").exists()


def test_ablation_resumes_its_runs(corpus_dir, tmp_path, capsys):
    """ablate-masking had no --resume, while a second run told to 'continue it with
    --resume': with it, finished splits are read back and new ones trained."""
    out = tmp_path / "abl"
    argv = ["ablate-masking", "--corpus", str(corpus_dir), "--out", str(out), "--steps", "2",
            "--batch-size", "8", "--seq-len", "32", "--vocab-size", "120", "--no-progress",
            "--attn-backend", "eager", "--splits"]
    assert main(argv + ["80/10/10"]) == 0
    first = (out / "split-80-10-10" / "model.safetensors").read_bytes()
    assert main(argv + ["80/10/10"]) == 2                       # not without --resume
    assert main(argv + ["80/10/10,0/0/100", "--resume"]) == 0
    assert (out / "split-80-10-10" / "model.safetensors").read_bytes() == first
    assert len((out / "ablation.csv").read_text().splitlines()) == 3


def test_sigterm_saves_a_checkpoint_like_ctrl_c(corpus_dir, tmp_path):
    """`kill` / `timeout` (SIGTERM) killed a run at once: the steps since the last
    checkpoint were lost. Now it is Ctrl-C: a checkpoint, status 143, and --resume gives
    the model an uninterrupted run gives."""
    import time
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "nanobert.cli", "pretrain", "--corpus", str(corpus_dir),
            "--out", str(out), "--steps", "100000", "--batch-size", "8", "--seq-len", "32",
            "--vocab-size", "120", "--save-every", "100000", "--eval-every", "100000",
            "--no-progress", "--threads", "1"]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         cwd=ROOT)
    deadline, log = time.time() + 120, out / "metrics.jsonl"
    # training has taken steps once the first "train" record (step 10) is written; a
    # fixed sleep after the vocabulary appeared was too short on a loaded machine, where
    # the signal then came before the first step (and a run with no step leaves nothing)
    while time.time() < deadline and not (log.exists() and log.stat().st_size):
        time.sleep(0.1)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 128 + signal.SIGTERM, err
    assert "Traceback" not in err and "terminated" in err
    state = json.loads((out / "checkpoint" / "state.json").read_text())
    assert state["step"] >= 1


def test_a_config_or_preset_changed_by_the_run_is_noted(tmp_path, capsys):
    """A --config vocab_size replaced by the tokenizer's, and a preset grown past its 512
    positions for --seq-len, were silent."""
    from nanobert import Tokenizer
    from nanobert.pretrain import PretrainConfig, _model_config
    tok = Tokenizer.train(["the cat sat on the mat"] * 20, vocab_size=40, min_frequency=1)
    hf = {"vocab_size": 50, "hidden_size": 32, "num_hidden_layers": 1,
          "num_attention_heads": 2, "intermediate_size": 64, "max_position_embeddings": 64}
    (tmp_path / "config.json").write_text(json.dumps(hf))
    c = _model_config(PretrainConfig(corpus=["c"], model_config=str(tmp_path / "config.json"),
                                     seq_len=32), tok)
    assert c.vocab_size == tok.vocab_size
    assert f"vocab_size 50 is replaced by the tokenizer's {tok.vocab_size}" in capsys.readouterr().err
    c = _model_config(PretrainConfig(corpus=["c"], preset="tiny", seq_len=600), tok)
    assert c.max_position_embeddings == 600
    assert "the tiny preset gets 600 positions" in capsys.readouterr().err
    _model_config(PretrainConfig(corpus=["c"], preset="tiny", seq_len=128), tok)
    assert capsys.readouterr().err == ""
    # a --config with too few positions is refused with the flags, before any work
    from nanobert.files import NanobertError
    with pytest.raises(NanobertError, match="--seq-len 128 exceeds --config .* 64 positions"):
        PretrainConfig(corpus=["c"], model_config=str(tmp_path / "config.json"), seq_len=128)
    # a config.json without vocab_size (the tokenizer's replaces it) was refused as
    # "missing key(s) vocab_size"
    del hf["vocab_size"]
    (tmp_path / "config.json").write_text(json.dumps(hf))
    c = _model_config(PretrainConfig(corpus=["c"], model_config=str(tmp_path / "config.json"),
                                     seq_len=32), tok)
    assert c.vocab_size == tok.vocab_size and capsys.readouterr().err == ""


def ablation_argv(corpus_dir, out, steps, splits, *extra) -> list:
    return ["ablate-masking", "--corpus", str(corpus_dir), "--out", str(out), "--steps",
            str(steps), "--batch-size", "8", "--seq-len", "32", "--vocab-size", "120",
            "--eval-every", "2", "--max-eval-rows", "16", "--no-progress", "--attn-backend",
            "eager", "--splits", splits, *extra]


def test_ablation_trains_and_names_the_exact_split(corpus_dir, tmp_path, capsys):
    """--splits 80.5/9.5/10 trained 80/10/10 (its name, rounded to whole percents, was
    passed on as the split), in split-80-10-10, and 80/10/10,80.4/9.6/10 was refused as
    'given twice'. Splits are the same only when they are equal as numbers."""
    from nanobert.pretrain import parse_splits
    assert parse_splits("80/10/10, 80.4/9.6/10") == [(0.8, 0.1, 0.1), (0.804, 0.096, 0.1)]
    with pytest.raises(NanobertError, match=r"80/10/10 is given twice .*\(also as 80\.0/10/10\)"):
        parse_splits("80/10/10,80.0/10/10")
    with pytest.raises(NanobertError, match="more than 10 decimals"):
        parse_splits("33.333333333333333/33.333333333333333/33.333333333333334")
    # a trailing comma is no split; an empty one between commas is a typo ('80/10/10,,'
    # trained 80/10/10 alone, unsaid)
    assert parse_splits("80/10/10,") == [(0.8, 0.1, 0.1)]
    with pytest.raises(NanobertError, match="an empty split between commas"):
        parse_splits("80/10/10,,100/0/0")
    out = tmp_path / "abl"
    assert main(ablation_argv(corpus_dir, out, 1, "80.5/9.5/10,80/10/10")) == 0
    assert sorted(p.name for p in out.glob("split-*")) == ["split-80-10-10", "split-80.5-9.5-10"]
    args = json.loads((out / "split-80.5-9.5-10" / "pretrain_args.json").read_text())
    assert args["mask_split"] == "80.5/9.5/10"
    assert PretrainConfig.create(corpus=["c"], mask_split=args["mask_split"]).split == \
        (0.805, 0.095, 0.1)
    assert "| 80.5/9.5/10 |" in (out / "ablation.md").read_text()
    assert "split 80.5/9.5/10" in capsys.readouterr().out


def test_the_ablation_directory_is_one_run(corpus_dir, tmp_path, capsys):
    """An ablation's --out had no run record: a new ablation there replaced the report and
    left the old split runs beside its own, and --overwrite kept them too. Now a directory
    holding an ablation needs --resume (of the same one) or --overwrite, which clears it."""
    out = tmp_path / "abl"
    assert main(ablation_argv(corpus_dir, out, 2, "80/10/10,0/0/100")) == 0
    report = (out / "ablation.md").read_text()
    rec = json.loads((out / "nanobert-run.json").read_text())
    assert rec["command"] == "ablate-masking" and rec["status"] == "finished"
    assert "mask_split" not in rec["fingerprint"]["flags"]
    assert "already holds a masking ablation (split-0-0-100, split-80-10-10" in cli_refusal(
        capsys, ablation_argv(corpus_dir, out, 1, "70/20/10"))
    assert "(--steps 2 there, 1 now)" in cli_refusal(
        capsys, ablation_argv(corpus_dir, out, 1, "70/20/10", "--resume"))
    assert (out / "ablation.md").read_text() == report and not (out / "split-70-20-10").exists()
    (out / "notes.txt").write_text("mine\n")      # (was there before: kept, as rundir keeps it)
    rec["foreign"] = ["notes.txt"]
    (out / "nanobert-run.json").write_text(json.dumps(rec))
    assert main(ablation_argv(corpus_dir, out, 1, "100/0/0", "--overwrite")) == 0
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == [
        "ablation.csv", "ablation.md", "ablation.png", "cache", "nanobert-run.json",
        "notes.txt", "split-100-0-0"]
    # an ablation written before ablations had a record: --resume cannot check it
    (out / "nanobert-run.json").unlink()
    assert "without a run record" in cli_refusal(
        capsys, ablation_argv(corpus_dir, out, 1, "100/0/0", "--resume"))
    assert main(ablation_argv(corpus_dir, out, 1, "0/0/100", "--overwrite")) == 0
    assert sorted(p.name for p in out.glob("split-*")) == ["split-0-0-100"]
    assert (out / "notes.txt").is_file()


def test_an_interrupted_ablation_keeps_its_runs_and_resumes_exactly(corpus_dir, tmp_path,
                                                                    monkeypatch):
    """Ctrl-C in the second split: the first split's model and the second's checkpoint
    stay (the ablation's record says unfinished), and --resume ends with the models of an
    uninterrupted ablation, byte for byte."""
    import nanobert.masking as masking
    argv = lambda out, *extra: ablation_argv(corpus_dir, out, 4, "80/10/10,0/0/100",  # noqa: E731
                                              "--save-every", "2", *extra)
    assert main(argv(tmp_path / "full")) == 0
    real_mask, calls = masking.Masker.mask, {"n": 0}

    def mask_then_interrupt(self, *a, **kw):   # split 1: 5 calls (validation + 4 steps)
        calls["n"] += 1
        if calls["n"] == 9:                    # split 2, building its 3rd batch
            raise KeyboardInterrupt
        return real_mask(self, *a, **kw)
    monkeypatch.setattr(masking.Masker, "mask", mask_then_interrupt)
    cut = tmp_path / "cut"
    assert main(argv(cut)) == 130
    monkeypatch.setattr(masking.Masker, "mask", real_mask)
    assert json.loads((cut / "nanobert-run.json").read_text())["status"] == "running"
    assert (cut / "split-80-10-10" / "model.safetensors").is_file()
    state = cut / "split-0-0-100" / "checkpoint" / "state.json"
    assert json.loads(state.read_text())["step"] == 2
    assert main(argv(cut, "--resume")) == 0
    assert json.loads((cut / "nanobert-run.json").read_text())["status"] == "finished"
    for d in ("split-80-10-10", "split-0-0-100"):
        assert (cut / d / "model.safetensors").read_bytes() == \
            (tmp_path / "full" / d / "model.safetensors").read_bytes()


def test_a_vocabulary_smaller_than_asked_is_noted(corpus_dir, capsys):
    """--vocab-size 99999999 printed 'training a WordPiece vocabulary of 99999999' and
    saved one of about a thousand tokens without a word."""
    from nanobert.corpus import load_corpus
    tok, _, _ = load_corpus([corpus_dir], None, vocab_size=99999999, log=lambda *a: None)
    err = capsys.readouterr().err
    assert f"--vocab-size 99999999: the vocabulary has {tok.vocab_size} tokens" in err
    tok, _, _ = load_corpus([corpus_dir], None, vocab_size=60, log=lambda *a: None)
    assert tok.vocab_size == 60 and capsys.readouterr().err == ""
    # under the specials and the characters: 16 gave ~100 tokens, silently
    tok, _, _ = load_corpus([corpus_dir], None, vocab_size=16, log=lambda *a: None)
    assert tok.vocab_size > 16 and f"--vocab-size 16: the vocabulary has {tok.vocab_size} " \
        "tokens, the special tokens and every character" in capsys.readouterr().err


def test_resume_logs_the_loss_curve_of_an_uninterrupted_run(
        corpus_dir, tmp_path, monkeypatch):
    """The weights, the evaluations and every training-loss record of a resumed run equal
    an uninterrupted run's, the record whose window (here steps 5-8) spans the stop
    (step 6) included: the checkpoint keeps the losses summed since the last record (that
    record averaged only the steps after the stop)."""
    import nanobert.masking as masking
    kw = dict(steps=12, eval_every=4, save_every=4, cache_dir=str(tmp_path / "cache"))
    run_pretrain(args_for(corpus_dir, tmp_path / "full", **kw), log=lambda *a: None)
    real_mask, calls = masking.Masker.mask, {"n": 0}

    def mask_then_interrupt(self, *a, **kw):
        calls["n"] += 1
        if calls["n"] == 8:                  # (the first call masks the validation rows)
            raise KeyboardInterrupt
        return real_mask(self, *a, **kw)
    monkeypatch.setattr(masking.Masker, "mask", mask_then_interrupt)
    cut = tmp_path / "cut"
    with pytest.raises(KeyboardInterrupt):
        run_pretrain(args_for(corpus_dir, cut, **kw), log=lambda *a: None)
    monkeypatch.setattr(masking.Masker, "mask", real_mask)
    assert json.loads((cut / "checkpoint" / "state.json").read_text())["step"] == 6
    run_pretrain(args_for(corpus_dir, cut, resume=True, **kw), log=lambda *a: None)
    for name in ("model.safetensors", "checkpoint/model.safetensors"):
        assert (cut / name).read_bytes() == (tmp_path / "full" / name).read_bytes()
    assert [r["loss"] for r in records(cut, "eval")] == \
        [r["loss"] for r in records(tmp_path / "full", "eval")]
    a, b = ({r["step"]: r["loss"] for r in records(d, "train")} for d in (tmp_path / "full", cut))
    assert list(a) == list(b) == [4, 8, 12]
    assert a == b


# ---- --config of other families ---------------------------------------------------------

def _hf_config(family: str) -> dict:
    """A tiny config.json of a family, as transformers writes it."""
    import transformers as hf
    small = dict(vocab_size=500, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=48)
    make = {"albert": lambda: hf.AlbertConfig(**small, embedding_size=16, num_hidden_groups=2,
                                              max_position_embeddings=64),
            "roberta": lambda: hf.RobertaConfig(**small, max_position_embeddings=66,
                                                hidden_act="relu"),
            "deberta-v2": lambda: hf.DebertaV2Config(**small, max_position_embeddings=64,
                                                     relative_attention=True,
                                                     pos_att_type=["p2c", "c2p"],
                                                     position_buckets=16, share_att_key=True,
                                                     norm_rel_ebd="layer_norm"),
            "modernbert": lambda: hf.ModernBertConfig(**small, max_position_embeddings=128,
                                                      local_attention=8)}[family]
    return make().to_dict()


@pytest.mark.parametrize("family,objective", [("albert", "mlm+sop"), ("roberta", "mlm"),
                                              ("deberta-v2", "mlm"), ("modernbert", "mlm")])
def test_a_config_of_another_family_pretrains_that_family(corpus_dir, tmp_path, family,
                                                          objective):
    """`--config` read only BERT's keys and built a BERT whatever the model_type (a
    DeBERTa-v2 config, type_vocab_size 0, gave a bert checkpoint without token types that
    transformers cannot run); its model_type now picks the family, as nanobert.load reads
    config.json, and transformers reads the checkpoint with the same MLM (and SOP) logits."""
    import torch
    import transformers as hf
    import nanobert
    cfg_file = tmp_path / f"{family}.json"
    cfg_file.write_text(json.dumps(_hf_config(family)))
    out = tmp_path / "run"
    assert main(["pretrain", "--corpus", str(corpus_dir), "--config", str(cfg_file),
                 "--objective", objective, "--out", str(out), "--steps", "2", "--batch-size", "4",
                 "--seq-len", "32", "--vocab-size", "120", "--eval-every", "2",
                 "--threads", "1", "--no-progress", "--attn-backend", "eager"]) == 0
    written = json.loads((out / "config.json").read_text())
    assert written["model_type"] == family
    model, tok = nanobert.load(out)
    assert model.config.family == family and model.head == ("pretraining" if objective != "mlm"
                                                             else "mlm")
    ref_class = hf.AlbertForPreTraining if family == "albert" else hf.AutoModelForMaskedLM
    ref = ref_class.from_pretrained(out).eval()
    assert type(ref).__name__ == written["architectures"][0]
    b = tok(["the first of the texts here", "and a second, longer one of them, with more words"])
    kw = dict(input_ids=b["input_ids"], attention_mask=b["attention_mask"])
    if family in ("albert", "roberta"):
        kw["token_type_ids"] = b["token_type_ids"]
    with torch.no_grad():
        theirs, ours = ref(**kw), model.eval()(b["input_ids"], b["attention_mask"],
                                               b["token_type_ids"])
    logits = getattr(theirs, "prediction_logits", None)
    logits = theirs.logits if logits is None else logits
    real = b["attention_mask"].bool()
    assert (logits - ours.logits)[real].abs().max() < 1e-4
    if family == "albert":
        assert (theirs.sop_logits - ours.pair_logits).abs().max() < 1e-4
    if family == "deberta-v2":
        assert written["type_vocab_size"] == 0


def test_roberta_positions_start_after_the_tokenizers_padding_id(tmp_path):
    """transformers' RoBERTa counts positions from config.json's pad_token_id + 1, and that
    is the tokenizer's padding id: a RoBERTa tokenizer (<pad> = 1) with the roberta-tiny
    preset trained positions from 1 while the checkpoint said 2; a --config keeps its
    positions too when the tokenizer pads with another id."""
    from nanobert import Tokenizer
    from nanobert.pretrain import _model_config
    from tokenizers import ByteLevelBPETokenizer
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(["the cat sat on the mat"] * 20, vocab_size=300, min_frequency=1,
                            special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    bpe.save_model(str(tmp_path))
    rob, wp = Tokenizer.from_dir(tmp_path), Tokenizer.train(["the cat sat"] * 9, vocab_size=40)
    (tmp_path / "roberta.json").write_text(json.dumps(_hf_config("roberta")))
    for tok in (rob, wp):
        c = _model_config(PretrainConfig(corpus=["c"], preset="roberta-tiny", seq_len=128), tok)
        assert (c.pad_token_id, c.position_offset) == (tok.pad_id, tok.pad_id + 1)
        assert c.max_position_embeddings - c.position_offset == 512
        c = _model_config(PretrainConfig(corpus=["c"], model_config=str(tmp_path / "roberta.json"),
                                         seq_len=32), tok)
        assert (c.family, c.pad_token_id, c.position_offset) == ("roberta", tok.pad_id, tok.pad_id + 1)


def test_perplexity_is_exp_of_the_loss_even_when_training_diverged(tiny_config):
    """The perplexity was capped at exp(50): losses of 75, 111 and 124 all printed
    5184705528587072045056 (docs: perplexity = exp(loss))."""
    import math

    import torch

    import nanobert
    from nanobert.pretrain import evaluate_mlm
    torch.manual_seed(0)
    model = nanobert.Bert(tiny_config, "mlm").eval()
    with torch.no_grad():   # a diverged model: a loss far above 50
        model.mlm.bias.copy_(torch.randn(tiny_config.vocab_size) * 100)
    ids = torch.randint(5, tiny_config.vocab_size, (2, 6))
    labels = torch.full_like(ids, -100)
    labels[:, 2] = ids[:, 2]
    m = evaluate_mlm(model, [{"input_ids": ids, "attention_mask": torch.ones_like(ids),
                              "labels": labels}])
    assert 50 < m["loss"] < 700
    assert m["perplexity"] == pytest.approx(math.exp(m["loss"]), rel=1e-9)


def test_nsp_with_one_held_out_document_names_the_validation_split(tmp_path, capsys):
    """Twelve documents leave one for validation at --val-fraction 0.1: the error said
    "two documents in the training corpus", which had eleven."""
    corpus = tmp_path / "c.txt"
    corpus.write_text("".join(f"document {i} says one thing. then another thing.\n\n"
                              for i in range(12)))
    args = ["pretrain", "--corpus", str(corpus), "--out", str(tmp_path / "o"), "--steps", "1",
            "--batch-size", "2", "--seq-len", "32", "--vocab-size", "120", "--preset", "tiny",
            "--objective", "mlm+nsp", "--no-progress"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.endswith("nanobert: error: next-sentence prediction needs at least two documents "
                        "in the validation split, which has 1: raise --val-fraction (now 0.1), "
                        "or make it 0 for no validation\n"), err
    assert not (tmp_path / "o").exists()
    assert main(args[:-1] + ["--val-fraction", "0.2", "--no-progress"]) == 0


def test_fill_mask_shows_byte_level_bpe_tokens_as_text(tmp_path, capsys):
    """A model with a byte-level BPE tokenizer (--tokenizer tokenizer.json) answered with
    the stored pieces, 'Ġlove' and 'ØªØŃØ¨' for 'تحب'; it answers with the text."""
    import torch
    import nanobert
    from tokenizers import Tokenizer as HF, models, pre_tokenizers, decoders, trainers
    from nanobert.pretrain import fill_mask
    from nanobert.tokenizer import Tokenizer
    tk = HF(models.BPE(unk_token="<unk>"))
    tk.pre_tokenizer, tk.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    tk.train_from_iterator(["i love تحب pizza \x1b[2J"] * 20, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"]))
    tk.save(str(tmp_path / "tokenizer.json"))
    tok = Tokenizer.from_dir(tmp_path / "tokenizer.json")
    model = nanobert.Bert(nanobert.preset("tiny", vocab_size=tok.vocab_size), "mlm").eval()
    got = {}
    for word in (" love", " تحب"):
        with torch.no_grad():
            model.mlm.bias.zero_()
            model.mlm.bias[tk.encode(word).ids[0]] = 50.0
        got[word] = fill_mask(model, tok, "i <mask> pizza", k=1)[0][0][0]
    assert got == {" love": "love", " تحب": "تحب"}
    from nanobert.checkpoint import save_model     # the command names masks as the model does
    save_model(model, tmp_path / "m", tok)
    assert main(["fill-mask", "--model", str(tmp_path / "m"), "i <mask> pizza <mask>"]) == 0
    out = capsys.readouterr().out
    assert "  <mask> 1: تحب" in out and "  <mask> 2:" in out and "[MASK]" not in out
    with torch.no_grad():         # a terminal's control character: escaped, not written
        model.mlm.bias.zero_()
        model.mlm.bias[tk.token_to_id(tk.encode("\x1b").tokens[0])] = 50.0
    save_model(model, tmp_path / "m", tok)
    assert main(["fill-mask", "--model", str(tmp_path / "m"), "i <mask> pizza"]) == 0
    out = capsys.readouterr().out
    assert "  <mask> 1: \\x1b " in out and "\x1b" not in out, out


def test_whole_word_mask_with_an_unmarked_tokenizer_is_refused_before_work(tmp_path, capsys):
    from tokenizers import Tokenizer as HF, models, pre_tokenizers, trainers
    tk = HF(models.BPE(unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()       # no '##', no 'Ġ': words unknown
    tk.train_from_iterator(["the cat sat on the mat"] * 5, trainers.BpeTrainer(
        vocab_size=60, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]))
    tk.save(str(tmp_path / "bpe.json"))
    (tmp_path / "c.txt").write_text("the cat sat.\n\non the mat.\n" * 20)
    out = tmp_path / "out"
    assert main(["pretrain", "--corpus", str(tmp_path / "c.txt"), "--out", str(out),
                 "--tokenizer", str(tmp_path / "bpe.json"), "--whole-word-mask",
                 "--steps", "2", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--whole-word-mask: the tokenizer's pieces" in err[0]
    assert not out.exists()


@pytest.mark.parametrize("missing", ["[MASK]", "[PAD]"])
def test_tokenizer_without_mask_or_pad_token_is_refused_in_one_line(tmp_path, capsys, missing):
    """A vocab.txt without [MASK] failed with a TypeError traceback from the masking."""
    vocab = [t for t in ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat"] if t != missing]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    (tmp_path / "c.txt").write_text("the cat.\n\nthe cat the cat.\n" * 20)
    out = tmp_path / "out"
    code = main(["pretrain", "--corpus", str(tmp_path / "c.txt"), "--out", str(out), "--tokenizer",
                 str(tmp_path / "vocab.txt"), "--steps", "2", "--batch-size", "2", "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and f"no {missing} token" in err[0] and not out.exists()


def test_the_parameter_count_pretrain_prints_is_the_saved_models(tmp_path, capsys):
    """pretrain printed 560,372 parameters where `info` and transformers count 543,860:
    an MLM model's pooler is neither trained nor saved."""
    import re
    (tmp_path / "c.txt").write_text("the cat sat on the mat.\n\na dog ran in the park.\n" * 20)
    out = tmp_path / "out"
    assert main(["pretrain", "--corpus", str(tmp_path / "c.txt"), "--out", str(out),
                 "--preset", "tiny", "--vocab-size", "60", "--steps", "1", "--batch-size", "2",
                 "--seq-len", "16", "--no-progress"]) == 0
    printed = int(re.search(r"([\d,]+) parameters", capsys.readouterr().out).group(1)
                  .replace(",", ""))
    from transformers import BertForMaskedLM
    assert printed == BertForMaskedLM.from_pretrained(out).num_parameters()


def test_rows_with_nothing_to_mask_neither_stop_training_nor_pick_the_best_model(tmp_path,
                                                                                capsys):
    """Rows of [UNK] alone (a script the vocabulary lacks) have no token to mask: a batch
    of them gave a NaN loss ('training diverged ... try a lower --lr'), and validation
    rows of them scored loss 0 at every step, so the first model was kept as the best."""
    import torch
    import torch.nn.functional as F
    from nanobert.model import masked_lm_loss
    logits = torch.randn(5, 7, requires_grad=True)
    none = masked_lm_loss(logits, torch.full((5,), -100))
    none.backward()
    assert none.item() == 0.0 and logits.grad.abs().sum() == 0
    labels = torch.tensor([1, -100, 3, -100, 6])
    assert torch.equal(masked_lm_loss(logits, labels), F.cross_entropy(logits, labels))
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat",
                                "sat", "on", "mat", "."]) + "\n")
    corpus = tmp_path / "c.txt"      # half the rows are [UNK] alone
    corpus.write_text("\n\n".join(["我们今天去公园散步。", "the cat sat on the mat ."] * 10))
    args = ["pretrain", "--corpus", str(corpus), "--tokenizer", str(vocab), "--steps", "8",
            "--batch-size", "1", "--seq-len", "16", "--no-progress"]
    assert main([*args, "--out", str(tmp_path / "a"), "--val-fraction", "0"]) == 0
    capsys.readouterr()
    corpus.write_text("\n\n".join(["我们今天去公园散步。"] * 20))   # validation too
    assert main([*args, "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert "the validation rows have no token that can be masked" in err
    assert not (tmp_path / "b").exists()


def test_the_saved_tokenizer_reads_as_far_as_the_model_and_streaming_vocabularies_skip_held_out(
        tmp_path):
    """--seq-len 600 gave the model 600 positions and its tokenizer_config.json 512 (so
    fill-mask refused a [MASK] past 512); --streaming trained the vocabulary on the
    held-out documents too, which the in-memory run keeps out of it."""
    from nanobert.corpus import StreamingCorpus
    (tmp_path / "c.txt").write_text("\n\n".join(f"doc {i} the cat sat." for i in range(25)))
    kept = [" ".join(d) for d in StreamingCorpus.training_documents([tmp_path / "c.txt"], 0.1)]
    assert len(kept) == 22 and not any(k.startswith(("doc 0 ", "doc 10 ", "doc 20 "))
                                       for k in kept)
    out = tmp_path / "out"
    assert main(["pretrain", "--corpus", str(tmp_path / "c.txt"), "--out", str(out), "--preset",
                 "tiny", "--vocab-size", "60", "--steps", "1", "--batch-size", "2",
                 "--seq-len", "600", "--no-progress"]) == 0
    assert json.loads((out / "tokenizer_config.json").read_text())["model_max_length"] == 600


def test_tokenizer_may_be_a_models_name(tmp_path, capsys):
    """--tokenizer minilm (as --model minilm) was refused as a path that does not exist."""
    (tmp_path / "c.txt").write_text("\n\n".join(f"the cat sat on mat number {i}." for i in range(20)))
    args = ["pretrain", "--corpus", str(tmp_path / "c.txt"), "--preset", "tiny", "--steps", "1",
            "--batch-size", "2", "--seq-len", "16", "--no-progress"]
    assert main([*args, "--tokenizer", "minilm", "--out", str(tmp_path / "a")]) == 0
    assert json.loads((tmp_path / "a" / "config.json").read_text())["vocab_size"] == 30522
    capsys.readouterr()
    assert main([*args, "--tokenizer", str(tmp_path / "nothere"), "--out", str(tmp_path / "b")]) == 2
    assert "--tokenizer " + str(tmp_path / "nothere") + ": no such file or directory" in \
        capsys.readouterr().err


def test_splits_equal_as_numbers_are_the_same_run(tmp_path):
    """--resume with --mask-split 80/10/10.0 on a run of the default 80/10/10 was refused
    as another run, though the docs call splits equal as numbers the same."""
    from nanobert.pretrain import PretrainConfig, _fingerprint
    corpus = tmp_path / "c.txt"
    corpus.write_text("a b c\n")
    runs = [_fingerprint(PretrainConfig.create(corpus=[str(corpus)], mask_split=s, max_steps=5))
            for s in ("80/10/10", "80/10/10.0", "80.0/10/10", "80/10/10")]
    assert runs[0] == runs[1] == runs[2] == runs[3]
    other = PretrainConfig.create(corpus=[str(corpus)], mask_split="70/20/10", max_steps=5)
    assert runs[0] != _fingerprint(other)


def test_ablate_masking_points_mask_split_at_splits(capsys):
    """`ablate-masking --mask-split X` was argparse's bare 'unrecognized arguments'."""
    with pytest.raises(SystemExit) as e:
        main(["ablate-masking", "--corpus", "c.txt", "--out", "o", "--mask-split", "90/5/5"])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().endswith(
        "--mask-split 90/5/5: ablate-masking compares several splits; give them with --splits "
        "(e.g. --splits 90/5/5,80/10/10)")
    with pytest.raises(SystemExit):     # (not the same split twice, which --splits refuses)
        main(["ablate-masking", "--corpus", "c.txt", "--out", "o", "--mask-split", "80/10/10"])
    assert capsys.readouterr().err.strip().endswith("(e.g. --splits 80/10/10,100/0/0)")
    for split in ("nonsense", "80/10"):    # (no split: the suggestion holds valid ones)
        with pytest.raises(SystemExit):
            main(["ablate-masking", "--corpus", "c.txt", "--out", "o", "--mask-split", split])
        assert capsys.readouterr().err.strip().endswith("(e.g. --splits 80/10/10,100/0/0)")
    with pytest.raises(SystemExit):     # --fsdp had been 'did you mean --seed?' (docs3)
        main(["ablate-masking", "--corpus", "c.txt", "--out", "o", "--fsdp"])
    assert capsys.readouterr().err.strip().endswith(
        "--fsdp: ablate-masking trains its small models in one process; shard one split's run "
        "with pretrain --fsdp")


@pytest.mark.parametrize("corpus", [None, [], [""], [5]])
def test_run_pretrain_checks_its_corpus(corpus, tmp_path):
    """None, [], [''] and [5] from Python were a TypeError from pathlib, or another error's
    words ('a single document', '--out is inside the --corpus directory') (api4)."""
    cfg = PretrainConfig.create(corpus=corpus, out_dir=str(tmp_path / "o"), max_steps=1)
    with pytest.raises(NanobertError, match=r"^--corpus: got .*, expected one or more text "
                                            "files or directories"):
        run_pretrain(cfg)
    assert not (tmp_path / "o").exists()
