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
flag, an early Ctrl-C), or that a full disk stopped before its first checkpoint, takes
back what it created: nothing is left half-written. A new run into a directory that
holds a model or a checkpoint stops unless `--overwrite` (which first deletes what runs
wrote there, `RUN_OUTPUTS` and the files a record lists as "written", and nothing else;
held back until the run writes something, and put back if it fails before that)
or `--resume` (which continues the checkpoint only when the fingerprint matches, and
otherwise says what differs). Directories without the file (hub downloads, models from
other tools) are finished models. A command that trains through another one (the demo
through finetune) holds the directory itself and lends it (`hosting`), so the record
names the command the user ran.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from typing import Optional
import re
import shutil
import struct
import sys
import time
from pathlib import Path

from .files import (LEFTOVER, NanobertError, check_not_input, check_output_dir, clear_leftovers,
                    no_such_file, note, path_kind, process_alive, write_failure, write_text)

RUN_FILE = "nanobert-run.json"
LOCK_FILE = ".nanobert-lock"
# what a finished run leaves: any of these makes a directory "another run's"
MODEL_FILES = ("config.json", "model.safetensors", "pytorch_model.bin", "checkpoint")
# kept by --overwrite: the tokenized-corpus cache (keyed by content) and a folder of input
# data (files in it that a run wrote, the demo's split, are listed in its record: "written")
KEEP_ON_OVERWRITE = ("cache", "data", LOCK_FILE)
# flags that change where or how visibly a run goes, not what it computes
NOT_SHAPING = {"out", "out_dir", "resume", "overwrite", "progress", "no_progress", "device",
               "func", "command", "cache_dir", "log_every", "json", "save_every",
               "fsdp"}   # (FSDP computes what DDP does, to 1e-6: either resumes the other)
# temporaries of files.atomic_path and save_model (files.LEFTOVER), and what an
# --overwrite run holds aside until it has written something (.old-run.PID)
HELD_ASIDE = re.compile(r"\.old-run\.(?P<pid>\d+)")
TEMPORARY = re.compile(LEFTOVER.pattern + "|" + HELD_ASIDE.pattern.replace("?P<pid>", ""))


# ----------------------------------------------------------------------------------
# Fingerprints


def file_digest(path) -> dict:
    """Size and SHA-256 of a file's content (not its name: a moved file is the same data)."""
    h = hashlib.sha256()
    path = Path(path)
    # a data folder (BEIR: corpus, queries, qrels) is the files in it, by relative name
    files = sorted(f for f in path.rglob("*") if f.is_file()) if path.is_dir() else [path]
    if not path.exists():
        raise no_such_file(path)
    if path_kind(path) == "other":   # (a FIFO: hashing it waited for good, or drained it)
        raise NanobertError(f"{path}: not a regular file (a pipe or a device); save the data "
                            "to a file and pass its path")
    for name in files:
        if path.is_dir():
            h.update(str(name.relative_to(path)).encode() + b"\0")
        with open(name, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return {"size": sum(f.stat().st_size for f in files), "sha256": h.hexdigest()[:24]}


# a flag naming a local input whose content the fingerprint holds (in "data"): how the
# path was spelled (train.tsv, ./train.tsv, /abs/train.tsv, another cwd) is not the run
LOCAL_INPUT = "(local input, by content)"


def fingerprint(task: str, data_files, flags: dict, defaults: Optional[dict] = None) -> dict:
    """What makes two runs the same run: the task, the data files' content (in order)
    and the flags that shape the computation (`NOT_SHAPING` ones left out). A flag that
    names one of the data files (or a folder holding them: a model, a corpus folder)
    counts by that content, not by the path's spelling. `defaults` ({flag: default}) lets
    a run recorded before a flag existed resume while that flag is at its default, which
    is what the run did then (_comparable)."""
    hashed = {Path(f).resolve() for f in data_files}
    shaping = {k: LOCAL_INPUT if _names_hashed(v, hashed) else _plain(v)
               for k, v in sorted(flags.items())
               if k not in NOT_SHAPING and not k.startswith("_")}   # (_given: the parse's own)
    at_default = [k for k, v in shaping.items()
                  if defaults is not None and k in defaults and _plain(defaults[k]) == v]
    # ("names" and "defaulted" are read, not compared)
    return {"task": task, "data": [file_digest(f) for f in data_files], "flags": shaping,
            "names": [str(f) for f in data_files], "defaulted": at_default}


def _names_hashed(value, hashed: set) -> bool:
    """`value` (a path or a list of them) names only files in `hashed`, or folders that
    hold some of them."""
    if isinstance(value, (list, tuple)):
        return bool(value) and all(_names_hashed(v, hashed) for v in value)
    if not isinstance(value, (str, Path)) or not str(value):
        return False
    p = Path(str(value)).expanduser()
    if not p.exists():
        return False
    p = p.resolve()
    return p in hashed or any(p in h.parents for h in hashed)


def _comparable(old: dict, new: dict) -> tuple:
    """Both fingerprints without the flags that either side counts by content (records
    written before that rule spelled the path), and without the flags the old record
    predates while they are at their defaults now (a flag is added with the default that
    does what nanobert did before it: an older nanobert's run resumes) or that it holds
    unset and nanobert no longer has."""
    fa, fb = dict(old.get("flags") or {}), dict(new.get("flags") or {})
    for k in [k for k in set(fa) | set(fb) if LOCAL_INPUT in (fa.get(k), fb.get(k))]:
        fa.pop(k, None)
        fb.pop(k, None)
    for k in set(fb) - set(fa):
        if k in (new.get("defaulted") or ()):
            fb.pop(k)
    for k in set(fa) - set(fb):
        if fa[k] is None:
            fa.pop(k)
    old, new = ({k: v for k, v in fp.items() if k not in ("names", "defaulted")}
                for fp in (old, new))
    return dict(old, flags=fa), dict(new, flags=fb)


def model_files(name) -> list:
    """The files that make a local model directory what it is (config and weights), so
    that a retrained base model counts as other data; a hub name is its own flag. A file
    (a tokenizer given as its vocab.txt or tokenizer.json) is itself."""
    d = Path(str(name))
    if name and d.is_file():
        return [d]
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
    out, names, read = [], new.get("names") or [], old.get("names") or []
    old, new = _comparable(old, new)
    if old.get("task") != new.get("task"):
        out.append(f"task {old.get('task')} there, {new.get('task')} now")
    a, b = old.get("data", []), new.get("data", [])
    if len(a) != len(b):
        out.append(f"{len(a)} data file(s) there, {len(b)} now")
    moved = _reordered(a, b)
    if moved is not None:      # (not "each has other content", with their sizes swapped)
        shown = ", ".join(names[i] if i < len(names) else f"data file {i + 1}" for i in moved)
        out.append(f"the same data files in another order (the run read them as {shown})")
    else:
        out += [_other_content(i, names, read) + _sizes(x, y)
                for i, (x, y) in enumerate(zip(a, b)) if x != y]
    fa, fb = old.get("flags", {}), new.get("flags", {})
    named = {"task"} if old.get("task") != new.get("task") else set()   # said once, above
    out += [_flag_difference(k, fa.get(k), fb.get(k)) if k in fa or k == "processes"
            else _new_flag(k, fb[k])
            for k in sorted(set(fa) | set(fb))
            if (k not in fa or k not in fb or fa[k] != fb[k]) and k not in named]
    return list(dict.fromkeys(out))[:limit]   # (one folder as --train and --dev: said once)


def _other_content(i: int, names: list, read: list) -> str:
    """'data.tsv has other content', or, where the run read another path in that place
    (--train given another file), 'dev.tsv has other content than train.tsv, which the
    run read' (the sizes that follow are of those two)."""
    if i >= len(names):
        return f"data file {i + 1} has other content"
    if i < len(read) and _where(read[i]) != _where(names[i]):
        return f"{names[i]} has other content than {read[i]}, which the run read"
    return f"{names[i]} has other content"


def _where(name: str) -> str:
    """A path as the system finds it (one file given as 'a.tsv' and '/x/a.tsv' is one)."""
    return os.path.realpath(name)


def _reordered(there: list, now: list) -> Optional[list]:
    """The order of `now`'s files as the run had them (indices into `now`), when the two
    lists of file fingerprints hold the same files in another order; else None."""
    if there == now or len(there) != len(now):
        return None
    left, order = list(range(len(now))), []
    for x in there:
        i = next((i for i in left if now[i] == x), None)
        if i is None:
            return None
        left.remove(i)
        order.append(i)
    return order


def _sizes(x, y) -> str:
    """' (3 bytes there, 5 now)' when the sizes tell the two files apart, else nothing."""
    sx, sy = (d.get("size") if isinstance(d, dict) else None for d in (x, y))
    if sx == sy or not isinstance(sx, int) or not isinstance(sy, int):
        return ""
    return f" ({sx:,} bytes there, {sy:,} now)"


def _flag_difference(key: str, there, now) -> str:
    """'--lr 0.001 there, 0.005 now'; an on/off setting by its name, 'init on there, off
    now', as its flag may be the negation (--no-init) of the setting's name."""
    if key == "processes":      # (torchrun's, not a flag: finetune's fingerprint)
        return f"{there or 1} process(es) there (torchrun), {now or 1} now"
    if isinstance(there, bool) or isinstance(now, bool):
        def on(v):
            return _shown(v) if not isinstance(v, bool) else "on" if v else "off"
        return f"{key.replace('_', '-')} {on(there)} there, {on(now)} now"
    return f"--{key.replace('_', '-')} {_shown(there)} there, {_shown(now)} now"


def _new_flag(key: str, now) -> str:
    """A flag the run's record predates, given a value other than its default now."""
    return (f"--{key.replace('_', '-')} {_shown(now)} now, a flag newer than the run (an older "
            "nanobert wrote it): resume without it")


def _shown(value) -> str:
    """A flag's value as the user types it: an unset flag is 'not set', not Python's None."""
    return "not set" if value is None else str(value)


# ----------------------------------------------------------------------------------
# Reading the state of a directory


def read_run(out_dir) -> dict | None:
    """The run record of a directory, or None when it has none. A record that cannot be
    read counts as an unfinished run, with what is wrong with it under "damaged"."""
    path = Path(out_dir) / RUN_FILE
    if not path.is_file():
        return None
    try:
        rec = json.loads(path.read_text("utf-8"))
    except json.JSONDecodeError as e:
        return _damaged(f"not valid JSON ({e.msg} at line {e.lineno} column {e.colno})")
    except UnicodeDecodeError:
        return _damaged("not valid UTF-8")
    except OSError as e:
        return _damaged(f"cannot be read ({e.strerror or e})")
    if not isinstance(rec, dict):
        return _damaged(f"not a run record (a JSON {type(rec).__name__}, not an object)")
    if not isinstance(rec.get("fingerprint"), dict):
        return dict(rec, fingerprint={}, damaged='not a run record (no "fingerprint" object)')
    return rec


def _damaged(why: str) -> dict:
    return {"status": "running", "command": "nanobert", "fingerprint": {}, "damaged": why}


def require_finished(model_dir):
    """Refuse a directory whose run has not finished (killed, crashed, or still going)."""
    rec = read_run(model_dir)
    if rec is None or rec.get("status") == "finished":
        return
    if rec.get("damaged"):
        raise NanobertError(f"{Path(model_dir) / RUN_FILE}: {rec['damaged']}; whether the run "
                            f"writing {model_dir} finished is unknown: run it again with "
                            "--overwrite")
    cmd = rec.get("command") or "the training command"
    step = checkpoint_step(Path(model_dir))
    where = f" (checkpoint at step {step})" if step is not None else ""
    if being_written(Path(model_dir)):   # (--resume and --overwrite were advised, and refused)
        raise NanobertError(f"{model_dir}: the {cmd} run writing this directory is still "
                            f"going{where}; use it once the run has finished")
    held = [] if step is not None or holds_a_run(Path(model_dir)) else \
        [p for p in _held_aside(Path(model_dir)) if any(p.iterdir())]
    aside = (f" (the model it was to replace is set aside in {held[0].name}: any other run "
             "command into the directory puts it back)") if held else ""
    raise NanobertError(f"{model_dir}: the {cmd} run writing this directory did not finish"
                        f"{where}; continue it with the same command and --resume, or start "
                        f"over with --overwrite{aside}")


def being_written(out_dir: Path) -> bool:
    """Does a live process hold the directory's run lock (`_lock`)?"""
    try:
        fd = os.open(out_dir / LOCK_FILE, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def checkpoint_step(out_dir: Path):
    try:
        return json.loads((out_dir / "checkpoint" / "state.json").read_text("utf-8"))["step"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def holds_a_run(out_dir: Path) -> bool:
    """A model or a checkpoint in the directory itself (an empty folder is neither: it
    is only a name a run would write over)."""
    def held(path: Path) -> bool:
        if path.is_dir() and not path.is_symlink():
            return any(path.iterdir())
        return path.exists() or path.is_symlink()
    return any(held(out_dir / name) for name in MODEL_FILES)


def _holds_runs(out_dir: Path) -> bool:
    """Runs one level down (the masking ablation: a run per split, each with its record)."""
    return out_dir.is_dir() and any((p / RUN_FILE).is_file() for p in out_dir.iterdir()
                                    if p.is_dir() and not TEMPORARY.fullmatch(p.name))


# ----------------------------------------------------------------------------------
# Cleaning


def clean_temporaries(out_dir: Path):
    """Remove what killed writes left behind (files.clear_leftovers: a half-swapped
    checkpoint goes back)."""
    clear_leftovers(out_dir)


def _held_aside(out_dir: Path) -> list:
    """The folders of what --overwrite runs killed outright (SIGKILL) had set aside."""
    return [p for p in sorted(out_dir.glob(".old-run.*"))
            if (m := HELD_ASIDE.fullmatch(p.name)) and p.is_dir()
            and not process_alive(int(m["pid"]))]


def _settle_held(out_dir: Path, resume: bool, fp: dict):
    """What an --overwrite run killed outright set aside (the older model): once that
    run wrote a model or a checkpoint, it goes; before, it waits for the next run
    command. A --resume of the killed run continues it (and the older model goes); any
    other puts the older model back first, over what the killed run had begun, and is
    then judged as it would have been on that directory."""
    for held in _held_aside(out_dir):
        rec = read_run(out_dir)
        if (holds_a_run(out_dir) or _holds_runs(out_dir) or not any(held.iterdir())
                or resume and rec is not None and _same_run(rec.get("fingerprint"), fp)):
            shutil.rmtree(held, ignore_errors=True)
            continue
        clear(out_dir, keep=[*foreign_entries(out_dir, rec), held.name], only=RUN_OUTPUTS)
        put_back(out_dir, [held])
        note(f"{out_dir}: put back what an --overwrite run killed before it wrote anything "
             "had set aside: the directory holds what it held before that run")


def clear(out_dir: Path, keep=(), only=None, written=None, held=None):
    """Empty a run directory (but the content-keyed cache and the names in `keep`; with
    `only`, just the names it matches), and remove the files `written` names (relative
    path -> digest) that still hold what the run wrote. Entries are first renamed into
    one hidden folder, so a kill half-way leaves nothing that looks like a model. With
    `held` (a list), that folder is kept and appended to it, the written files moved in
    too (under WRITTEN_HELD), for `put_back`."""
    trash = out_dir / f".old-run.{os.getpid()}"
    trash.mkdir(exist_ok=True)
    for p in sorted(out_dir.iterdir()):
        if p.name in KEEP_ON_OVERWRITE or p.name in keep or p == trash:
            continue
        if only is None or only.fullmatch(p.name):
            os.replace(p, trash / p.name)
    still = _still_written(out_dir, written)
    if held is None:
        shutil.rmtree(trash, ignore_errors=True)
        _remove_written(out_dir, still)
        return
    for rel in still:
        (trash / WRITTEN_HELD / rel).parent.mkdir(parents=True, exist_ok=True)
        os.replace(out_dir / rel, trash / WRITTEN_HELD / rel)
    _remove_written(out_dir, still)   # (the folders they leave empty)
    held.append(trash)


WRITTEN_HELD = ".written"   # in a held folder: the written files, at their relative paths


def put_back(out_dir: Path, held: list):
    """What `clear` held back goes back where it was (over anything of the same name), and
    the held folders go: an --overwrite run that failed before it wrote a model or a
    checkpoint (bad data, a bad model) leaves the directory as it found it."""
    for trash in held:
        for p in sorted(trash.iterdir()) if trash.is_dir() else []:
            if p.name == WRITTEN_HELD:
                continue
            _replace(p, out_dir / p.name)
        written = trash / WRITTEN_HELD
        for p in sorted(written.rglob("*")) if written.is_dir() else []:
            if p.is_file() or p.is_symlink():
                (out_dir / p.relative_to(written)).parent.mkdir(parents=True, exist_ok=True)
                _replace(p, out_dir / p.relative_to(written))
        shutil.rmtree(trash, ignore_errors=True)
    held.clear()


def _replace(src: Path, dst: Path):
    if dst.is_dir() and not dst.is_symlink():
        shutil.rmtree(dst)
    elif dst.exists() or dst.is_symlink():
        dst.unlink()
    os.replace(src, dst)


def _remove_written(out_dir: Path, written: dict):
    """Delete the recorded files, and the folders they leave empty (up to `out_dir`)."""
    for rel in written:
        path = out_dir / rel
        path.unlink(missing_ok=True)
        for folder in path.parents:
            if folder == out_dir or out_dir not in folder.parents:
                break
            with contextlib.suppress(OSError):
                folder.rmdir()


def text_digest(text: str) -> dict:
    """`file_digest` of the file that `text` makes."""
    data = text.encode("utf-8")
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()[:24]}


def _still_written(out_dir: Path, written) -> dict:
    """The entries of a record's "written" (relative path -> digest) whose file is still
    there, inside `out_dir`, with the content the run wrote: a file changed since (the
    user's now) is not the run's."""
    out = {}
    for rel, digest in (written or {}).items() if isinstance(written, dict) else ():
        path = out_dir / str(rel)
        if (isinstance(rel, str) and not Path(rel).is_absolute() and ".." not in Path(rel).parts
                and path.is_file() and not path.is_symlink() and file_digest(path) == digest):
            out[rel] = digest
    return out


def check_owned(out_dir, rels, command: str, written=None):
    """Each of `rels` (paths in `out_dir`) is absent, or a file that a run recorded as its
    own ("written", or in `written`: relative path -> digest) and that still holds what
    it wrote: writing there replaces nothing of the user's."""
    out_dir = Path(out_dir)
    rec = read_run(out_dir) if out_dir.is_dir() else None
    mine = _still_written(out_dir, dict((rec or {}).get("written") or {}, **(written or {})))
    for rel in rels:
        path = out_dir / rel
        if (path.exists() or path.is_symlink()) and rel not in mine:
            raise NanobertError(f"--out {out_dir}: {path} is not a file that {command} wrote "
                                "(or it was changed since), and it is never replaced: move "
                                "it, or choose another --out")
    return mine


def write_owned(out_dir, rel: str, text: str, command: str):
    """Write `text` to `out_dir/rel`, a file a run makes beside its outputs (the demo's
    data split), inside the run that holds `out_dir`. It is recorded ("written", with
    its digest) first, so that --overwrite and a failed run take it back; a file already
    there that a run did not write (or that was changed since) is refused, never
    replaced (`check_owned`)."""
    out_dir = Path(out_dir)
    if out_dir.resolve() not in _HELD:
        raise RuntimeError(f"write_owned: no run holds {out_dir}")
    written = check_owned(out_dir, [rel], command)
    written[rel] = text_digest(text)
    rec = read_run(out_dir) or {}
    write_text(out_dir / RUN_FILE, json.dumps(dict(rec, written=written), indent=1) + "\n")
    write_text(out_dir / rel, text)


# the folders of a sentence-transformers layout's modules (1_Pooling, 2_Normalize...), by
# the module classes it names them after (a user's 2024_Analysis/ is none of them)
ST_MODULE_DIR = (r"\d+_(Transformer|Pooling|Normalize|Dense|LayerNorm|Dropout|WordEmbeddings"
                 r"|WordWeights|WeightedLayerPooling|LSTM|CNN|BoW|Asym|StaticEmbedding|CLIPModel)")
# what a model directory that no nanobert run wrote is made of (a hub download, another
# tool's model): --overwrite replaces these and nothing else there
MODEL_ARTIFACTS = re.compile(
    r"config\.json|generation_config\.json|(model|pytorch_model)(-\d+-of-\d+)?\.(safetensors|bin)"
    r"|(model\.safetensors|pytorch_model\.bin)\.index\.json|model(_quantized)?\.onnx"
    r"|tokenizer(_config)?\.json|special_tokens_map\.json|added_tokens\.json|vocab\.(txt|json)"
    r"|merges\.txt|modules\.json|sentence_bert_config\.json|config_sentence_transformers\.json"
    r"|" + ST_MODULE_DIR + r"|checkpoint|nanobert\.json|metrics\.jsonl|training_curve\.png")
# a run's own bookkeeping: never another program's files
BOOKKEEPING = {RUN_FILE, LOCK_FILE, *KEEP_ON_OVERWRITE}
# what nanobert runs write at the top of their --out (a model's files, the training log
# and curve, the checkpoint, pretrain's arguments, an ablation's report and split runs,
# the demo's report): --overwrite deletes these, and the files a run recorded as its own
# ("written"), and nothing else
RUN_OUTPUTS = re.compile(
    MODEL_ARTIFACTS.pattern + "|" + re.escape(RUN_FILE) + r"|pretrain_args\.json"
    r"|ablation\.(md|csv|png)|split-[\d. eE+]+-[\d. eE+]+-[\d. eE+]+|confusion_matrix\.png"
    r"|demo_results\.json")


def foreign_entries(out_dir: Path, rec) -> list:
    """The names in `out_dir` that no nanobert run wrote: what was there when a run first
    took the directory (a notes file, the user's project when --out is '.'), carried from
    run to run in the record. --overwrite never deletes them. A record from before this
    was kept says nothing (the directory was all the run's)."""
    present = {p.name for p in out_dir.iterdir() if not TEMPORARY.fullmatch(p.name)}
    if rec is None:
        return sorted(present - BOOKKEEPING)
    given = rec.get("foreign")
    if not isinstance(given, list):
        return []
    return sorted(n for n in given if isinstance(n, str) and n in present)


def repair_log(path: Path):
    """Drop the lines of a JSON-lines log that do not parse: a run killed while it
    appended a record leaves a torn last line, which resuming would choke on."""
    if not path.is_file():
        return
    try:
        lines = path.read_text("utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        lines = None
    good = []
    for line in lines or []:
        try:
            if line.strip() and isinstance(json.loads(line), dict):
                good.append(line)
        except ValueError:
            continue
    if lines is None or len(good) != len([x for x in lines if x.strip()]):
        write_text(path, "".join(x + "\n" for x in good))


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
    return header


# what a resume reads from state.json: the position (whole numbers >= 0), the best and
# last evaluations, the Python and NumPy generator states
STATE_FIELDS = {"step": int, "epoch": int, "batch_index": int, "best": (dict, type(None)),
                "last_eval": (dict, type(None)), "python_rng": list, "numpy_rng": list}
RNG_TENSORS = ("rng.torch", "rng.numpy")


def check_checkpoint(ckpt_dir: Path):
    """Every file a resume reads is there, whole and holding what the resume reads
    (state.json's fields, the generator states), before any of it is loaded."""
    for name in ("state.json", "model.safetensors", "optimizer.safetensors"):
        if not (ckpt_dir / name).is_file():
            raise NanobertError(f"{ckpt_dir / name}: missing; the checkpoint is incomplete "
                                "(start over with --overwrite)")
    check_safetensors(ckpt_dir / "model.safetensors")
    optimizer = check_safetensors(ckpt_dir / "optimizer.safetensors")
    lacking = [k for k in RNG_TENSORS if k not in optimizer]
    if lacking:
        raise NanobertError(f"{ckpt_dir / 'optimizer.safetensors'}: not a nanobert optimizer "
                            f"state (no {lacking[0]}); start over with --overwrite")
    try:
        state = json.loads((ckpt_dir / "state.json").read_text("utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        state = None
    if not isinstance(state, dict):
        raise NanobertError(f"{ckpt_dir / 'state.json'}: not a valid checkpoint state "
                            "(start over with --overwrite)")
    for key, kind in STATE_FIELDS.items():
        v = state.get(key)
        ok = isinstance(v, kind) and not isinstance(v, bool) and (kind is not int or v >= 0)
        if not ok:
            raise NanobertError(f"{ckpt_dir / 'state.json'}: not a valid checkpoint state "
                                f"({key} is {v!r}); start over with --overwrite")


# ----------------------------------------------------------------------------------
# A run


# the directories this process holds for a run (resolved path -> the command), and those
# of them whose run lends them to a run it starts (`hosting`: demo -> finetune)
_HELD: dict = {}
_HOSTED: set = set()


@contextlib.contextmanager
def hosting(out_dir):
    """Inside the run that holds `out_dir`, let a run it starts there (the demo's
    finetune) join it: that run neither claims nor locks the directory again, and its
    record stays the outer run's (the command the user ran, its fingerprint)."""
    key = Path(out_dir).resolve()
    if key not in _HELD:
        raise RuntimeError(f"hosting: no run holds {out_dir}")
    _HOSTED.add(key)
    try:
        yield
    finally:
        _HOSTED.discard(key)


@contextlib.contextmanager
def run(out_dir, command: str, fp: dict, resume: bool = False, overwrite: bool = False,
        reads=(), written=None):
    """Own `out_dir` for one training run (see the module docstring). Yields the
    directory; on a normal exit the run is marked finished, on an exception or a kill
    it stays "running". `reads` are the run's inputs, which --overwrite must not clear;
    `written` (relative path -> digest) are files in it that the caller knows an earlier
    run of its own wrote (and that its record does not list). Inside a run that already
    hosts runs in `out_dir` (`hosting`: the demo's finetune), it joins that run."""
    out_dir = Path(out_dir)
    if out_dir.resolve() in _HOSTED:
        yield out_dir
        return
    if resume and overwrite:   # (before anything is touched)
        raise NanobertError("--resume and --overwrite contradict each other: choose one")
    check_output_dir(out_dir, "--out")
    if overwrite and not resume:
        _check_inputs_kept(out_dir, reads, written)
    else:   # (distill --out TEACHER was told to --overwrite, which then refused it)
        check_not_input(out_dir, reads, "--out",
                        keep=os.listdir(out_dir) if out_dir.is_dir() else ())
    before = set(os.listdir(out_dir)) if out_dir.is_dir() else None
    made = [p for p in out_dir.absolute().parents if not p.exists()]   # (innermost first)
    out_dir.mkdir(parents=True, exist_ok=True)
    key = out_dir.resolve()
    held: list = []   # what --overwrite moved aside, until the run has written something
    with _lock(out_dir):
        _HELD[key] = command
        record = None
        try:
            clean_temporaries(out_dir)
            _settle_held(out_dir, resume, fp)
            if before is not None:   # (what it put back was there before this run)
                before = {n for n in os.listdir(out_dir) if n != LOCK_FILE or LOCK_FILE in before}
            record = _start(out_dir, command, fp, resume, overwrite, written, held)
            yield out_dir
        except BaseException as e:
            # kept for --resume: a model or checkpoint it wrote, or runs it holds
            if not (_holds_runs(out_dir) or holds_a_run(out_dir) and not _unsaved(out_dir, e)):
                _take_back(out_dir, before if before is None else before | {t.name for t in held})
                put_back(out_dir, held)
                for folder in made if before is None else ():   # (--out new/a/b: new/ too)
                    with contextlib.suppress(OSError):
                        folder.rmdir()
            elif record is None and before is not None and LOCK_FILE not in before:
                (out_dir / LOCK_FILE).unlink(missing_ok=True)   # refused: no trace of it
            elif (full := _full_disk(out_dir, e)) is not None:
                raise full from e
            raise
        finally:
            _HELD.pop(key, None)
            for trash in held:
                shutil.rmtree(trash, ignore_errors=True)
        now = read_run(out_dir) or {}    # with the files it recorded while it ran
        write_text(out_dir / RUN_FILE, json.dumps(
            dict(record, status="finished", written=_still_written(out_dir, now.get("written"))),
            indent=1) + "\n")


def _start(out_dir: Path, command: str, fp: dict, resume: bool, overwrite: bool,
           written, held: list) -> dict:
    """Claim the directory and write the "running" record; returns it."""
    old = read_run(out_dir) or {}
    mine = dict(old.get("written") or {}) if isinstance(old.get("written"), dict) else {}
    mine.update(written or {})
    foreign = _claim(out_dir, command, fp, resume, overwrite, mine, held)
    threads = _threads()
    if resume and isinstance(old.get("threads"), int) and threads not in (None, old["threads"]):
        note(f"--resume: the run started with --threads {old['threads']} and continues with "
             f"{threads}: its model will differ in the last bits from an uninterrupted run "
             "(same --threads for bit-identical results, docs/runs.md)")
    if resume and isinstance(old.get("threads"), int):
        threads = old["threads"]   # (the count it started with: what reproduces it)
    record = {"status": "running", "command": command, "fingerprint": fp,
              "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "foreign": foreign,
              "threads": threads, "written": _still_written(out_dir, mine)}
    write_text(out_dir / RUN_FILE, json.dumps(record, indent=1) + "\n")
    return record


def _threads():
    """The CPU threads torch computes with (part of what makes a run's bits), or None
    when torch is not loaded."""
    torch = sys.modules.get("torch")
    return torch.get_num_threads() if torch is not None else None


def _full_disk(out_dir: Path, e: BaseException):
    """The one line for a disk that filled up (or went read-only) after the run wrote a
    checkpoint, which is written whole or not at all: the last one is there to continue
    from. None for any other error, or when no whole checkpoint is there."""
    what = write_failure(e)
    if what is None:
        return None
    try:
        check_checkpoint(out_dir / "checkpoint")
    except NanobertError:
        return None
    command = _HELD.get(out_dir.resolve()) or "training"
    return NanobertError(f"{out_dir}: {what}; the last checkpoint (step "
                         f"{checkpoint_step(out_dir)}) is intact: make room and continue it "
                         f"with the same {command} command and --resume")


def _overwritten(out_dir: Path, written=None) -> list:
    """The paths in `out_dir` that --overwrite deletes (`_claim`'s three cases): a run's
    outputs (`RUN_OUTPUTS`) but what was there when a run first took the directory, and
    the files runs recorded as their own; in a model directory no run recorded, the
    model's files; in any other directory, the files named as a run's outputs."""
    if not out_dir.is_dir():
        return []
    rec = read_run(out_dir)
    if rec is not None:
        only, keep = RUN_OUTPUTS, set(foreign_entries(out_dir, rec)) | set(KEEP_ON_OVERWRITE)
    elif holds_a_run(out_dir) or _holds_runs(out_dir):
        only, keep = MODEL_ARTIFACTS, set(KEEP_ON_OVERWRITE)
    else:
        only, keep = RUN_OUTPUTS, set(KEEP_ON_OVERWRITE)
    mine = dict((rec or {}).get("written") or {}, **(written or {}))
    return ([p for p in out_dir.iterdir() if p.name not in keep and only.fullmatch(p.name)
             and not TEMPORARY.fullmatch(p.name)]
            + [out_dir / rel for rel in _still_written(out_dir, mine)])


def _check_inputs_kept(out_dir: Path, reads, written):
    """--overwrite would delete none of the run's inputs (those in the directory that no
    run wrote, the run's data in `--out .`, are kept and may be read)."""
    check_not_input(out_dir, reads, "--out", keep=os.listdir(out_dir) if out_dir.is_dir() else ())
    gone = [p.resolve() for p in _overwritten(out_dir, written)]
    for given in reads:
        if not given or not Path(str(given)).exists():  # a hub name or an alias
            continue
        src = Path(str(given)).resolve()
        if any(src == p or p in src.parents for p in gone):
            raise NanobertError(f"--out {out_dir}: holds the input {given}, which --overwrite "
                                "would delete (choose another --out)")


def _unsaved(out_dir: Path, e: BaseException) -> bool:
    """A run the disk stopped (full, over quota, read-only) before it wrote a checkpoint:
    there is nothing to resume, and a best model it wrote is not the run's result."""
    return write_failure(e) is not None and not (out_dir / "checkpoint").exists()


def _take_back(out_dir: Path, before):
    """A run that failed before it wrote a model or a checkpoint (bad data, a bad flag, an
    early Ctrl-C) leaves nothing: the directory goes if the run made it, else what the
    run added to it (`before`: the names that were there), the files it recorded as its
    own included (the demo's split, in a data/ folder that was there)."""
    if before is None:
        shutil.rmtree(out_dir, ignore_errors=True)
        return
    _remove_written(out_dir, _still_written(out_dir, (read_run(out_dir) or {}).get("written")))
    for name in set(os.listdir(out_dir)) - before:
        path = out_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def _claim(out_dir: Path, command: str, fp: dict, resume: bool, overwrite: bool,
           written=None, held=None) -> list:
    """Decide whether this run may use the directory, clearing it when told to. A new
    run stops at a model or a checkpoint (a run that died before writing either left
    nothing to lose); --resume stops at any other run's record. --overwrite deletes
    what runs wrote (`_overwritten`) and nothing else. Returns the names there that no
    run wrote (`foreign_entries`), which every later --overwrite keeps."""
    rec, holds = read_run(out_dir), holds_a_run(out_dir) or _holds_runs(out_dir)
    if overwrite:
        if rec is not None:      # a run's directory: what runs wrote, but what was there before
            clear(out_dir, keep=foreign_entries(out_dir, rec), only=RUN_OUTPUTS, written=written,
                  held=held)
        elif holds:              # another program's model: its files, never the rest
            clear(out_dir, only=MODEL_ARTIFACTS, written=written, held=held)
        else:                    # files a run writes, not a run's: replaced, as asked
            clear(out_dir, only=RUN_OUTPUTS, written=written, held=held)
        return foreign_entries(out_dir, rec)
    foreign = foreign_entries(out_dir, rec)
    ours = [n for n in foreign if RUN_OUTPUTS.fullmatch(n)] if rec is None and not holds else []
    if ours:   # (they were written over, then listed as the user's, kept by --overwrite)
        raise NanobertError(f"--out {out_dir} holds {', '.join(sorted(ours)[:4])}, which no "
                            "run recorded and this run would write over; move them, choose "
                            "another directory, or replace them with --overwrite")
    if resume:
        _check_resume(out_dir, rec, holds, fp, command)
    elif holds and rec is not None and rec.get("damaged"):
        raise NanobertError(f"--out {out_dir} holds a run whose record cannot be used "
                            f"({out_dir / RUN_FILE}: {rec['damaged']}); start over with "
                            "--overwrite, or choose another directory")
    elif holds and command and (rec or {}).get("command") not in (None, command):
        # (--resume continues a run of this command only: it was offered, then refused)
        state = "a finished" if rec.get("status") == "finished" else "an unfinished"
        raise NanobertError(f"--out {out_dir} already holds {state} {rec['command']} run, "
                            f"which {command} cannot continue; start over with --overwrite, "
                            "or choose another directory")
    elif holds:
        raise NanobertError(f"--out {out_dir} already holds {_held(out_dir, rec)}; continue it "
                            "with --resume, start over with --overwrite, or choose another "
                            "directory")
    return foreign


# commands whose run directory holds runs of their own (one per split), not a checkpoint
RUNS_OF_RUNS = ("ablate-masking",)


def _check_resume(out_dir: Path, rec, holds: bool, fp: dict, command: str = ""):
    """--resume continues only this run, from a whole checkpoint."""
    if rec is not None and rec.get("damaged"):
        raise NanobertError(f"--resume: {out_dir / RUN_FILE}: {rec['damaged']}; the run "
                            "cannot be continued: start over with --overwrite")
    if rec is None and not holds:   # (a script may always pass --resume; a typo says so)
        note(f"--resume: {out_dir} holds no run to continue; starting a new one")
    if rec is None and holds:
        what = ("a checkpoint" if not any((out_dir / f).exists() for f in MODEL_FILES[:3])
                else "a model")
        raise NanobertError(f"--resume: {out_dir} holds {what} that no nanobert run "
                            f"recorded ({RUN_FILE} removed? another tool's model, or a "
                            "nanobert older than run records, whose runs cannot be "
                            "continued); start over with --overwrite or choose another --out")
    other = (rec or {}).get("command")
    if rec is not None and command and other and other != command:
        # (its flags and files are another command's: listing them as changed misleads)
        raise NanobertError(f"--resume: {out_dir} holds a {other} run, not a {command} one; "
                            "resume it with that command, or start over with --overwrite")
    if rec is not None and not _same_run(rec.get("fingerprint"), fp):
        diff = "; ".join(differences(rec.get("fingerprint") or {}, fp)) or "unknown run"
        raise NanobertError(f"--resume: {out_dir} holds another run ({diff}); resume with "
                            "the same data and flags, or start over with --overwrite")
    if (out_dir / "checkpoint").exists():
        check_checkpoint(out_dir / "checkpoint")
    if rec is not None and command not in RUNS_OF_RUNS and \
            not (out_dir / "checkpoint" / "state.json").is_file():
        # (killed while it read its data or loaded its model; the trainer said it only
        # where a metrics log was started, and a directory with no run is said above)
        note(f"--resume: the run in {out_dir} has no checkpoint to continue from (it "
             "stopped before saving one, or its checkpoint folder was removed); starting it "
             "again from step 0")
    repair_log(out_dir / "metrics.jsonl")


def _held(out_dir: Path, rec) -> str:
    """What a directory a new run may not use holds, in a few words."""
    if rec and rec.get("status") != "finished":
        return "an unfinished run"
    if holds_a_run(out_dir):
        return "a model"
    return f"the runs of {(rec or {}).get('command') or 'another command'}"   # one level down


def _same_run(old, new: dict) -> bool:
    if not isinstance(old, dict):
        return False
    a, b = _comparable(old, new)
    return a == b


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
