"""User-facing errors and safe file writing.

Every problem with a user's input is raised as `NanobertError`; the command line
prints it on one line and exits with status 2. Files are written to a temporary
name beside the target and renamed into place, so nothing is ever half-written.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path


class NanobertError(Exception):
    """A problem the user can fix (bad file, missing model, wrong flag)."""


def data_error(path, line, msg) -> NanobertError:
    """An error that points at a place in a file: 'path:line: msg'."""
    where = f"{path}:{line}" if line else f"{path}"
    return NanobertError(f"{where}: {msg}")


def read_lines(path):
    """Yield (line_number, text) of a UTF-8 text file, without line endings. A leading
    byte-order mark is dropped; bad UTF-8 is reported with its line number."""
    path = Path(path)
    if not path.is_file():
        raise NanobertError(f"{path}: no such file")
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise data_error(path, n, f"not valid UTF-8 ({e.reason} at byte {e.start})")
            if n == 1:
                text = text.lstrip("\ufeff")
            yield n, text.rstrip("\r\n")


@contextlib.contextmanager
def atomic_path(target):
    """Yield a temporary path next to `target`; on success rename it onto `target`.
    Works for files and for directories."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent)) / "t"
    try:
        yield tmp
        if target.is_dir() and tmp.is_dir():
            old = target.with_name(f".{target.name}.old{os.getpid()}")
            os.replace(target, old)
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp.parent, ignore_errors=True)


def write_text(target, text: str):
    with atomic_path(target) as tmp:
        tmp.write_text(text, encoding="utf-8")
