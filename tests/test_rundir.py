"""The life cycle of an output directory (issue 11, class 1): unfinished runs are marked
and refused, another run's directory is not silently reused, --resume continues only
the same run, temporaries are cleaned."""
from __future__ import annotations

import errno
import json
import os
import random
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError

import nanobert
from conftest import tiny_classify_task
from nanobert.cli import main
from nanobert.files import NanobertError
from nanobert.rundir import (RUN_FILE, clean_temporaries, differences, fingerprint,
                             model_files, read_run, require_finished, run)


@pytest.fixture
def data(tmp_path):
    p = tmp_path / "train.tsv"
    p.write_text("sentence\tlabel\na\t1\nb\t0\n")
    return p


def fp(data, **flags):
    return fingerprint("classify", [data], dict(dict(lr=1e-3, seed=1, out="x"), **flags))


def test_a_run_is_unfinished_until_it_ends(tmp_path, data):
    out = tmp_path / "out"
    with run(out, "finetune", fp(data)):
        (out / "config.json").write_text("{}")
        assert read_run(out)["status"] == "running"
        with pytest.raises(NanobertError, match="the finetune run writing this directory did not "
                                                "finish; continue it with the same command and --resume"):
            require_finished(out)
    assert read_run(out)["status"] == "finished"
    require_finished(out)
    require_finished(tmp_path)  # no run file: a model from elsewhere


def test_an_exception_leaves_the_run_unfinished(tmp_path, data):
    out = tmp_path / "out"
    with pytest.raises(RuntimeError):
        with run(out, "pretrain", fp(data)):
            (out / "checkpoint").mkdir()              # something to resume
            raise RuntimeError("killed")
    with pytest.raises(NanobertError, match="pretrain run"):
        require_finished(out)


def test_a_run_that_fails_before_a_model_takes_back_what_it_made(tmp_path, data):
    out = tmp_path / "new"
    with pytest.raises(RuntimeError):
        with run(out, "finetune", fp(data)):
            (out / "metrics.jsonl").write_text("{}")
            raise RuntimeError("bad data")
    assert not out.exists()                           # it made the directory: gone
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("kept")
    with pytest.raises(KeyboardInterrupt):
        with run(mine, "finetune", fp(data)):
            (mine / "cache").mkdir()
            raise KeyboardInterrupt                   # Ctrl-C before the first checkpoint
    assert sorted(os.listdir(mine)) == ["notes.txt"]  # only what the run added is gone


def test_another_runs_directory_needs_overwrite_or_resume(tmp_path, data):
    out = tmp_path / "out"
    with run(out, "finetune", fp(data)):
        (out / "config.json").write_text("{}")
        (out / "cache").mkdir()
        (out / "cache" / "tokens.npz").write_text("kept")
    with pytest.raises(NanobertError) as e:
        with run(out, "finetune", fp(data, lr=5e-3)):
            pass
    assert str(e.value) == (f"--out {out} already holds a model; continue it with --resume, "
                            "start over with --overwrite, or choose another directory")
    assert (out / "config.json").exists()           # nothing touched
    with run(out, "finetune", fp(data, lr=5e-3), overwrite=True):
        assert not (out / "config.json").exists()   # cleared before the run starts
        assert (out / "cache" / "tokens.npz").read_text() == "kept"


def test_overwrite_never_clears_the_runs_own_inputs(tmp_path, data):
    out = tmp_path
    with run(out, "finetune", fp(data)):
        (out / "config.json").write_text("{}")
    with pytest.raises(NanobertError, match=f"holds the input {data}, which clearing"):
        with run(out, "finetune", fp(data), overwrite=True, reads=[data, "minilm"]):
            pass
    assert data.exists() and (out / "config.json").exists()
    (out / "cache").mkdir()                       # what --overwrite keeps may be read
    (out / "cache" / "corpus.txt").write_text("kept")
    with run(out, "finetune", fp(data), overwrite=True, reads=[out / "cache" / "corpus.txt"]):
        pass
    assert (out / "cache" / "corpus.txt").exists() and not (out / "config.json").exists()
    assert data.exists()       # there before the first run: no run's to delete (foreign)


def test_a_run_that_died_before_writing_a_model_blocks_nothing(tmp_path, data):
    out = tmp_path / "out"
    with pytest.raises(RuntimeError):
        with run(out, "finetune", fp(data)):
            raise RuntimeError("bad data")
    with run(out, "finetune", fp(data, lr=0.5)):   # no --overwrite needed: nothing to lose
        pass
    assert read_run(out)["fingerprint"]["flags"]["lr"] == 0.5


def test_overwrite_never_empties_a_directory_no_run_wrote(tmp_path, data):
    out = tmp_path / "notes"
    out.mkdir()
    (out / "todo.txt").write_text("mine")
    with run(out, "finetune", fp(data), overwrite=True):
        pass
    assert (out / "todo.txt").read_text() == "mine"


def test_resume_checks_the_fingerprint(tmp_path, data):
    out = tmp_path / "out"
    with pytest.raises(RuntimeError):
        with run(out, "finetune", fp(data)):
            (out / "config.json").write_text("{}")   # the best model so far
            raise RuntimeError("killed")
    with pytest.raises(NanobertError) as e:
        with run(out, "finetune", fp(data, lr=5e-3, seed=2), resume=True):
            pass
    assert str(e.value) == (f"--resume: {out} holds another run (--lr 0.001 there, 0.005 now; "
                            "--seed 1 there, 2 now); resume with the same data and flags, or "
                            "start over with --overwrite")
    data.write_text(data.read_text() + "c\t1\n")
    with pytest.raises(NanobertError, match="data file 1 has other content"):
        with run(out, "finetune", fp(data), resume=True):
            pass
    data.write_text("sentence\tlabel\na\t1\nb\t0\n")
    with run(out, "finetune", fp(data, out="elsewhere"), resume=True):  # --out is not the run
        pass
    with pytest.raises(NanobertError, match="contradict"):
        with run(out, "finetune", fp(data), resume=True, overwrite=True):
            pass


def test_fingerprint_is_content_not_path(tmp_path, data):
    moved = tmp_path / "moved.tsv"
    moved.write_bytes(data.read_bytes())
    assert fp(data) == fp(moved)
    assert differences(fp(data), fingerprint("ner", [data, data], {"lr": 1})) == [
        "task classify there, ner now", "1 data file(s) there, 2 now", "--lr 0.001 there, 1 now"]


def test_stale_temporaries_are_cleaned_and_a_torn_swap_is_undone(tmp_path, data):
    out = tmp_path / "out"
    out.mkdir()
    for name in (".checkpoint.ab12cd34", ".save.xyz", ".model.safetensors.k2j3h4g5", ".old-run.77"):
        (out / name).mkdir()
    (out / ".checkpoint.old4242").mkdir()               # killed between the two renames
    (out / ".checkpoint.old4242" / "state.json").write_text('{"step": 4}')
    (out / ".gitignore").write_text("kept")
    clean_temporaries(out)
    assert sorted(p.name for p in out.iterdir()) == [".gitignore", "checkpoint"]
    assert json.loads((out / "checkpoint" / "state.json").read_text()) == {"step": 4}


def test_one_run_per_directory_at_a_time(tmp_path, data):
    out = tmp_path / "out"
    with run(out, "finetune", fp(data)):
        with pytest.raises(NanobertError, match="being written by another nanobert process"):
            with run(out, "finetune", fp(data), resume=True):
                pass


def test_a_torn_run_file_counts_as_unfinished(tmp_path):
    (tmp_path / RUN_FILE).write_text('{"status": "runn')
    with pytest.raises(NanobertError) as e:
        require_finished(tmp_path)
    assert str(e.value) == (f"{tmp_path / RUN_FILE}: not valid JSON (Unterminated string "
                            "starting at at line 1 column 12); whether the run writing "
                            f"{tmp_path} finished is unknown: run it again with --overwrite")


@pytest.mark.parametrize("text, why", [
    ('{"status": "running"', "not valid JSON (Expecting ',' delimiter at line 1 column 21)"),
    ("[]", "not a run record (a JSON list, not an object)"),
    ('{"status": "finished"}', 'not a run record (no "fingerprint" object)'),
    ('{"status": "finished", "fingerprint": "x"}', 'not a run record (no "fingerprint" object)')])
def test_a_damaged_run_record_is_named(tmp_path, data, text, why):
    """--resume said 'holds another run (task None there, classify now)' (or failed on a
    fingerprint that is not an object): the record itself is what is wrong."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "config.json").write_text("{}")
    (out / RUN_FILE).write_text(text)
    with pytest.raises(NanobertError) as e:
        with run(out, "finetune", fp(data), resume=True):
            pass
    assert str(e.value) == (f"--resume: {out / RUN_FILE}: {why}; the run cannot be "
                            "continued: start over with --overwrite")
    with pytest.raises(NanobertError) as e:
        with run(out, "finetune", fp(data)):
            pass
    assert str(e.value) == (f"--out {out} holds a run whose record cannot be used "
                            f"({out / RUN_FILE}: {why}); start over with --overwrite, or "
                            "choose another directory")
    with run(out, "finetune", fp(data), overwrite=True):
        pass
    assert read_run(out)["status"] == "finished" and "damaged" not in read_run(out)


@pytest.mark.parametrize("error", [
    OSError(errno.ENOSPC, "No space left on device"), OSError(errno.EDQUOT, "Disk quota exceeded"),
    SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")])
def test_a_full_disk_before_the_first_checkpoint_takes_the_run_back(tmp_path, data, error):
    """The best model was written, the checkpoint after it was not (the disk filled up):
    the run was left marked "running" with a model beside it. With nothing to resume, it
    is taken back like any failed new run; with a checkpoint, it is kept."""
    out = tmp_path / "new"
    with pytest.raises(type(error)):
        with run(out, "finetune", fp(data)):
            (out / "config.json").write_text("{}")
            (out / "model.safetensors").write_text("weights")
            raise error
    assert not out.exists()
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("kept")
    with pytest.raises(type(error)):
        with run(mine, "finetune", fp(data)):
            (mine / "config.json").write_text("{}")
            raise error
    assert sorted(os.listdir(mine)) == ["notes.txt"]
    with pytest.raises(type(error)):
        with run(out, "finetune", fp(data)):
            (out / "checkpoint").mkdir()              # something to resume
            raise error
    assert read_run(out)["status"] == "running"


def test_a_tokenizer_file_counts_by_content(tmp_path, data):
    """--tokenizer may name a vocab.txt: the run is its content, as for a directory."""
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\na\n")
    assert model_files(vocab) == [vocab]
    a = fingerprint("mlm", [data, *model_files(vocab)], {"tokenizer": str(vocab)})
    vocab.write_text(vocab.read_text() + "b\n")
    b = fingerprint("mlm", [data, *model_files(vocab)], {"tokenizer": str(vocab)})
    assert differences(a, b) == ["data file 2 has other content (33 bytes there, 35 now)"]


# ---- whole runs: SIGKILL at several moments, older runs, resume mismatch ---------------
#
# A killed run is a subprocess stopped with SIGKILL right after it prints a given line;
# everything else runs in this process. Resuming must end with the very bytes of an
# uninterrupted run, and nothing may load the directory in between.


ROOT = Path(__file__).resolve().parents[1]
POS, NEG = "great good fun superb lovely".split(), "bad dull boring awful poor".split()
FILL = "the movie film plot acting was is a and very".split()


def killed_at(pattern: str, *argv) -> str:
    """Run `nanobert *argv` in a subprocess, SIGKILL it as soon as a stdout line matches
    `pattern`; returns what it printed. Fails if it ends before the line."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               PYTHONUNBUFFERED="1")
    p = subprocess.Popen([sys.executable, "-m", "nanobert.cli", *map(str, argv)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    for line in p.stdout:
        seen.append(line)
        if re.search(pattern, line):
            p.send_signal(signal.SIGKILL)
            break
    p.wait(timeout=120)
    p.stdout.close()
    assert p.returncode == -signal.SIGKILL, "".join(seen)
    return "".join(seen)


@pytest.fixture(scope="module")
def fixture_dir(tmp_path_factory):
    """A tiny base model and a small sentiment task."""
    d = tmp_path_factory.mktemp("runs")
    rng = random.Random(0)
    rows = [(" ".join(rng.sample(FILL, 3) + [rng.choice(POS if y else NEG)]), y)
            for y in (0, 1) * 12]
    (d / "dev.tsv").write_text("sentence\tlabel\n" + "".join(f"{t}\t{y}\n" for t, y in rows[:8]))
    return tiny_classify_task(d, rows, vocab_size=60, positions=32, layers=2)


def ft(d, out, **changes) -> list:
    """`nanobert finetune` with the tiny run's flags (changes: {"--lr": 1e-2, ...})."""
    flags = {"--task": "classify", "--model": d / "base", "--train": d / "train.tsv",
             "--dev": d / "dev.tsv", "--out": out, "--epochs": 4, "--batch-size": 4,
             "--eval-every": 3, "--lr": 3e-3, "--max-length": 16, "--seed": 3, "--device": "cpu"}
    flags.update(changes)
    return ["finetune"] + [str(x) for kv in flags.items() for x in kv] + ["--no-progress"]


def model_bytes(out) -> dict:
    return {n: (out / n).read_bytes() for n in ("model.safetensors", "config.json", "vocab.txt")}


def losses(out) -> list:
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [(r["type"], r["step"], r.get("loss"), r.get("accuracy")) for r in recs]


@pytest.fixture(scope="module")
def reference(fixture_dir):
    """The uninterrupted fine-tuning run."""
    out = fixture_dir / "reference"
    assert main(ft(fixture_dir, out)) == 0
    return out


def refused(capsys, argv, *expected) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and all(e in err for e in expected), err
    return err


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("moment", [r"^classify: \d+ training", r"^step 3: ", r"^step 12: "])
def test_finetune_killed_then_resumed_ends_as_if_never_stopped(fixture_dir, reference, tmp_path,
                                                              capsys, moment):
    out = tmp_path / "run"
    killed_at(moment, *ft(fixture_dir, out))
    refused(capsys, ["evaluate", "--model", str(out), "--data", str(fixture_dir / "dev.tsv")],
            f"{out}: the finetune run writing this directory did not finish", "--resume")
    refused(capsys, ["predict", "--model", str(out), "good"], "did not finish")
    if (out / "config.json").exists():  # a model to lose: a plain new run must not take it
        refused(capsys, ft(fixture_dir, out), "already holds an unfinished run")
    assert main(ft(fixture_dir, out) + ["--resume"]) == 0
    assert model_bytes(out) == model_bytes(reference)
    assert losses(out) == losses(reference)
    assert main(["evaluate", "--model", str(out), "--data", str(fixture_dir / "dev.tsv")]) == 0
    assert not [p for p in out.iterdir() if p.name.startswith((".checkpoint.", ".save."))]


def tree(out) -> dict:
    """Every file under `out` with its bytes."""
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


@pytest.mark.usefixtures("one_thread")
def test_a_new_finetune_into_an_older_run(fixture_dir, reference, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(ft(fixture_dir, out, **{"--seed": 9, "--epochs": 1})) == 0   # the older run
    before = tree(out)
    refused(capsys, ft(fixture_dir, out), f"--out {out} already holds a model", "--overwrite")
    assert tree(out) == before                                   # nothing written or mixed
    killed_at(r"^step 3: ", *ft(fixture_dir, out), "--overwrite")
    refused(capsys, ["evaluate", "--model", str(out), "--data", str(fixture_dir / "dev.tsv")],
            "did not finish")                                    # never the older model
    err = refused(capsys, ft(fixture_dir, out, **{"--lr": 1e-2}) + ["--resume"], "--resume:")
    assert err == (f"nanobert: error: --resume: {out} holds another run (--lr 0.003 there, 0.01 "
                   "now); resume with the same data and flags, or start over with --overwrite")
    assert main(ft(fixture_dir, out) + ["--resume"]) == 0
    assert model_bytes(out) == model_bytes(reference) and losses(out) == losses(reference)


@pytest.mark.usefixtures("one_thread")
def test_resume_refuses_other_data_and_a_truncated_checkpoint(fixture_dir, tmp_path, capsys):
    data = tmp_path / "train.tsv"
    data.write_bytes((fixture_dir / "train.tsv").read_bytes())
    out = tmp_path / "run"
    killed_at(r"^step 6: ", *ft(fixture_dir, out, **{"--train": data}))
    data.write_text(data.read_text() + "an extra line\t1\n")
    refused(capsys, ft(fixture_dir, out, **{"--train": data}) + ["--resume"],
            "holds another run (data file 1 has other content")
    data.write_bytes((fixture_dir / "train.tsv").read_bytes())
    opt = out / "checkpoint" / "optimizer.safetensors"
    opt.write_bytes(opt.read_bytes()[:-100])
    refused(capsys, ft(fixture_dir, out, **{"--train": data}) + ["--resume"],
            f"{opt}: truncated", "--overwrite")


# ---- pretrain ---------------------------------------------------------------------------

def pt(d, out, **changes) -> list:
    flags = {"--corpus": d / "corpus.txt", "--out": out, "--preset": "tiny", "--steps": 12,
             "--batch-size": 8, "--seq-len": 32, "--vocab-size": 70, "--eval-every": 4,
             "--seed": 1, "--device": "cpu", "--lr": 2e-3}
    flags.update(changes)
    return ["pretrain"] + [str(x) for kv in flags.items() for x in kv] + ["--no-progress"]


@pytest.fixture(scope="module")
def pretrained(fixture_dir):
    """A corpus and the uninterrupted pretraining run."""
    rng = random.Random(1)
    docs = [" ".join(" ".join(rng.sample(FILL + POS + NEG, 6)) + "." for _ in range(3))
            for _ in range(40)]
    (fixture_dir / "corpus.txt").write_text("\n\n".join(docs) + "\n")
    out = fixture_dir / "pretrained"
    assert main(pt(fixture_dir, out)) == 0
    return out


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("moment, older", [(r"^model: ", True), (r"^step 8: ", True),
                                           (r"^step 4: ", False)])
def test_pretrain_killed_then_resumed(fixture_dir, pretrained, tmp_path, capsys, moment, older):
    """Into a fresh directory, or over an older model: the older weights never sit
    beside the new vocabulary, and the resumed run ends as if never stopped."""
    out = tmp_path / "run"
    if older:
        assert main(pt(fixture_dir, out, **{"--vocab-size": 50, "--steps": 4})) == 0
        before = tree(out)
        refused(capsys, pt(fixture_dir, out), "already holds a model")
        assert tree(out) == before             # the new vocabulary was not written
    killed_at(moment, *pt(fixture_dir, out), *(["--overwrite"] if older else []))
    assert (out / "vocab.txt").read_bytes() == (pretrained / "vocab.txt").read_bytes()
    refused(capsys, ["fill-mask", "--model", str(out), "the [MASK] was good"],
            "the pretrain run writing this directory did not finish", "--resume")
    assert main(pt(fixture_dir, out) + ["--resume"]) == 0
    assert model_bytes(out) == model_bytes(pretrained)
    assert losses(out) == losses(pretrained)
    assert main(["fill-mask", "--model", str(out), "the [MASK] was good"]) == 0
