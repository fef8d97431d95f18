"""Job configs, and the command-line flags generated from them.

Every job (pretrain, finetune, distill, the trainer they share) is a dataclass whose
fields carry their own help text, allowed range and flag in the field metadata:

    @dataclass
    class TrainConfig(Config):
        lr: float = param(5e-5, "peak learning rate", positive())

From that one description come
  - the flags:         `add_flags(parser, FinetuneConfig)` (one per field; nested
                       configs such as the trainer's are flattened, see `Config.flags`)
  - the config back:   `FinetuneConfig.from_args(args)`
  - the validation:    on construction (`__post_init__`) and while parsing, with one
                       message `--lr: got inf, expected a finite number > 0 and <= 1`

so Python callers and the command line share defaults, ranges and messages:

    cfg = FinetuneConfig(task="ner", model="minilm", train="t.txt", dev="d.txt")
    cfg = cfg.replace(lr=1e-4, epochs=5, out_dir="runs/ner")  # flat names reach nested ones

Flags of the commands that have no job config (fill-mask -k, tsne --perplexity) use the
same checks through `checked(kind, range)` as their argparse `type`.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import numbers
import os
import sys
from dataclasses import dataclass
from typing import Any, ClassVar, Optional

from .files import ERROR_WAIT, NanobertError, plain_number, said_elsewhere

# ----------------------------------------------------------------------------------
# Allowed ranges


@dataclass(frozen=True)
class Range:
    """lo <= x <= hi (strict where `*_open`); None is unbounded. Floats must be finite."""
    lo: Optional[float] = None
    hi: Optional[float] = None
    lo_open: bool = False
    hi_open: bool = False

    def contains(self, x) -> bool:
        if isinstance(x, float) and not math.isfinite(x):
            return False
        if self.lo is not None and (x <= self.lo if self.lo_open else x < self.lo):
            return False
        return self.hi is None or (x < self.hi if self.hi_open else x <= self.hi)

    def describe(self, kind: type) -> str:
        what = "an integer" if kind is int else "a finite number"
        lo = None if self.lo is None else f"{'>' if self.lo_open else '>='} {_shown(self.lo)}"
        hi = None if self.hi is None else f"{'<' if self.hi_open else '<='} {_shown(self.hi)}"
        if lo and hi:
            return f"{what} {lo} and {hi}"
        return f"{what} {lo or hi}" if (lo or hi) else what


def _shown(x) -> str:
    """A bound as written: whole numbers in full (4294967295, not 4.29497e+09)."""
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e16 else f"{x:g}"


def seed_range() -> Range:
    """What every random generator takes (numpy's legacy seeding stops at 2**32 - 1;
    a larger seed was a traceback from torch.manual_seed)."""
    return Range(0, 2**32 - 1)


def check_count(value, name: str, none_ok: bool = False, minimum: int = 1):
    """A whole number >= minimum (numpy's too), or None where none_ok; else an error
    naming the argument."""
    if value is None and none_ok:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer >= {minimum}"
                        f"{' or None' if none_ok else ''}, got {type(value).__name__} "
                        f"{value!r}"[:200])
    if value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value}")
    return int(value)


def at_least(n, at_most=None) -> Range:
    return Range(lo=n, hi=at_most)


# Ceilings of counts that have no natural one: far beyond any real run, but they turn a
# typo (--steps 1e20 spelled out, --seq-len 1000000000) into an error naming the flag
# instead of a run that never ends or a traceback from a failed allocation.
MAX_STEPS = 10**9
MAX_SEQ_LEN = 1 << 17

# The fewest tokens a --max-length (and a Python max_length) may give a sequence: [CLS],
# [SEP] and some text. Below it, truncation kept nothing of the text (every input read
# as [CLS] [SEP]), or a 1 turned truncation off.
MIN_MAX_LENGTH = 4


def max_length_range() -> Range:
    """What every --max-length flag and Python max_length take."""
    return at_least(MIN_MAX_LENGTH)


def positive() -> Range:
    return Range(lo=0, lo_open=True)


def learning_rate() -> Range:
    """What every --lr takes: AdamW's step is about lr per weight, so an lr above 1 is
    never meaningful (--lr 1e23 gave weights of 5e22 and a model that answers NaN)."""
    return Range(lo=0, hi=1, lo_open=True)


def temperature() -> Range:
    """A softmax temperature (distillation's T) or its inverse (a bi-encoder's scale):
    logits divided by 1e-45 are infinite, and the loss NaN at the first step, blamed on
    --lr; beyond these bounds nothing is learnt that is not learnt within them."""
    return Range(lo=0.01, hi=1000)


def fraction(open_hi: bool = False, open_lo: bool = False) -> Range:
    """0..1, either end excluded on request (a dropout of 1 drops everything)."""
    return Range(0, 1, lo_open=open_lo, hi_open=open_hi)


def check_value(flag: str, value, kind: type = float, allowed: Optional[Range] = None,
                choices=None):
    """Raise NanobertError('--flag: got X, expected ...') unless `value` is allowed."""
    if value is None:
        return
    if choices is not None and value not in choices:
        raise NanobertError(f"{flag}: got {value!r}, expected one of {', '.join(map(str, choices))}")
    wrong_type = isinstance(value, bool) or not isinstance(value, int if kind is int else (int, float))
    if allowed is not None and (wrong_type or not allowed.contains(value)):
        shown = repr(value) if wrong_type else value
        raise NanobertError(f"{flag}: got {shown}, expected {allowed.describe(kind)}")


def check_device(flag: str, value) -> None:
    """A device torch can use here: auto, cpu, cuda, cuda:N (N a GPU this machine has),
    mps where there is one. Checked with the flags, not when the trainer starts (after the
    data was read and the model loaded) with a traceback from torch."""
    if value is None or value == "auto":
        return
    import torch
    expected = "expected auto, cpu, cuda or cuda:N"
    try:
        dev = torch.device(str(value))
    except (RuntimeError, TypeError, ValueError):
        raise NanobertError(f"{flag}: got {value!r}, {expected}")
    if dev.type == "cpu" or (dev.type == "mps" and torch.backends.mps.is_available()):
        return
    if dev.type != "cuda":
        raise NanobertError(f"{flag}: got {value!r}, {expected}")
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n == 0:
        raise NanobertError(f"{flag} {value}: no CUDA GPU is available here (torch "
                            f"{torch.__version__}); use cpu or auto")
    if dev.index is not None and dev.index >= n:
        raise NanobertError(f"{flag} {value}: no such GPU (this machine has {n}: cuda:0 to "
                            f"cuda:{n - 1})")


def checked(kind: type, allowed: Optional[Range] = None, flag: str = ""):
    """An argparse `type` that converts with `kind` and checks the range; the message
    reaches the user through `OneLineParser.error` as `--flag: got X, expected ...`."""
    def convert(text: str):
        try:
            value = plain_number(text, kind)
        except ValueError:
            raise argparse.ArgumentTypeError(f"got {text!r}, expected "
                                             f"{(allowed or Range()).describe(kind)}")
        try:
            check_value(flag, value, kind, allowed)
        except NanobertError as e:
            raise argparse.ArgumentTypeError(str(e).split(": ", 1)[1])
        return value
    convert.__name__ = kind.__name__  # argparse names the type in its messages
    convert.kind, convert.allowed = kind, allowed     # (for show_ranges)
    return convert


def show_ranges(parser: argparse.ArgumentParser) -> None:
    """Each `checked` flag's allowed range at the end of its help, as add_flags writes it
    ([an integer >= 4]): flags added by hand had enforced ranges --help did not show."""
    for action in parser._actions:
        allowed = getattr(action.type, "allowed", None)
        if allowed is None or not action.help or action.help is argparse.SUPPRESS:
            continue
        shown = f"[{allowed.describe(action.type.kind)}]"
        if shown not in action.help:
            action.help = f"{action.help} {shown}"


def nonempty(convert=None):
    """An argparse `type` that refuses an empty string (a path or a name left empty by a
    shell variable that was not set: `--tokenizer "$TOK"`), then converts with `convert`."""
    def check(text: str):
        if isinstance(text, str) and not text.strip():
            raise argparse.ArgumentTypeError(f"got {text!r}, expected a non-empty value")
        return convert(text) if convert is not None else text
    check.__name__ = getattr(convert, "__name__", "str")
    return check


def reject_empty_values(parser: argparse.ArgumentParser, keep=()):
    """Every flag and argument of `parser` that takes a string (a path, a model, a column,
    a preset) refuses an empty one, with the flag named, before any work, instead of
    treating it as unset or as the current directory. `keep`: the dests where an empty
    string means something (free text that the command checks itself)."""
    for action in parser._actions:
        if not isinstance(action, (argparse._StoreAction, argparse._AppendAction)):
            continue
        if action.dest in keep or action.choices is not None or action.nargs == 0:
            continue
        if action.type is None or action.type is str:
            action.type = nonempty()


def utf8_text(convert=None):
    """An argparse `type` for free text (a sentence, a query, a template): refuses text
    that is not UTF-8, which Python hands over as lone surrogates ('\\udce9' for a Latin-1
    byte 0xe9) and the tokenizer cannot encode, then converts with `convert`."""
    def check(text: str):
        if isinstance(text, str):
            bad = next((ch for ch in text if "\udc80" <= ch <= "\udcff"), None)
            if bad is not None:
                byte = text.encode("utf-8", "surrogateescape")[:60]
                raise argparse.ArgumentTypeError(
                    f"not valid UTF-8 (byte 0x{ord(bad) - 0xdc00:02x} in {byte!r}); "
                    "give text in UTF-8 (the shell's locale may be another encoding)")
        return convert(text) if convert is not None else text
    check.__name__ = getattr(convert, "__name__", "str")
    return check


def reject_undecodable_text(parser: argparse.ArgumentParser, texts=()):
    """The free-text arguments of `parser` (dests in `texts`) refuse text that is not
    UTF-8 with the flag named (a path may hold such bytes: paths are left alone)."""
    for action in parser._actions:
        if action.dest in texts and isinstance(action, (argparse._StoreAction,
                                                        argparse._AppendAction)):
            action.type = utf8_text(action.type if action.type is not str else None)


class OneLineParser(argparse.ArgumentParser):
    """argparse, with its errors on one line: `nanobert: error: --flag: got X, expected ...`
    and exit status 2, like every other error the user can fix."""

    noting = True      # (given_dests parses again: its parse says nothing)

    def __init__(self, *args, **kwargs):
        # no abbreviations: `--corp` for --corpus slipped past the check of a list flag
        # given twice, and a new flag could make an old abbreviation ambiguous
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        args = sys.argv[1:] if args is None else list(args)
        self._given = args
        self._no_list_flag_twice(args)
        return super().parse_known_args(self._dash_values_joined(args), namespace)

    def _no_list_flag_twice(self, args: list) -> None:
        """A flag of several values given twice (`--corpus a.txt --corpus b.txt`): argparse
        kept the last list, and the first was never read, not even checked to exist. A
        flag of one value given twice keeps the last, as argparse does (a command line
        that adds to another), with a note (it was said nowhere)."""
        seen = set()
        for a in args:
            if a == "--":
                return
            name = a[:2] if a[:1] == "-" and a[1:2] not in ("-", "") else a.split("=", 1)[0]
            action = self._option_string_actions.get(name)    # ('-k2': -k with its value)
            if action is None or isinstance(action, argparse._AppendAction):
                continue
            flag = action.option_strings[-1]
            if action.dest in seen and action.nargs in ("+", "*"):
                self.error(f"{flag}: given twice (only the last would be read); list every "
                           f"value after one {flag}: {flag} A B")
            if action.dest in seen and action.nargs is None and self.noting and isinstance(
                    action, argparse._StoreAction):
                from .files import note
                note(f"{flag} given more than once: the last one is used")
            seen.add(action.dest)

    def _dash_values_joined(self, args: list) -> list:
        """`--flag -value` as `--flag=-value`, where the flag takes one value and the
        value is no flag: argparse takes a value that starts with a dash for a flag unless
        it is a plain negative number, so `--mask-split -10/100/10` said "expected one
        argument" instead of what is wrong with the value. A flag of several paths
        (`--corpus`) takes such a value as ./-value, the same file."""
        flags, out, i = self._option_string_actions, [], 0

        def dash_value(v) -> bool:
            return (v is not None and v[:1] == "-" and v[:2] != "--" and len(v) > 1
                    and not any(f.startswith(v) for f in flags))
        while i < len(args):
            a = args[i]
            if a == "--":
                return out + args[i:]
            nxt = args[i + 1] if i + 1 < len(args) else None
            if a in flags and flags[a].nargs is None and dash_value(nxt):
                out.append(f"{a}={nxt}")
                i += 2
                continue
            out.append(a)
            i += 1
            if a in flags and flags[a].nargs == "+":   # (paths: --corpus -a.txt b.txt)
                while i < len(args) and (args[i][:1] != "-" or dash_value(args[i])):
                    out.append(f"./{args[i]}" if dash_value(args[i]) else args[i])
                    i += 1
        return out

    def _unknown_flag(self) -> Optional[str]:
        """The first `--flag` of the command line this parser has no such flag for, with
        the one it may stand for: `--corp` had been refused as '--corpus is required'."""
        for a in getattr(self, "_given", []):
            if a == "--":
                return None
            name = a.split("=", 1)[0]
            if name.startswith("--") and len(name) > 2 and name not in self._option_string_actions:
                return f"unrecognized argument {name}{self._meant(name)}"
        return None

    def _meant(self, name: str) -> str:
        """' (did you mean --corpus?)' for a flag of the command given close to `name`."""
        import difflib
        near = difflib.get_close_matches(name, self._command_flags(), 1, 0.6) \
            if name.startswith("--") else []
        return f" (did you mean {near[0]}?)" if near else ""

    def _command_flags(self) -> dict:
        """The flags of the command given (this parser's own where it has no commands)."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                chosen = next((a for a in getattr(self, "_given", []) if a in action.choices),
                              None)
                return action.choices[chosen]._option_string_actions if chosen else {}
        return self._option_string_actions

    def error(self, message):
        if message.startswith("the following arguments are required"):
            message = self._unknown_flag() or message
        elif message.startswith("unrecognized arguments: "):    # (the top parser's words)
            message += self._meant(message.split(": ", 1)[1].split(" ")[0].split("=", 1)[0])
        prefix = "argument "
        if message.startswith(prefix) and ": " in message:  # 'argument -k/--top-k: ...'
            names, rest = message[len(prefix):].split(": ", 1)
            message = f"{names.split('/')[-1]}: {rest}"
        line = f"nanobert: error: {message}"
        self.exit(2, None if said_elsewhere(line, ERROR_WAIT) else line + "\n")


def given_dests(parser: argparse.ArgumentParser, argv) -> set:
    """The dests of the flags `argv` gives, at any value (a parse compares values with
    defaults; a flag given at its default value is given all the same). `argv` has
    already parsed without error: it is parsed again with every default suppressed."""
    parsers, saved = [parser], []
    while parsers:
        p = parsers.pop()
        for action in p._actions:
            saved.append((action, action.default))
            action.default = argparse.SUPPRESS
            if isinstance(action, argparse._SubParsersAction):
                parsers += list(action.choices.values())
    OneLineParser.noting = False
    try:
        return set(vars(parser.parse_args(argv)))
    finally:
        OneLineParser.noting = True
        for action, default in saved:
            action.default = default


# ----------------------------------------------------------------------------------
# Fields


def param(default=dataclasses.MISSING, help: str = "", allowed: Optional[Range] = None, *,
          choices=None, flag: Optional[str] = None, required: bool = False, check=None,
          **argparse_kw):
    """A config field with its flag's help, allowed range or choices. `flag` renames the
    flag (default: --field-name); `required` makes the flag required even though Python
    callers have a default; `check(flag, value)` raises NanobertError for a value no range
    describes (a device); other keywords go to argparse (nargs, metavar).
    A mutable default (a list, a nested config) is given as a zero-argument callable."""
    meta = {"help": help, "range": allowed, "choices": choices, "flag": flag,
            "required": required, "check": check, "argparse": argparse_kw}
    if callable(default) and not isinstance(default, type):
        return dataclasses.field(default_factory=default, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def _kind(f: dataclasses.Field) -> type:
    """int, float, bool, list or str, from the annotation ('Optional[int]' is int; under
    `from __future__ import annotations` annotations are strings)."""
    t = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    t = t.strip()
    if t.startswith("Optional[") and t.endswith("]"):
        t = t[len("Optional["):-1]
    return {"bool": bool, "int": int, "float": float, "list": list}.get(t, str)


def _flag(f: dataclasses.Field, renamed: Optional[str] = None) -> str:
    return renamed or f.metadata.get("flag") or "--" + f.name.replace("_", "-")


class Config:
    """Base of the job configs: validation on construction, flat overrides, flags.

    `nested` maps a field that holds another Config (the trainer's settings, the data
    columns) to the fields of it that this job offers as flags, each with its flag name
    (None: the field's own), or to None for all of them."""
    nested: ClassVar[dict] = {}

    def __new__(cls, *args, **fields):
        """A TypeError that says where a field of a nested config goes (`FinetuneConfig(
        lr=1e-5)`: lr is the trainer's), rather than Python's bare 'unexpected keyword'."""
        if dataclasses.is_dataclass(cls):
            own = {f.name for f in dataclasses.fields(cls) if f.init}
            unknown = [k for k in fields if k not in own]
            if unknown and unknown[0] in {p[-1] for p, _, _ in cls.flags() if len(p) > 1}:
                raise TypeError(f"{cls.__name__}() has no field {unknown[0]}: it is a field of "
                                f"one of its parts, set with {cls.__name__}.create(..., "
                                f"{unknown[0]}=...) or cfg.replace({unknown[0]}=...)")
            if unknown:
                raise TypeError(f"{cls.__name__}() has no field {', '.join(unknown)}"
                                f"{cls._field_of_flag(unknown)}")
        return super().__new__(cls)

    @classmethod
    def _field_of_flag(cls, names) -> str:
        """' (the flag --teacher is the field teachers)' where a name taken for a field is a
        flag's that sets a field of another name; else ''."""
        of_flag = {flag.lstrip("-").replace("-", "_"): path[-1] for path, _, flag in cls.flags()}
        said = [f"--{n.replace('_', '-')} is the field {of_flag[n]}" for n in names
                if of_flag.get(n, n) != n]
        return f" (the flag {'; '.join(said)})" if said else ""

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if _kind(f) is list and isinstance(value, (str, os.PathLike)):
                setattr(self, f.name, [value])   # one path given alone, not its letters
            if type(value).__module__ == "numpy" and getattr(value, "ndim", None) == 0:
                setattr(self, f.name, value.item())   # np.int64(8) from a sweep: its number
            if _kind(f) is bool and not isinstance(getattr(self, f.name), bool) and \
                    getattr(self, f.name) is not None:   # ('no' read as true: overwrote a run)
                value = getattr(self, f.name)
                raise TypeError(f"{f.name} must be True or False, got "
                                f"{type(value).__name__} {value!r}")
            if f.metadata.get("range") or f.metadata.get("choices"):
                check_value(_flag(f), getattr(self, f.name), _kind(f), f.metadata.get("range"),
                            f.metadata.get("choices"))
            if f.metadata.get("check"):
                f.metadata["check"](_flag(f), getattr(self, f.name))

    def replace(self, **changes) -> "Config":
        """A copy with `changes`; names of a nested config's fields reach it, so
        `cfg.replace(lr=1e-4)` sets `cfg.trainer.lr`. Unknown names raise TypeError."""
        own = {f.name for f in dataclasses.fields(self)}
        mine = {k: v for k, v in changes.items() if k in own}
        rest = {k: v for k, v in changes.items() if k not in own}
        for name in self.nested:
            inner = getattr(mine.get(name, getattr(self, name)), "__dataclass_fields__")
            part = {k: v for k, v in rest.items() if k in inner}
            if part:
                mine[name] = mine.get(name, getattr(self, name)).replace(**part)
                rest = {k: v for k, v in rest.items() if k not in part}
        if rest:
            raise TypeError(f"{type(self).__name__} has no field(s) {', '.join(rest)}"
                            f"{self._field_of_flag(rest)}")
        return dataclasses.replace(self, **mine)

    @classmethod
    def given(cls, job: str, config, args: tuple, fields: dict, names: tuple) -> "Config":
        """The config a job function `job(config, *args, **fields)` runs: `config` with
        `fields` changed, or one built from positional values named `names` (`config` the
        first) and `fields`. Keywords beside a config, and positional values past `names`,
        had been dropped without a word (max_steps=1 trained the default 3 epochs)."""
        if isinstance(config, cls):
            if args:
                raise TypeError(f"{job}({cls.__name__}, ...): no positional values after the "
                                f"config, got {len(args)} (give fields as keywords)")
            return config.replace(**fields) if fields else config
        values = (config,) + tuple(args)
        if len(values) > len(names):
            raise TypeError(f"{job}() takes at most {len(names)} positional values "
                            f"({', '.join(names)}), got {len(values)}: give the rest as "
                            "keywords")
        return cls.create(**dict(zip(names, values)), **fields)

    @classmethod
    def create(cls, **fields) -> "Config":
        """The defaults with `fields` set; flat names reach the nested configs."""
        own = {f.name for f in dataclasses.fields(cls) if f.init}
        base = cls(**{k: v for k, v in fields.items() if k in own})
        rest = {k: v for k, v in fields.items() if k not in own}
        return base.replace(**rest) if rest else base

    @classmethod
    def flags(cls) -> list:
        """(field path, dataclasses.Field, flag name) of every flag of this job."""
        out = []
        for f in dataclasses.fields(cls):
            if f.name in cls.nested:
                inner = f.default_factory()
                offered = cls.nested[f.name]
                if offered is None:
                    out += [((f.name,) + path, g, flag) for path, g, flag in inner.flags()]
                    continue
                fields = {g.name: g for g in dataclasses.fields(inner)}
                out += [((f.name, name), fields[name], _flag(fields[name], renamed))
                        for name, renamed in offered.items()]
            elif f.metadata.get("help") and f.init:
                out.append(((f.name,), f, _flag(f)))
        return out

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "Config":
        """The config of parsed flags (validated on construction); flags the command
        does not offer keep their defaults. Where the parse recorded which flags were
        given (`args._given`, by nanobert.cli), each config keeps the names of its fields
        given (`given_fields`), and `check_given` runs on them."""
        flat = {path[-1]: getattr(args, _dest(flag)) for path, _, flag in cls.flags()
                if hasattr(args, _dest(flag))}
        cfg = cls.create(**flat)
        given = getattr(args, "_given", None)
        if given is not None:
            paths = [path for path, _, flag in cls.flags() if _dest(flag) in given]
            object.__setattr__(cfg, "_given_fields", {p[0] for p in paths if len(p) == 1})
            for name in cls.nested:
                object.__setattr__(getattr(cfg, name), "_given_fields",
                                   {p[1] for p in paths if len(p) == 2 and p[0] == name})
            cfg.check_given()
        return cfg

    def given_fields(self) -> set:
        """The fields given: the flags on the command line when this config came from
        one (`from_args`), else the fields that differ from their defaults."""
        given = getattr(self, "_given_fields", None)
        if given is not None:
            return set(given)
        return {f.name for f in dataclasses.fields(self)
                if f.default is not dataclasses.MISSING and getattr(self, f.name) != f.default}

    def check_given(self):
        """Checks of which fields were given, run again once the command line's flags
        are known (a flag given at its default value); none here."""


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def add_flags(parser: argparse.ArgumentParser, cls, skip=(), helps=None, ranges=None,
              **defaults):
    """One flag per field of `cls.flags()` (but those in `skip`): help, type, default,
    choices and the allowed range from the field's metadata. `defaults` replaces a
    field's default for this command (the masking ablation runs 1,000 steps), `helps`
    its help (a default that differs: pretraining evaluates a tenth of its steps),
    `ranges` its range (the ablation needs a validation split: its --val-fraction > 0)."""
    sample = _default_instance(cls)
    for path, f, flag in cls.flags():
        if path[-1] in skip:
            continue
        default = defaults.get(path[-1], _get(sample, path))
        kind, meta = _kind(f), dict(f.metadata)
        if path[-1] in (ranges or {}):
            meta["range"] = ranges[path[-1]]
        kw = dict(meta.get("argparse") or {})
        kw["help"] = (helps or {}).get(path[-1]) or meta.get("help") or None
        if meta.get("range") is not None:
            kw["help"] += f" [{meta['range'].describe(kind)}]"
        kw["dest"] = _dest(flag)
        if kind is bool and default and kw["help"]:   # --no-X turns off what X does
            kw["help"] = f"turn off (on by default): {kw['help']}"
        if kind is bool:
            parser.add_argument(flag if not default else _negated(flag), default=default,
                                action="store_false" if default else "store_true", **kw)
            continue
        if meta.get("choices"):
            kw["choices"] = meta["choices"]
        if kind in (int, float):
            kw["type"] = checked(kind, meta.get("range"), flag)
        if default is _REQUIRED or meta.get("required"):
            kw["required"] = True
        else:
            kw["default"] = default
        parser.add_argument(flag, **kw)


def as_flags(cfg: Config) -> dict:
    """{flag dest: value} of a config: what the command line would have said."""
    return {_dest(flag): _get(cfg, path) for path, _, flag in cfg.flags()}


def default_flags(cfg: Config) -> dict:
    """{flag dest: default value} of a config's flags (those with a default), as
    `as_flags` names them: what a command line that leaves a flag out means."""
    sample = _default_instance(type(cfg))
    out = {_dest(flag): _get(sample, path) for path, _, flag in cfg.flags()}
    return {k: v for k, v in out.items() if v is not _REQUIRED}


def _negated(flag: str) -> str:
    return "--no-" + flag[2:]


_REQUIRED = object()


def _default_instance(cls):
    """Field values of `cls` with its defaults; required fields hold `_REQUIRED`."""
    kw = {f.name: _REQUIRED for f in dataclasses.fields(cls)
          if f.init and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    obj = object.__new__(cls)  # no __post_init__: the placeholders are not valid values
    for f in dataclasses.fields(cls):
        if f.name in kw:
            value: Any = kw[f.name]
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
        else:
            value = f.default
        object.__setattr__(obj, f.name, value)
    return obj


def _get(obj, path):
    for name in path:
        obj = getattr(obj, name)
    return obj
