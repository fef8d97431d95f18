"""Command-line inputs given two ways at once: `predict` with --input FILE and TEXT
arguments read the file and dropped the texts without a word."""
from __future__ import annotations

import pytest

from nanobert.cli import main


@pytest.mark.parametrize("order", ["texts last", "texts first"])
def test_predict_refuses_input_file_and_texts_together(tmp_path, capsys, order):
    """Refused before the model loads: the one named here does not exist."""
    data = tmp_path / "in.txt"
    data.write_text("good movie\nbad movie\n")
    model = ["--model", str(tmp_path / "none")]
    argv = (["--input", str(data), "extra"] if order == "texts last"
            else ["extra", "--input", str(data)])
    assert main(["predict", *model, *argv]) == 2
    err = capsys.readouterr().err
    assert err == (f"nanobert: error: --input {data} and TEXT arguments (1 given) both name "
                   "inputs: give the texts on the command line or in the file, not both\n")


def test_predict_refuses_context_with_an_input_file(tmp_path, capsys):
    """--context pairs the command line's texts; with --input it was dropped too."""
    data = tmp_path / "in.txt"
    data.write_text("who lives here\n")
    assert main(["predict", "--model", str(tmp_path / "none"), "--input", str(data),
                 "--context", "Alice lives here"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("nanobert: error: --context") and "--input" in err
    assert err.count("\n") == 1


def test_predict_without_inputs_says_so_before_loading(tmp_path, capsys):
    assert main(["predict", "--model", str(tmp_path / "none")]) == 2
    assert capsys.readouterr().err == ("nanobert: error: give texts on the command line or "
                                       "--input FILE\n")


@pytest.mark.parametrize("flag", ["--text-column", "--text-pair-column", "--label-column"])
def test_predict_refuses_column_flags_without_an_input_file(tmp_path, capsys, flag):
    """The columns of --input FILE: with TEXT arguments they were dropped without a word."""
    assert main(["predict", "--model", str(tmp_path / "none"), "a text", flag, "body"]) == 2
    assert capsys.readouterr().err == (f"nanobert: error: {flag} names a column of an --input "
                                       "table; TEXT arguments have no columns (leave it out)\n")
