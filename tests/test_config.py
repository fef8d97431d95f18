"""Configs and the flags generated from them: one description, three uses (flags,
config back from flags, validation), and one-line errors with exit status 2."""
import json

import pytest

from nanobert.cli import build_parser, main
from nanobert.config import OneLineParser, add_flags, as_flags
from nanobert.distill import DistillConfig
from nanobert.files import NanobertError
from nanobert.finetune import TASKS, FinetuneConfig
from nanobert.pretrain import PretrainConfig

FT = ["finetune", "--task", "ner", "--model", "m", "--train", "t", "--dev", "d", "--out", "o"]


def parse(argv):
    return build_parser().parse_args(argv)


def test_flags_round_trip_into_the_config():
    classify = [("classify" if a == "ner" else a) for a in FT]   # (column flags: tables)
    cfg = FinetuneConfig.from_args(parse(classify + ["--lr", "1e-4", "--text-pair-column", "b",
                                                     "--no-progress", "--early-stopping", "3"]))
    assert (cfg.task, cfg.model, cfg.train, cfg.dev) == ("classify", "m", "t", "d")
    assert cfg.trainer.lr == 1e-4 and cfg.trainer.out_dir == "o" and cfg.trainer.epochs == 3
    assert cfg.trainer.early_stopping == 3 and cfg.trainer.progress is False
    assert cfg.columns.given() == {"pair_column": "b"}
    assert as_flags(cfg)["lr"] == 1e-4 and as_flags(cfg)["out"] == "o"


def test_job_defaults_differ_where_the_jobs_do():
    pre = PretrainConfig.from_args(parse(["pretrain", "--corpus", "c", "--out", "o"]))
    assert pre.trainer.max_steps == 10000 and pre.trainer.lr == 1e-3 and pre.trainer.seed == 0
    ab = PretrainConfig.from_args(parse(["ablate-masking", "--corpus", "c", "--out", "o"]))
    assert ab.trainer.max_steps == 1000
    dis = DistillConfig.from_args(parse(["distill", "--teacher", "t", "--corpus", "c",
                                         "--out", "o", "--no-init"]))
    assert dis.trainer.max_steps == 2000 and dis.init is False and dis.preset is None


def test_replace_reaches_nested_fields_and_keeps_the_original():
    cfg = FinetuneConfig(task="qa", model="m", train="t", dev="d")
    new = cfg.replace(lr=3e-5, seed=7, doc_stride=64)
    assert new.trainer.lr == 3e-5 and new.trainer.seed == 7 and new.doc_stride == 64
    assert cfg.trainer.lr == 5e-5 and cfg.trainer.seed == 42
    # (a column flag reaches its nested config too, on a task that reads columns)
    assert cfg.replace(task="classify", text_column="q").columns.text_column == "q"
    with pytest.raises(TypeError, match="no field"):
        cfg.replace(learning_rate=1)
    with pytest.raises(NanobertError, match="--doc-stride: got 0"):
        cfg.replace(doc_stride=0)


def test_job_functions_take_keywords_beside_a_config_and_refuse_extra_values(monkeypatch):
    """finetune(cfg, max_steps=1, lr=1e-3) trained the config's own 3 epochs at its lr, and
    a sixth positional value (or gpt2.compare's n=5 beside a config) was dropped too."""
    import importlib
    F = importlib.import_module("nanobert.finetune")
    G = importlib.import_module("nanobert.gpt2")

    class Ran(Exception):
        pass

    def caught(cfg):     # (the run stops at its first check of the config it runs)
        raise Ran(cfg)
    monkeypatch.setattr(F, "check_output_dir", lambda out: None)
    monkeypatch.setattr(F, "_check_beir_flags", caught)
    cfg = FinetuneConfig.create(task="classify", model="m", train="t", dev="d", out_dir="o")
    with pytest.raises(Ran) as ran:
        F.finetune(cfg, max_steps=1, lr=1e-3)
    assert ran.value.args[0].trainer.max_steps == 1 and ran.value.args[0].trainer.lr == 1e-3
    with pytest.raises(TypeError, match="no field"):
        F.finetune(cfg, this_is_not_a_field=1)
    with pytest.raises(TypeError, match=r"finetune\(FinetuneConfig, ...\): no positional"):
        F.finetune(cfg, "x")
    with pytest.raises(TypeError, match=r"at most 5 positional values \(task, model, train, "
                                        r"dev, out_dir\), got 6"):
        F.finetune("classify", "m", "t", "d", "o", 5)
    c = G.CompareConfig.given("compare", G.CompareConfig.create(bert="b", gpt2="g", data="d"),
                              (), {"n": 5}, ("bert", "gpt2", "data"))
    assert c.n == 5
    with pytest.raises(TypeError, match=r"compare\(bert=...\) takes a loaded \(model, "
                                        r"tokenizer\) pair; a directory is the config's 'bert'"):
        G.compare(c, bert="runs/x")                 # (it was an AttributeError inside)


def test_a_flags_name_taken_for_a_field_names_the_field():
    """`cfg.replace(teacher=[...])`, `PretrainConfig(config=...)`: 'no field teacher', and
    the docs say each flag is a field; the error names the field the flag sets."""
    cfg = FinetuneConfig(task="classify", model="m", train="t", dev="d")
    with pytest.raises(TypeError) as e:
        cfg.replace(teacher=["x"], text_pair_column="b")
    assert str(e.value) == ("FinetuneConfig has no field(s) teacher, text_pair_column (the "
                            "flag --teacher is the field teachers; --text-pair-column is the "
                            "field pair_column)")
    with pytest.raises(TypeError) as e:
        PretrainConfig(corpus=["c.txt"], config="x.json")
    assert str(e.value).endswith("has no field config (the flag --config is the field "
                                 "model_config)")
    with pytest.raises(TypeError) as e:
        cfg.replace(no_such_thing=1)
    assert str(e.value) == "FinetuneConfig has no field(s) no_such_thing"


def test_task_choices_come_from_the_task_table():
    assert set(FinetuneConfig.__dataclass_fields__["task"].metadata["choices"]) == set(TASKS)
    with pytest.raises(NanobertError, match="--task: got 'nope', expected one of classify"):
        FinetuneConfig(task="nope")


@pytest.mark.parametrize("argv,message", [
    (FT + ["--lr", "nan"], "--lr: got nan, expected a finite number > 0"),
    (FT + ["--batch-size", "0"], "--batch-size: got 0, expected an integer >= 1"),
    (FT + ["--max-length", "1"], "--max-length: got 1, expected an integer >= 4"),
    (FT + ["--epochs", "two"], "--epochs: got 'two', expected an integer >= 1"),
    (["pretrain", "--corpus", "c", "--out", "o", "--steps", "-1"],
     "--steps: got -1, expected an integer >= 1"),
    (["pretrain", "--corpus", "c", "--out", "o", "--mask-prob", "1.5"],
     "--mask-prob: got 1.5, expected a finite number > 0 and < 1"),
    # 1 passed the flag, then the masker refused it with a ValueError traceback
    (["pretrain", "--corpus", "c", "--out", "o", "--mask-prob", "1"],
     "--mask-prob: got 1.0, expected a finite number > 0 and < 1"),
    (["pretrain", "--corpus", "c", "--out", "o", "--mask-split", "90/20/0"],
     "--mask-split: got '90/20/0', expected three percentages"),
    # a value that starts with a dash and is no plain number: argparse took it for a flag
    # ("expected one argument")
    (["pretrain", "--corpus", "c", "--out", "o", "--mask-split", "-10/100/10"],
     "--mask-split: got '-10/100/10', expected three percentages"),
    (FT + ["--lr", "-1e-5x"], "--lr: got '-1e-5x', expected a finite number > 0"),
    # the head learns at lr x scale: 1e30 saved weights of 5e25, exit 0
    # the ablation's --help said ">= 0" (pretrain's range), then refused 0
    (["ablate-masking", "--corpus", "c", "--out", "o", "--val-fraction", "0"],
     "--val-fraction: got 0.0, expected a finite number > 0 and < 1"),
    (FT + ["--head-lr-scale", "1e30"], "--head-lr-scale: got 1e+30, but the head would learn "
                                       "at --lr x --head-lr-scale = 5e+25, past 1"),
    (FT + ["--lr", "--epochs", "2"], "--lr: expected one argument"),
    (["fill-mask", "--model", "m", "-k", "-3", "a [MASK]"],
     "--top-k: got -3, expected an integer >= 1"),
    (["tsne", "--model", "m", "--data", "d", "--out", "o.png", "--perplexity", "0"],
     "--perplexity: got 0.0, expected a finite number > 0"),
    # a seed past 2**32 - 1 was a traceback from torch.manual_seed mid-run
    (["pretrain", "--corpus", "c", "--out", "o", "--seed", "99999999999999999999"],
     "--seed: got 99999999999999999999, expected an integer >= 0 and <= 4294967295"),
    (FT + ["--seed", "4294967296"], "--seed: got 4294967296, expected an integer >= 0"),
    (["demo", "--seed", "-1"], "--seed: got -1, expected an integer >= 0 and <= 4294967295"),
    # Python's int() reads '1_0' and full-width digits: a number as people write it only
    (["embed", "--input", "x", "--out", "y.npy", "--batch-size", "1_0"],
     "--batch-size: got '1_0', expected an integer >= 1"),
    (["search", "--corpus", "x", "--query", "q", "-k", "\uff11"], "--top-k: got '\uff11', expected"),
    # --vocab-size is for a vocabulary pretrain trains: with --tokenizer it was dropped
    (["pretrain", "--corpus", "c", "--out", "o", "--steps", "2", "--tokenizer", "t",
      "--vocab-size", "100"], "--vocab-size 100: the size of a vocabulary to train, but"),
    # ... also at its default value (8000), as --preset tiny beside --config
    (["pretrain", "--corpus", "c", "--out", "o", "--steps", "2", "--tokenizer", "t",
      "--vocab-size", "8000"], "--vocab-size 8000: the size of a vocabulary to train, but"),
])
def test_bad_values_give_one_line_and_status_2(argv, message, capsys):
    try:                       # while parsing (argparse exits) or building the config
        rc = main(argv)
    except SystemExit as e:
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith(f"nanobert: error: {message}") and err.count("\n") == 1


def test_help_shows_the_allowed_range(capsys):
    with pytest.raises(SystemExit):
        main(["finetune", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "peak learning rate [a finite number > 0 and <= 1]" in out
    # each command's own default, not a list of the others' (docs3); no '(default: [])'
    assert "steps between evaluations (default: each epoch) [" in out
    assert "(default: [])" not in out and "--max-train-examples subset" in out
    with pytest.raises(SystemExit):
        main(["pretrain", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "steps between evaluations (default: a tenth of --steps) [" in out
    assert "subset" not in out
    # flags added by hand show the range they enforce too (docs3: embed's --max-length 2
    # was refused with '>= 4', which no --help said)
    for command in ("embed", "serve", "fill-mask"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        out = " ".join(capsys.readouterr().out.split())
        assert {"embed": "[an integer >= 4", "serve": "[an integer >= 0 and <= 65535]",
                "fill-mask": "[an integer >= 1]"}[command] in out


def test_every_command_has_a_whole_summary_line():
    """finetune's line in `nanobert --help` ended at a semicolon (its docstring's first
    line): each command's summary is a whole sentence."""
    import argparse
    from nanobert.cli import build_parser
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    helps = {a.dest: a.help for a in sub._choices_actions}
    assert len(helps) >= 15 and "finetune" in helps
    assert [c for c, h in helps.items() if not h.endswith((".", ")"))] == []


def test_add_flags_skip_and_defaults():
    p = OneLineParser(prog="x")
    add_flags(p, PretrainConfig, skip=("mask_split",), max_steps=7)
    args = p.parse_args(["--corpus", "a", "b", "--out", "o"])
    assert args.steps == 7 and args.corpus == ["a", "b"] and not hasattr(args, "mask_split")


def test_a_flag_of_several_paths_takes_a_name_that_starts_with_a_dash():
    """--corpus -dash.txt said "--corpus: expected at least one argument" where a flag of
    one path (--input -dash.txt) took the name."""
    args = parse(["pretrain", "--corpus", "-dash.txt", "b.txt", "-c.txt", "--out", "o"])
    assert args.corpus == ["./-dash.txt", "b.txt", "./-c.txt"] and args.out == "o"
    assert parse(["distill", "--corpus", "a", "--teacher", "-t", "--out", "o"]).teacher == "-t"
    assert parse(FT + ["--teacher", "-t1", "t2"]).teacher == ["./-t1", "t2"]
    with pytest.raises(SystemExit):     # a flag after the paths is still a flag
        parse(["pretrain", "--corpus", "a", "--steps", "x", "--out", "o"])


def test_python_callers_get_the_same_checks_for_wrong_types():
    with pytest.raises(NanobertError, match=r"--batch-size: got 2\.5, expected an integer >= 1"):
        FinetuneConfig(task="ner", batch_size=2.5)
    with pytest.raises(NanobertError, match=r"--lr: got '1e-4', expected a finite number > 0"):
        FinetuneConfig(task="ner").replace(lr="1e-4")


@pytest.mark.parametrize("argv, flag", [
    (["predict", "--model", "m", "caf\udce9"], "texts"),
    (["predict", "--model", "m", "who", "--context", "Bob \udcff did"], "--context"),
    (["search", "--corpus", "c.txt", "--query", "\udcff"], "--query"),
    (["fill-mask", "--model", "m", "[MASK] \udcff"], "text"),
    (["attention", "--model", "m", "--text", "\udcff", "--out", "a.png"], "--text"),
    (["compare-gpt2", "--bert", "b", "--gpt2", "g", "--data", "d", "--template", " \udcff {}"],
     "--template"),
])
def test_text_that_is_not_utf8_is_refused_by_its_flag(argv, flag, capsys):
    """Bytes that are not UTF-8 on the command line (a Latin-1 shell) reach Python as
    lone surrogates: a free-text argument refuses them by name, before any work (they
    were tracebacks from the tokenizer, or a misleading message about QA windows)."""
    with pytest.raises(SystemExit) as e:     # argparse exits
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"nanobert: error: {flag}: not valid UTF-8 (byte 0x") and "\n" not in err


def test_paths_may_hold_bytes_that_are_not_utf8_and_text_flags_exist(tmp_path, capsys):
    import argparse
    from nanobert.cli import TEXT_ARGS
    name = tmp_path / "caf\udce9.tsv"          # a Latin-1 file name: a path, not text
    assert main(["embed", "--model", str(tmp_path / "none\udcff"), "--input", str(name),
                 "--out", str(tmp_path / "o.npy")]) == 2
    assert "UTF-8" not in capsys.readouterr().err
    dests = {a.dest for p in build_parser()._subparsers._group_actions[0].choices.values()
             for a in p._actions if isinstance(a, (argparse._StoreAction, argparse._AppendAction))}
    assert TEXT_ARGS <= dests                  # every name in the table is a real argument


def test_numpy_numbers_are_taken_and_runaway_temperatures_refused():
    """A sweep over np.arange gave np.int64(8): '--batch-size: got np.int64(8), expected
    an integer >= 1'. A temperature of 1e-45 (or a scale or weight decay of 1e20) passed
    and made the first loss NaN, blamed on --lr; run_pretrain(None) was an AttributeError."""
    import numpy as np
    import nanobert
    cfg = nanobert.FinetuneConfig.create(task="classify", model="m", train="a", dev="b",
                                         batch_size=np.int64(8), epochs=np.int64(2),
                                         lr=np.float32(1e-4))
    assert type(cfg.batch_size) is int and type(cfg.trainer.epochs) is int
    assert type(cfg.trainer.lr) is float and json.dumps(cfg.trainer.epochs) == "2"
    with pytest.raises(NanobertError, match=r"--batch-size: got 8.5, expected an integer"):
        nanobert.FinetuneConfig.create(task="classify", model="m", train="a", dev="b",
                                       batch_size=np.float64(8.5))
    assert type(nanobert.preset("tiny", vocab_size=np.int64(100)).vocab_size) is int
    for field, value, flag in [("temperature", 1e-45, "--temperature"), ("scale", 1e20, "--scale"),
                               ("weight_decay", 1e20, "--weight-decay")]:
        with pytest.raises(NanobertError, match=f"^{flag}: got .*, expected a finite number >= "):
            nanobert.FinetuneConfig.create(task="embed", model="m", train="a", dev="b",
                                           **{field: value})
    with pytest.raises(TypeError, match=r"run_pretrain\(cfg\): expected a PretrainConfig"):
        nanobert.run_pretrain(None)


def test_a_job_without_out_dir_says_so_whatever_the_working_directory_holds(tmp_path,
                                                                             monkeypatch):
    """finetune(cfg) without out_dir read the working directory as --out: 'already holds
    the runs of another command' where other runs were."""
    import nanobert
    (tmp_path / "nanobert-run.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(NanobertError, match=r"^--out: an output directory is required"):
        nanobert.finetune(nanobert.FinetuneConfig.create(task="classify", model="m",
                                                         train="a", dev="b"))
    with pytest.raises(NanobertError, match=r"^--out: an output directory is required"):
        nanobert.run_pretrain(nanobert.PretrainConfig.create(corpus="c"))


def test_a_flag_of_several_values_given_twice_is_refused(capsys):
    """`--corpus a.txt --corpus b.txt` and `--teacher A --teacher B` read only the last
    list, and the first paths were never checked; `--teacher A B` is the way."""
    for argv, flag in [(["pretrain", "--corpus", "a.txt", "--corpus", "b.txt", "--steps", "1"],
                        "--corpus"),
                       (["finetune", "--task", "classify", "--model", "minilm", "--train", "t",
                         "--teacher", "x", "--teacher=y"], "--teacher")]:
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2
        assert capsys.readouterr().err == (f"nanobert: error: {flag}: given twice (only the last "
                                           f"would be read); list every value after one {flag}: "
                                           f"{flag} A B\n")


def test_no_abbreviated_flags_and_a_repeated_value_is_noted(capsys):
    """`--corp b.txt` beside `--corpus a.txt` (argparse's abbreviation) slipped past the
    check above: only b.txt was read. A flag of one value given twice keeps the last
    (a command line that adds to another), now said once."""
    with pytest.raises(SystemExit) as e:
        main(["pretrain", "--corpus", "a.txt", "--corp", "b.txt", "--out", "o"])
    assert e.value.code == 2
    assert "unrecognized arguments: --corp b.txt" in capsys.readouterr().err
    from nanobert.cli import build_parser
    from nanobert.config import given_dests
    argv = ["embed", "--input", "a", "--out", "b.npy", "--batch-size", "4", "--batch-size=8"]
    args = build_parser().parse_args(argv)
    given_dests(build_parser(), argv)
    assert args.batch_size == 8
    assert capsys.readouterr().err == ("nanobert: note: --batch-size given more than once: the "
                                       "last one is used\n")
    assert build_parser().parse_args(["search", "--corpus", "c", "--query", "q", "-k2",
                                      "-k", "1"]).k == 1        # (a short flag's value joined)
    assert "--top-k given more than once" in capsys.readouterr().err


@pytest.mark.parametrize("argv, said", [
    # a misspelt required flag had been refused as the flag missing
    (["pretrain", "--corp", "wiki.txt", "--out", "o"],
     "unrecognized argument --corp (did you mean --corpus?)"),
    (["finetune", "--task", "classify", "--model", "m", "--trian", "t", "--dev", "d", "--out",
      "o"], "unrecognized argument --trian (did you mean --train?)"),
    (["predict", "--model", "m", "--jsn", "hi"],             # (argparse's own words, and ...)
     "unrecognized arguments: --jsn (did you mean --json?)"),
    (["predict", "--model", "m", "--zzzzz", "hi"], "unrecognized arguments: --zzzzz"),
    (["pretrain", "--out", "o"], "the following arguments are required: --corpus"),
])
def test_a_misspelt_flag_is_named_with_the_one_meant(argv, said, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert capsys.readouterr().err == f"nanobert: error: {said}\n"


def test_a_commands_flag_before_the_command_is_named(capsys):
    """`nanobert --threads 2 finetune` said "COMMAND: invalid choice: '2'"."""
    with pytest.raises(SystemExit) as e:
        main(["--threads", "2", "info", "minilm"])
    assert e.value.code == 2
    assert capsys.readouterr().err.startswith("nanobert: error: --threads: not a flag of "
                                              "nanobert itself; a command's flags go after")


def test_the_ablations_val_fraction_help_says_its_own_range(capsys):
    with pytest.raises(SystemExit):
        main(["ablate-masking", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "compared by their validation loss) [a finite number > 0 and < 1]" in shown
    with pytest.raises(SystemExit):
        main(["pretrain", "--help"])
    assert "held out for validation [a finite number >= 0 and < 1]" in " ".join(
        capsys.readouterr().out.split())
