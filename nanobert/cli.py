"""The `nanobert` command line.

Each command lives next to the code it drives: COMMANDS maps a command name to the
module that defines `<name>_args(parser)` (its flags) and `<name>_cmd(args)` (the work;
its docstring's first line is the help). Errors the user can fix (`NanobertError`)
print one line and exit with status 2.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import signal
import sys
from pathlib import Path

from .files import NanobertError, signals_replaced, torchrun_processes

# the pipeline, in order: inspect a model, train it, use it, look inside it, experiments
COMMANDS = {
    "info": "nanobert.info",
    "demo": "nanobert.demo",
    "pretrain": "nanobert.pretrain",
    "finetune": "nanobert.finetune",
    "evaluate": "nanobert.finetune",
    "predict": "nanobert.finetune",
    "fill-mask": "nanobert.pretrain",
    "attention": "nanobert.inspection",
    "tsne": "nanobert.inspection",
    "embed": "nanobert.embed",
    "search": "nanobert.embed",
    "ablate-masking": "nanobert.pretrain",
    "compare-gpt2": "nanobert.gpt2",
    "distill": "nanobert.distill",
    "serve": "nanobert.serve",
    "export": "nanobert.export",
}

# string arguments where an empty value means something, or that the command checks with
# a message of its own (free text); every other string flag refuses an empty value
EMPTY_VALUE_OK = {"texts", "text", "query", "pair"}
# free-text arguments: a sentence, a query, a template (not UTF-8: refused by name)
TEXT_ARGS = EMPTY_VALUE_OK | {"context", "template", "verdicts", "label_names",
                              "positive_label"}
# commands whose string flags are checked by their own code (serve: --host, --api-key)
OWN_STRING_CHECKS = {"serve"}


def build_parser(argv=None) -> argparse.ArgumentParser:
    """The whole command line; given the `argv` it will parse, only the module of the
    command `argv` names is imported (`nanobert --version` and `nanobert predict` load no
    server, no plots): the other commands stay bare names."""
    from .config import OneLineParser, reject_empty_values, reject_undecodable_text, show_ranges
    from .threads import add_threads_flag
    parser = OneLineParser(
        prog="nanobert", description="BERT-style encoders: pretrain, fine-tune, inspect, embed.")
    from . import __version__
    parser.add_argument("--version", action="version", version=f"nanobert {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    wanted = _named_command(argv)
    for name, module_name in COMMANDS.items():
        if wanted is not None and name != wanted:
            sub.add_parser(name, add_help=False)
            continue
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name == module_name:  # command not built yet
                continue
            raise
        attr = name.replace("-", "_")
        run = getattr(module, f"{attr}_cmd")
        doc = (run.__doc__ or "").strip()
        p = sub.add_parser(name, help=doc.splitlines()[0] if doc else None, description=doc,
                           formatter_class=DefaultsHelp)
        getattr(module, f"{attr}_args")(p)
        add_threads_flag(p)
        show_ranges(p)
        if name not in OWN_STRING_CHECKS:
            reject_empty_values(p, keep=EMPTY_VALUE_OK)
        reject_undecodable_text(p, TEXT_ARGS)
        p.set_defaults(func=run)
    return parser


def _named_command(argv):
    """The command `argv` names with nothing but `--version` before it; "" for `--version`
    alone (no command's module is needed); None where every command's help may be shown
    (`--help`, no command, a mistyped one)."""
    if argv is None:
        return None
    for token in argv:
        if token == "--version":
            return ""
        if token.startswith("-"):
            return None
        return token if token in COMMANDS else None
    return None


class DefaultsHelp(argparse.ArgumentDefaultsHelpFormatter):
    """Appends '(default: X)' only where it tells something: not for flags that are off
    or unset by default, nor where the help already states its default."""

    def _get_help_string(self, action):
        h = action.help or ""
        # (`is`, not `in`: 0 == False, and a default of 0 is worth showing)
        if action.default is None or action.default is False or action.default == [] or \
                action.default is argparse.SUPPRESS or "default" in h:
            return h
        return super()._get_help_string(action)


class Terminated(KeyboardInterrupt):
    """SIGTERM (`kill`, `timeout`, a job scheduler, `docker stop`): handled as Ctrl-C is,
    so a training run saves its checkpoint and a run that wrote nothing yet takes back
    its output directory, instead of dying with its temporaries in place."""


_SIGNALLED: list = []   # Ctrl-C / SIGTERM that came while the command ran
_RETURNED: list = []    # the command has returned: its work is done


def _interrupt(signum, frame):
    """Ctrl-C or SIGTERM while the command runs: a KeyboardInterrupt (Terminated), as
    Python raises for Ctrl-C, and the signal noted. Raised inside an import, the exception
    can be lost (Python ignores it in importlib's lock callbacks) and the command runs on;
    the note still makes it end as interrupted (`_command`). Once the command has
    returned, its outputs are whole: the signal is ignored."""
    if _RETURNED:
        return
    _SIGNALLED.append(signum)
    raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def _ours_to_handle(signum, current) -> bool:
    """Ctrl-C where Python's own handler is in place; SIGTERM where nobody handles it.
    Under torchrun the launcher passes its SIGTERM on to every worker and waits for them
    as for a Ctrl-C: rank 0 alone writes the checkpoint (under --fsdp none is written,
    and the line says which step --resume continues from)."""
    if signum == signal.SIGINT:
        return current is signal.default_int_handler
    return current in (signal.SIG_DFL, None)


def _end_at_once(signum, frame):
    """Ctrl-C or SIGTERM while the command's modules load: one line and the status, now.
    A KeyboardInterrupt raised in the middle of an import can be lost (raised inside
    importlib's lock callbacks, where Python ignores exceptions: the command then ran on)
    or abort torch's C++ extension half-initialised; and nothing is written yet."""
    word = "terminated" if signum == signal.SIGTERM else "interrupted"
    if _first_process():    # (torchrun: Ctrl-C reaches every worker)
        os.write(2, f"nanobert: {word}\n".encode())
    os._exit(128 + signum)


@contextlib.contextmanager
def _while_loading():
    """Inside the block, Ctrl-C and SIGTERM end the process at once (`_end_at_once`),
    where nobody else handles them (in the main thread)."""
    usual = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}
    with signals_replaced(_end_at_once, lambda signum, current: current is usual[signum]):
        yield


def _out_of_memory(e: BaseException) -> bool:
    """A failed allocation: MemoryError, torch's OutOfMemoryError, or the RuntimeError
    torch's CPU allocator raises ('DefaultCPUAllocator: can't allocate memory')."""
    if isinstance(e, MemoryError):
        return True
    name = type(e).__name__
    return name == "OutOfMemoryError" or (isinstance(e, RuntimeError) and (
        "can't allocate memory" in str(e) or "out of memory" in str(e).lower()))


def _out_of_resources(e: BaseException, args) -> str | None:
    """The one-line error for a limit of the machine that `e` hit (memory; a disk that is
    full, over quota or read-only), or None when it is none of these."""
    from .files import write_failure
    if _out_of_memory(e):
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        return (f"out of memory ({first[:200]}); try a smaller --batch-size, --seq-len or "
                "--max-length")
    what = write_failure(e)
    if what is None:
        return None
    where = _written(e, getattr(args, "out", None))
    return f"{where}: {what}" if where else what


_PEER_GONE = ("Connection reset by peer", "Connection closed by peer", "remote process exited",
              "NCCL communicator was aborted")   # (gloo's and NCCL's words for it)


def _another_process_gone(e: BaseException) -> str | None:
    """The one-line error of a torchrun process whose partner died (killed, out of
    memory) in the middle of a step: gloo had printed a page of traceback."""
    dist = sys.modules.get("torch.distributed")
    backend_error = getattr(dist, "DistBackendError", ()) if dist is not None else ()
    if torchrun_processes() <= 1 or not (
            isinstance(e, backend_error) or any(words in str(e) for words in _PEER_GONE)):
        return None
    return ("another process of this torchrun job stopped (its own lines and torchrun's "
            "summary say why), so this one stops too; run the same command with --resume to "
            "continue from the last checkpoint")


def _written(e: BaseException, out):
    """What a failed write was writing, as the user named it: the command's output
    (--out, OUT) when the error names no file or one on the output's file system (the
    temporary files beside it), else the file the error names."""
    named = getattr(e, "filename", None)
    if named is None or out is None or named == STDOUT:
        return out if named is None else named
    try:
        return out if _device(named) == _device(out) else named
    except OSError:
        return out


class _StdoutWrites:
    """sys.stdout, whose failed writes say they were its (a full disk under `> FILE`,
    `> /dev/full`): an OSError without a file name was blamed on --out, written whole."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text):
        return self._tagged(self.stream.write, text)

    def flush(self):
        return self._tagged(self.stream.flush)

    @staticmethod
    def _tagged(fn, *args):
        try:
            return fn(*args)
        except OSError as e:
            if e.filename is None and not isinstance(e, BrokenPipeError):
                e.filename = STDOUT
            raise

    def __getattr__(self, name):
        return getattr(self.stream, name)


STDOUT = "standard output"


def _device(path) -> int:
    """The file system `path` is on (that of its nearest existing ancestor)."""
    p = Path(os.path.abspath(path))
    while not p.exists() and p != p.parent:
        p = p.parent
    return p.stat().st_dev


def _error(message) -> None:
    """The one line of an error, on stderr; a path of bytes that are not UTF-8 (lone
    surrogates in Python) is shown with backslash escapes rather than failing to print."""
    from .files import ERROR_WAIT, message_line, said_elsewhere, to_stderr
    line = message_line(f"nanobert: error: {message}".encode("utf-8", "backslashreplace")
                        .decode("utf-8"))
    if not said_elsewhere(line, ERROR_WAIT):   # (torchrun: one line, not one a process)
        # (2>/dev/full or 2>&-: the status still says it, 2, not a traceback's 1)
        to_stderr(line)


def main(argv=None) -> int:
    """Run one command. Everything heavy (torch, the commands' modules) is imported in
    here: a Ctrl-C at any moment is one line, never a traceback."""
    _escape_what_output_cannot_show()
    stdout = sys.stdout
    if stdout is not None:   # (None where fd 1 is closed: print() writes nothing)
        sys.stdout = _StdoutWrites(stdout)
    try:
        code = _command(argv)
    except KeyboardInterrupt:   # a second Ctrl-C while the first was being answered
        code = 130
    finally:
        if isinstance(sys.stdout, _StdoutWrites):
            sys.stdout = stdout
    try:
        _leave_processes(code)
    except KeyboardInterrupt:   # a second Ctrl-C as the command ends: it has ended
        code = code or 130
    return code


def run() -> None:
    """The `nanobert` program: main(), then the interpreter's teardown with Ctrl-C and
    SIGTERM ignored. The command has ended and its outputs are whole; a signal in the
    teardown (torch's exit callbacks take up to a second) printed a traceback, or killed
    a finished run with status 130 or 143."""
    try:
        code = main()
    finally:   # (--help and usage errors leave main by SystemExit)
        with contextlib.suppress(ValueError, OSError):   # (not the main thread)
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, signal.SIG_IGN)
    sys.exit(code)


def _escape_what_output_cannot_show():
    """A character stdout's encoding lacks (an emoji, with PYTHONIOENCODING=ascii or a
    Latin-1 locale) is written as a backslash escape: results stopped half-printed in
    a UnicodeEncodeError traceback."""
    for stream in (sys.stdout, sys.stderr):
        if getattr(stream, "errors", None) == "strict" and hasattr(stream, "reconfigure"):
            try:
                stream.reconfigure(errors="backslashreplace")
            except (ValueError, OSError):   # (a stream already closed or detached)
                pass


def _leave_processes(code: int):
    """A torchrun worker (pretrain, distill, finetune) takes its process group down with
    the other ranks (nanobert.train.leave_processes), then exits at once with `code`:
    what is left to do is the interpreter's teardown, where gloo's threads could still
    abort the process after its work was done and written."""
    train = sys.modules.get("nanobert.train")
    if train is not None and train.leave_processes(ok=code == 0):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _flags_after_the_command(parser, argv: list) -> None:
    """`nanobert --threads 2 finetune ...` said "COMMAND: invalid choice: '2'": a command's
    flag before the command is named as such."""
    first = argv[0].split("=", 1)[0] if argv else ""
    if first.startswith("-") and first not in parser._option_string_actions:
        parser.error(f"{first}: not a flag of nanobert itself; a command's flags go after "
                     f"the command: nanobert COMMAND {first} ... (nanobert --help lists them)")


def _first_process() -> bool:
    """Not a later torchrun worker: a Ctrl-C reaches every worker, and one line says so."""
    return os.environ.get("RANK", "0") == "0"


def _said_once(line: str) -> None:
    """'interrupted': a Ctrl-C reaches every torchrun worker, and one line says so (rank
    0's); a worker signalled alone says it too (the others' line says to read its own)."""
    from .files import SIGNAL_WAIT, said_elsewhere, to_stderr
    if not said_elsewhere(line, SIGNAL_WAIT, once=True):
        to_stderr(line)


def _command(argv) -> int:
    """main() without the torchrun teardown."""
    args = None
    _SIGNALLED.clear()
    _RETURNED.clear()
    try:
        with _while_loading():
            from .threads import set_threads
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
            from .config import given_dests
            argv = sys.argv[1:] if argv is None else list(argv)
            parser = build_parser(argv)
            _flags_after_the_command(parser, argv)
            args = parser.parse_args(argv)
            args._given = given_dests(parser, argv)
            set_threads(args.threads)
            from .files import check_one_process
            if getattr(args, "command", None):
                check_one_process(args.command)
        with signals_replaced(_interrupt, _ours_to_handle):
            code = args.func(args) or 0
            if _SIGNALLED:   # its KeyboardInterrupt was lost in an import: it ran on
                raise Terminated() if _SIGNALLED[-1] == signal.SIGTERM else KeyboardInterrupt()
            _RETURNED.append(True)
        return code
    except NanobertError as e:
        if not getattr(e, "said_elsewhere", False):   # (torchrun: another rank says it)
            _error(e)
        return 2
    except Terminated:
        _said_once("nanobert: terminated")
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:
        _said_once("nanobert: interrupted")
        return 130
    except BrokenPipeError:     # the reader went away (`| head`): as a killed Unix tool,
        return 128 + signal.SIGPIPE   # 141, not 0: a training run stopped unfinished
    except Exception as e:
        from .files import path_failure
        message = _out_of_resources(e, args) or path_failure(e) or _another_process_gone(e)
        if message is None:
            raise
        _error(message)
        return 2


if __name__ == "__main__":
    run()
