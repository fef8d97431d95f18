"""What the machine does to a command, answered as bad input is: one line on stderr, a
status, nothing half-written. A disk that fills up (or a quota, or a read-only file
system) while a model, a checkpoint or an output file is written; a Ctrl-C while the
command is still importing torch."""
from __future__ import annotations

import errno
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import safetensors.torch
import torch
from safetensors import SafetensorError

import nanobert
from conftest import tiny_classify_task
from nanobert.cli import main

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny base model and a small classification task."""
    d = tmp_path_factory.mktemp("tiny")
    rows = [(f"the film was {w}", y) for w, y in [("good", 1), ("bad", 0)] * 4]
    (d / "texts.txt").write_text("".join(t + "\n" for t, _ in rows))
    return tiny_classify_task(d, rows, vocab_size=40, positions=16, layers=1)


def error_line(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err, err
    return err


FULL = "no space left on device (free some space or write elsewhere)"
CASES = [(OSError(errno.ENOSPC, "No space left on device"), FULL),
         (OSError(errno.EDQUOT, "Disk quota exceeded"),
          "disk quota exceeded (free some space or write elsewhere)"),
         (OSError(errno.EROFS, "Read-only file system"), "read-only file system (write elsewhere)"),
         (OSError(errno.EFBIG, "File too large"),      # ulimit -f, a FAT32 drive: a traceback
          "file too large for this file system or for the file-size limit (ulimit -f) (write "
          "elsewhere, or raise the limit)"),
         (OSError("1152000 requested and 524256 written"),     # numpy's tofile: no errno
          "no space left on device, or over the file-size limit? (only 524,256 of 1,152,000 "
          "bytes could be written; free some space or write elsewhere)")]


@pytest.mark.parametrize("error, said", CASES)
def test_a_full_disk_while_writing_an_output_file(tiny, tmp_path, capsys, monkeypatch, error,
                                                  said):
    """`embed --out` on a full tmpfs: numpy's OSError traceback and status 1."""
    def full(*args, **kwargs):
        raise error
    monkeypatch.setattr(np, "save", full)
    out = tmp_path / "new" / "e.npy"
    argv = ["embed", "--model", str(tiny / "base"), "--input", str(tiny / "texts.txt"),
            "--out", str(out)]
    assert error_line(capsys, argv) == f"nanobert: error: {out}: {said}"
    assert not list(tmp_path.iterdir())              # no temporary, no folder made for it


def test_the_file_named_is_the_output_or_the_file_elsewhere(tiny, tmp_path, capsys,
                                                            monkeypatch):
    """An error naming a temporary beside --out says --out; one naming a file on another
    file system (a cache, say) names that file."""
    out = tmp_path / "e.npy"
    argv = ["embed", "--model", str(tiny / "base"), "--input", str(tiny / "texts.txt"),
            "--out", str(out)]
    for named, shown in [(tmp_path / ".e.npy.k2j3h4g5" / "t", out), ("/proc/x/y", "/proc/x/y")]:
        def full(*args, **kwargs):
            raise OSError(errno.ENOSPC, "No space left on device", str(named))
        monkeypatch.setattr(np, "save", full)
        assert error_line(capsys, argv) == f"nanobert: error: {shown}: {FULL}"


def test_a_failed_write_to_stdout_is_said_to_be_stdouts(tiny, tmp_path):
    """`embed --out e.npy > /dev/full` said 'e.npy: no space left on device' after e.npy
    was written whole (the user would free space on the wrong disk, or delete it); a
    command without --out named nothing."""
    out = tmp_path / "e.npy"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for argv in (["embed", "--model", str(tiny / "base"), "--input", str(tiny / "texts.txt"),
                  "--out", str(out)], ["info", str(tiny / "base")]):
        with open("/dev/full", "w") as full:
            done = subprocess.run([sys.executable, "-m", "nanobert", *argv], stdout=full,
                                  stderr=subprocess.PIPE, text=True, env=env, timeout=300)
        assert done.returncode == 2 and done.stderr == (
            f"nanobert: error: standard output: {FULL}\n"), done.stderr
    assert np.load(out).shape[0] == 8


def test_a_closed_stdout_is_no_error(tiny):
    """With fd 1 closed (`>&-`, some cron and daemon setups) Python's sys.stdout is None,
    and print() writes nothing: wrapping it to name stdout in errors made that a
    traceback."""
    code = ("import sys; from nanobert.cli import main; "
            f"sys.exit(main(['info', {str(tiny / 'base')!r}]))")
    done = subprocess.run([sys.executable, "-c", code], stdout=subprocess.DEVNULL, text=True,
                          stderr=subprocess.PIPE, timeout=300, close_fds=True,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)),
                          preexec_fn=lambda: os.close(1))
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr


def test_an_error_with_stderr_closed_or_full_is_still_status_2(tmp_path):
    """`info nosuch 2>/dev/full` or `2>&-` ended with status 1: writing the error line
    itself failed (and with fd 2 closed, print() sent it to stdout)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    argv = [sys.executable, "-m", "nanobert", "info", str(tmp_path / "nosuch")]
    with open("/dev/full", "w") as full:
        done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=full, env=env, timeout=300)
    assert done.returncode == 2 and done.stdout == b""
    done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
                          timeout=300, close_fds=True, preexec_fn=lambda: os.close(2))
    assert done.returncode == 2 and done.stdout == b""
    # a note that cannot be written stops nothing (a full stderr had ended the command)
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "nanobert", "info", "minilm", "--json",
                               "--threads", "1", "--threads", "1"], stdout=subprocess.PIPE,
                              stderr=full, env=env, timeout=300)
    assert done.returncode == 0 and json.loads(done.stdout)["layers"] == 6


def test_an_error_line_quoting_a_huge_value_is_cut(capsys):
    """A 100 kB label (or a 300 kB first row) was quoted whole: a 100 kB error line. The
    line keeps its start (the file and line) and its end (the advice)."""
    from nanobert.cli import _error
    from nanobert.files import LINE_CHARS, note
    _error(f"data.tsv:6: unknown label '{'x' * 100_000}' (the model knows 0, 1)")
    note(f"data.tsv: 1 label of a single row (first '{'y' * 100_000}', line 6)")
    error, said = capsys.readouterr().err.splitlines()
    assert len(error) < LINE_CHARS + 100 and len(said) < LINE_CHARS + 100
    assert error.startswith("nanobert: error: data.tsv:6: unknown label 'xxx")
    assert error.endswith("xxx' (the model knows 0, 1)") and "characters ...]" in error
    assert said.startswith("nanobert: note: data.tsv: 1 label") and said.endswith("', line 6)")
    # breaks and control characters in quoted text are escaped: one line (a corpus "file
    # name" of two lines, a document given as a file name, was shown over 25 lines)
    from nanobert.files import NanobertError
    e = NanobertError("a long document.\nIts second paragraph.\r\x1b[2J\u2028 " * 50)
    assert len(str(e).splitlines()) == 1 and "\x1b" not in str(e)
    assert str(e).startswith("a long document.\\nIts second paragraph.\\r\\x1b[2J\\u2028")
    assert str(NanobertError("C:\\data\ttabs.tsv: no such file")) == \
        "C:\\data\ttabs.tsv: no such file"                 # (backslashes, tabs: as they are)
    _error("first line\nsecond line: no such file or directory")
    note("read\r\nit")
    assert capsys.readouterr().err.splitlines() == [
        "nanobert: error: first line\\nsecond line: no such file or directory",
        "nanobert: note: read\\r\\nit"]


def test_under_torchrun_a_line_every_process_meets_is_said_by_the_first(tmp_path, monkeypatch,
                                                                       capsys):
    """Processes of one torchrun attempt share a folder. The first (LOCAL_RANK 0, the
    stream `--local-ranks-filter 0` shows and finetune keeps) always says its lines;
    another says a line only where the first has not within the wait (one only it
    meets), and of those the first to claim it. Before, whichever process came first
    said it, and finetune's silenced ranks lost notes about half the time."""
    from nanobert import files
    attempt = tmp_path / "attempt_0"
    (attempt / "0").mkdir(parents=True)
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(attempt / "0" / "error.json"))
    monkeypatch.setattr(files, "_CLAIMED", set())
    monkeypatch.setenv("LOCAL_RANK", "1")          # a later process meets it first
    assert not files.said_elsewhere("nanobert: error: only mine", 0.1)
    monkeypatch.setenv("LOCAL_RANK", "0")
    files.note("train.tsv:6: an empty text")
    files.note("train.tsv:6: an empty text")       # (met again, in the dev file: said again)
    assert not files.said_elsewhere("nanobert: error: only mine", 10)   # the first says all
    monkeypatch.setattr(files, "_CLAIMED", set())
    monkeypatch.setenv("LOCAL_RANK", "2")
    assert files.said_elsewhere("nanobert: note: train.tsv:6: an empty text", 10)
    assert files.said_elsewhere("nanobert: error: only mine", 0.1)   # claimed by process 1
    assert capsys.readouterr().err.splitlines() == [
        "nanobert: note: train.tsv:6: an empty text", "nanobert: note: train.tsv:6: an empty text"]
    # 'interrupted' (once): the first process, held in a collective step until a later
    # one had waited for its line and said it, said it again (and the wait held the stop)
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert not files.said_elsewhere("nanobert: terminated", files.SIGNAL_WAIT, once=True)
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert files.said_elsewhere("nanobert: terminated", 10, once=True)
    assert not files.said_elsewhere("nanobert: interrupted", 10, once=True)  # (first: says it)
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(tmp_path / "gone" / "0" / "error.json"))
    assert not files.said_elsewhere("nanobert: note: train.tsv:7: another", 0.1)


def test_a_write_refused_by_the_file_size_limit_is_one_line(tiny, tmp_path):
    """Under `ulimit -f` (batch schedulers set it) every writer but embed ended in a
    traceback of OSError(EFBIG) or of safetensors' '(os error 27)'."""
    import resource
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "nanobert", "finetune", "--task", "classify", "--model",
            str(tiny / "base"), "--train", str(tiny / "train.tsv"), "--dev",
            str(tiny / "train.tsv"), "--out", str(out), "--max-steps", "1", "--batch-size", "4",
            "--max-length", "16", "--device", "cpu", "--no-progress"]
    limit = lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))  # noqa: E731
    done = subprocess.run(argv, capture_output=True, text=True, preexec_fn=limit, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"nanobert: error: {out}: file too large for this file system or for the file-size "
        "limit (ulimit -f) (write elsewhere, or raise the limit)")
    assert not out.exists()


def test_a_full_disk_at_the_first_checkpoint_leaves_no_run(tiny, tmp_path, capsys, monkeypatch):
    """finetune on a full disk: the best model was written, then the checkpoint failed in
    safetensors (a traceback, status 1), and the run was left marked "running" with a
    model beside it. Now one line, status 2, and the new run is taken back."""
    out = tmp_path / "run"
    written = []

    def full(*args, **kwargs):
        written.append((out / "model.safetensors").exists())
        raise SafetensorError("Error while serializing: I/O error: No space left on device "
                              "(os error 28)")
    monkeypatch.setattr(safetensors.torch, "save_model", full)   # the checkpoint's writer
    argv = ["finetune", "--task", "classify", "--model", str(tiny / "base"), "--train",
            str(tiny / "train.tsv"), "--dev", str(tiny / "train.tsv"), "--out", str(out),
            "--max-steps", "1", "--batch-size", "4", "--max-length", "16", "--device", "cpu",
            "--no-progress"]
    assert error_line(capsys, argv) == f"nanobert: error: {out}: {FULL}"
    assert written == [True] and not out.exists()


def test_the_package_imports_no_torch_and_keeps_its_api():
    """`import nanobert` loaded torch (every name of the API, eagerly): the command line
    could not answer a Ctrl-C until it had. The names are there when used."""
    code = ("import sys, nanobert.cli, nanobert; print('torch' in sys.modules); "
            "import nanobert.finetune, nanobert.embed; from nanobert import finetune, Tokenizer; "
            "print(nanobert.finetune is finetune, callable(finetune), "
            "nanobert.Encoder is nanobert.embed.Encoder, nanobert.model.Bert is nanobert.Bert, "
            "Tokenizer is nanobert.tokenizer.Tokenizer, os.environ['OMP_WAIT_POLICY'])")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("OMP_WAIT_POLICY", None)
    out = subprocess.run([sys.executable, "-c", "import os; " + code], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["False", "True", "True", "True", "True", "True", "PASSIVE"], \
        out.stderr


# what the console script does (`from nanobert.cli import main; sys.exit(main())`), saying
# when main() has taken the signals over (its first step): a Ctrl-C from then on is main's.
# Announcing it after the import instead left a race: on a busy CI machine the Ctrl-C came
# before main() was called, a plain KeyboardInterrupt in the starter line itself.
STARTER = """
import contextlib, sys
from nanobert import cli
loading = cli._while_loading

@contextlib.contextmanager
def announced():
    with loading():
        print('started', flush=True)
        yield

cli._while_loading = announced
sys.exit(cli.main(sys.argv[1:]))
"""


@pytest.mark.parametrize("delay", [0.0, 0.2, 0.4])
def test_ctrl_c_while_torch_is_imported(delay):
    """Ctrl-C in the first second of `nanobert info minilm` (torch still loading) was a
    KeyboardInterrupt traceback from nanobert/__init__.py; raised inside an import it
    could also be lost (the command ran on) or abort torch half-initialised."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.Popen([sys.executable, "-c", STARTER, "info", "minilm"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline() == "started\n"
    time.sleep(delay)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 130, (out, err)
    assert "Traceback" not in err and err.strip().splitlines()[-1] == "nanobert: interrupted", err


def as_the_command(monkeypatch, command):
    """cli.main runs `command(args)` as the command its arguments name."""
    import argparse

    from nanobert import cli

    def parser(argv=None):
        p = argparse.ArgumentParser()
        p.set_defaults(func=command, threads=1)
        return p
    monkeypatch.setattr(cli, "build_parser", parser)


@pytest.mark.parametrize("signum, code, word", [(signal.SIGINT, 130, "interrupted"),
                                                (signal.SIGTERM, 143, "terminated")])
def test_an_interrupt_lost_inside_the_command_still_ends_it_as_interrupted(
        monkeypatch, capsys, signum, code, word):
    """A Ctrl-C that comes after the modules loaded, while the command imports more,
    raises its KeyboardInterrupt inside an import, where Python can drop it (importlib's
    lock callbacks ignore exceptions) and the command runs on. Here a command loses it on
    purpose: it must still end as interrupted, with its status."""
    from nanobert import cli

    def command(args):
        try:
            os.kill(os.getpid(), signum)
            time.sleep(0.5)          # (the handler runs here)
        except KeyboardInterrupt:    # lost, as inside an import
            pass
        print("ran on")
        return 0

    as_the_command(monkeypatch, command)
    assert cli.main([]) == code
    out, err = capsys.readouterr()
    assert out == "ran on\n" and err == f"nanobert: {word}\n"
    # the handlers are the caller's again
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None)


def test_a_second_ctrl_c_as_the_command_ends_is_no_traceback(monkeypatch, capsys):
    """A Ctrl-C pressed again while an interrupted command winds down (after 'nanobert:
    interrupted') came out of main as a KeyboardInterrupt: a traceback and status 1."""
    from nanobert import cli

    def second_ctrl_c(code):
        raise KeyboardInterrupt
    monkeypatch.setattr(cli, "_leave_processes", second_ctrl_c)
    assert cli.main(["info", "minilm", "--json"]) == 130
    monkeypatch.setattr(cli, "_command", lambda argv: 2)
    assert cli.main([]) == 2                 # a failure keeps its own status



def test_a_signal_after_the_command_returned_is_ignored(monkeypatch, capsys):
    """A Ctrl-C or SIGTERM just after the command's work was done (its output whole):
    inside the command's last steps it made a finished command 'interrupted' (130); in
    the interpreter's teardown (torch's exit callbacks) it printed a traceback, or killed
    a finished run with status 130/143. The `nanobert` program (cli.run) ignores them
    from the moment the command returns; a second Ctrl-C while the first is answered
    ends with 130, without a traceback."""
    from nanobert import cli

    def command(args):
        cli._RETURNED.append(True)      # (as _command marks it, just before it returns)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)                  # (the handler runs here: ignored)
        print("done")
        return 0

    as_the_command(monkeypatch, command)
    assert cli.main([]) == 0
    assert capsys.readouterr() == ("done\n", "")
    monkeypatch.setattr(cli, "_command", lambda argv: (_ for _ in ()).throw(KeyboardInterrupt))
    assert cli.main([]) == 130
    # the program: signals ignored in the teardown (seen from an exit callback)
    probe = ("import atexit, signal, sys; from nanobert.cli import run; "
             "atexit.register(lambda: print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN, "
             "signal.getsignal(signal.SIGTERM) is signal.SIG_IGN)); "
             "sys.argv = ['nanobert', '--version']; run()")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=120)
    assert out.returncode == 0 and out.stdout.splitlines()[-1] == "True True", out
    assert 'nanobert = "nanobert.cli:run"' in (ROOT / "pyproject.toml").read_text()


def test_a_reader_that_goes_away_is_status_141(tiny, monkeypatch, capsys):
    """`nanobert ... | head`: the reader closes the pipe. The command stops quietly, with
    the status of a Unix tool killed by SIGPIPE (141), not 0: a training run stopped this
    way is unfinished, and `set -o pipefail` scripts must see it."""
    class ClosedPipe:
        def write(self, text):
            raise BrokenPipeError(errno.EPIPE, "Broken pipe")

        def flush(self):
            pass
    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    assert main(["info", str(tiny / "base")]) == 141
    assert capsys.readouterr().err == ""


def test_output_an_encoding_cannot_show_is_escaped(tiny, monkeypatch, capsys):
    """With PYTHONIOENCODING=ascii (or a Latin-1 locale), a result holding an emoji
    stopped the printing half-way in a UnicodeEncodeError traceback."""
    import io
    out = io.TextIOWrapper(io.BytesIO(), encoding="ascii")
    monkeypatch.setattr(sys, "stdout", out)
    assert main(["search", "--model", str(tiny / "base"), "--corpus", str(tiny / "texts.txt"),
                 "--query", "the film \U0001f600", "-k", "1"]) == 0
    out.flush()
    printed = out.buffer.getvalue().decode("ascii")
    assert printed.startswith("query: the film \\U0001f600\n") and "1. " in printed


def test_long_work_shows_a_bar_on_a_terminal_only(tiny, tmp_path, monkeypatch, capsys):
    """`embed` of a large file and `search`'s corpus embedding ran for minutes without
    a word; on a terminal a bar now shows (cleared when done), in a log nothing."""
    for terminal in (True, False):
        monkeypatch.setattr(sys.stderr, "isatty", lambda: terminal)
        assert main(["embed", "--model", str(tiny / "base"), "--input", str(tiny / "texts.txt"),
                     "--out", str(tmp_path / f"e{terminal}.npy")]) == 0
        assert ("encoding" in capsys.readouterr().err) == terminal
        corpus = tmp_path / f"c{terminal}.txt"
        corpus.write_text((tiny / "texts.txt").read_text())
        assert main(["search", "--model", str(tiny / "base"), "--corpus", str(corpus),
                     "--query", "the film", "-k", "1"]) == 0
        assert ("encoding" in capsys.readouterr().err) == terminal


def test_version_loads_no_torch_and_a_command_loads_only_its_module():
    """`nanobert --version` answered after torch's 2-4 s import, and every command built
    the flags of all the others (server, plots) before running."""
    code = ("import sys; from nanobert.cli import build_parser\n"
            "try:\n    build_parser(['--version']).parse_args(['--version'])\n"
            "except SystemExit:\n    pass\n"
            "print('torch' in sys.modules)\n"
            "build_parser(['info', 'minilm'])\n"
            "print(sorted(m for m in sys.modules if m.startswith('nanobert.') and "
            "m.split('.')[1] in ('serve', 'gpt2', 'inspection', 'distill')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert out[-2:] == ["False", "[]"], out


def test_a_file_the_user_may_not_read_or_write_is_one_line_wherever_it_is_met(
        monkeypatch, capsys):
    """Unreadable inputs were a PermissionError traceback (exit 1) in the commands that
    fingerprint their inputs (finetune, pretrain, distill), and for a model folder that
    may not be entered; safetensors calls such a file missing."""
    from nanobert import cli

    def command(args):   # (an open that no check looked at before)
        raise PermissionError(13, "Permission denied", "data/train.tsv")
    as_the_command(monkeypatch, command)
    assert cli.main([]) == 2
    assert capsys.readouterr().err == \
        "nanobert: error: data/train.tsv: cannot be used (Permission denied)\n"


def test_weights_safetensors_may_not_read_are_not_called_missing(tmp_path, monkeypatch):
    from nanobert import checkpoint
    from nanobert.files import NanobertError
    (tmp_path / "model.safetensors").write_bytes(b"x")

    def refused(path, *a, **k):
        if str(path).endswith("model.safetensors"):
            raise PermissionError(13, "Permission denied", str(path))
        return open_(path, *a, **k)
    open_ = open
    monkeypatch.setattr("safetensors.torch.load_file",
                        lambda f: (_ for _ in ()).throw(FileNotFoundError(f)))
    monkeypatch.setattr("builtins.open", refused)
    with pytest.raises(NanobertError, match=r"model\.safetensors: cannot be read \(Permission "
                                            r"denied\)$"):
        checkpoint.read_weights(tmp_path)


def test_a_world_size_that_is_no_number_is_one_process(monkeypatch, capsys):
    """WORLD_SIZE set by hand to no number is no torchrun job: finetune and pretrain had
    raised a traceback from int() where they ask for their processes (train.dist_info)."""
    from nanobert.cli import main
    from nanobert.train import dist_info
    for value in ("", "abc", " 2x"):
        monkeypatch.setenv("WORLD_SIZE", value)
        assert dist_info() == (0, 1, 0)
        assert main(["predict", "--model", "minilm", "--json", "good"]) == 0
        assert capsys.readouterr().out.strip()
    monkeypatch.setenv("WORLD_SIZE", " 1 ")
    assert dist_info() == (0, 1, 0)


def test_one_process_commands_refuse_torchrun_before_writing(monkeypatch, tmp_path, capsys):
    """ablate-masking under torchrun ran whole in each worker: the second was refused its
    --out as "being written by another nanobert process", the folder left marked
    running. It is refused in one line, nothing written (finetune runs under DDP:
    test_finetune)."""
    from nanobert.cli import main
    (tmp_path / "t.txt").write_text("a line of text\n")
    monkeypatch.setenv("WORLD_SIZE", "2")
    for cmd in (["ablate-masking", "--corpus", str(tmp_path / "t.txt")], ["demo"]):
        assert main(cmd + ["--out", str(tmp_path / "out")]) == 2
        assert capsys.readouterr().err.strip() == (
            f"nanobert: error: {cmd[0]} trains in one process, and torchrun started 2: run "
            "it without torchrun (pretrain, distill and finetune train across several)")
        assert not (tmp_path / "out").exists()
    # commands that train nothing ran whole in each worker: every line and file twice,
    # two servers sharing one port
    for cmd in (["predict", "--model", "minilm", "good"], ["serve", "minilm"], ["info", "minilm"],
                ["embed", "--model", "minilm", "--input", str(tmp_path / "t.txt"), "--out",
                 str(tmp_path / "out")]):
        assert main(cmd) == 2
        assert capsys.readouterr().err.strip() == (
            f"nanobert: error: {cmd[0]} runs in one process, and torchrun started 2: run "
            "it without torchrun (pretrain, distill and finetune train across several)")
        assert not (tmp_path / "out").exists()


def test_long_work_into_a_log_says_how_it_goes_now_and_then(monkeypatch, capsys):
    """Evaluating a reranker on a BEIR folder, mining hard negatives or embedding a corpus
    printed nothing into a log for minutes (the bar drew on a terminal only): there a
    line now and then says how far it is, none at the end, none for short work."""
    import nanobert.files as F
    monkeypatch.setattr(F, "PLAIN_PROGRESS_S", 0.0)
    with F.progress_bar(True, 10, "scoring", "pair") as bar:     # (capsys: no terminal)
        bar.update(4)
        bar.update(6)
    assert re.fullmatch(r"nanobert: scoring: 4 of 10 pairs \(40%\) in 0s, about 0s left\n",
                        capsys.readouterr().err)
    for show in (False, "log"):    # nothing asked; lines asked for a log only, on a terminal
        monkeypatch.setattr(F, "bar_shows", lambda: show == "log")
        bar = F.progress_bar(show, 10, "scoring", "pair")
        bar.update(4)
        bar.close()
        assert capsys.readouterr().err == ""
    monkeypatch.setattr(F, "PLAIN_PROGRESS_S", 1e9)
    monkeypatch.setattr(F, "bar_shows", lambda: False)
    bar = F.progress_bar(True, 10, "scoring", "pair")
    bar.update(4)
    assert capsys.readouterr().err == ""        # (under the interval: quiet)


def test_a_note_says_which_stage_said_it(capsys):
    """A reranker's BEIR evaluation said '248 of 343 texts are longer than 256 tokens'
    (the retriever's) and '884 of 1100 pairs are longer...' (its own) without naming
    either model."""
    from nanobert.files import note, noting_as
    with noting_as("the retriever minilm"):
        note("3 of 4 texts are longer than 8 tokens")
    note("after")
    assert capsys.readouterr().err == ("nanobert: note: the retriever minilm: 3 of 4 texts are "
                                       "longer than 8 tokens\nnanobert: note: after\n")


@pytest.mark.parametrize("argv", [
    ["evaluate", "--model", "minilm", "--data", "-"],
    ["search", "--corpus", "-", "--query", "q"],
    ["pretrain", "--corpus", "-", "--out", "OUT", "--steps", "1"],
])
def test_a_dash_where_stdin_is_not_read_says_so(argv, tmp_path, capsys):
    """'-: no such file' spoke of a file named '-' (badinputs3)."""
    argv = [str(tmp_path / "o") if a == "OUT" else a for a in argv]
    assert main(argv) == 2
    assert capsys.readouterr().err == (
        "nanobert: error: -: the standard input is not read here (predict --input and embed "
        "--input take '-'); save the data to a file and pass its path\n")
    assert not (tmp_path / "o").exists()


def test_a_parquet_file_or_a_spreadsheet_is_named_with_what_to_do(tmp_path):
    """Parquet was 'not valid UTF-8', an .xlsx 'compressed (zip): decompress it' (which
    gives XML) (formats4)."""
    import zipfile
    from nanobert.files import NanobertError, read_lines
    (tmp_path / "t.parquet").write_bytes(b"PAR1\x15\x04\x15\xd0\x01\x15\xd0\x01LPAR1")
    (tmp_path / "par1.txt").write_text("PAR1 is a name\nanother line\n")   # (text: regress5)
    assert [t for _, t in read_lines(tmp_path / "par1.txt")] == ["PAR1 is a name",
                                                                 "another line"]
    with zipfile.ZipFile(tmp_path / "t.xlsx", "w") as z:
        z.writestr("xl/workbook.xml", "<w/>")
    with zipfile.ZipFile(tmp_path / "t.ods", "w") as z:
        z.writestr("mimetype", "application/vnd.oasis.opendocument.spreadsheet")
    with zipfile.ZipFile(tmp_path / "t.zip", "w") as z:
        z.writestr("train.tsv", "a\t1\n")
    for name, says in (("t.parquet", "a Parquet file (the Hugging Face Hub's format), not a "
                                     "text file; write it as JSON Lines first"),
                       ("t.xlsx", "an Excel workbook (.xlsx), not a text file; save it as CSV"),
                       ("t.ods", "an OpenDocument spreadsheet (.ods), not a text file; save"),
                       ("t.zip", "compressed (zip), not a text file; decompress it first")):
        with pytest.raises(NanobertError) as e:
            list(read_lines(tmp_path / name))
        assert str(e.value).startswith(f"{tmp_path / name}: {says}")


def test_model_settings_files_are_read_as_data_files_are(tmp_path, minilm_dir):
    """A config.json or tokenizer.json saved with a byte-order mark (or as UTF-16) was
    refused with Python's "decode using utf-8-sig" or "cannot be read (expected value)";
    a gzipped one said "cannot be read", as if a permission were missing."""
    import gzip
    import shutil
    from nanobert.checkpoint import load_model
    from nanobert.files import NanobertError, read_json
    from nanobert.tokenizer import Tokenizer
    d = tmp_path / "m"
    shutil.copytree(minilm_dir, d)
    for name in ("config.json", "tokenizer.json"):
        text = (d / name).read_text("utf-8")
        (d / name).write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))
    (d / "tokenizer_config.json").write_bytes(
        (minilm_dir / "tokenizer_config.json").read_text("utf-8").encode("utf-16"))
    tok = Tokenizer.from_dir(d)
    assert tok.encode("Hello world").ids == Tokenizer.from_dir(minilm_dir).encode("Hello world").ids
    assert load_model(d, head=None).config.hidden_size == 384
    (d / "tokenizer.json").write_bytes(gzip.compress(text.encode("utf-8")))
    with pytest.raises(NanobertError, match=r"tokenizer.json: compressed \(gzip\), not a text"):
        Tokenizer.from_dir(d)
    (d / "config.json").write_text('{\n  "hidden_size": 384,\n  oops\n}\n')
    with pytest.raises(NanobertError, match=r"config.json:3: not valid JSON \(Expecting"):
        read_json(d / "config.json")
