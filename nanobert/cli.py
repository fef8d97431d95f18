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


def build_parser() -> argparse.ArgumentParser:
    from .config import OneLineParser
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
        p.set_defaults(func=run)
    return parser


class DefaultsHelp(argparse.ArgumentDefaultsHelpFormatter):
    """Appends '(default: X)' only where it tells something: not for flags that are off
    or unset by default, nor where the help already states its default."""

    def _get_help_string(self, action):
        h = action.help or ""
        if action.default in (None, False, argparse.SUPPRESS) or "default" in h:
            return h
        return super()._get_help_string(action)


def main(argv=None) -> int:
    from .files import NanobertError
    from .threads import set_threads
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        set_threads(args.threads)
        return args.func(args) or 0
    except NanobertError as e:
        print(f"nanobert: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("nanobert: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
