"""The life cycle of an output directory: a training run owns it from start to finish.

    start   the directory is checked (a directory, writable, not another run's), stale
            temporaries are cleaned, and `nanobert-run.json` is written with status
            "running" and the run's fingerprint (task, data files' size and content hash,
            the flags that shape the run)
    train   checkpoints and the best model land in it; while the status is "running"
            every command that loads a model refuses the directory (`require_finished`)
            and says how to continue
    finish  the final model, config and tokenizer are complete: the status becomes
            "finished", and the directory is a model like any other

A killed run leaves "running" behind, so its half-written directory is never taken for a
model. A run that fails before it has written a model or a checkpoint (bad data, a bad
flag, an early Ctrl-C) takes back what it created: nothing is left half-written. A new
run into a directory that holds a model or a checkpoint stops unless `--overwrite` (which
clears it first) or `--resume` (which continues the checkpoint only when the fingerprint
matches, and otherwise says what differs). Directories without the file (hub downloads,
models from other tools) are finished models.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import struct
import time
from pathlib import Path

from .files import NanobertError, check_not_input, check_output_dir, write_text

RUN_FILE = "nanobert-run.json"
LOCK_FILE = ".nanobert-lock"
# what a finished run leaves: any of these makes a directory "another run's"
MODEL_FILES = ("config.json", "model.safetensors", "pytorch_model.bin", "checkpoint")
# kept by --overwrite: the tokenized-corpus cache (keyed by content) and input data (demo)
KEEP_ON_OVERWRITE = ("cache", "data", LOCK_FILE)
# flags that change where or how visibly a run goes, not what it computes
NOT_SHAPING = {"out", "out_dir", "resume", "overwrite", "progress", "no_progress", "device",
               "func", "command", "cache_dir", "log_every", "json", "save_every"}
# temporaries of files.atomic_path (.NAME.xxxxxxxx, .NAME.oldPID) and of save_model (.save.*)
TEMPORARY = re.compile(r"\.(?P<name>.+)\.(?:[a-z0-9_]{8}|old\d+)|\.save\..+|\.old-run\..+")


# ----------------------------------------------------------------------------------
# Fingerprints


def file_digest(path) -> dict:
    """Size and SHA-256 of a file's content (not its name: a moved file is the same data)."""
    h = hashlib.sha256()
    path = Path(path)
    # a data folder (BEIR: corpus, queries, qrels) is the files in it, by relative name
    files = sorted(f for f in path.rglob("*") if f.is_file()) if path.is_dir() else [path]
    if not path.exists():
        raise NanobertError(f"{path}: no such file")
    for name in files:
        if path.is_dir():
            h.update(str(name.relative_to(path)).encode() + b"\0")
        with open(name, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return {"size": sum(f.stat().st_size for f in files), "sha256": h.hexdigest()[:24]}


def fingerprint(task: str, data_files, flags: dict) -> dict:
    """What makes two runs the same run: the task, the data files' content (in order)
    and the flags that shape the computation (`NOT_SHAPING` ones left out)."""
    shaping = {k: _plain(v) for k, v in sorted(flags.items()) if k not in NOT_SHAPING}
    return {"task": task, "data": [file_digest(f) for f in data_files], "flags": shaping}


def model_files(name) -> list:
    """The files that make a local model directory what it is (config and weights), so
    that a retrained base model counts as other data; a hub name is its own flag."""
    d = Path(str(name))
    if not name or not d.is_dir():
        return []
    return [f for n in ("config.json", "model.safetensors", "pytorch_model.bin", "vocab.txt",
                        "tokenizer.json") if (f := d / n).is_file()]


def _plain(v):
    """A JSON-comparable form of a flag value (paths as strings, tuples as lists)."""
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    return v if isinstance(v, (int, float, str, bool, type(None))) else str(v)


def differences(old: dict, new: dict, limit: int = 3) -> list:
    """Human-readable differences between two fingerprints, at most `limit`."""
    out = []
    if old.get("task") != new.get("task"):
        out.append(f"task {old.get('task')} there, {new.get('task')} now")
    a, b = old.get("data", []), new.get("data", [])
    if len(a) != len(b):
        out.append(f"{len(a)} data file(s) there, {len(b)} now")
    out += [f"data file {i + 1} has other content ({x['size']:,} bytes there, {y['size']:,} now)"
            for i, (x, y) in enumerate(zip(a, b)) if x != y]
    fa, fb = old.get("flags", {}), new.get("flags", {})
    out += [f"--{k.replace('_', '-')} {fa.get(k)} there, {fb.get(k)} now"
            for k in sorted(set(fa) | set(fb)) if fa.get(k) != fb.get(k)]
    return out[:limit]


# ----------------------------------------------------------------------------------
# Reading the state of a directory


def read_run(out_dir) -> dict | None:
    """The run record of a directory, or None when it has none."""
    path = Path(out_dir) / RUN_FILE
    if not path.is_file():
        return None
    try:
        rec = json.loads(path.read_text("utf-8"))
    except (ValueError, UnicodeDecodeError, OSError):
        return {"status": "running", "command": "nanobert", "fingerprint": {}}  # torn: unfinished
    return rec if isinstance(rec, dict) else {"status": "running", "fingerprint": {}}


def require_finished(model_dir):
    """Refuse a directory whose run has not finished (killed, crashed, or still going)."""
    rec = read_run(model_dir)
    if rec is None or rec.get("status") == "finished":
        return
    cmd = rec.get("command") or "the training command"
    step = checkpoint_step(Path(model_dir))
    where = f" (checkpoint at step {step})" if step is not None else ""
    raise NanobertError(f"{model_dir}: the {cmd} run writing this directory did not finish"
                        f"{where}; continue it with the same command and --resume, or start "
                        "over with --overwrite")


def checkpoint_step(out_dir: Path):
    try:
        return json.loads((out_dir / "checkpoint" / "state.json").read_text("utf-8"))["step"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _holds_a_run(out_dir: Path) -> bool:
    return any((out_dir / name).exists() for name in MODEL_FILES)


# ----------------------------------------------------------------------------------
# Cleaning


def clean_temporaries(out_dir: Path):
    """Remove what interrupted atomic writes left behind. A directory swap killed between
    its two renames left the previous version as .NAME.oldPID: it is put back."""
    for p in sorted(out_dir.iterdir()) if out_dir.is_dir() else []:
        m = TEMPORARY.fullmatch(p.name)
        if not m:
            continue
        original = out_dir / m.group("name") if m.group("name") else None
        if original is not None and ".old" in p.name and p.is_dir() and not original.exists():
            os.replace(p, original)
        elif p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


def clear(out_dir: Path):
    """Empty a run directory (but the content-keyed cache). Entries are first renamed into
    one hidden folder, so a kill half-way leaves nothing that looks like a model."""
    trash = out_dir / f".old-run.{os.getpid()}"
    trash.mkdir(exist_ok=True)
    for p in sorted(out_dir.iterdir()):
        if p.name not in KEEP_ON_OVERWRITE and p != trash:
            os.replace(p, trash / p.name)
    shutil.rmtree(trash, ignore_errors=True)


# ----------------------------------------------------------------------------------
# Checkpoint files


def check_safetensors(path: Path):
    """A safetensors file is whole: its header parses and the data it announces is all
    there (a copy or a disk that filled up leaves a shorter file)."""
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n)) if n < (1 << 27) else None
        size = path.stat().st_size
    except (OSError, struct.error, ValueError, UnicodeDecodeError):
        header = None
    if not isinstance(header, dict):
        raise NanobertError(f"{path}: not a safetensors file (truncated or corrupted); "
                            "delete the checkpoint folder or start over with --overwrite")
    ends = [v["data_offsets"][1] for k, v in header.items()
            if k != "__metadata__" and isinstance(v, dict) and "data_offsets" in v]
    if 8 + n + max(ends, default=0) > size:
        raise NanobertError(f"{path}: truncated ({size:,} bytes, the header announces "
                            f"{8 + n + max(ends):,}); delete the checkpoint folder or start "
                            "over with --overwrite")


def check_checkpoint(ckpt_dir: Path):
    """Every file a resume reads is there and whole, before any of it is loaded."""
    for name in ("state.json", "model.safetensors", "optimizer.safetensors"):
        if not (ckpt_dir / name).is_file():
            raise NanobertError(f"{ckpt_dir / name}: missing; the checkpoint is incomplete "
                                "(start over with --overwrite)")
    for name in ("model.safetensors", "optimizer.safetensors"):
        check_safetensors(ckpt_dir / name)
    if checkpoint_step(ckpt_dir.parent) is None:
        raise NanobertError(f"{ckpt_dir / 'state.json'}: not a valid checkpoint state "
                            "(start over with --overwrite)")


# ----------------------------------------------------------------------------------
# A run


@contextlib.contextmanager
def run(out_dir, command: str, fp: dict, resume: bool = False, overwrite: bool = False,
        reads=()):
    """Own `out_dir` for one training run (see the module docstring). Yields the
    directory; on a normal exit the run is marked finished, on an exception or a kill
    it stays "running". `reads` are the run's inputs, which --overwrite must not clear."""
    out_dir = Path(out_dir)
    check_output_dir(out_dir, "--out")
    if overwrite:
        check_not_input(out_dir, reads, "--out", KEEP_ON_OVERWRITE)
    before = set(os.listdir(out_dir)) if out_dir.is_dir() else None
    out_dir.mkdir(parents=True, exist_ok=True)
    with _lock(out_dir):
        try:
            clean_temporaries(out_dir)
            _claim(out_dir, command, fp, resume, overwrite)
            record = {"status": "running", "command": command, "fingerprint": fp,
                      "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
            write_text(out_dir / RUN_FILE, json.dumps(record, indent=1) + "\n")
            yield out_dir
        except BaseException:
            if not _holds_a_run(out_dir):   # no model, no checkpoint: nothing to resume
                _take_back(out_dir, before)
            raise
        write_text(out_dir / RUN_FILE, json.dumps(dict(record, status="finished"), indent=1) + "\n")


def _take_back(out_dir: Path, before):
    """A run that failed before it wrote a model or a checkpoint (bad data, a bad flag, an
    early Ctrl-C) leaves nothing: the directory goes if the run made it, else what the
    run added to it (`before`: the names that were there)."""
    if before is None:
        shutil.rmtree(out_dir, ignore_errors=True)
        return
    for name in set(os.listdir(out_dir)) - before:
        path = out_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def _claim(out_dir: Path, command: str, fp: dict, resume: bool, overwrite: bool):
    """Decide whether this run may use the directory, clearing it when told to. A new
    run stops at a model or a checkpoint (a run that died before writing either left
    nothing to lose); --resume stops at any other run's record."""
    if resume and overwrite:
        raise NanobertError("--resume and --overwrite contradict each other: choose one")
    rec, holds = read_run(out_dir), _holds_a_run(out_dir)
    if overwrite:
        if holds or rec is not None:  # never empty a directory no run of ours wrote
            clear(out_dir)
        return
    if resume:
        if rec is None and holds:
            raise NanobertError(f"--resume: {out_dir} holds a model that no nanobert run "
                                "recorded; start over with --overwrite or choose another --out")
        if rec is not None and rec.get("fingerprint") != fp:
            diff = "; ".join(differences(rec.get("fingerprint") or {}, fp)) or "unknown run"
            raise NanobertError(f"--resume: {out_dir} holds another run ({diff}); resume with "
                                "the same data and flags, or start over with --overwrite")
        if (out_dir / "checkpoint").exists():
            check_checkpoint(out_dir / "checkpoint")
    elif holds:
        what = "an unfinished run" if rec and rec.get("status") != "finished" else "a model"
        raise NanobertError(f"--out {out_dir} already holds {what}; continue it with --resume, "
                            "start over with --overwrite, or choose another directory")


@contextlib.contextmanager
def _lock(out_dir: Path):
    """One run per directory at a time (an advisory lock the kernel drops when the
    process dies, so a killed run never leaves a stale lock)."""
    fd = os.open(out_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise NanobertError(f"--out {out_dir} is being written by another nanobert process")
        yield
    finally:
        os.close(fd)
