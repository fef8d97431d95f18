"""Writing figures: every plot of nanobert (training curves, attention maps, t-SNE,
confusion matrices, the masking ablation) goes through `pyplot()` and `save()`.

- matplotlib draws headless (Agg) figures of their own, so plots work over ssh and in CI,
  and pyplot's backend (a notebook's inline plots) is left as the user has it;
- text in a script DejaVu Sans lacks (CJK tokens, Arabic or Hindi label names) is drawn
  with any installed font that has it, as matplotlib falls back along a family list;
- a character no installed font has is named once, in one note, instead of a warning
  from matplotlib for every glyph;
- the file is written under a temporary name and renamed into place.
"""
from __future__ import annotations

import logging
import os
import re
import sys
import warnings
from pathlib import Path

from .files import atomic_path, note

# fonts with the scripts DejaVu Sans lacks, tried in this order where installed (then
# any other "Noto Sans ..." font); matplotlib draws each glyph with the first that has it
FALLBACK_FONTS = ("Noto Sans CJK JP", "Noto Sans CJK SC", "Noto Sans CJK TC",
                  "Noto Sans CJK KR", "Source Han Sans", "WenQuanYi Zen Hei",
                  "WenQuanYi Micro Hei", "Droid Sans Fallback", "Microsoft YaHei", "SimHei",
                  "Yu Gothic", "Malgun Gothic", "PingFang SC", "Hiragino Sans",
                  "Arial Unicode MS", "Noto Sans Arabic", "Noto Sans Devanagari",
                  "Noto Sans Hebrew", "Noto Sans Thai")
MAX_FALLBACKS = 16      # (each one tried is a font file matplotlib opens for a missing glyph)
MISSING_GLYPH = re.compile(r"Glyph (\d+) .*missing from (?:current )?font")


def font_families(installed) -> list:
    """The font family list: DejaVu Sans (matplotlib's own), then the installed fonts
    of `installed` (names) that draw other scripts."""
    known = [f for f in FALLBACK_FONTS if f in installed]
    noto = sorted(n for n in installed if n.startswith("Noto Sans") and n not in known
                  and "Mono" not in n)
    return ["DejaVu Sans", *(known + noto)[:MAX_FALLBACKS]]


def pyplot():
    """What nanobert's plots use of matplotlib.pyplot (`Figures`), drawing headless, with
    the fonts of `font_families` where the process keeps matplotlib's default font."""
    _writable_matplotlib_folder()
    import matplotlib
    from matplotlib import font_manager
    if matplotlib.rcParams["font.family"] == ["sans-serif"]:   # (a user's choice is kept)
        installed = {f.name for f in font_manager.fontManager.ttflist}
        matplotlib.rcParams["font.family"] = font_families(installed)
    # (a fallback font of one weight only: "Failed to find font weight normal", twice a plot)
    logging.getLogger("matplotlib.font_manager").setLevel(logging.ERROR)
    return Figures


class Figures:
    """pyplot's subplots, figure and get_cmap, without pyplot's global state: each figure
    is a matplotlib Figure of its own, drawn by Agg when saved and freed with its last
    reference. pyplot had been switched to Agg for the whole process, and a notebook's
    inline plots showed nothing after nanobert drew one."""

    @staticmethod
    def figure(figsize=None, layout=None, dpi=None):
        from matplotlib.figure import Figure
        return Figure(figsize=figsize, layout=layout, dpi=dpi)

    @staticmethod
    def subplots(nrows: int = 1, ncols: int = 1, *, figsize=None, layout=None, **kw):
        fig = Figures.figure(figsize=figsize, layout=layout)
        return fig, fig.subplots(nrows, ncols, **kw)

    @staticmethod
    def get_cmap(name: str):
        import matplotlib
        return matplotlib.colormaps[name]


def _writable_matplotlib_folder():
    """MPLCONFIGDIR, where matplotlib's own (~/.config/matplotlib) cannot be written (a
    read-only or missing HOME): a folder of this process's, removed at exit. matplotlib
    made one itself, with a warning of two lines that read as a fault of the run."""
    import atexit
    import shutil
    import tempfile
    if "MPLCONFIGDIR" in os.environ or not sys.platform.startswith("linux"):
        return     # (elsewhere matplotlib's folder is another: ~/.matplotlib on macOS)
    xdg = os.environ.get("XDG_CONFIG_HOME")   # (as matplotlib reads it, relative or not)
    own = (Path(xdg) if xdg else Path.home() / ".config") / "matplotlib"
    try:
        if not Path.home().is_dir():    # (not made: a HOME that is not there)
            raise FileNotFoundError(str(Path.home()))
        own.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=own).close()
    except (OSError, RuntimeError):    # (RuntimeError: no home folder can be found)
        folder = tempfile.mkdtemp(prefix="nanobert-matplotlib-")
        atexit.register(shutil.rmtree, folder, True)
        os.environ["MPLCONFIGDIR"] = folder


def _close(fig) -> None:
    """Close a figure pyplot made (a Figures one has nothing to close)."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is not None and getattr(fig, "number", None) is not None:
        plt.close(fig)


def save(fig, out, dpi: int = 100, fmt: str = "png", layout: bool = False,
         tight: bool = False) -> None:
    """Write `fig` to `out` (atomically) and close it. `layout`: fig.tight_layout() first;
    `tight`: crop to what is drawn (bbox_inches="tight": long names are never cut)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            if layout:
                fig.tight_layout()
            with atomic_path(Path(out)) as tmp:
                fig.savefig(tmp, format=fmt, dpi=dpi, bbox_inches="tight" if tight else None)
        finally:
            _close(fig)
    missing = []
    for w in caught:
        m = MISSING_GLYPH.search(str(w.message))
        if m is None:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        elif chr(int(m.group(1))) not in missing:
            missing.append(chr(int(m.group(1))))
    if missing:
        note(f"{out}: {len(missing)} character(s) are drawn as boxes, no installed font has "
             f"them ({''.join(missing[:10])}{'...' if len(missing) > 10 else ''}); install "
             "a font that does (e.g. Noto Sans CJK for Chinese, Japanese, Korean) and plot "
             "again")
