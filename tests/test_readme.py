"""The README's Python examples run as written (in a scratch folder holding the small
train.tsv/dev.tsv they name)."""
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"

pytestmark = pytest.mark.usefixtures("one_thread")


def python_blocks(text: str) -> list:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_readme_has_python_examples():
    blocks = python_blocks(README.read_text("utf-8"))
    assert len(blocks) >= 3 and any("Predictor" in b for b in blocks)


def test_readme_python_examples_run(tmp_path, monkeypatch, capsys):
    good = ["a gorgeous, witty film", "warm and funny", "a delight", "moving and smart"]
    bad = ["a tedious mess", "dull and long", "a waste of time", "flat and lifeless"]
    rows = "".join(f"{t}\t1\n" for t in good) + "".join(f"{t}\t0\n" for t in bad)
    for name in ("train.tsv", "dev.tsv"):
        (tmp_path / name).write_text("sentence\tlabel\n" + rows)
    monkeypatch.chdir(tmp_path)
    scope = {}
    for block in python_blocks(README.read_text("utf-8")):
        exec(compile(block, str(README), "exec"), scope)
    out = capsys.readouterr().out
    assert "(384,) (2, 384) A man is eating food." in out
    assert "'label':" in out and (tmp_path / "runs" / "sst2" / "config.json").is_file()
    assert (tmp_path / "runs" / "new" / "config.json").is_file()
