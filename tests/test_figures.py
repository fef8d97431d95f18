"""How every plot is written: fonts for other scripts, one note for characters no font
has, atomic saves."""
from __future__ import annotations


def test_plots_fall_back_to_installed_fonts_of_other_scripts():
    """DejaVu Sans first (matplotlib's own), then the installed fonts that draw CJK,
    Arabic, Devanagari...: a CJK token or label name is drawn, not a box."""
    from nanobert.figures import MAX_FALLBACKS, font_families
    installed = {"DejaVu Sans", "Noto Sans Arabic", "WenQuanYi Zen Hei", "Noto Sans Mono",
                 "Noto Sans Tamil", "Liberation Serif", "Noto Sans CJK JP"}
    assert font_families(installed) == ["DejaVu Sans", "Noto Sans CJK JP", "WenQuanYi Zen Hei",
                                        "Noto Sans Arabic", "Noto Sans Tamil"]
    assert font_families({"DejaVu Sans"}) == ["DejaVu Sans"]
    many = {f"Noto Sans Script{i:03d}" for i in range(100)}
    assert len(font_families(many)) == 1 + MAX_FALLBACKS


def test_characters_no_font_has_are_named_once_in_a_note(tmp_path, capsys):
    """matplotlib warned once per missing glyph (a CJK sentence: dozens of lines); the
    plot now says once which characters are boxes and what to install."""
    import warnings
    from nanobert import figures
    plt = figures.pyplot()
    fig, ax = plt.subplots()
    ax.set_title("\ue000\ue001\ue000 private-use characters")
    ax.set_xticks([0, 1], ["\ue001", "ok"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")            # no warning gets through
        figures.save(fig, tmp_path / "p.png", layout=True)
    err = capsys.readouterr().err
    assert err.count("note:") == 1 and "2 character(s) are drawn as boxes" in err
    import re
    assert sorted(re.search(r"has them \((.*?)\)", err).group(1)) == ["\ue000", "\ue001"]
    assert str(tmp_path / "p.png") in err
    import matplotlib.pyplot
    assert (tmp_path / "p.png").stat().st_size > 0 and not matplotlib.pyplot.get_fignums()


def test_no_matplotlib_warning_where_home_cannot_be_written(tmp_path):
    """With HOME read-only or missing, every plot printed matplotlib's two lines ('mkdir
    -p failed ... it is highly recommended to set the MPLCONFIGDIR'), which read as a
    fault of the run; and a missing HOME was made."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k not in ("MPLCONFIGDIR", "XDG_CONFIG_HOME")}
    (tmp_path / "tmp").mkdir()
    env.update(HOME=str(tmp_path / "gone"), PYTHONPATH=str(root), XDG_CACHE_HOME="",
               TMPDIR=str(tmp_path / "tmp"))
    code = ("from nanobert.figures import pyplot, save; plt = pyplot(); fig = plt.figure(); "
            f"save(fig, {str(tmp_path / 'p.png')!r})")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert (tmp_path / "p.png").stat().st_size > 0 and not (tmp_path / "gone").exists()
    assert not list((tmp_path / "tmp").iterdir())          # (its folder removed at exit)


def test_drawing_leaves_pyplot_and_a_chosen_font_as_they_were(tmp_path):
    """Every plot switched pyplot to Agg for the whole process (a notebook's inline plots
    then showed nothing) and replaced the user's font.family."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    code = ("import matplotlib; matplotlib.rcParams['font.family'] = ['serif']\n"
            "from nanobert.figures import pyplot, save\n"
            "fig, ax = pyplot().subplots(figsize=(2, 2), layout='constrained')\n"
            "ax.plot([1, 2]); save(fig, %r)\n"
            "import matplotlib.pyplot as plt\n"
            "print(matplotlib.get_backend(), matplotlib.rcParams['font.family'], "
            "plt.get_fignums())" % str(tmp_path / "p.png"))
    env = dict(os.environ, PYTHONPATH=str(root), MPLBACKEND="svg")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=120, check=True).stdout.split()
    assert out == ["svg", "['serif']", "[]"] and (tmp_path / "p.png").stat().st_size > 0
