"""The life cycle of an output directory (issue 11, class 1): unfinished runs are marked
and refused, another run's directory is not silently reused, --resume continues only
the same run, temporaries are cleaned; and output paths fail before any work (class 4)."""
from __future__ import annotations

import json
import os

import pytest

from nanobert.files import NanobertError, check_output_dir, check_output_file
from nanobert.rundir import (RUN_FILE, clean_temporaries, differences, fingerprint, read_run,
                             require_finished, run)


@pytest.fixture
def data(tmp_path):
    p = tmp_path / "train.tsv"
    p.write_text("sentence\tlabel\na\t1\nb\t0\n")
    return p


def fp(data, **flags):
    return fingerprint("classify", [data], dict(dict(lr=1e-3, seed=1, out="x"), **flags))


def test_a_run_is_unfinished_until_it_ends(tmp_path, data):
    out = tmp_path / "out"
    with run(out, "finetune", fp(data)):
        (out / "config.json").write_text("{}")
        assert read_run(out)["status"] == "running"
        with pytest.raises(NanobertError, match="the finetune run writing this directory did not "
                                                "finish; continue it with the same command and --resume"):
            require_finished(out)
    assert read_run(out)["status"] == "finished"
    require_finished(out)
    require_finished(tmp_path)  # no run file: a model from elsewhere


def test_an_exception_leaves_the_run_unfinished(tmp_path, data):
    out = tmp_path / "out"
    with pytest.raises(RuntimeError):
        with run(out, "pretrain", fp(data)):
            raise RuntimeError("killed")
    with pytest.raises(NanobertError, match="pretrain run"):
        require_finished(out)


def test_another_runs_directory_needs_overwrite_or_resume(tmp_path, data):
    out = tmp_path / "out"
    with run(out, "finetune", fp(data)):
        (out / "config.json").write_text("{}")
        (out / "cache").mkdir()
        (out / "cache" / "tokens.npz").write_text("kept")
    with pytest.raises(NanobertError) as e:
        with run(out, "finetune", fp(data, lr=5e-3)):
            pass
    assert str(e.value) == (f"--out {out} already holds a model; continue it with --resume, "
                            "start over with --overwrite, or choose another directory")
    assert (out / "config.json").exists()           # nothing touched
    with run(out, "finetune", fp(data, lr=5e-3), overwrite=True):
        assert not (out / "config.json").exists()   # cleared before the run starts
        assert (out / "cache" / "tokens.npz").read_text() == "kept"


def test_resume_checks_the_fingerprint(tmp_path, data):
    out = tmp_path / "out"
    with pytest.raises(RuntimeError):
        with run(out, "finetune", fp(data)):
            raise RuntimeError
    with pytest.raises(NanobertError) as e:
        with run(out, "finetune", fp(data, lr=5e-3, seed=2), resume=True):
            pass
    assert str(e.value) == (f"--resume: {out} holds another run (--lr 0.001 there, 0.005 now; "
                            "--seed 1 there, 2 now); resume with the same data and flags, or "
                            "start over with --overwrite")
    data.write_text(data.read_text() + "c\t1\n")
    with pytest.raises(NanobertError, match="data file 1 has other content"):
        with run(out, "finetune", fp(data), resume=True):
            pass
    data.write_text("sentence\tlabel\na\t1\nb\t0\n")
    with run(out, "finetune", fp(data, out="elsewhere"), resume=True):  # --out is not the run
        pass
    with pytest.raises(NanobertError, match="contradict"):
        with run(out, "finetune", fp(data), resume=True, overwrite=True):
            pass


def test_fingerprint_is_content_not_path(tmp_path, data):
    moved = tmp_path / "moved.tsv"
    moved.write_bytes(data.read_bytes())
    assert fp(data) == fp(moved)
    assert differences(fp(data), fingerprint("ner", [data, data], {"lr": 1})) == [
        "task classify there, ner now", "1 data file(s) there, 2 now", "--lr 0.001 there, 1 now"]


def test_stale_temporaries_are_cleaned_and_a_torn_swap_is_undone(tmp_path, data):
    out = tmp_path / "out"
    out.mkdir()
    for name in (".checkpoint.ab12cd34", ".save.xyz", ".model.safetensors.k2j3h4g5", ".old-run.77"):
        (out / name).mkdir()
    (out / ".checkpoint.old4242").mkdir()               # killed between the two renames
    (out / ".checkpoint.old4242" / "state.json").write_text('{"step": 4}')
    (out / ".gitignore").write_text("kept")
    clean_temporaries(out)
    assert sorted(p.name for p in out.iterdir()) == [".gitignore", "checkpoint"]
    assert json.loads((out / "checkpoint" / "state.json").read_text()) == {"step": 4}


def test_one_run_per_directory_at_a_time(tmp_path, data):
    out = tmp_path / "out"
    with run(out, "finetune", fp(data)):
        with pytest.raises(NanobertError, match="being written by another nanobert process"):
            with run(out, "finetune", fp(data), resume=True):
                pass


def test_a_torn_run_file_counts_as_unfinished(tmp_path):
    (tmp_path / RUN_FILE).write_text('{"status": "runn')
    with pytest.raises(NanobertError, match="did not finish"):
        require_finished(tmp_path)


# ---- output paths (class 4) -------------------------------------------------------------

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
