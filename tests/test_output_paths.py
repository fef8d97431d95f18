"""Output paths fail before any work, in one line naming the flag (issue 11, class 4):
an --out whose parent is a file, that is a file where a directory is needed (or the
reverse), on a read-only or virtual file system, or with an image type nothing saves."""
from __future__ import annotations

import errno
import json
import os
import time
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

import nanobert
from nanobert.cli import main
from nanobert.files import (NanobertError, atomic_path, check_not_input, check_output_dir,
                            check_output_file, write_text)
from nanobert.rundir import RUN_FILE, fingerprint, read_run, run


def test_output_directories_fail_before_any_work(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    cases = {f: f"--out {f}: is a file; a directory is needed here",
             f / "sub": f"--out {f / 'sub'}: {f} is a file, not a directory",
             "/proc/nanobert-out": "--out /proc/nanobert-out: /proc is a virtual file system; "
                                   "choose a directory on disk",
             "/proc": "--out /proc: /proc is a virtual file system; choose a directory on disk"}
    for path, msg in cases.items():
        with pytest.raises(NanobertError) as e:
            check_output_dir(path)
        assert str(e.value) == msg
    check_output_dir(tmp_path / "new" / "deeper")
    assert not (tmp_path / "new").exists()           # checking creates nothing


def test_a_read_only_directory_is_refused(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        if os.geteuid() == 0:  # root writes anyway: the probe then rightly succeeds
            check_output_dir(ro / "out")
        else:
            with pytest.raises(NanobertError, match=f"cannot write in {ro}"):
                check_output_dir(ro / "out")
    finally:
        ro.chmod(0o755)


def test_output_files_and_image_formats(tmp_path):
    images = (".png", ".pdf", ".svg")
    with pytest.raises(NanobertError) as e:
        check_output_file(tmp_path / "plot.bmp", "--out", images)
    assert str(e.value) == (f"--out {tmp_path / 'plot.bmp'}: unsupported file type '.bmp' "
                            "(choose one of .png, .pdf, .svg)")
    with pytest.raises(NanobertError, match="is a directory; a file name is needed"):
        check_output_file(tmp_path, "--out")
    check_output_file(tmp_path / "a" / "plot.PNG", "--out", images)


def test_a_link_to_a_device_or_a_pipe_is_never_written_through(tmp_path, capsys):
    """`--out null.npy` with null.npy a link to /dev/null renamed a new .npy over
    /dev/null: the machine's /dev/null became a file (the /dev check read the link's own
    path). A rename never replaces a device, a pipe or a socket, whatever names it."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    (tmp_path / "to_pipe.png").symlink_to(fifo)
    (tmp_path / "to_null.npy").symlink_to("/dev/null")
    for name, said in (("to_pipe.png", f"{fifo} is a named pipe, not a file"),
                       ("to_null.npy", "/dev/null is on a virtual file system")):
        with pytest.raises(NanobertError, match=said):
            check_output_file(tmp_path / name, "--out")
        with pytest.raises(NanobertError, match=said):
            with atomic_path(tmp_path / name) as tmp:
                tmp.write_text("x")
    assert fifo.is_fifo() and Path("/dev/null").is_char_device()
    texts = tmp_path / "t.txt"
    texts.write_text("a line\n")
    assert refused(capsys, ["embed", "--model", "minilm", "--input", str(texts), "--out",
                            str(tmp_path / "to_null.npy")]).startswith(f"--out {tmp_path}")
    real = tmp_path / "real.npy"                       # a link to a file is written through
    (tmp_path / "to_file.npy").symlink_to(real)
    with atomic_path(tmp_path / "to_file.npy") as tmp:
        tmp.write_text("x")
    assert real.read_text() == "x" and (tmp_path / "to_file.npy").is_symlink()


WRITER = """
import os, sys
import nanobert.files as F
if sys.argv[2] == "moved":                  # the way of systems without renameat2
    F._exchanged = lambda a, b: False
for i in range(60):
    with F.atomic_path(sys.argv[1]) as tmp:
        tmp.mkdir()
        for name in ("config.json", "model.safetensors"):
            (tmp / name).write_text(f"{os.getpid()} {i}")
"""


@pytest.mark.parametrize("how", ["exchanged", "moved"])
def test_folders_written_by_several_processes_at_once(tmp_path, how):
    """Two exports to one folder: between moving the old aside and renaming the new in,
    another writer's rename came, and one ended in 'Directory not empty' (a traceback),
    leaving the old folder beside it; a reader could find no folder at all. Now the last writer's folder stays,
    whole, and nothing is left beside it; where the system exchanges two folders in one
    step, the folder is never missing."""
    import subprocess
    import sys
    target = tmp_path / "export"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    with atomic_path(target) as tmp:
        tmp.mkdir()
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(target), how], env=env,
                                stderr=subprocess.PIPE, text=True) for _ in range(3)]
    gone = 0
    while any(w.poll() is None for w in writers):
        gone += not target.is_dir()
    assert [w.wait() for w in writers] == [0, 0, 0], [w.stderr.read() for w in writers]
    assert os.listdir(tmp_path) == ["export"] and len(set(
        (target / n).read_text() for n in ("config.json", "model.safetensors"))) == 1
    if how == "exchanged":            # (a reader never finds the folder missing)
        assert gone == 0


def test_a_ctrl_c_between_the_two_renames_keeps_the_old_folder(tmp_path, monkeypatch):
    """Without a one-step exchange (macOS, NFS), a folder is moved aside before the new
    one is renamed in; a Ctrl-C (or another failure) between the two deleted the old one
    and left nothing in its place."""
    import nanobert.files as F
    target = tmp_path / "model"
    with atomic_path(target) as tmp:
        tmp.mkdir()
        (tmp / "weights").write_text("old")
    monkeypatch.setattr(F, "_exchanged", lambda a, b: False)
    real, calls = os.replace, []

    def interrupted_second(a, b):
        calls.append(b)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(a, b)
    monkeypatch.setattr(os, "replace", interrupted_second)
    with pytest.raises(KeyboardInterrupt):
        with atomic_path(target) as tmp:
            tmp.mkdir()
            (tmp / "weights").write_text("new")
    monkeypatch.setattr(os, "replace", real)
    assert (target / "weights").read_text() == "old" and os.listdir(tmp_path) == ["model"]


def refused(capsys, argv) -> str:
    try:                       # while parsing (argparse exits) or while running
        rc = main(argv)
    except SystemExit as e:
        rc = e.code
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    return err.removeprefix("nanobert: error: ")


def test_commands_check_their_output_before_anything_else(tmp_path, capsys):
    """The model and data named here do not exist: the --out error comes first, so
    nothing was loaded, trained or written."""
    f = tmp_path / "file"
    f.write_text("x")
    missing = str(tmp_path / "no-model")
    cases = [
        (["tsne", "--model", missing, "--data", missing, "--out", str(tmp_path / "p.bmp")],
         f"--out {tmp_path / 'p.bmp'}: unsupported file type '.bmp'"),
        (["attention", "--model", missing, "--text", "x", "--out", str(f / "a.png")],
         f"--out {f / 'a.png'}: {f} is a file, not a directory"),
        (["embed", "--model", missing, "--input", missing, "--out", str(tmp_path)],
         f"--out {tmp_path}: is a directory; a file name is needed here"),
        (["embed", "--model", missing, "--input", missing, "--out", str(tmp_path / "e.txt")],
         f"--out {tmp_path / 'e.txt'}: unsupported file type '.txt' (choose one of .npy)"),
        (["finetune", "--task", "classify", "--model", missing, "--train", missing, "--dev",
          missing, "--out", str(f)], f"--out {f}: is a file; a directory is needed here"),
        (["pretrain", "--corpus", missing, "--out", "/proc/nanobert-run", "--steps", "2"],
         "--out /proc/nanobert-run: /proc is a virtual file system"),
        (["ablate-masking", "--corpus", missing, "--out", str(f / "abl")],
         f"--out {f / 'abl'}: {f} is a file, not a directory"),
        (["distill", "--teacher", missing, "--corpus", missing, "--out", str(f)],
         f"--out {f}: is a file; a directory is needed here"),
    ]
    before = sorted(tmp_path.rglob("*"))
    for argv, expected in cases:
        assert refused(capsys, argv).startswith(expected), argv[0]
    assert sorted(tmp_path.rglob("*")) == before


def test_paths_the_system_cannot_look_up_are_one_line(tmp_path, capsys):
    """A loop of symbolic links, a name over the system's limit (as input or output),
    an --out that is a dangling link and the file system's root: one line naming the
    path, status 2 (pathlib's RuntimeError / OSError came out as tracebacks, and --out /
    wrote a model into the root)."""
    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    data = tmp_path / "t.tsv"
    data.write_text("sentence\tlabel\ngood\t1\nbad\t0\n")
    long_name = str(tmp_path / ("a" * 300))
    loop = str(tmp_path / "loop1")

    def finetune(train, out):
        return ["finetune", "--task", "classify", "--model", "minilm", "--max-steps", "1",
                "--train", train, "--dev", str(data), "--out", out]
    cases = [(finetune(loop, str(tmp_path / "r")), f"{loop}: cannot be"),
             (finetune(long_name + ".tsv", str(tmp_path / "r")), "File name too long"),
             (finetune(str(data), loop), f"{loop}: cannot be"),
             (finetune(str(data), long_name), "File name too long"),
             (finetune(str(data), str(tmp_path / "dangling")),
              f"--out {tmp_path / 'dangling'}: is a link to {tmp_path / 'nowhere'}, which does "
              "not exist"),
             (finetune(str(data), "/"), "--out /: is the root of the file system")]
    for argv, expected in cases:
        assert expected in refused(capsys, argv), argv
    assert not (tmp_path / "r").exists() and not (tmp_path / "nowhere").exists()


def test_an_output_that_is_an_input_is_refused(tmp_path, capsys):
    """embed --out equal to --input overwrote the input; --overwrite into the model
    directory, or into a folder holding an input among the files it replaces, deleted it,
    then failed. (An input that --overwrite keeps is no reason to refuse: test_rundir.py.)"""
    text = tmp_path / "in.txt"
    text.write_text("good\nbad\n")
    assert refused(capsys, ["embed", "--model", "minilm", "--input", str(text), "--out",
                            str(tmp_path / "." / "in.txt")]).startswith(
        f"--out {tmp_path / 'in.txt'}: is the input {text}; writing it would destroy it")
    assert text.read_text() == "good\nbad\n"
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    train = model / "vocab.txt"     # one of a model's files, which --overwrite replaces
    train.write_text("sentence\tlabel\na\t1\nb\t0\n")
    ft = ["finetune", "--task", "classify", "--dev", str(train), "--overwrite"]
    assert refused(capsys, ft + ["--model", str(model), "--train", str(train), "--out",
                                 str(model)]).startswith(f"--out {model}: is the input {model}")
    assert refused(capsys, ft + ["--model", "minilm", "--train", str(train), "--out",
                                 str(model)]).startswith(
        f"--out {model}: holds the input {train}, which --overwrite would delete")
    assert sorted(p.name for p in model.iterdir()) == ["config.json", "vocab.txt"]
    assert refused(capsys, ["pretrain", "--corpus", str(train), "--out", str(model),
                            "--overwrite"]).startswith(f"--out {model}: holds the input {train}")
    assert (model / "config.json").exists()


def test_a_file_output_that_is_a_directory_holding_the_input_is_a_directory(tmp_path, capsys):
    """embed/tsne/compare-gpt2 --out DIR, DIR holding the input, said 'clearing it would
    delete' the input: none of them clears anything; DIR is no file name, that is all."""
    data = tmp_path / "corpus.txt"
    data.write_text("a good film\t1\n")
    missing = str(tmp_path / "no-model")
    said = f"--out {tmp_path}: is a directory; a file name is needed here"
    with pytest.raises(NanobertError) as e:
        check_output_file(tmp_path, "--out", (".npy",), inputs=[data])
    assert str(e.value) == said
    for argv in (["embed", "--model", missing, "--input", str(data)],
                 ["tsne", "--model", missing, "--data", str(data)],
                 ["compare-gpt2", "--bert", missing, "--gpt2", missing, "--data", str(data)]):
        assert refused(capsys, argv + ["--out", str(tmp_path)]) == said, argv[0]
    with pytest.raises(NanobertError, match="holds the input"):   # a directory output: kept
        check_not_input(tmp_path, [data])


# ---- what --overwrite deletes, what --resume compares, what export replaces --------------


def test_overwrite_keeps_the_files_no_run_wrote(tmp_path):
    """A first run into a folder of the user's files (`--out .`, a notes file) recorded
    nothing about them, and the next --overwrite deleted them all."""
    data = tmp_path / "train.tsv"
    data.write_text("sentence\tlabel\na\t1\nb\t0\n")
    out = tmp_path / "project"
    (out / "src").mkdir(parents=True)
    (out / "notes.txt").write_text("mine")
    fp = fingerprint("classify", [data], {"lr": 1e-3})
    with run(out, "finetune", fp):
        (out / "config.json").write_text("{}")
    assert read_run(out)["foreign"] == ["notes.txt", "src"]
    for lr in (2e-3, 3e-3):                                   # twice: the list is carried on
        with run(out, "finetune", fingerprint("classify", [data], {"lr": lr}), overwrite=True):
            assert not (out / "config.json").exists()        # the run's files: cleared
            (out / "config.json").write_text("{}")
        assert (out / "notes.txt").read_text() == "mine" and (out / "src").is_dir()
    hub = tmp_path / "hub-download"                           # a model no nanobert run wrote
    (hub / "1_Pooling").mkdir(parents=True)
    for name in ("config.json", "pytorch_model.bin", "vocab.txt", "modules.json", "README.md"):
        (hub / name).write_text("x")
    with run(hub, "finetune", fp, overwrite=True):   # (the model held back until the run ends)
        assert sorted(p.name for p in hub.iterdir() if not p.name.startswith(".old-run.")) == [
            ".nanobert-lock", "README.md", RUN_FILE]
        (hub / "config.json").write_text("{}")
    assert sorted(p.name for p in hub.iterdir()) == [".nanobert-lock", "README.md", "config.json",
                                                     RUN_FILE]
    assert read_run(hub)["foreign"] == ["README.md"]


def test_resume_compares_data_by_content_not_by_path_spelling(tmp_path, monkeypatch):
    """--train train.tsv, then --resume with ./train.tsv, an absolute path or from another
    directory was 'holds another run (--train train.tsv there, ./train.tsv now)'."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.tsv").write_text("sentence\tlabel\na\t1\nb\t0\n")
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "config.json").write_text("{}")
    out = tmp_path / "out"

    def fp(train, model, lr=1e-3):
        from nanobert.rundir import model_files
        return fingerprint("classify", [train] + model_files(model),
                           {"train": train, "model": model, "lr": lr})
    with pytest.raises(RuntimeError):
        with run(out, "finetune", fp("train.tsv", "base")):
            (out / "config.json").write_text("{}")          # the best model so far
            raise RuntimeError("killed")
    (tmp_path / "elsewhere").mkdir()
    for train, model in [("./train.tsv", "./base/"), (str(tmp_path / "train.tsv"), "base"),
                         ("../train.tsv", "../base")]:
        if train.startswith(".."):
            monkeypatch.chdir(tmp_path / "elsewhere")
        with run(out, "finetune", fp(train, model), resume=True):
            pass
    with pytest.raises(NanobertError, match=r"--lr 0.001 there, 0.002 now"):
        with run(out, "finetune", fp("../train.tsv", "../base", lr=2e-3), resume=True):
            pass
    # a record written before: paths spelled out there, by content here
    rec = read_run(out)
    rec["fingerprint"]["flags"].update(train="train.tsv", model="base")
    (out / RUN_FILE).write_text(json.dumps(rec))
    with run(out, "finetune", fp("../train.tsv", "../base"), resume=True):
        pass


def test_a_torn_metrics_line_is_dropped_on_resume(tmp_path):
    """A run killed while appending to metrics.jsonl left half a line; --resume then
    stopped with a JSONDecodeError traceback."""
    data = tmp_path / "d.tsv"
    data.write_text("x\n")
    out = tmp_path / "out"
    fp = fingerprint("classify", [data], {"lr": 1})
    with pytest.raises(RuntimeError):
        with run(out, "finetune", fp):
            (out / "config.json").write_text("{}")
            (out / "metrics.jsonl").write_text('{"type": "train", "step": 2}\n{"type": "tr')
            raise RuntimeError("killed")
    with run(out, "finetune", fp, resume=True):
        assert (out / "metrics.jsonl").read_text() == '{"type": "train", "step": 2}\n'


@pytest.fixture(scope="module")
def small_models(tmp_path_factory):
    """Two tiny model directories (one a sentence-transformers layout with [CLS] pooling)."""
    d = tmp_path_factory.mktemp("export")
    tok = nanobert.Tokenizer.train(["the movie was good", "a dull film"] * 3, vocab_size=60,
                                   min_frequency=1)
    torch.manual_seed(0)
    cfg = nanobert.preset("tiny", vocab_size=tok.vocab_size, pad_token_id=tok.pad_id,
                          max_position_embeddings=32, num_hidden_layers=1)
    for name in ("a", "b"):
        nanobert.Bert(cfg).save_pretrained(d / name, tokenizer=tok)
    (d / "b" / "1_Pooling").mkdir()
    (d / "b" / "1_Pooling" / "config.json").write_text('{"pooling_mode_cls_token": true}')
    (d / "b" / "modules.json").write_text(json.dumps(
        [{"type": "sentence_transformers.models.Pooling", "path": "1_Pooling"}]))
    (d / "b" / "sentence_bert_config.json").write_text('{"max_seq_length": 16}')
    return d


def test_export_refuses_an_out_that_holds_something_else(small_models, tmp_path, capsys):
    """export wrote into the model directory itself, over another model or run (leaving a
    mix of two models), or into a folder of other files."""
    a, b = small_models / "a", small_models / "b"
    b_files = sorted(p.name for p in b.iterdir())
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("x")
    for out, why in [(a, f"OUT {a}: is the model being exported"),
                     (b, f"OUT {b} already holds a model and is not an earlier export"),
                     (notes, f"OUT {notes} already holds other files")]:
        assert refused(capsys, ["export", str(a), str(out)]).startswith(why)
    assert sorted(p.name for p in b.iterdir()) == b_files and not (a / "model.onnx").exists()


def test_export_replaces_an_earlier_export_whole_and_keeps_the_pooling(small_models, tmp_path,
                                                                       one_thread):
    """An export dropped 1_Pooling/modules.json/sentence_bert_config.json and nanobert.json
    (a [CLS]-pooling encoder came back mean-pooling), and an export over an earlier int8
    one left that model_quantized.onnx beside the new model.onnx."""
    from nanobert.embed import Encoder
    out = tmp_path / "exported"
    assert main(["export", str(small_models / "a"), str(out), "--dtype", "int8"]) == 0
    assert (out / "model_quantized.onnx").is_file()
    assert main(["export", str(small_models / "b"), str(out)]) == 0
    assert not (out / "model_quantized.onnx").exists()
    for f in ("modules.json", "1_Pooling/config.json", "sentence_bert_config.json"):
        assert (out / f).read_text() == (small_models / "b" / f).read_text()
    enc = Encoder(str(out))
    assert enc.pooling == "cls"
    assert np.allclose(enc.encode(["the movie"]), Encoder(str(small_models / "b")).encode(["the movie"]))
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_bad_device_and_thread_counts_fail_before_work(tmp_path, capsys):
    """--device bogus / cuda without a GPU / meta were torch tracebacks after the data was
    read and the model loaded; --threads 99999999999 an OverflowError (and a few million
    threads would start)."""
    from nanobert.train import TrainConfig
    missing = str(tmp_path / "none")
    ft = ["finetune", "--task", "classify", "--model", missing, "--train", missing, "--dev",
          missing, "--out", str(tmp_path / "out")]
    for device in ("bogus", "cpu:x", "meta", "cuda:99"):
        assert refused(capsys, ft + ["--device", device]).startswith("--device")
        with pytest.raises(NanobertError, match="--device"):
            TrainConfig(device=device)
    if not torch.cuda.is_available():
        assert "no CUDA GPU" in refused(capsys, ft + ["--device", "cuda"])
    TrainConfig(device="cpu")
    assert refused(capsys, ["info", missing, "--threads", "99999999999"]).startswith(
        "--threads: got 99999999999, expected an integer >= 1 and <= 1024")
    assert refused(capsys, ["info", missing, "--threads", "abc"]) == \
        "--threads: got 'abc', expected an integer >= 1 and <= 1024"
    assert not (tmp_path / "out").exists()


def test_selection_and_split_flags(tmp_path, capsys):
    """--layers 1-99999999999 built the whole range (MemoryError); --mask-split nan/50/50
    passed the sum check (then a traceback); --splits '' or ',' trained nothing and failed
    with an IndexError, a split named twice trained it and then refused; a refused
    ablation left its --out behind; --label-names '=x' was found only after t-SNE."""
    from nanobert.inspection import parse_selection
    from nanobert.masking import parse_split
    with pytest.raises(NanobertError, match="got 99999999999, expected 1 to 6"):
        parse_selection("1-99999999999", 6, "layers", [0])
    assert parse_selection("2-3,3", 6, "layers", [0]) == [1, 2]
    for bad in ("nan/50/50", "inf/0/0", "150/-50/0"):
        with pytest.raises(ValueError):
            parse_split(bad)
    corpus = tmp_path / "c.txt"
    corpus.write_text("the movie was good\n" * 50)
    out = tmp_path / "ablation"
    for splits, why in [("", "--splits: got ''"), (",", "--splits: got ','"),
                        ("80/10/10,80.0/10/10", "--splits: 80/10/10 is given twice"),
                        ("nan/50/50", "--splits: got 'nan/50/50'")]:
        assert refused(capsys, ["ablate-masking", "--corpus", str(corpus), "--out", str(out),
                                "--splits", splits, "--steps", "1"]).startswith(why)
    assert refused(capsys, ["ablate-masking", "--corpus", str(tmp_path / "none.txt"), "--out",
                            str(out), "--steps", "1"]).endswith("no such file or directory")
    assert not out.exists()
    data = tmp_path / "d.tsv"
    data.write_text("sentence\tlabel\na\t1\n")
    for names in ("=x", "0=", "0=a,0=b"):
        assert refused(capsys, ["tsne", "--model", str(tmp_path / "none"), "--data", str(data),
                                "--out", str(tmp_path / "t.png"), "--label-names", names]
                       ).startswith("--label-names")


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_atomic_writes_get_the_mode_a_new_file_gets(tmp_path, umask):
    """safetensors writes a temporary file and renames it, as tempfile.mkstemp does, with
    mode 0o600: a model's and a checkpoint's weights were readable by their owner only
    (every other file by all). Every file written atomically gets 0o666 less the umask."""
    from safetensors.torch import save_file

    from nanobert.checkpoint import save_model
    tok = nanobert.Tokenizer.train(["a small text"] * 3, vocab_size=30, min_frequency=1)
    cfg = nanobert.preset("tiny", vocab_size=tok.vocab_size, max_position_embeddings=16,
                          num_hidden_layers=1)
    old = os.umask(umask)
    try:
        with atomic_path(tmp_path / "w.safetensors") as tmp:          # a file
            save_file({"x": torch.zeros(2)}, str(tmp))
        with atomic_path(tmp_path / "checkpoint") as tmp:             # a directory
            tmp.mkdir()
            save_file({"x": torch.zeros(2)}, str(tmp / "optimizer.safetensors"))
            os.close(tempfile.mkstemp(dir=tmp)[0])
        save_model(nanobert.Bert(cfg), tmp_path / "model", tokenizer=tok)
        write_text(tmp_path / "notes.txt", "x")
    finally:
        os.umask(old)
    modes = {str(p.relative_to(tmp_path)): oct(p.stat().st_mode & 0o777)
             for p in tmp_path.rglob("*") if p.is_file()}
    assert "model/model.safetensors" in modes and len(modes) == 10, modes
    assert modes == dict.fromkeys(modes, oct(0o666 & ~umask))


def test_a_ctrl_c_as_the_temporary_is_made_leaves_nothing(tmp_path, monkeypatch):
    """A Ctrl-C (or SIGTERM) between making the hidden temporary and keeping its name left
    the temporary behind (.a.png.nanobert-tmp-...): the signal now waits until the name
    is kept, and the write's cleanup removes it."""
    import signal
    from nanobert.files import atomic_path
    made = os.mkdir

    def interrupted(path, *a, **kw):
        made(path, *a, **kw)
        if "nanobert-tmp" in os.path.basename(path):
            os.kill(os.getpid(), signal.SIGINT)  # lands right after the folder exists
            time.sleep(0.5)
    monkeypatch.setattr(os, "mkdir", interrupted)
    with pytest.raises(KeyboardInterrupt):
        with atomic_path(tmp_path / "a.png") as tmp:
            tmp.write_text("never")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_failed_atomic_write_leaves_nothing(tmp_path):
    """A write the disk refused left the folders made for the file (export OUT a/b/c on
    a full disk left a/b)."""
    for target in (tmp_path / "a" / "b" / "e.npy", tmp_path / "c" / "export"):
        with pytest.raises(OSError):
            with atomic_path(target) as tmp:
                tmp.write_bytes(b"half")
                raise OSError(errno.ENOSPC, "No space left on device")
    assert not list(tmp_path.iterdir())
    with atomic_path(tmp_path / "a" / "b" / "e.npy") as tmp:
        tmp.write_bytes(b"whole")
    assert (tmp_path / "a" / "b" / "e.npy").read_bytes() == b"whole"


def test_a_write_clears_what_a_killed_write_of_the_same_target_left(tmp_path):
    """A SIGKILLed `export` left its 150 MB temporary beside the target for good."""
    import subprocess
    import sys
    from nanobert.files import write_text
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    dead, live = p.pid, os.getpid()
    stale = tmp_path / f".out.nanobert-tmp-{dead}-abcd1234"
    stale.mkdir()
    (stale / "t").write_text("half an export")
    busy = tmp_path / f".out.nanobert-tmp-{live}-efgh5678"       # a live writer's own
    busy.mkdir()
    other = tmp_path / f".other.nanobert-tmp-{dead}-ijkl9012"     # another target's
    other.mkdir()
    write_text(tmp_path / "out", "whole")
    assert (tmp_path / "out").read_text() == "whole"
    assert not stale.exists() and busy.exists() and other.exists()


def test_an_output_directory_not_in_utf8_is_refused_before_work(tmp_path, capsys):
    """A Latin-1 --out trained and saved, then could be neither resumed (a safetensors
    traceback) nor loaded ('corrupted or truncated checkpoint' of an intact file)."""
    import os
    from nanobert.cli import main
    out = os.fsdecode(os.fsencode(str(tmp_path)) + b"/lat\xe9n")
    assert main(["pretrain", "--corpus", str(tmp_path / "c.txt"), "--out", out,
                 "--steps", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a UTF-8 path" in err and not os.path.exists(out)
