"""Output paths fail before any work, in one line naming the flag (issue 11, class 4):
an --out whose parent is a file, that is a file where a directory is needed (or the
reverse), on a read-only or virtual file system, or with an image type nothing saves."""
from __future__ import annotations

import os

import pytest

from nanobert.cli import main
from nanobert.files import NanobertError, check_output_dir, check_output_file


def test_output_directories_fail_before_any_work(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    cases = {f: f"--out {f}: is a file; a directory is needed here",
             f / "sub": f"--out {f / 'sub'}: {f} is a file, not a directory",
             "/proc/nanobert-out": "--out /proc/nanobert-out: /proc is a virtual file system; "
                                   "choose a directory on disk"}
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




def refused(capsys, argv) -> str:
    assert main(argv) == 2
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


def test_an_output_that_is_an_input_is_refused(tmp_path, capsys):
    """embed --out equal to --input overwrote the input; --overwrite into the model
    directory, or into the folder holding the training file, deleted it, then failed."""
    text = tmp_path / "in.txt"
    text.write_text("good\nbad\n")
    assert refused(capsys, ["embed", "--model", "minilm", "--input", str(text), "--out",
                            str(tmp_path / "." / "in.txt")]).startswith(
        f"--out {tmp_path / 'in.txt'}: is the input {text}; writing it would destroy it")
    assert text.read_text() == "good\nbad\n"
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    train = model / "train.tsv"
    train.write_text("sentence\tlabel\na\t1\nb\t0\n")
    ft = ["finetune", "--task", "classify", "--dev", str(train), "--overwrite"]
    assert refused(capsys, ft + ["--model", str(model), "--train", str(train), "--out",
                                 str(model)]).startswith(f"--out {model}: is the input {model}")
    assert refused(capsys, ft + ["--model", "minilm", "--train", str(train), "--out",
                                 str(model)]).startswith(
        f"--out {model}: holds the input {train}, which clearing it would delete")
    assert sorted(p.name for p in model.iterdir()) == ["config.json", "train.tsv"]
    assert refused(capsys, ["pretrain", "--corpus", str(train), "--out", str(model),
                            "--overwrite"]).startswith(f"--out {model}: holds the input {train}")
    assert (model / "config.json").exists()
