"""The `nanobert` command line.

Each command lives next to the code it drives: COMMANDS maps a command name to the
module that defines `<name>_args(parser)` (its flags) and `<name>_cmd(args)` (the work;
its docstring's first line is the help). Errors the user can fix (`NanobertError`)
print one line and exit with status 2.
"""
from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys

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
# commands whose string flags are checked by their own code (serve: --host, --api-key)
OWN_STRING_CHECKS = {"serve"}


def build_parser() -> argparse.ArgumentParser:
    from .config import OneLineParser, reject_empty_values
    from .threads import add_threads_flag
    parser = OneLineParser(
        prog="nanobert", description="BERT-style encoders: pretrain, fine-tune, inspect, embed.")
    from . import __version__
    parser.add_argument("--version", action="version", version=f"nanobert {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, module_name in COMMANDS.items():
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
        if name not in OWN_STRING_CHECKS:
            reject_empty_values(p, keep=EMPTY_VALUE_OK)
        p.set_defaults(func=run)
    return parser


class DefaultsHelp(argparse.ArgumentDefaultsHelpFormatter):
    """Appends '(default: X)' only where it tells something: not for flags that are off
    or unset by default, nor where the help already states its default."""

    def _get_help_string(self, action):
        h = action.help or ""
        # (`is`, not `in`: 0 == False, and a default of 0 is worth showing)
        if action.default is None or action.default is False or \
                action.default is argparse.SUPPRESS or "default" in h:
            return h
        return super()._get_help_string(action)


class Terminated(KeyboardInterrupt):
    """SIGTERM (`kill`, `timeout`, a job scheduler, `docker stop`): handled as Ctrl-C is,
    so a training run saves its checkpoint and a run that wrote nothing yet takes back
    its output directory, instead of dying with its temporaries in place."""


def _terminate_like_ctrl_c(signum, frame):
    raise Terminated()


def _catch_sigterm():
    """Only in the main thread of a single process (under torchrun the launcher stops
    the workers with SIGTERM, and a checkpoint there needs every rank), and only where
    nobody else handles SIGTERM. Returns the handler to put back, or None."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return None
    try:
        if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
            return signal.signal(signal.SIGTERM, _terminate_like_ctrl_c)
    except ValueError:   # not the main thread (main() called from a worker thread)
        pass
    return None


def _out_of_memory(e: BaseException) -> bool:
    """A failed allocation: MemoryError, torch's OutOfMemoryError, or the RuntimeError
    torch's CPU allocator raises ('DefaultCPUAllocator: can't allocate memory')."""
    if isinstance(e, MemoryError):
        return True
    name = type(e).__name__
    return name == "OutOfMemoryError" or (isinstance(e, RuntimeError) and (
        "can't allocate memory" in str(e) or "out of memory" in str(e).lower()))


def main(argv=None) -> int:
    from .files import NanobertError
    from .threads import set_threads
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    parser = build_parser()
    args = parser.parse_args(argv)
    previous = _catch_sigterm()
    try:
        set_threads(args.threads)
        return args.func(args) or 0
    except NanobertError as e:
        print(f"nanobert: error: {e}", file=sys.stderr)
        return 2
    except Terminated:
        print("nanobert: terminated", file=sys.stderr)
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:
        print("nanobert: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except (MemoryError, RuntimeError) as e:
        if not _out_of_memory(e):
            raise
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        print(f"nanobert: error: out of memory ({first[:200]}); try a smaller --batch-size, "
              "--seq-len or --max-length", file=sys.stderr)
        return 2
    finally:
        if previous is not None:   # (main() called in-process: leave the caller's as it was)
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
