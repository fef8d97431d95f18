"""`nanobert demo` on the user's files: what it prints and draws, and what it refuses.
(Its reader and split: test_finetune.py; its output directory: test_rundir.py.)"""
import random

import pytest
from PIL import Image

import nanobert
from nanobert import cli
from nanobert.demo import distinct, plot_confusion, short_labels, shown_text

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest

WORDS = ["good", "great", "bad", "awful", "the", "film", "was", "a", "plot", "cast",
         "really", "quite", "and", "so"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny random BERT whose vocabulary covers WORDS."""
    d = tmp_path_factory.mktemp("demo") / "base"
    tok = nanobert.Tokenizer.train([" ".join(WORDS)] * 20, vocab_size=80, min_frequency=1)
    config = nanobert.preset("tiny", vocab_size=tok.vocab_size, pad_token_id=tok.pad_id,
                             max_position_embeddings=64, num_hidden_layers=2)
    nanobert.Bert(config).save_pretrained(d, tokenizer=tok)
    return d


def pair_rows(n: int, seed: int) -> list:
    rng = random.Random(seed)
    labels = ["the_first_label_with_a_very_long_name", "the_second_label_with_a_long_name"]
    return [(" ".join(rng.choices(WORDS, k=30)), " ".join(rng.choices(WORDS, k=4)) + " tail",
             labels[i % 2]) for i in range(n)]


def write_pairs(path, rows):
    path.write_text("sentence1\tsentence2\tlabel\n" + "".join(f"{a}\t{b}\t{y}\n" for a, b, y in rows))
    return path


def test_a_confusion_matrix_of_20_long_labels_reads(tmp_path):
    """The matrix was drawn 4.5 x 4 inches whatever the classes: 20 classes with long names
    were a blur of overlapping names and counts (and 'tight layout not applied')."""
    labels = [f"category_number_{i:02d}_with_a_rather_long_descriptive_name" for i in range(20)]
    rng = random.Random(0)
    gold = [rng.randrange(20) for _ in range(400)]
    pred = [g if rng.random() < 0.5 else rng.randrange(20) for g in gold]
    plot_confusion(gold, pred, labels, tmp_path / "cm.png")
    width, height = Image.open(tmp_path / "cm.png").size
    assert width >= 20 * 30 and height >= 20 * 30      # room for 20 rows and columns of counts
    plot_confusion([0, 1, 1], [0, 1, 0], ["0", "1"], tmp_path / "two.png")
    assert Image.open(tmp_path / "two.png").size[0] < 500   # a small one stays small


def test_long_label_names_are_shortened_yet_told_apart():
    names = [f"category_number_{i:02d}_with_a_rather_long_descriptive_name" for i in range(20)]
    assert short_labels(names) == [f"category_number_{i:02d}_with…" for i in range(20)]
    ends = [f"a_very_long_common_prefix_for_the_label_{i}" for i in range(3)]
    assert [s[-1] for s in short_labels(ends)] == ["0", "1", "2"]
    same = ["x" * 30 + "a" + "y" * 30, "x" * 30 + "b" + "y" * 30]
    assert short_labels(same)[0].startswith("0: ") and short_labels(same)[1].startswith("1: ")
    assert all(len(s) <= 24 for s in short_labels(names + ends))
    assert short_labels(["negative", "positive"]) == ["negative", "positive"]


def test_a_shown_pair_keeps_its_second_text_and_one_line():
    """A pair was cut at 90 characters as 'A ||| B': with a long first text the second
    (the hypothesis in RTE) was never seen; a text with a newline broke the line."""
    line = shown_text("premise " * 30, "the short hypothesis")
    assert line.endswith("||| the short hypothesis") and len(line) <= 90
    line = shown_text("a" * 200, "b" * 200)
    assert len(line) == 90 and line.count("a") > 35 and line.count("b") > 35
    assert shown_text("two\nlines\tand  tabs") == "two lines and tabs"


def test_distinct_tweets_leave_no_copy_on_both_sides_of_the_split():
    """The tweet corpus repeats retweets (one 303 times): 8 of the 500 'held-out' tweets
    were in the training part too."""
    rows = [("rt same", "positive")] * 50 + [("torn", "positive"), ("torn", "negative")] + \
        [(f"tweet {i}", ("negative", "neutral", "positive")[i % 3]) for i in range(30)]
    kept = distinct(rows)
    assert [t for t, _ in kept].count("rt same") == 1 and "torn" not in {t for t, _ in kept}
    assert len(kept) == 31


def test_the_demo_refuses_its_training_file_as_dev(tiny, tmp_path, capsys):
    """--train X --dev X ran and printed 'held-out accuracy' and 'held-out examples' that
    were training examples."""
    train = write_pairs(tmp_path / "train.tsv", pair_rows(12, 0))
    (tmp_path / "copy.tsv").write_bytes(train.read_bytes())
    for dev, said in ((train, "is the training file"), (tmp_path / "copy.tsv", "has the content")):
        out = tmp_path / "out"
        rc = cli.main(["demo", "--model", str(tiny), "--train", str(train), "--dev", str(dev),
                       "--out", str(out)])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and said in err[0] and "held out" in err[0]
        assert not out.exists()


def test_the_demos_flags_are_checked_before_the_tweets_are_read(tiny, tmp_path, capsys,
                                                                monkeypatch):
    """--epochs 1e12 was refused by finetune, after the 37k tweets were read and split."""
    import nanobert.demo as D

    def unread():
        raise AssertionError("the tweets were read")
    monkeypatch.setattr(D, "find_corpus", unread)
    for flags, says in ((["--epochs", "1000000000000"], "--epochs: got 1000000000000"),
                        (["--freeze-layers", "7"], "--freeze-layers 7: the model has 2 blocks")):
        rc = cli.main(["demo", "--model", str(tiny), "--out", str(tmp_path / "o"), *flags])
        err = capsys.readouterr().err
        assert rc == 2 and says in err, err


def test_the_demo_shows_pairs_and_long_labels_in_columns(tiny, tmp_path, capsys):
    train = write_pairs(tmp_path / "train.tsv", pair_rows(16, 1))
    dev = write_pairs(tmp_path / "dev.tsv", pair_rows(6, 2))
    out = tmp_path / "demo"
    assert cli.main(["demo", "--model", str(tiny), "--train", str(train), "--dev", str(dev),
                     "--out", str(out), "--epochs", "1", "--batch-size", "8",
                     "--max-length", "32"]) == 0
    text, err = capsys.readouterr()
    # the dev texts' cut is said once: the report's reloaded tokenizer said it again
    assert err.count("6 of 6 pairs are longer than 32 tokens") == 1, err
    shown = [line for line in text.splitlines() if " right " in line + " " or "WRONG" in line]
    assert len(shown) == 6 and all(line.rstrip().endswith(" tail") for line in shown)
    # the confidence column starts at the same place on every line
    assert len({line.index(" 0.") for line in shown}) == 1
    assert all("the_first_label_with_a_…" in line or "the_second_label_with_a…" in line
               for line in shown)


def test_the_demo_writes_its_results_before_it_prints_them(tiny, tmp_path, monkeypatch):
    """`nanobert demo | head -3`: the closed pipe stopped the report after the run was
    marked finished and before demo_results.json was written (docs3)."""
    import builtins
    import json
    import nanobert.demo as demo
    train = write_pairs(tmp_path / "train.tsv", pair_rows(16, 1))
    dev = write_pairs(tmp_path / "dev.tsv", pair_rows(6, 2))
    out = tmp_path / "demo"
    real_print, reporting = builtins.print, []
    real_report = demo.report

    def report(*a, **kw):
        reporting.append(True)
        return real_report(*a, **kw)

    def closed_pipe(*a, **kw):        # every line of the report: the reader has gone
        if reporting:
            raise BrokenPipeError(32, "Broken pipe")
        real_print(*a, **kw)
    monkeypatch.setattr(demo, "report", report)
    monkeypatch.setattr(builtins, "print", closed_pipe)
    assert cli.main(["demo", "--model", str(tiny), "--train", str(train), "--dev", str(dev),
                     "--out", str(out), "--epochs", "1", "--batch-size", "8",
                     "--max-length", "32"]) == 141          # (a closed pipe: stops quietly)
    assert json.loads((out / "demo_results.json").read_text())["n_dev"] == 6
