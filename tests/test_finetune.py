"""Fine-tuning end to end on tiny fixtures: overfit, evaluate, predict, load in transformers."""
import importlib
import json
import random
import unicodedata

import pytest
import transformers
import torch

from conftest import counted_chunks, tiny_model_dir, with_flags
import nanobert
from nanobert import cli
from nanobert.files import NanobertError
from nanobert.data import Sentence
from nanobert.finetune import (encode_ner, finetune, load_finetuned, ner_labels, predict_ner_text,
                               predict_classify,
                               sentence_word_predictions)

POS = ["great", "wonderful", "lovely", "superb", "fun", "brilliant"]
NEG = ["awful", "boring", "terrible", "dull", "bad", "painful"]
FILLER = ["the", "movie", "was", "really", "plot", "acting", "and", "quite", "a", "story"]
NAMES = ["alice", "bob", "carol", "dave"]
PLACES = ["paris", "london", "rome", "oslo"]


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A small random BERT with a WordPiece vocabulary trained on the fixture words."""
    d = tmp_path_factory.mktemp("tiny")
    words = POS + NEG + FILLER + NAMES + PLACES + ["lives", "in", "met", "who", "where", "does"]
    return tiny_model_dir(d, words, 200, "? . , -")


def sentiment_rows(n, seed):
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        good = i % 2 == 0
        words = rng.sample(FILLER, 4) + [rng.choice(POS if good else NEG)]
        rng.shuffle(words)
        rows.append((" ".join(words), "good" if good else "bad"))
    return rows


def write_tsv(path, rows):
    path.write_text("sentence\tlabel\n" + "".join(f"{t}\t{l}\n" for t, l in rows))
    return path


def last_json(capsys):
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_classifier_from_a_mean_pooling_checkpoint_runs_the_same_in_transformers(tiny_dir, tmp_path):
    """A classifier fine-tuned by default from a sentence-transformers checkpoint (which
    declares mean pooling, as minilm does) gives transformers' BertForSequenceClassification
    the logits nanobert computes: before, it was trained on the mean and transformers read
    [CLS], so a model that went out gave other predictions there."""
    import shutil
    st = tmp_path / "st"
    shutil.copytree(tiny_dir, st)
    (st / "1_Pooling").mkdir()
    (st / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    train = write_tsv(tmp_path / "train.tsv", sentiment_rows(24, 0))
    out = tmp_path / "model"
    assert cli.main(["finetune", "--task", "classify", "--model", str(st), "--train", str(train),
                     "--dev", str(train), "--out", str(out), "--epochs", "2", "--lr", "3e-3",
                     "--batch-size", "8", "--max-length", "16", "--no-progress"]) == 0
    model, tok, _ = load_finetuned(out)
    model.cpu().eval()
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(out).eval()
    batch = tok(["the movie was great", "a dull plot and boring acting ."])
    with torch.inference_mode():
        ours = model(**batch).logits
        theirs = hf(**{k: v for k, v in batch.items() if k in ("input_ids", "attention_mask",
                                                                 "token_type_ids")}).logits
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-4)


def test_pooling_follows_the_checkpoint_and_mean_pooling_round_trips(tiny_dir, tmp_path, capsys):
    """classify/regress read [CLS], the vector transformers' BertForSequenceClassification
    reads, even from a sentence-transformers checkpoint that declares mean pooling, unless
    the family's transformers classifier reads the pooling (ModernBERT); --pooling
    overrides; the choice is saved with the model."""
    import shutil
    from nanobert.finetune import TASKS, FinetuneConfig, sentence_pooling
    st = tmp_path / "st"
    shutil.copytree(tiny_dir, st)
    (st / "1_Pooling").mkdir()
    (st / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))

    def pooling(task, model, **kw):
        cfg = FinetuneConfig.create(task=task, model=str(model), train="t", dev="d",
                                    out_dir="o", **kw)
        return sentence_pooling(TASKS[task], cfg)

    assert pooling("classify", st) is None and pooling("regress", st) is None  # BERT's [CLS]
    assert pooling("classify", tiny_dir) is None
    assert pooling("classify", st, pooling="mean") == "mean"
    modern = tmp_path / "modern"
    (modern / "1_Pooling").mkdir(parents=True)
    transformers.ModernBertConfig().save_pretrained(modern)
    (modern / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    assert pooling("classify", modern) == "mean"           # transformers reads it there
    assert pooling("classify", st, pooling="cls") == "cls"
    assert pooling("rerank", st) is None                     # cross-encoders read [CLS]
    assert pooling("embed", tiny_dir) == "mean"
    with pytest.raises(NanobertError, match="--pooling"):
        pooling("ner", tiny_dir, pooling="mean")

    train = write_tsv(tmp_path / "train.tsv", sentiment_rows(24, 0))
    out = tmp_path / "model"
    rc = cli.main(["finetune", "--task", "classify", "--model", str(st), "--train", str(train),
                   "--dev", str(train), "--out", str(out), "--epochs", "12", "--lr", "3e-3",
                   "--batch-size", "8", "--max-length", "16", "--no-progress", "--pooling", "mean"])
    assert rc == 0 and "classify: mean pooling" in capsys.readouterr().out
    model, tok, _ = load_finetuned(out)
    model.cpu()  # (load_finetuned puts it on the GPU where there is one)
    assert model.config.classifier_pooling == "mean"
    batch = tok(["the movie was great", "a dull plot and boring acting ."])
    with torch.inference_mode():
        logits = model(**batch).logits
        h = model.bert(**batch).last_hidden_state                       # (B, T, H)
        m = batch["attention_mask"].unsqueeze(-1).float()
        mean = model.classifier(model.bert.pooler((h * m).sum(1) / m.sum(1)))
    torch.testing.assert_close(logits, mean, atol=1e-5, rtol=1e-4)
    rc = cli.main(["evaluate", "--model", str(out), "--data", str(train), "--json"])
    assert rc == 0 and last_json(capsys)["accuracy"] >= 0.9


def test_classify_overfits_evaluates_predicts_and_loads_in_transformers(tiny_dir, tmp_path, capsys):
    train = write_tsv(tmp_path / "train.tsv", sentiment_rows(24, 0))
    out = tmp_path / "model"
    rc = cli.main(["finetune", "--task", "classify", "--model", str(tiny_dir), "--train", str(train),
                   "--dev", str(train), "--out", str(out), "--epochs", "12", "--lr", "3e-3",
                   "--batch-size", "8", "--max-length", "16", "--warmup-ratio", "0.1",
                   "--eval-every", "1000", "--no-progress"])
    assert rc == 0 and "no better than" not in capsys.readouterr().err   # (not at chance)
    rc = cli.main(["evaluate", "--model", str(out), "--data", str(train), "--json"])
    res = last_json(capsys)
    assert rc == 0 and res["task"] == "classify" and res["n"] == 24
    # learnt (chance is 0.5), with a margin no seed or vocabulary detail can flip
    assert res["accuracy"] >= 0.9 and res["f1"] >= 0.9 and res["mcc"] >= 0.8
    assert json.loads((out / "nanobert.json").read_text())["task"] == "classify"
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert {r["type"] for r in lines} == {"train", "eval"}
    assert (out / "training_curve.png").is_file()

    rc = cli.main(["predict", "--model", str(out), "--json", "the movie was great",
                   "a dull plot"])
    preds = [json.loads(x) for x in capsys.readouterr().out.strip().splitlines()]
    assert rc == 0 and [p["label"] for p in preds] == ["good", "bad"]
    assert all(0.5 < p["probability"] <= 1.0 for p in preds)

    # the directory is an ordinary transformers checkpoint with the same predictions
    transformers = pytest.importorskip("transformers")
    hf = transformers.BertForSequenceClassification.from_pretrained(out).eval()
    assert hf.config.id2label == {0: "bad", 1: "good"}
    model, tok, _ = load_finetuned(out)
    model.cpu()  # (load_finetuned puts it on the GPU where there is one)
    batch = tok(["the movie was great", "a dull plot and boring acting"])
    with torch.inference_mode():
        ours = model(**batch).logits
        theirs = hf(**batch).logits
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-4)

    # a label the model does not know, at evaluation: one line, exit status 2
    bad = write_tsv(tmp_path / "bad.tsv", [("the movie", "good"), ("a plot", "meh")])
    rc = cli.main(["evaluate", "--model", str(out), "--data", str(bad), "--json"])
    err = capsys.readouterr().err
    assert rc == 2 and f"{bad}:3: unknown label 'meh'" in err

    # another task's data: the reader's error, and what the file looks like
    conll = tmp_path / "tags.conll"
    conll.write_text("John B-PER\nlives O\n\nMary B-PER\nruns O\n")
    squad = tmp_path / "squad.json"
    squad.write_text(json.dumps({"version": "v2.0", "data": [{"title": "t", "paragraphs": [
        {"context": "abc def", "qas": [{"id": "1", "question": "what?",
                                         "answers": [{"text": "abc", "answer_start": 0}]}]}]}]}))
    for data, what in ((conll, "NER data (CoNLL columns)"), (squad, "QA data (SQuAD JSON or a question/context table)")):
        rc = cli.main(["evaluate", "--model", str(out), "--data", str(data)])
        err = capsys.readouterr().err
        assert rc == 2 and f"({data} holds {what}, but {out} is a classify model)" in err, err
        assert len(err.strip().splitlines()) == 1

    # BEIR-only flags on a labelled file would change nothing: refused, not ignored
    for flag, value in (("--holdout", "0.5"), ("--split", "test"), ("--rerank-k", "5")):
        rc = cli.main(["evaluate", "--model", str(out), "--data", str(train), flag, value])
        err = capsys.readouterr().err
        assert rc == 2 and f"{flag}: only for a BEIR folder" in err and str(train) in err


def test_ner_label_set_has_b_and_i_of_every_type():
    # a training sample whose MISC entities are all one word has no I-MISC: the dev file's
    # I-MISC was refused as an unknown tag (finetune, evaluate)
    train = [Sentence(["EU", "rejects", "German"], ["B-ORG", "O", "B-MISC"]),
             Sentence(["Peter", "Blackburn"], ["B-PER", "I-PER"])]
    assert ner_labels(train) == ["O", "B-MISC", "I-MISC", "B-ORG", "I-ORG", "B-PER", "I-PER"]
    with pytest.raises(NanobertError, match="t.txt: no entities in the training data"):
        ner_labels([Sentence(["x"], ["O"])], "t.txt")


def test_an_unknown_tag_is_named_at_its_own_line(tmp_path):
    """A tag the model does not know is reported at the line that holds it (it was the
    line of its sentence's first word); in JSON Lines a sentence is one line. Data with
    no entity cannot be scored."""
    from types import SimpleNamespace
    from nanobert import data as D
    from nanobert.finetune import ner_check
    model = SimpleNamespace(config=SimpleNamespace(id2label={0: "O", 1: "B-PER", 2: "I-PER"}))
    conll = tmp_path / "dev.txt"
    conll.write_text("a O\nb O\n\nc O\nd O\ne O\nf B-XYZ\n\n")
    with pytest.raises(NanobertError, match=r"dev.txt:7: unknown entity type 'XYZ' \(the "
                                            r"model tags PER\)"):
        ner_check(D.read_conll(conll), model, conll)
    jsonl = tmp_path / "dev.jsonl"
    jsonl.write_text('{"tokens": ["a"], "tags": ["O"]}\n{"tokens": ["c", "f"], "tags": ["O", "B-XYZ"]}\n')
    with pytest.raises(NanobertError, match=r"dev.jsonl:2: unknown entity type 'XYZ'"):
        ner_check(D.read_conll(jsonl), model, jsonl)
    # named by its type: the file's S-ORG (BIOES) or IOB1 I-ORG is read as B-ORG, a tag
    # the file does not hold
    for tags in ("Google S-ORG\nhired O\n", "Alice B-PER\nhired O\nGoogle I-ORG\n"):
        conll.write_text(tags)
        with pytest.raises(NanobertError, match=r"unknown entity type 'ORG'"):
            ner_check(D.read_conll(conll), model, conll)
    # with no entity at all, precision, recall and F1 are 0 whatever the model tags
    conll.write_text("the O\ncat O\n\na O\n")
    with pytest.raises(NanobertError) as e:
        ner_check(D.read_conll(conll), model, conll)
    assert str(e.value) == (f"{conll}: no entities (every tag is O): precision, recall and "
                            "F1 would be 0 whatever the model tags")


def test_a_word_that_maps_to_no_token_is_noted(minilm, capsys):
    """A CoNLL word of only characters the tokenizer drops (a zero-width space) has no
    sub-word: its tag was neither learned nor scored without a word."""
    _, tok = minilm
    s = Sentence(["Ann", "\u200b", "met", "Bo"], ["B-PER", "B-PER", "O", "B-PER"], line=7,
                 word_a_line=True)
    end = Sentence(["Bo", "\u200b"], ["B-PER", "B-PER"])          # the last word too
    item = encode_ner(tok, [s, Sentence(["ok"], ["O"]), end], 32, {"O": 0, "B-PER": 1})[0]
    assert 1 not in item["word_ids"]
    assert capsys.readouterr().err == (
        "nanobert: note: 2 training words map to no token (only characters the tokenizer drops: "
        "zero-width, control, a lone accent; first '\\u200b', line 8): their tags are neither "
        "learned nor predicted\n")


def test_ner_labels_go_on_the_first_subword(minilm):
    _, tok = minilm
    s = Sentence(["Smithsonianville", "met", "unbelievably", "Bo"], ["B-ORG", "O", "O", "B-PER"])
    label2id = {"O": 0, "B-ORG": 1, "B-PER": 2}
    item = encode_ner(tok, [s], 32, label2id)[0]
    toks = [tok.id_to_token(i) for i in item["input_ids"]]
    assert toks[0] == "[CLS]" and toks[-1] == "[SEP]"
    pieces = [[t for t, w in zip(toks, item["word_ids"]) if w == k] for k in range(4)]
    assert len(pieces[0]) >= 2 and len(pieces[2]) >= 2  # really split into several pieces
    labelled = [(t, lab) for t, lab in zip(toks, item["labels"]) if lab != -100]
    assert labelled == [(pieces[0][0], 1), ("met", 0), (pieces[2][0], 0), (pieces[3][0], 2)]
    assert item["labels"][0] == -100 and item["labels"][-1] == -100

    # word-level predictions come back from the first sub-word of each word
    class Fake(torch.nn.Module):
        task = "token"

        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def forward(self, input_ids, attention_mask=None, token_type_ids=None):
            T = input_ids.shape[1]
            logits = torch.zeros(input_ids.shape[0], T, 3)
            logits[:, :, 0] = 5.0
            for t, (w, f) in enumerate(zip(item["word_ids"], item["first"])):
                if w == 3:
                    logits[:, t, 2 if f else 1] = 10.0  # only the first piece says B-PER
            return type("O", (), {"logits": logits})()

    preds = list(sentence_word_predictions(Fake(), tok, [s], 32, batch_size=4))
    assert {w: p[0] for w, p in preds[0].items()} == {0: 0, 1: 0, 2: 0, 3: 2}


def ner_files(tmp_path):
    rng = random.Random(0)
    blocks = []
    for i in range(16):
        name, place = NAMES[i % 4], PLACES[(i // 4) % 4]
        if i % 2:
            rows = [(name.title(), "B-PER"), ("lives", "O"), ("in", "O"), (place.title(), "B-LOC")]
        else:
            rows = [(name.title(), "B-PER"), (NAMES[(i + 1) % 4].title(), "I-PER"), ("met", "O"),
                    (rng.choice(FILLER), "O")]
        blocks.append("".join(f"{w} NN O {t}\n" for w, t in rows))
    p = tmp_path / "ner.txt"
    p.write_text("-DOCSTART- -X- -X- O\n\n" + "\n".join(blocks))
    return p


def test_ner_overfits_and_predicts_char_spans(tiny_dir, tmp_path, capsys):
    data = ner_files(tmp_path)
    out = tmp_path / "ner"
    best = finetune("ner", str(tiny_dir), data, data, out, epochs=25, lr=5e-3, batch_size=4,
                    max_length=24, eval_every=1000, progress=False)
    assert best["f1"] >= 0.9  # learnt, with a margin no seed detail can flip
    rc = cli.main(["evaluate", "--model", str(out), "--data", str(data), "--json"])
    res = last_json(capsys)
    assert rc == 0 and res["task"] == "ner" and res["n"] == 16
    assert min(res["precision"], res["recall"], res["f1"]) >= 0.9

    # predict on the labelled CoNLL file itself: its sentences, not its lines, are the inputs
    rc = cli.main(["predict", "--model", str(out), "--input", str(data), "--json"])
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert rc == 0 and len(lines) == 16
    # the same file piped in (--input -): read the same way, CoNLL detected from its lines
    import io
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(open(data, "rb").read())))
        assert cli.main(["predict", "--model", str(out), "--input", "-", "--json"]) == 0
    assert [json.loads(x) for x in capsys.readouterr().out.splitlines()] == lines
    assert all(len(r["text"].split()) == 4 and "NN" not in r["text"] for r in lines)
    assert sum(e["type"] == "PER" for r in lines for e in r["entities"]) >= 16

    model, tok, settings = load_finetuned(out)
    model.cpu()  # (load_finetuned puts it on the GPU where there is one)
    text = "Carol lives in Rome"
    ents = list(predict_ner_text(model, tok, [text], 24))[0]
    assert [(e["type"], text[e["start"]:e["end"]]) for e in ents] == [("PER", "Carol"), ("LOC", "Rome")]
    assert ents[0]["text"] == "Carol" and 0 < ents[0]["score"] <= 1
    from nanobert import Predictor
    tagger = Predictor(out)
    assert tagger.predict(text) == {"text": text, "entities": ents}      # one in, one out
    assert tagger.predict([text, "Alice met Bob"])[0]["entities"] == ents  # a list, a list

    transformers = pytest.importorskip("transformers")
    hf = transformers.BertForTokenClassification.from_pretrained(out).eval()
    batch = tok([text, "Alice Bob met the"])
    with torch.inference_mode():
        torch.testing.assert_close(model(**batch).logits, hf(**batch).logits, atol=1e-5, rtol=1e-4)


def test_demo_reader_survives_encoding_debris_and_splits_by_label(tmp_path):
    from nanobert.demo import read_tweets, split
    raw = (b"sentiment,confidence,text\n"
           b"negative,0.75,I don't trust it #cars_\xd1_.no thanks\n"
           b"positive,0.9,\"love it, truly\"\n"
           b"neutral,0.5,a car\n"
           b"bogus,0.1,dropped row\n"
           b"positive,0.8,\n")
    p = tmp_path / "tweets.csv"
    p.write_bytes(raw * 10)
    rows = read_tweets(p)
    assert len(rows) == 30 and rows[0] == ("I don't trust it #cars__.no thanks", "negative")
    assert rows[1] == ("love it, truly", "positive")
    train, dev = split(rows, 15, 9, seed=1)
    assert len(dev) == 9 and sorted(l for _, l in dev) == ["negative"] * 3 + ["neutral"] * 3 + ["positive"] * 3
    assert not {t for t in map(id, train)} & {t for t in map(id, dev)}
    assert split(rows, 15, 9, seed=1) == (train, dev)
    # the sizes asked for, exactly (each label's share rounded alone gave 3,001 for 3,000)
    assert [len(part) for part in split(rows, 11, 7, seed=1)] == [11, 7]


def test_demo_on_user_files(tiny_dir, tmp_path, capsys):
    train = write_tsv(tmp_path / "train.tsv", sentiment_rows(16, 0))
    dev = write_tsv(tmp_path / "dev.tsv", sentiment_rows(8, 1))
    out = tmp_path / "demo"
    rc = cli.main(["demo", "--model", str(tiny_dir), "--train", str(train), "--dev", str(dev),
                   "--out", str(out), "--epochs", "2", "--batch-size", "8", "--max-length", "16"])
    text = capsys.readouterr().out
    assert rc == 0 and "held-out accuracy" in text
    for f in ("training_curve.png", "confusion_matrix.png", "config.json", "demo_results.json"):
        assert (out / f).is_file(), f
    res = json.loads((out / "demo_results.json").read_text())
    assert res["n_dev"] == 8 and res["shown"] == 8          # --show 10, but only 8 held out
    # every dev example is printed once, with its gold label when the prediction is wrong
    shown = [line for line in text.splitlines() if "right" in line or "WRONG (gold:" in line]
    verb = "is" if res["shown_right"] == 1 else "are"
    assert len(shown) == 8 + 1 and f"{res['shown_right']} of these 8 {verb} right." in text
    assert sum("WRONG" in line for line in shown) == 8 - res["shown_right"]
    # the command to try is on the user's data (its first dev text), not a tweet
    first = dev.read_text().splitlines()[1].split("\t")[0]
    assert text.splitlines()[-1] == f"try:  nanobert predict --model {out} -- '{first}'"
    line = text.splitlines()[-1].removeprefix("try:  nanobert ")
    import shlex
    assert cli.main(shlex.split(line)) == 0                  # the line runs as printed
    # --n-train / --n-dev size the tweet split: with own files they were ignored
    rc = cli.main(["demo", "--model", str(tiny_dir), "--train", str(train), "--dev", str(dev),
                   "--out", str(tmp_path / "d2"), "--n-dev", "100"])
    assert rc == 2 and "--n-dev sizes the tweet split" in capsys.readouterr().err
    assert not (tmp_path / "d2").exists()


def test_epoch_batches_are_seeded_and_grouped_by_length():
    from nanobert.finetune import epoch_batches, epoch_order
    lengths = [random.Random(i).randint(3, 60) for i in range(500)]
    plain = epoch_batches(lengths, 16, 42, 0)
    assert plain == [epoch_order(500, 42, 0)[i:i + 16] for i in range(0, 500, 16)]
    grouped = epoch_batches(lengths, 16, 42, 0, group_by_length=True)
    assert len(grouped) == len(plain) and sorted(i for b in grouped for i in b) == list(range(500))
    assert grouped == epoch_batches(lengths, 16, 42, 0, group_by_length=True)
    assert grouped != epoch_batches(lengths, 16, 42, 1, group_by_length=True)

    def padded(batches):
        return sum(len(b) * max(lengths[i] for i in b) for b in batches)
    assert padded(grouped) < 0.7 * padded(plain)


def test_the_dev_sample_is_the_same_whatever_the_seed(tmp_path):
    """--max-dev-examples picked its sample with --seed: a seed sweep scored each seed on
    other rows (dev Pearson 0.919 and 0.931 for two copies of one model). The training
    sample still follows the seed."""
    from nanobert.finetune import TASKS, FinetuneConfig, _read_splits
    rows = "".join(f"sentence number {i} here\t{i % 2}\n" for i in range(60))
    for name in ("train.tsv", "dev.tsv"):
        (tmp_path / name).write_text("sentence\tlabel\n" + rows)
    splits = []
    for seed in (5, 6):
        cfg = FinetuneConfig(task="classify", model="minilm", train=str(tmp_path / "train.tsv"),
                             dev=str(tmp_path / "dev.tsv"), max_train_examples=10,
                             max_dev_examples=10).replace(seed=seed)
        splits.append(_read_splits(TASKS["classify"], cfg))
    (train5, dev5, *_), (train6, dev6, *_) = splits
    assert [e.text_a for e in dev5] == [e.text_a for e in dev6] and len(dev5) == 10
    assert [e.text_a for e in train5] != [e.text_a for e in train6]


def test_a_dev_sample_of_ranked_rows_takes_whole_queries(tmp_path, capsys):
    """--max-dev-examples 40 on a reranker's table of 100 queries x 4 rows drew 40 rows
    scattered over ~33 queries, most of them left with one relevance grade (nothing to
    rank); it takes every row of N queries, and notes N over the queries there are.
    Scored pairs of a bi-encoder (Spearman, per row) are still sampled by row."""
    from nanobert.finetune import TASKS, FinetuneConfig, _read_splits
    rows = "".join(f"query {q}\tdocument {q} {k}\t{int(k == 0)}\n" for q in range(100)
                   for k in range(4))
    for name in ("train.tsv", "dev.tsv"):
        (tmp_path / name).write_text("query\tdocument\tlabel\n" + rows)
    for n in (40, 7):
        cfg = FinetuneConfig(task="rerank", model="minilm", train=str(tmp_path / "train.tsv"),
                             dev=str(tmp_path / "dev.tsv"), max_dev_examples=n)
        dev = _read_splits(TASKS["rerank"], cfg)[1]
        queries = {r.texts[0] for r in dev}
        assert len(queries) == n and len(dev) == 4 * n
        assert {r.score for r in dev if r.texts[0] == sorted(queries)[0]} == {0.0, 1.0}
    capsys.readouterr()
    cfg = cfg.replace(max_dev_examples=101)
    assert len(_read_splits(TASKS["rerank"], cfg)[1]) == 400
    assert (f"--max-dev-examples 101 is over the 100 queries of {tmp_path / 'dev.tsv'}: all of "
            "them are used") in capsys.readouterr().err
    (tmp_path / "sts.tsv").write_text("sentence1\tsentence2\tscore\n" + "".join(
        f"a {i}\tb {i}\t{i % 5}\n" for i in range(30)))
    cfg = FinetuneConfig(task="embed", model="minilm", train=str(tmp_path / "sts.tsv"),
                         dev=str(tmp_path / "sts.tsv"), max_dev_examples=10)
    assert len(_read_splits(TASKS["embed"], cfg)[1]) == 10


def test_attn_backend_trains_padded_with_the_masks_transformers_draws(tiny_dir, tmp_path):
    """--attn-backend sdpa/eager train on padded batches: with dropout on, the two draw the
    same masks (transformers' own, tests/test_train.py) and give the same losses; the
    default unpadded run draws other masks. The saved model keeps its own backend."""
    import shutil
    from nanobert.train import read_metrics
    d = tmp_path / "dropout"
    shutil.copytree(tiny_dir, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    (d / "config.json").write_text(json.dumps(cfg))
    rows = [(t + " " + " ".join(FILLER[:i % 5]), y) for i, (t, y) in enumerate(sentiment_rows(24, 0))]
    train = write_tsv(tmp_path / "train.tsv", rows)   # (lengths vary: batches have padding)
    losses = {}
    for backend in ("sdpa", "eager", None):
        out = tmp_path / f"run-{backend}"
        finetune("classify", str(d), str(train), str(train), str(out), epochs=2, lr=1e-3,
                 batch_size=8, max_length=16, attn_backend=backend, progress=False)
        losses[backend] = [r["loss"] for r in read_metrics(out / "metrics.jsonl")
                           if r["type"] == "train"]
        assert json.loads((out / "config.json").read_text())["nanobert_attn_backend"] == "unpadded"
    assert len(losses[None]) == 6
    assert losses["sdpa"] == pytest.approx(losses["eager"], abs=1e-5)
    assert max(abs(a - b) for a, b in zip(losses["sdpa"], losses[None])) > 1e-3


def test_freeze_layers_fixes_the_bottom_and_trains_the_top(tiny_dir, tmp_path):
    from nanobert.checkpoint import read_weights
    train = write_tsv(tmp_path / "train.tsv", sentiment_rows(16, 0))
    out = tmp_path / "model"
    finetune("classify", str(tiny_dir), str(train), str(train), str(out), epochs=2,
                      lr=1e-2, batch_size=8, max_length=16, freeze_layers=1, progress=False)
    before = read_weights(tiny_dir)
    after = {k.removeprefix("bert."): v for k, v in read_weights(out).items()}
    frozen = [k for k in before if "embeddings" in k or ".layer.0." in k]
    trained = [k for k in before if ".layer.1." in k and k.endswith("weight")]
    assert frozen and trained
    for k in frozen:
        torch.testing.assert_close(after[k], before[k], rtol=0, atol=0, msg=k)
    assert all(not torch.equal(after[k], before[k]) for k in trained)
    # a run that would leave nothing to train, and a negative count, are refused; the
    # count before the data is read (a training file that is not there is not reached)
    for n, why in ((2, "leave at least one"), (-1, "--freeze-layers")):
        with pytest.raises(NanobertError, match=why):
            finetune("classify", str(tiny_dir), str(tmp_path / "absent.tsv"), str(train),
                              str(tmp_path / f"m{n}"), epochs=1, max_length=16,
                              freeze_layers=n, progress=False)
        assert not (tmp_path / f"m{n}").exists()


def test_a_classifier_of_other_labels_gets_a_new_head_on_its_encoder(tiny_dir, tmp_path, capsys):
    """Fine-tuning a 2-label classifier on 3 labels trains a new head on its encoder (the
    loader refuses a label count its classifier contradicts), with its encoder's weights."""
    rows = sentiment_rows(12, 0)
    two = write_tsv(tmp_path / "two.tsv", rows)
    three = write_tsv(tmp_path / "three.tsv", rows + [("the plot was so so", "meh")] * 3)
    flags = ["--epochs", "1", "--batch-size", "8", "--max-length", "16", "--no-progress"]
    first, second = tmp_path / "first", tmp_path / "second"
    assert cli.main(["finetune", "--task", "classify", "--model", str(tiny_dir), "--train",
                     str(two), "--dev", str(two), "--out", str(first)] + flags) == 0
    with pytest.raises(ValueError, match="asks for 3 labels, but the checkpoint's classify"):
        nanobert.load(first, num_labels=3)
    capsys.readouterr()
    assert cli.main(["finetune", "--task", "classify", "--model", str(first), "--train",
                     str(three), "--dev", str(three), "--out", str(second), "--lr", "1e-12"]
                    + flags) == 0
    assert (f"nanobert: note: {first}: its classifier has 2 outputs, the training data 3 labels: a "
            "new head is trained on its encoder") in capsys.readouterr().err
    before, _ = nanobert.load(first)
    after, _ = nanobert.load(second)
    assert sorted(after.config.id2label.values()) == ["bad", "good", "meh"]
    assert torch.allclose(before.bert.blocks[0].up.weight, after.bert.blocks[0].up.weight, atol=1e-6)


def test_a_classifier_keeps_its_label_order_when_fine_tuned_again(tiny_dir, tmp_path, capsys):
    """A classifier whose labels are the data's in another order (good, bad) had its
    outputs renamed to the data's sorted order (bad, good): every prediction swapped.
    Its order is kept; a classifier of as many labels with other names gets a new head."""
    import json as _json
    rows = sentiment_rows(12, 0)
    data = write_tsv(tmp_path / "d.tsv", rows)
    flags = ["--epochs", "1", "--batch-size", "8", "--max-length", "16", "--no-progress"]
    first = tmp_path / "first"
    assert cli.main(["finetune", "--task", "classify", "--model", str(tiny_dir), "--train",
                     str(data), "--dev", str(data), "--out", str(first)] + flags) == 0
    # the same classifier with its labels named in the other order (rows swapped too)
    swapped = tmp_path / "swapped"
    model, tok = nanobert.load(first)
    with torch.no_grad():
        model.classifier.weight.copy_(model.classifier.weight.flip(0))
        model.classifier.bias.copy_(model.classifier.bias.flip(0))
    model.config.id2label = {0: "good", 1: "bad"}
    model.save_pretrained(swapped, tokenizer=tok)
    text = "the movie was great"

    def said(d):
        assert cli.main(["predict", "--model", str(d), "--json", text]) == 0
        return _json.loads(capsys.readouterr().out.splitlines()[-1])
    want = said(first)
    assert said(swapped)["label"] == want["label"]
    again = tmp_path / "again"
    assert cli.main(["finetune", "--task", "classify", "--model", str(swapped), "--train",
                     str(data), "--dev", str(data), "--out", str(again), "--lr", "1e-12",
                     "--warmup-ratio", "0"] + flags) == 0
    assert "kept in that order" in capsys.readouterr().err
    got = said(again)
    assert got["label"] == want["label"] and got["probability"] == pytest.approx(
        want["probability"], abs=1e-3)
    # its f1 is still the 'good' label's (the second in the data's order), not id 1's
    scores = []
    for d in (first, again):
        assert cli.main(["evaluate", "--model", str(d), "--data", str(data), "--json"]) == 0
        scores.append(_json.loads(capsys.readouterr().out.splitlines()[-1]))
    assert scores[0]["f1"] == pytest.approx(scores[1]["f1"], abs=1e-9)
    assert scores[0]["accuracy"] == pytest.approx(scores[1]["accuracy"], abs=1e-9)
    # two labels of other names: a new head, said
    other = write_tsv(tmp_path / "o.tsv", [(t, {"good": "yes", "bad": "no"}[l]) for t, l in rows])
    assert cli.main(["finetune", "--task", "classify", "--model", str(first), "--train",
                     str(other), "--dev", str(other), "--out", str(tmp_path / "o")] + flags) == 0
    assert (f"{first}: its classifier's labels (bad, good) are not the training data's (no, yes): "
            "a new head is trained on its encoder") in capsys.readouterr().err


def test_teachers_pass_on_what_they_learnt_and_are_checked(tiny_dir, tmp_path, capsys):
    """--teacher: with all the weight on the teachers' soft predictions, a run on
    training labels that are pure noise still learns the task the teachers learnt (and
    with none on them it cannot); teachers of another task, label set or vocabulary, and
    tasks without per-label outputs, are refused in one line."""
    from nanobert.distill import Ensemble, teacher_loss_fn
    good = write_tsv(tmp_path / "good.tsv", sentiment_rows(24, 0))
    rows = sentiment_rows(24, 0)
    noise = write_tsv(tmp_path / "noise.tsv",   # every other label flipped: no signal
                      [(t, l if i % 4 < 2 else {"good": "bad", "bad": "good"}[l])
                       for i, (t, l) in enumerate(rows)])
    common = ["--model", str(tiny_dir), "--dev", str(good), "--epochs", "12", "--lr", "3e-3",
              "--batch-size", "8", "--max-length", "16", "--no-progress"]
    teacher = tmp_path / "teacher"
    assert cli.main(["finetune", "--task", "classify", "--train", str(good), "--out",
                     str(teacher)] + common) == 0
    capsys.readouterr()

    import shutil
    twin = shutil.copytree(teacher, tmp_path / "twin")      # two teachers (one named twice
                                                            # is refused: a doubled vote)

    def student(weight, out):   # (weight None: no teachers, the gold labels alone)
        taught = ([] if weight is None else ["--teacher", str(teacher), str(twin),
                                             "--teacher-weight", weight, "--temperature", "1"])
        rc = cli.main(["finetune", "--task", "classify", "--train", str(noise), "--out",
                       str(out)] + taught + common)
        printed = capsys.readouterr().out
        assert rc == 0
        assert cli.main(["evaluate", "--model", str(out), "--data", str(good), "--json"]) == 0
        return printed, last_json(capsys)["accuracy"]
    printed, learnt = student("1", tmp_path / "s1")
    assert "learning from 2 teacher(s)" in printed and "ensemble's dev accuracy: 1.0000" in printed
    assert learnt >= 0.9
    _, alone = student(None, tmp_path / "s0")
    assert alone <= 0.8

    # the loss: the head's alone at weight 0; nothing to learn from a copy of oneself
    model, tok, _ = load_finetuned(teacher)
    model.cpu().eval()
    batch = dict(tok(["the movie was great", "a dull plot"]), labels=torch.tensor([1, 0]))
    with torch.no_grad():
        own = model(**batch).loss
        assert torch.allclose(teacher_loss_fn(Ensemble([model]), 0.0, 2.0)(model, batch), own)
        assert teacher_loss_fn(Ensemble([model]), 1.0, 2.0)(model, batch).abs() < 1e-6

    # a teacher whose labels are the run's in another order (a checkpoint's order, kept
    # when it was fine-tuned again) is read by name: it was refused, showing two
    # identical sorted lists
    import copy
    import dataclasses
    from nanobert.distill import load_teachers
    swapped = copy.deepcopy(model)
    with torch.no_grad():
        swapped.classifier.weight.copy_(model.classifier.weight.flip(0))
        swapped.classifier.bias.copy_(model.classifier.bias.flip(0))
    names = model.config.id2label
    swapped.config = dataclasses.replace(model.config, id2label={0: names[1], 1: names[0]})
    ens = load_teachers(["swapped"], "classify", model, tok,
                        lambda d: (swapped, tok, {"task": "classify"}))
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
    with torch.no_grad():
        assert torch.allclose(ens.probabilities(**inputs),
                              Ensemble([model]).probabilities(**inputs), atol=1e-6)

    # refused in one line, exit status 2, naming the teacher
    ner = ner_files(tmp_path)
    ner_model = tmp_path / "ner"
    finetune("ner", str(tiny_dir), ner, ner, ner_model, epochs=1, batch_size=8, max_length=16,
             progress=False)
    tagger, tok, _ = load_finetuned(ner_model)
    tagger.cpu().eval()
    batch = dict(tok(["Alice met Bob", "Carol lives in Rome ."]),
                 labels=torch.tensor([[-100, 1, 0, 1, -100, -100, -100], [-100, 1, 0, 0, 2, 0, -100]]))
    with torch.no_grad():   # per token: only the labelled positions, padding left out
        own = tagger(**batch).loss
        assert torch.allclose(teacher_loss_fn(Ensemble([tagger]), 0.0, 2.0)(tagger, batch), own)
        assert teacher_loss_fn(Ensemble([tagger]), 1.0, 2.0)(tagger, batch).abs() < 1e-6
    three = write_tsv(tmp_path / "three.tsv", rows[:10] + [("the plot", "meh")])
    paired = tmp_path / "paired.tsv"       # pairs, where the teacher learnt single texts
    paired.write_text("sentence1\tsentence2\tlabel\n"
                      + "".join(f"{t}\t{t}\t{y}\n" for t, y in rows[:12]))
    other_vocab = tiny_model_dir(tmp_path / "other", POS + NEG + FILLER[:6], 120, ". ,")
    base, base_tok = nanobert.load(tiny_dir)
    mlm = tmp_path / "mlm"
    nanobert.Bert(base.config, "mlm").save_pretrained(mlm, tokenizer=base_tok)
    cases = [(["--train", str(good), "--teacher", str(ner_model)], "a fine-tuned ner model"),
             (["--train", str(good), "--teacher", str(mlm)],      # pretrained, not fine-tuned
              f"--teacher {mlm}: not a fine-tuned classify"),
             (["--train", str(good), "--teacher", str(teacher), "--model", str(other_vocab)],
              "its vocabulary differs from --model's"),
             (["--train", str(three), "--teacher", str(teacher)], "its labels ['bad', 'good'] are "
              "not the training data's ['bad', 'good', 'meh']"),
             (["--train", str(good), "--teacher", str(teacher), "--teacher-weight", "1.5"],
              "--teacher-weight: got 1.5"),
             (["--train", str(good), "--temperature", "3"], "--temperature: only with --teacher"),
             (["--train", str(paired), "--dev", str(paired), "--teacher", str(teacher)],
              "trained on single texts, but the training data are text pairs")]
    for i, (flags, why) in enumerate(cases):
        try:  # (a bad flag value ends in argparse's exit)
            rc = cli.main(with_flags(["finetune", "--task", "classify", "--out",
                                      str(tmp_path / f"x{i}")] + common, flags))
        except SystemExit as e:
            rc = e.code
        err = capsys.readouterr().err
        assert rc == 2 and why in err and len(err.strip().splitlines()) == 1, err
        assert not (tmp_path / f"x{i}").exists()          # nothing left behind
    rc = cli.main(["finetune", "--task", "regress", "--model", str(tiny_dir), "--train",
                   str(good), "--dev", str(good), "--teacher", str(teacher), "--out",
                   str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert rc == 2 and "--teacher: a regress run cannot learn from teachers" in err


class FakeTagger(torch.nn.Module):
    """A token-classification 'model' whose tag of each token is fixed by its id (`tags`:
    token id -> label id, 0 = O elsewhere): what a word gets is then known exactly."""
    head = "token"

    def __init__(self, id2label: dict, tags: dict):
        super().__init__()
        self.config = type("C", (), {"id2label": id2label})()
        self.tags = tags
        self.w = torch.nn.Parameter(torch.zeros(1))

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        logits = torch.zeros(*input_ids.shape, len(self.config.id2label))
        for b in range(input_ids.shape[0]):
            for t, i in enumerate(input_ids[b].tolist()):
                logits[b, t, self.tags.get(i, 0)] = 5.0
        return type("O", (), {"logits": logits})()


def test_plain_lines_taken_for_conll_as_one_sentence_get_a_note(tmp_path, capsys):
    """Sentences that each end in 'O' look like CoNLL columns (a token, its tag): the
    file became one sentence of their first words, answered with exit 0 and nothing said.
    A file read so as one sentence of several lines is named; real CoNLL stays quiet."""
    from nanobert.finetune import ner_inputs
    plain = tmp_path / "o2.txt"
    plain.write_text("My blood type is O\nHer blood type is O\n")
    assert [s.words for s in ner_inputs(plain)] == [["My", "Her"]]
    assert capsys.readouterr().err == (
        f"nanobert: note: {plain}: read as CoNLL columns (a token and its tag a line), so "
        "its 2 lines are one sentence; for one text a line, give a table with a 'text' "
        "column or JSON Lines\n")
    conll = tmp_path / "t.conll"
    conll.write_text("John B-PER\nsaid O\n\nhello O\n")
    assert [s.words for s in ner_inputs(conll)] == [["John", "said"], ["hello"]]
    assert capsys.readouterr().err == ""


def test_ner_predict_on_conll_words_gives_the_tags_evaluate_scores(minilm, tmp_path):
    """`predict --input FILE.conll` tags the file's words as `evaluate` does (the tag of a
    word is its first sub-word's). Before, the sentence was joined by spaces and split
    again by the tokenizer, so "U.S." became four words, three of them tagged on pieces
    the model never learnt to tag: the entity came out as "U" and the predictions scored
    by hand were not the numbers `evaluate` printed."""
    from nanobert.data import Example
    from nanobert.finetune import ner_inputs, ner_predict, predict_ner_words
    from nanobert.metrics import ner_metrics
    _, tok = minilm
    u, s = tok.tk.token_to_id("u"), tok.tk.token_to_id("john")
    model = FakeTagger({0: "O", 1: "B-LOC", 2: "I-LOC", 3: "B-PER"}, {u: 1, s: 3})
    conll = tmp_path / "test.conll"
    conll.write_text("-DOCSTART- -X- -X- O\n\nJohn B-PER\nvisited O\nthe O\nU.S. B-LOC\n"
                     "today O\n\nU.S. B-LOC\nand O\nJohn B-PER\n" + "x O\n" * 30 + "John B-PER\n")
    inputs = ner_inputs(conll)
    assert [type(x).__name__ for x in inputs] == ["Sentence", "Sentence"]
    settings = {"max_length": 24}   # the second sentence is read in two windows
    out = list(ner_predict(model, tok, inputs, settings))
    assert out[0]["text"] == "John visited the U.S. today"
    assert [(e["type"], e["text"]) for e in out[0]["entities"]] == [("PER", "John"),
                                                                    ("LOC", "U.S.")]
    for r in out:
        assert all(r["text"][e["start"]:e["end"]] == e["text"] for e in r["entities"])
    # the entities, read back onto the words, are evaluate's word tags
    words_tags = list(predict_ner_words(model, tok, inputs, 24))
    back = []
    for sent, r in zip(inputs, out):
        starts = [sum(len(w) + 1 for w in sent.words[:k]) for k in range(len(sent.words))]
        tags = ["O"] * len(sent.words)
        for e in r["entities"]:
            inside = [k for k, a in enumerate(starts) if e["start"] <= a < e["end"]]
            tags[inside[0]] = "B-" + e["type"]
            for k in inside[1:]:
                tags[k] = "I-" + e["type"]
        back.append(tags)
    assert back == words_tags and back[1][-1] == "B-PER"   # (the second window's)
    gold = [["B-PER", "O", "O", "B-LOC", "O"], ["B-LOC", "O", "B-PER"] + ["O"] * 30 + ["B-PER"]]
    assert ner_metrics(gold, back)["f1"] == 1.0
    assert ner_metrics(gold, back) == ner_metrics(gold, words_tags)
    # a raw text still goes through the tokenizer's words, with its own character spans
    raw = list(ner_predict(model, tok, [Example("  John\u00a0went  home")], settings))[0]
    assert raw["entities"][0]["text"] == "John" and raw["entities"][0]["start"] == 2


def test_ner_inputs_from_python_are_texts_or_word_lists(tmp_path):
    from nanobert.data import Example, Sentence
    from nanobert.finetune import ner_input, ner_inputs
    tokens = tmp_path / "test.jsonl"     # Hugging Face datasets' layout: its words, as split
    tokens.write_text('{"tokens": ["U.S.", "troops"], "ner_tags": ["B-LOC", "O"]}\n'
                      '{"tokens": ["in", "Rome"]}\n')
    assert [s.words for s in ner_inputs(tokens)] == [["U.S.", "troops"], ["in", "Rome"]]
    lines = tmp_path / "texts.txt"
    lines.write_text("U.S. troops\nin Rome\n")
    assert [e.text_a for e in ner_inputs(lines)] == ["U.S. troops", "in Rome"]
    # a table of pairs: its second texts were dropped without a word
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("sentence1\tsentence2\nU.S. troops\tin Rome\n")
    with pytest.raises(NanobertError, match=f"^{pairs}:2: a tagger reads one text a row, and "
                                            "this row is a pair; name the text's column with "
                                            "--text-column"):
        ner_inputs(pairs)
    assert ner_inputs(pairs, {"text_column": "sentence2"}) == [Example("in Rome", line=2)]
    assert ner_input(0, "Carol lives in Rome") == Example("Carol lives in Rome")
    assert ner_input(0, ["U.S.", "troops"]) == Sentence(["U.S.", "troops"])
    for bad in (("a", "b"), ["two words"], [], [""], 3):
        with pytest.raises(NanobertError):
            ner_input(0, bad)


def test_classification_inputs_mix_single_texts_and_pairs(minilm):
    """Each input is encoded as what it is: before, the first input decided for the whole
    batch, so a pair after a single text lost its second text silently."""
    from nanobert.data import Example
    from nanobert.finetune import encode_classification
    _, tok = minilm
    ex = [Example("a cat sat"), Example("a cat sat", "on the mat"), Example("dogs", "")]
    items = encode_classification(tok, ex, 16)
    one = tok.tk.encode("a cat sat")
    two = tok.tk.encode("a cat sat", "on the mat")
    three = tok.tk.encode("dogs", "")
    assert [it["input_ids"] for it in items] == [one.ids, two.ids, three.ids]
    assert [it["token_type_ids"] for it in items] == [one.type_ids, two.type_ids, three.type_ids]
    assert 1 in items[1]["token_type_ids"] and set(items[0]["token_type_ids"]) == {0}


def test_classification_training_features_are_held_as_token_ids(minilm, monkeypatch):
    """A training set's features were a dict of two lists of Python ints per example (a
    million SST-2 sentences: 1.3 GB). classify_features keeps token ids (FeatureRows):
    each item reads as encode_classification's dict, and the epoch's batches are the
    same."""
    import nanobert.tokenizer as T
    from nanobert.data import Example
    F = importlib.import_module("nanobert.finetune")
    _, tok = minilm
    examples = [Example(f"{'a very ' * (i % 6)}good film {i}", None if i % 3 else "so it is",
                        ("pos", "neg")[i % 2]) for i in range(50)]
    l2i = {"neg": 0, "pos": 1}
    want = F.encode_classification(tok, examples, 12, l2i)
    monkeypatch.setattr(T, "CHUNK_CHARS", 300)
    got = F.classify_features(tok, examples, {"max_length": 12}, l2i)
    assert isinstance(got, F.FeatureRows) and len(got) == 50
    assert [got[i] for i in range(50)] == want
    assert got.lengths() == [len(it["input_ids"]) for it in want]
    cfg = type("C", (), {"batch_size": 8, "group_by_length": True,
                         "trainer": type("T", (), {"seed": 3})()})()
    new, n_new = F.feature_batches(got, cfg, 0)
    old, n_old = F.feature_batches(want, cfg, 0)
    assert n_new == n_old == 7
    for a, b in zip(new(1, 0), old(1, 0)):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_classifier_at_chance_on_dev_is_said_to_be(tiny_dir, tmp_path, capsys):
    """A short run on a few hundred SST-2 rows at the defaults stayed at chance (dev
    accuracy 0.52, 101 of 200 negative), and 'best dev ... model saved' read as a success."""
    train = write_tsv(tmp_path / "train.tsv", sentiment_rows(16, 0))
    rows = [r for r in sentiment_rows(16, 1) if r[-1] == "good"]    # one label: chance is 1.0
    dev = write_tsv(tmp_path / "dev.tsv", rows)
    assert cli.main(["finetune", "--task", "classify", "--model", str(tiny_dir), "--train",
                     str(train), "--dev", str(dev), "--out", str(tmp_path / "m"), "--max-steps",
                     "1", "--batch-size", "8", "--max-length", "16", "--no-progress"]) == 0
    said = [x for x in capsys.readouterr().err.splitlines() if "no better than" in x]
    assert len(said) == 1 and said[0].endswith(
        "than always answering the commonest label, 'good' (1.0000): train longer (--epochs), "
        "or on small data try --pooling mean --lr 1e-4 --head-lr-scale 10"), said


def test_classify_predict_yields_a_chunk_before_reading_the_next(tiny_dir, monkeypatch):
    """`predict` on a million texts printed nothing until all were scored; the results of
    each chunk now come before the next is tokenized, equal to predict_classify's."""
    from nanobert.data import Example
    F = importlib.import_module("nanobert.finetune")
    model, tok = nanobert.load(tiny_dir, head="classify", num_labels=2,
                               id2label={0: "neg", 1: "pos"})
    examples = [Example(f"{POS[i % len(POS)]} film {'and ' * (i % 4)}{i}",
                        None if i % 3 else "so it is") for i in range(23)]
    encoded = counted_chunks(monkeypatch, tok, 5)
    results = F.classify_predict(model.eval(), tok, examples, {"max_length": 16}, 4)
    first = next(results)
    assert first["text"] == examples[0].text_a and first["pair"] == "so it is"
    assert 1 <= len(encoded) <= 2          # (one chunk: its single texts and its pairs)
    probs = F.predict_classify(model, tok, examples, 16, 4)
    got = [first] + list(results)
    assert [r["label"] for r in got] == [("neg", "pos")[i] for i in probs.argmax(-1).tolist()]
    assert [r["probability"] for r in got] == pytest.approx(probs.max(-1).values.tolist())


def test_a_word_of_no_tokens_inside_an_entity_continues_it():
    """A word no sub-word reads (a lone soft hyphen or zero-width space in a CoNLL
    sentence) was O, so `John \xad Smith` (gold B-PER I-PER I-PER) came out as two
    entities, which seqeval counts wrong. Between two words of one entity it is I-X; at
    an entity's edge, or between two entities, it stays O."""
    from nanobert.finetune import bridged
    id2label = {0: "O", 1: "B-PER", 2: "I-PER", 3: "B-LOC"}
    inside = bridged({0: (1, 0.9), 2: (2, 0.8)}, 3, id2label)
    assert inside == {0: (1, 0.9), 1: (2, 0.9), 2: (2, 0.8)}
    assert bridged({0: (1, 0.9), 3: (2, 0.8)}, 4, id2label)[2] == (2, 0.9)   # two in a row
    for preds, n in [({0: (1, 0.9), 2: (1, 0.8)}, 3),   # a new PER after it
                     ({0: (1, 0.9), 2: (3, 0.8)}, 3),   # a LOC after it
                     ({0: (0, 0.9), 2: (2, 0.8)}, 3),   # after O
                     ({0: (1, 0.9)}, 2)]:               # at the end
        assert bridged(preds, n, id2label) == preds


def test_entities_end_at_a_word_with_no_prediction():
    """A word with no prediction is O for `entity_spans` (`bridged` gives one to a word
    of no tokens inside an entity first); the entities end there."""
    from nanobert.finetune import entity_spans
    id2label = {0: "O", 1: "B-PER", 2: "I-PER"}
    spans = {0: (0, 3), 1: (4, 5), 2: (6, 9)}
    ents = entity_spans("Ann \u200b Lee", spans, {0: (1, 0.9), 2: (2, 0.8)}, id2label)
    assert [(e["text"], e["start"]) for e in ents] == [("Ann", 0), ("Lee", 6)]
    ents = entity_spans("Ann Lee", {0: (0, 3), 1: (4, 7)}, {0: (1, 0.9), 1: (2, 0.7)}, id2label)
    assert [(e["text"], e["score"]) for e in ents] == [("Ann Lee", 0.8)]


def test_entities_take_the_marks_that_follow_a_word():
    """An uncased tokenizer strips accents, so "Zoe\u0308" is a token of "Zoe" and the
    mark maps to no token: the entity ended before it. A word now ends after the
    characters that attach to its last one (combining marks, variation selectors, the
    zero-width joiner), never over whitespace (a mark after a space is not its) or into
    the next word; a zero-width space separates."""
    from nanobert.finetune import entities
    tok = tiny_tokenizer()
    id2label = {0: "O", 1: "B-PER"}

    def spans(text):
        enc = tok.encode_batch([text])[0]
        words = {w for w in enc.word_ids if w is not None}
        return [e["text"] for e in entities(text, enc.offsets, enc.word_ids, {w: (1, 0.9) for w in words}, id2label)]

    assert spans("met Zoe\u0308 Smith") == ["met", "Zoe\u0308", "Smith"]
    assert spans("Zoe\u0308\u0301 Orle\u0301ans") == ["Zoe\u0308\u0301", "Orle\u0301ans"]
    assert spans("love\u2764\ufe0f x") == ["love\u2764\ufe0f", "x"]     # (one [UNK])
    assert spans("Ann\ufe0f\u200d Lee") == ["Ann\ufe0f\u200d", "Lee"]
    assert spans("Ann \u0308Lee") == ["Ann", "Lee"]
    assert spans("Ann\u0308.Lee") == ["Ann\u0308", ".", "Lee"]
    assert spans("Ann\u200b Lee") == ["Ann", "Lee"]


def test_entities_of_byte_level_words_take_their_combining_marks():
    """Byte-level BPE (RoBERTa) pre-tokenizes the accent of a decomposed "Zoe\u0301" as a
    word of its own: the entity ended before it ("Zoe"), or the accent was one. A mark
    right after a word is that word's (its tag is the word's, from its first sub-word);
    marks that open a word before other characters leave those a word; composed (NFC)
    text gives the same spans."""
    from nanobert.finetune import entities
    from test_qa import _byte_level_bpe
    tk = _byte_level_bpe()
    id2label = {0: "O", 1: "B-PER", 2: "I-PER"}

    def spans(text, tags):
        enc = tk.encode(text)
        assert len({w for w in enc.word_ids if w is not None}) == len(tags)   # the words
        got = entities(text, enc.offsets, enc.word_ids, {w: (t, 0.9) for w, t in enumerate(tags)},
                       id2label)
        return [e["text"] for e in got]

    nfd = "met Zoe\u0301 Smith"
    assert spans(nfd, [0, 1, 0, 2]) == ["Zoe\u0301 Smith"]       # the accent's tag: not read
    assert spans(nfd, [1, 1, 1, 1]) == ["met", "Zoe\u0301", "Smith"]
    nfc = unicodedata.normalize("NFC", nfd)
    assert spans(nfc, [0, 1, 2]) == ["Zo\u00e9 Smith"]
    assert spans(nfc, [1, 1, 1]) == ["met", "Zo\u00e9", "Smith"]
    assert spans("Zoe\u0308\u0301", [1, 0]) == ["Zoe\u0308\u0301"]   # two marks, one word
    assert spans("Ann\u0308.Lee", [1, 1, 1]) == ["Ann\u0308", ".", "Lee"]
    assert spans("Ann \u0308Lee", [1, 0, 1]) == ["Ann", "Lee"]     # after a space: not its


def test_entity_scores_are_not_rounded():
    """Rounded to 4 places, the scores of the server and of Predictor differed by the
    rounding when the batches differed; `predict` rounds only what it prints."""
    from nanobert.finetune import entity_spans, ner_show
    ents = entity_spans("Ann Lee", {0: (0, 3), 1: (4, 7)}, {0: (1, 0.123456), 1: (2, 0.2)},
                        {0: "O", 1: "B-PER", 2: "I-PER"})
    assert ents[0]["score"] == (0.123456 + 0.2) / 2
    assert "[PER 0:7 'Ann Lee' 0.16]" in ner_show({"text": "Ann Lee", "entities": ents})
    # the entity's text is escaped as the text line is: a no-break space stays raw (repr
    # wrote \xa0), a tab and a line break are escaped
    ents = entity_spans("Ann\u00a0L\te", {0: (0, 3), 1: (4, 7)}, {0: (1, 0.5), 1: (2, 0.5)},
                        {0: "O", 1: "B-PER", 2: "I-PER"})
    assert "[PER 0:7 'Ann\u00a0L\\te' 0.50]" in ner_show({"text": "x", "entities": ents})


def tiny_tokenizer():
    """An uncased WordPiece vocabulary (BERT's normalizer strips accents)."""
    words = "ann lee met zoe smith orleans love x".split()
    return nanobert.Tokenizer.train([" ".join(words)] * 3 + ["? . , !"], vocab_size=80,
                                    min_frequency=1)


def test_entity_spans_read_bioes_and_bare_labels():
    """Checkpoints tagged elsewhere: BIOES (E- continues, S- is one word) and bare labels
    (IO tagging, 'LABEL_1' from an unnamed head) were read as if their first two
    characters were 'B-'/'I-' (types 'BEL_1')."""
    from nanobert.finetune import entity_spans
    text = "Ann Lee met Bo in Rome"
    words = text.split()
    spans, pos = {}, 0
    for i, w in enumerate(words):
        spans[i] = (pos, pos + len(w))
        pos += len(w) + 1

    def ents(tags):
        id2label = dict(enumerate(sorted(set(tags))))
        ids = {t: i for i, t in id2label.items()}
        preds = {i: (ids[t], 0.9) for i, t in enumerate(tags)}
        return [(e["type"], e["text"]) for e in entity_spans(text, spans, preds, id2label)]

    assert ents(["B-PER", "E-PER", "O", "S-PER", "O", "S-LOC"]) == \
        [("PER", "Ann Lee"), ("PER", "Bo"), ("LOC", "Rome")]
    assert ents(["LABEL_1", "LABEL_1", "O", "LABEL_1", "O", "LABEL_2"]) == \
        [("LABEL_1", "Ann Lee"), ("LABEL_1", "Bo"), ("LABEL_2", "Rome")]
    assert ents(["B-PER", "I-PER", "O", "I-PER", "O", "B-LOC"]) == \
        [("PER", "Ann Lee"), ("PER", "Bo"), ("LOC", "Rome")]


def test_a_model_records_whether_it_learnt_pairs_and_refuses_the_other_kind(tiny_dir, tmp_path,
                                                                              capsys):
    """nanobert.json says whether a classifier learnt text pairs; evaluate, predict (files,
    the command line, Python) and a dev file of the other kind are refused in one line,
    naming the model and the file: before, a pair model scored single texts (and a
    single-text model pairs) silently. Models without the record are not checked."""
    from nanobert.finetune import Predictor
    rows = sentiment_rows(8, 0)
    single = write_tsv(tmp_path / "single.tsv", rows)
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("sentence1\tsentence2\tlabel\n" + "".join(f"{t}\tthe plot\t{l}\n"
                                                                for t, l in rows))

    def run(*argv):
        rc = cli.main([*argv, "--no-progress"] if argv[0] == "finetune" else list(argv))
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) <= 1, err
        return rc, err

    def finetune_on(name, train, dev):
        return run("finetune", "--task", "classify", "--model", str(tiny_dir), "--train",
                   str(train), "--dev", str(dev), "--out", str(tmp_path / name),
                   "--max-steps", "1", "--batch-size", "8", "--max-length", "16")

    assert finetune_on("p", pairs, pairs)[0] == 0 and finetune_on("s", single, single)[0] == 0
    p, s = tmp_path / "p", tmp_path / "s"
    assert json.loads((p / "nanobert.json").read_text())["pairs"] is True
    assert json.loads((s / "nanobert.json").read_text())["pairs"] is False
    rc, err = finetune_on("x", pairs, single)
    assert rc == 2 and f"{single}: single texts, but the training file {pairs} has text " \
                      "pairs" in err

    for model, data, kind in ((p, single, "single texts"), (s, pairs, "text pairs")):
        for argv in (["evaluate", "--data", str(data)], ["predict", "--input", str(data)]):
            rc, err = run(argv[0], "--model", str(model), *argv[1:])
            assert rc == 2 and f"{data}: {kind}, but the model {model} was trained on" in err, err
    rc, err = run("predict", "--model", str(p), "the movie")
    assert rc == 2 and f"{p} was trained on text pairs: give the second text with --context" in err
    rc, err = run("predict", "--model", str(s), "the movie", "--context", "the plot")
    assert rc == 2 and f"{s} was trained on single texts: --context" in err
    assert run("predict", "--model", str(p), "the movie", "--context", "the plot")[0] == 0
    assert run("evaluate", "--model", str(p), "--data", str(pairs))[0] == 0
    with pytest.raises(NanobertError, match=r"input 1: one text, but .* trained on text pairs"):
        Predictor(p).predict([("the movie", "the plot"), "the movie"])
    assert Predictor(s).predict("the movie")["label"] in ("good", "bad")
    # a pair's texts come back apart, as a regression model's do (they were joined by
    # " ||| ", which a text may hold)
    got = Predictor(p).predict(("the movie ||| x", "the plot"))
    assert (got["text"], got["pair"]) == ("the movie ||| x", "the plot")
    assert "pair" not in Predictor(s).predict("the movie")
    capsys.readouterr()
    assert cli.main(["predict", "--model", str(p), "a film", "--context", "a plot"]) == 0
    assert capsys.readouterr().out.rstrip("\n").split("\t")[2:] == ["a film", "a plot"]

    # a model without the record (an older run, a transformers checkpoint): not checked
    (p / "nanobert.json").write_text(json.dumps({"task": "classify", "max_length": 16}))
    assert run("evaluate", "--model", str(p), "--data", str(single))[0] == 0
    # a record that is no boolean, or settings that are no object: named, not ignored
    for settings, says in (({"task": "classify", "pairs": "yes"}, "pairs must be true or false"),
                           (["classify"], "not a JSON object of settings")):
        (p / "nanobert.json").write_text(json.dumps(settings))
        rc, err = run("evaluate", "--model", str(p), "--data", str(single))
        assert rc == 2 and f"{p / 'nanobert.json'}: {says}" in err, err


def test_labels_come_from_the_whole_training_file_not_the_sample(tiny_dir, tmp_path):
    """--max-train-examples samples the training file; the label set is the whole file's,
    so a dev label the sample lacks is known (it was 'unknown label' at the dev file)."""
    rows = sentiment_rows(12, 0) + [("the plot was so so", "meh")]
    train = write_tsv(tmp_path / "train.tsv", rows)
    dev = write_tsv(tmp_path / "dev.tsv", rows[-3:])
    out = tmp_path / "out"
    assert cli.main(["finetune", "--task", "classify", "--model", str(tiny_dir), "--train",
                     str(train), "--dev", str(dev), "--out", str(out), "--epochs", "1",
                     "--max-train-examples", "4", "--max-length", "16", "--no-progress"]) == 0
    model, _ = nanobert.load(out)
    assert sorted(model.config.id2label.values()) == ["bad", "good", "meh"]


def test_a_dev_label_missing_from_the_training_file_names_that_file(tiny_dir, tmp_path, capsys):
    """The labels a fine-tuned head knows come from its training file, so a dev label
    outside it is reported against that file (it said "the model knows", and the model
    given was an encoder with no labels), before any training or output directory."""
    train = write_tsv(tmp_path / "train.tsv", sentiment_rows(8, 0))
    dev = write_tsv(tmp_path / "dev.tsv", sentiment_rows(2, 1) + [("so so", "meh")])
    out = tmp_path / "out"
    rc = cli.main(["finetune", "--task", "classify", "--model", str(tiny_dir), "--train",
                   str(train), "--dev", str(dev), "--out", str(out), "--epochs", "1",
                   "--max-length", "16", "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and f"{dev}:4: unknown label 'meh' (the training file {train} has bad, good)" in err
    assert not out.exists()


def head_dir(tiny_dir, out, head, settings, id2label=None):
    """tiny_dir's encoder under a new random `head`, saved with its nanobert.json
    (`settings`; None: without one)."""
    from nanobert.checkpoint import save_model
    base, tok = nanobert.load(tiny_dir)
    config = base.config
    if id2label is not None:
        config = nanobert.preset("tiny", vocab_size=config.vocab_size, id2label=id2label,
                                 max_position_embeddings=config.max_position_embeddings)
    extra = {} if settings is None else {"nanobert.json": json.dumps(settings)}
    save_model(nanobert.Bert(config, head), out, tokenizer=tok, extra_files=extra)
    return out


def test_plain_predict_output_keeps_one_record_a_line(tiny_dir, tmp_path, capsys):
    """Plain `predict` printed texts raw: a newline or tab inside one split its record
    over two lines, or into more tab-separated fields. They are escaped as Python writes
    them in a string (a backslash too, so the escapes read back); --json is unchanged."""
    clf = head_dir(tiny_dir, tmp_path / "clf", "classify",
                    {"task": "classify", "max_length": 32, "pairs": False}, {0: "bad", 1: "good"})
    texts = ["two\nlines\there", "back\\slash \\n not a newline", "cr\r\x1b\u2028 é\u0301 🙂"]
    assert cli.main(["predict", "--model", str(clf)] + texts) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and all(len(line.split("\t")) == 3 for line in lines)
    shown = [line.split("\t")[2] for line in lines]
    assert shown == ["two\\nlines\\there", "back\\\\slash \\\\n not a newline",
                     "cr\\r\\x1b\\u2028 é\u0301 🙂"]
    assert [eval(f"'{s}'") for s in shown] == texts                # they read back
    assert cli.main(["predict", "--model", str(clf), "--json"] + texts) == 0
    assert [json.loads(x)["text"] for x in capsys.readouterr().out.splitlines()] == texts

    reader = head_dir(tiny_dir, tmp_path / "qa", "qa",
                       {"task": "qa", "max_length": 32, "doc_stride": 8})
    assert cli.main(["predict", "--model", str(reader), "--context", "alice lives\tin paris",
                     "where does\nalice\tlive"]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    question, answer, score, prob = line.split("\t")
    assert question == "where does\\nalice\\tlive" and "\t" not in answer


def test_plain_output_cuts_a_huge_text_and_json_keeps_it_whole(tiny_dir, tmp_path, capsys):
    """A 200 MB input line was printed whole by plain `predict` and `search`; a text is
    now cut to about files.SHOWN_CHARS there, its start and end kept, and --json keeps it."""
    from nanobert.files import SHOWN_CHARS
    clf = head_dir(tiny_dir, tmp_path / "clf", "classify",
                    {"task": "classify", "max_length": 16, "pairs": False}, {0: "bad", 1: "good"})
    text = "alice " * 5000 + "the end"
    (tmp_path / "in.txt").write_text(text + "\nshort one\n")
    assert cli.main(["predict", "--model", str(clf), "--input", str(tmp_path / "in.txt")]) == 0
    long, short = capsys.readouterr().out.splitlines()
    shown = long.split("\t")[2]
    assert len(shown) < SHOWN_CHARS + 50 and shown.startswith("alice alice")
    assert shown.endswith("alice the end") and f"[... {len(text) - SHOWN_CHARS:,} characters" \
        in shown and short.endswith("\tshort one")
    assert cli.main(["predict", "--model", str(clf), "--json", "--input",
                     str(tmp_path / "in.txt")]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[0])["text"] == text
    assert cli.main(["search", "--model", str(tiny_dir), "--corpus", str(tmp_path / "in.txt"),
                     "--query", "alice", "-k", "2"]) == 0
    hits = [x for x in capsys.readouterr().out.splitlines() if x.startswith("  ")]
    assert len(hits) == 2 and max(len(h) for h in hits) < SHOWN_CHARS + 80


def test_long_sentences_are_tagged_in_windows_word_by_word(minilm, capsys):
    """A sentence over max_length tokens is tagged in overlapping windows, not cut (its
    last words were O): each word gets its own first sub-word's tag, also where a window
    opens on a continuation ("##") of a word begun in the window before."""
    from nanobert.data import Sentence
    from nanobert.finetune import predict_ner_words
    _, tok = minilm
    vocab = tok.tk.get_vocab()
    # first sub-words tag B-LOC (1), continuations I-PER (2): a word read on a
    # continuation would come out I-PER
    tags = {i: 2 if t.startswith("##") else 1 for t, i in vocab.items() if t.isalpha()
            or t.startswith("##")}
    model = FakeTagger({0: "O", 1: "B-LOC", 2: "I-PER"}, tags)
    words = ("Wolfeschlegelsteinhausen visited extraordinarily unpronounceable "
             "municipalities yesterday").split() * 12
    n_tokens = len(tok.tk.encode(words, is_pretokenized=True).ids)
    assert n_tokens > 4 * 24
    s = Sentence(words, ["O"] * len(words), 1)
    for max_length in (16, 17, 24, 512):
        assert list(predict_ner_words(model, tok, [s], max_length)) == [["B-LOC"] * len(words)]
    assert "1 sentence over 16 tokens was tagged in windows overlapping by 7 tokens" \
        in capsys.readouterr().err


def test_predictor_says_the_windows_note_once(tiny_dir, tmp_path, capsys):
    """Predictor.predict, called again and again, said "N texts over ... were tagged in
    windows" at each new count N: it is said once per Predictor (a new one says it again)."""
    tagger = head_dir(tiny_dir, tmp_path / "tagger", "token", {"task": "ner", "max_length": 16},
                      {0: "O", 1: "B-PER", 2: "I-PER"})
    long = " ".join(NAMES * 8)                         # over 16 tokens
    p = nanobert.Predictor(tagger)
    capsys.readouterr()
    for n in (1, 2, 3, 1):
        assert len(p.predict([long] * n + ["bob"])) == n + 1
    err = capsys.readouterr().err
    assert err.count("tagged in windows") == 1 and "1 text over 16 tokens was" in err
    nanobert.Predictor(tagger).predict([long, long])
    assert "2 texts over 16 tokens were tagged in windows" in capsys.readouterr().err


def test_tagging_reads_a_chunk_of_texts_at_a_time_with_the_same_entities(tiny_dir, tmp_path,
                                                                        capsys, monkeypatch):
    """predict tagged every window of every text at once: 5,000 texts of 1,300 characters
    took +1.25 GB. Texts and CoNLL sentences are tagged tokenizer.CHUNK_CHARS at a time:
    the same entities and tags, and one windows note counting every chunk."""
    import random
    import nanobert.tokenizer as T
    from nanobert.data import Sentence
    torch.manual_seed(0)
    tagger = head_dir(tiny_dir, tmp_path / "tagger", "token", {"task": "ner", "max_length": 16},
                      {0: "O", 1: "B-PER", 2: "I-PER"})
    rnd = random.Random(0)
    texts = [" ".join(rnd.choice(NAMES) for _ in range(rnd.randint(1, 30))) for _ in range(30)]
    sentences = [Sentence(t.split(), ["O"] * len(t.split()), 1) for t in texts]
    p = nanobert.Predictor(tagger)
    whole, tags = p.predict(texts), p.predict(sentences)
    notes = capsys.readouterr().err
    monkeypatch.setattr(T, "CHUNK_CHARS", 60)
    p = nanobert.Predictor(tagger)

    def near(results):   # (other batches: float rounding in the scores)
        return [{**r, "entities": [{**e, "score": pytest.approx(e["score"], abs=1e-5)}
                                   for e in r["entities"]]} for r in results]
    assert p.predict(texts) == near(whole) and p.predict(sentences) == near(tags)
    assert capsys.readouterr().err == notes and "texts over 16 tokens were" in notes
    assert "sentences over 16 tokens were" in notes


def test_classification_is_run_a_chunk_of_texts_at_a_time_with_the_same_probabilities(
        tiny_dir, tmp_path, monkeypatch):
    """predict_classify made the features of every text before running any (a million
    texts: gigabytes of token lists). It runs tokenizer.CHUNK_CHARS at a time: the same
    probabilities, in order."""
    import nanobert.tokenizer as T
    from nanobert.data import Example
    F = importlib.import_module("nanobert.finetune")
    torch.manual_seed(0)
    path = head_dir(tiny_dir, tmp_path / "clf", "classify", {"task": "classify", "max_length": 16},
                    {0: "neg", 1: "pos"})
    model, tok, settings = F.load_finetuned(path)
    examples = [Example(" ".join(NAMES[(i + j) % 4] for j in range(1 + i % 9)),
                        None if i % 3 else "bob met carol") for i in range(40)]
    whole = F.predict_classify(model, tok, examples, 16)
    sizes, real = [], F.run_batches
    monkeypatch.setattr(F, "run_batches", lambda m, items, *a, **k: sizes.append(len(items))
                        or real(m, items, *a, **k))
    monkeypatch.setattr(T, "CHUNK_CHARS", 100)
    chunked = F.predict_classify(model, tok, examples, 16, progress=True)
    assert len(sizes) > 5 and sum(sizes) == len(examples) and max(sizes) < len(examples)
    assert torch.allclose(chunked, whole, atol=1e-6) and chunked.shape == (40, 2)


def test_predict_prints_each_chunk_of_results_before_tagging_the_next(tiny_dir, tmp_path,
                                                                      capsys, monkeypatch):
    """predict held every result until the last was made (NER's entities are ten times
    their input: 500 texts of 2-10 kB took 1.26 GB). It prints each chunk's results
    before tagging the next: the same lines, and the windows note once, counting all."""
    import nanobert.tokenizer as T
    from nanobert import cli
    F = importlib.import_module("nanobert.finetune")
    torch.manual_seed(0)
    tagger = head_dir(tiny_dir, tmp_path / "tagger", "token", {"task": "ner", "max_length": 16},
                      {0: "O", 1: "B-PER", 2: "I-PER"})
    texts = [" ".join(NAMES[(i + j) % 4] for j in range(1 + i % 25)) for i in range(30)]
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n")
    args = ["predict", "--model", str(tagger), "--input", str(tmp_path / "in.txt"), "--json"]
    assert cli.main(args) == 0
    whole = capsys.readouterr()
    monkeypatch.setattr(T, "CHUNK_CHARS", 60)
    shown, printed, real = [], [], F.run_batches

    def spy(*a, **k):   # the lines printed before each chunk is tagged
        shown.append(capsys.readouterr().out)
        printed.append("".join(shown).count("\n"))
        return real(*a, **k)
    monkeypatch.setattr(F, "run_batches", spy)
    assert cli.main(args) == 0
    out = capsys.readouterr()
    assert len(printed) > 5 and printed[0] == 0 and 0 < printed[-1] < len(texts)
    lines = [json.loads(x) for x in ("".join(shown) + out.out).splitlines()]
    want = [json.loads(x) for x in whole.out.splitlines()]
    assert [r["text"] for r in lines] == texts == [r["text"] for r in want]
    assert [[(e["type"], e["start"], e["end"]) for e in r["entities"]] for r in lines] == \
        [[(e["type"], e["start"], e["end"]) for e in r["entities"]] for r in want]
    assert "texts over 16 tokens were tagged in windows" in whole.err
    assert out.err == whole.err


class EdgeShy(torch.nn.Module):
    """A tagger that tags a token B-LOC only in the middle half of its window's room,
    O near the window's edges: what a word gets says where it was read."""
    head = "token"

    def __init__(self):
        super().__init__()
        self.config = type("C", (), {"id2label": {0: "O", 1: "B-LOC"}})()
        self.w = torch.nn.Parameter(torch.zeros(1))

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        B, T = input_ids.shape
        logits = torch.zeros(B, T, 2)
        for b in range(B):
            n = int(attention_mask[b].sum()) - 2          # the window's sentence tokens
            for t in range(T):
                logits[b, t, int(n // 4 <= t - 1 < n - n // 4)] = 5.0
        return type("O", (), {"logits": logits})()


def test_overlapping_windows_read_each_word_where_it_has_the_most_context(minilm):
    """Where windows overlap, a word's tag is read in the window where it is farthest
    from a cut edge: away from the sentence's ends, every word is read in the middle
    half of some window (the windows overlap by half their room)."""
    from nanobert.data import Sentence
    from nanobert.finetune import predict_ner_words
    _, tok = minilm
    words = [f"w{i % 10}" if i % 3 else "x" for i in range(90)]
    s = Sentence(words, ["O"] * len(words), 1)
    firsts = []                         # the sentence token of each word's first sub-word
    enc = tok.tk.encode(words, is_pretokenized=True, add_special_tokens=False)
    for g, w in enumerate(enc.word_ids):
        if g == 0 or enc.word_ids[g - 1] != w:
            firsts.append(g)
    total, room = len(enc.ids), 30
    tags = list(predict_ner_words(EdgeShy(), tok, [s], room + 2))[0]
    middle = [w for w, g in enumerate(firsts) if room // 4 <= g < total - room // 4]
    assert len(middle) > 40 and all(tags[w] == "B-LOC" for w in middle), tags
    # cut, each word was read in one window only: many were read near an edge
    from nanobert.finetune import encode_ner, run_batches, token_logits, window_word_predictions
    items = [dict(encode_ner(tok, [s], room + 2)[0], reach=[0] * (room + 2))]
    logits = run_batches(EdgeShy(), items, 4, take=token_logits)
    one = window_word_predictions(items, [0], logits, 1)[0]
    assert sum(one.get(w, (0,))[0] == 0 for w in middle) > 10


def test_raw_texts_are_tagged_in_windows_with_character_spans(minilm, capsys):
    """A raw text over max_length tokens (predict on text lines, /ner) is read in
    overlapping windows as a CoNLL sentence is: words past the first window get tags,
    each from where it has the most context, and spans are characters of the text."""
    _, tok = minilm
    words = [f"w{i % 10}" if i % 3 else "x" for i in range(90)]
    text = "  ".join(words) + " ."
    room = 30
    ents = list(predict_ner_text(EdgeShy(), tok, [text], room + 2))[0]
    assert "1 text over 32 tokens was tagged in windows" in capsys.readouterr().err
    starts = [len("  ".join(words[:w])) + 2 * (w > 0) for w in range(len(words))]
    tagged = {starts.index(e["start"]) for e in ents}
    assert all(e["text"] == words[starts.index(e["start"])] for e in ents)
    enc = tok.tk.encode(text, add_special_tokens=False)
    last_word = enc.word_ids[-room // 4 - 1]       # the last word read in some middle half
    assert set(range(6, last_word)) <= tagged, sorted(set(range(6, last_word)) - tagged)
    assert max(tagged) > 2 * room                  # far past the first window


def test_without_nanobert_json_the_tokenizers_shorter_length_holds(tiny_dir, tmp_path):
    """A classifier whose nanobert.json was lost read inputs up to the task's 128 tokens,
    though its tokenizer_config.json says the shorter length it was trained at."""
    from nanobert.finetune import load_finetuned
    d = head_dir(tiny_dir, tmp_path / "clf", "classify", None,
                 id2label={0: "bad", 1: "good"})
    conf = json.loads((d / "tokenizer_config.json").read_text())
    (d / "tokenizer_config.json").write_text(json.dumps(dict(conf, model_max_length=24)))
    assert load_finetuned(d)[2]["max_length"] == 24
    (d / "tokenizer_config.json").write_text(json.dumps(dict(conf, model_max_length=512)))
    model, _, settings = load_finetuned(d)     # the task's 128, within the model's positions
    assert settings["max_length"] == min(128, model.config.usable_positions)


def test_a_beir_folder_for_a_model_of_another_task_says_so(tiny_dir, tmp_path, capsys):
    """A regression model evaluated on a BEIR folder said only '... is a directory,
    expected a file'."""
    from nanobert import cli
    reg = head_dir(tiny_dir, tmp_path / "reg", "regression", {"task": "regress", "max_length": 16})
    beir = tmp_path / "beir"
    (beir / "qrels").mkdir(parents=True)
    (beir / "corpus.jsonl").write_text('{"_id": "d1", "text": "Paris."}\n')
    (beir / "queries.jsonl").write_text('{"_id": "q1", "text": "France?"}\n')
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    assert cli.main(["evaluate", "--model", str(reg), "--data", str(beir)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.endswith(f"({beir} holds a BEIR retrieval folder, which embed "
                                            f"and rerank models are scored on, but {reg} is a "
                                            "regress model)"), err


def test_a_new_head_on_a_checkpoint_of_another_kind_of_head(tiny_dir, tmp_path, capsys):
    """classify from a regression checkpoint (an STS model, a reranker) kept its
    problem_type: MSE against class ids, a traceback (or, at a batch size equal to the
    label count, a 'regression' model of 3 labels saved). regress from a classifier was
    refused, blaming config.json. Both now train a new head on the encoder."""
    import json
    from nanobert import cli
    reg = head_dir(tiny_dir, tmp_path / "reg", "regression", None)
    three = [(t, y) for t, y in sentiment_rows(24, 0)] + [("alice lives in paris", "other")] * 4
    train = write_tsv(tmp_path / "t.tsv", three)
    for batch in ("3", "8"):
        out = tmp_path / f"cls{batch}"
        assert cli.main(["finetune", "--task", "classify", "--model", str(reg), "--train",
                         str(train), "--dev", str(train), "--out", str(out), "--epochs", "1",
                         "--batch-size", batch, "--max-length", "16", "--no-progress"]) == 0
        config = json.loads((out / "config.json").read_text())
        assert config.get("problem_type") != "regression" and len(config["id2label"]) == 3
    cls = head_dir(tiny_dir, tmp_path / "cls", "classify", None, {0: "a", 1: "b", 2: "c"})
    sts = tmp_path / "sts.tsv"
    sts.write_text("sentence1\tsentence2\tscore\n" + "".join(
        f"{a}\t{b}\t{s}\n" for a, b, s in [("alice met bob", "bob met alice", 4.5),
                                           ("good film", "awful film", 0.5)] * 6))
    capsys.readouterr()
    assert cli.main(["finetune", "--task", "regress", "--model", str(cls), "--train", str(sts),
                     "--dev", str(sts), "--out", str(tmp_path / "r"), "--epochs", "1",
                     "--max-length", "16", "--no-progress"]) == 0
    assert "its classifier has 3 outputs, a score one: a new head is trained" in \
        capsys.readouterr().err
    assert json.loads((tmp_path / "r" / "config.json").read_text())["problem_type"] == "regression"


def test_a_classifier_of_unnamed_labels_is_evaluated_on_integer_labels(tiny_dir, tmp_path, capsys):
    """A hub classifier whose labels were never named (LABEL_0, LABEL_1) was refused on a
    GLUE file labelled 0/1 ('unknown label 1'), though finetune maps 0/1 onto it."""
    import json
    from nanobert import cli
    d = head_dir(tiny_dir, tmp_path / "m", "classify", None, {0: "LABEL_0", 1: "LABEL_1"})
    rows = [(t, "1" if y == "good" else "0") for t, y in sentiment_rows(12, 1)]
    data = write_tsv(tmp_path / "dev.tsv", rows)
    assert cli.main(["evaluate", "--model", str(d), "--data", str(data), "--json"]) == 0
    captured = capsys.readouterr()
    assert "labels 0..1 read as the model's unnamed LABEL_0..LABEL_1" in captured.err
    got = json.loads(captured.out.strip().splitlines()[-1])
    model, tok, settings = load_finetuned(d)
    from nanobert.data import Example
    probs = predict_classify(model, tok, [Example(t) for t, _ in rows], settings["max_length"])
    want = sum(int(p) == int(y) for p, (_, y) in zip(probs.argmax(-1).tolist(), rows)) / len(rows)
    assert got["n"] == 12 and got["accuracy"] == pytest.approx(want)
    words = write_tsv(tmp_path / "w.tsv", sentiment_rows(4, 1))        # good/bad: unknown
    assert cli.main(["evaluate", "--model", str(d), "--data", str(words)]) == 2
    assert "unknown label 'good'" in capsys.readouterr().err


def test_columns_saved_with_a_model_that_a_file_lacks_are_named_as_the_models(tmp_path):
    """A CoLA model trained with --text-column 3 read the CoLA test file (`index,
    sentence`) as 'no text column '3'', a flag the user never gave predict."""
    import argparse
    from nanobert.finetune import _with_columns, get_task
    f = tmp_path / "test.tsv"
    f.write_text("index\tsentence\n0\tthe dog ran\n")
    task = get_task("classify")
    settings = {"columns": {"text_column": "3", "pair_column": "4"}}
    none = argparse.Namespace(text_column=None, pair_column=None, label_column=None)
    with pytest.raises(NanobertError) as e:
        _with_columns(none, settings, lambda cols: task.inputs(f, cols))
    assert str(e.value).startswith(f"{f}:1: no text column '3'")
    assert str(e.value).endswith("(the model's columns, saved in its nanobert.json when it was "
                                 "trained with --text-column 3 --text-pair-column 4; name "
                                 "this file's with those flags)")
    given = argparse.Namespace(text_column="sentence", pair_column=None, label_column=None)
    assert [x.text_a for x in _with_columns(given, settings, lambda c: task.inputs(f, c))] \
        == ["the dog ran"]
    with pytest.raises(NanobertError) as e:      # given on the command line: as it was
        _with_columns(argparse.Namespace(text_column="7", pair_column=None, label_column=None),
                      settings, lambda cols: task.inputs(f, cols))
    assert "saved in its nanobert.json" not in str(e.value)
    # a plain file of one text a line: the saved columns are a table's, not refused (a
    # model trained with --text-column could not predict on plain text); given: refused
    plain = tmp_path / "plain.txt"
    plain.write_text("the film was good\nthe movie, it was bad\n")
    for name in ("classify", "regress", "ner"):
        got = _with_columns(none, settings, lambda c: get_task(name).inputs(plain, c))
        assert [getattr(x, "text_a", None) or x.texts[0] for x in got] == [
            "the film was good", "the movie, it was bad"], name
    with pytest.raises(NanobertError, match="--text-column sentence: .* plain text"):
        _with_columns(given, settings, lambda cols: task.inputs(plain, cols))


def test_a_dev_sample_that_cannot_be_scored_names_the_flag(tmp_path):
    """--max-dev-examples 1 drew one row of an STS file whose scores vary: the error
    blamed the file ("every score is 4.5"). It now says the sample is at fault."""
    from types import SimpleNamespace
    from nanobert.data import TextRow
    from nanobert.finetune import check_dev, get_task
    dev = tmp_path / "dev.tsv"
    rows = [TextRow(("a", "b"), s, n, dev) for n, s in ((2, 4.5), (3, 0.5), (4, 3.0))]
    cfg = SimpleNamespace(train="train.tsv", dev=dev, max_dev_examples=1)
    task = get_task("regress")
    check_dev(task, rows, rows, None, cfg)                       # the whole file: fine
    with pytest.raises(NanobertError) as e:
        check_dev(task, rows[:1], rows, None, cfg)
    assert str(e.value).startswith(f"{dev}: every score is 4.5: ") and str(e.value).endswith(
        "(only in the 1 dev example drawn by --max-dev-examples 1, not in the whole file: "
        "draw more)")
    with pytest.raises(NanobertError) as e:                      # the file itself: as it was
        check_dev(task, rows[:1], rows[:1], None, cfg)
    assert "--max-dev-examples" not in str(e.value)


@pytest.mark.parametrize("rows, shared", [
    ([("what do cats eat", "cats eat fish"), ("what do cats eat", "cats like mice")], "anchor"),
    ([("what do cats eat", "cats eat fish"), ("where is paris", "cats eat fish")], "positive")])
def test_embed_rows_with_no_negative_anywhere_are_refused(minilm, rows, shared):
    """Rows sharing an anchor (or a positive) are no negatives of each other: when every
    row shares one, the mnrl loss was 0 at every step, and the run saved the model it
    started from with exit 0 (one row a batch was already refused so)."""
    from types import SimpleNamespace
    from nanobert.biencoder import RowBatches
    from nanobert.data import TextRow
    from nanobert.finetune import row_batches
    _, tok = minilm
    cfg = SimpleNamespace(batch_size=8, train="pairs.tsv", group_by_length=False,
                          trainer=SimpleNamespace(seed=1))
    features = RowBatches(tok, [TextRow(r) for r in rows], 32)
    with pytest.raises(NanobertError, match=rf"^pairs.tsv: every training row has the same "
                                            rf"{shared}, so no row is a negative of another"):
        row_batches(features, cfg, 0)
    other = RowBatches(tok, [TextRow(r) for r in rows + [("where is rome", "in italy")]], 32)
    assert row_batches(other, cfg, 0)[1] == 1              # one batch of three rows


def test_a_file_of_one_class_is_scored_with_a_note(capsys):
    """accuracy 1.0 beside f1 0.0 and mcc 0.0, with nothing said (scikit-learn's
    'ill-defined' warnings are not shown): a note says what the scores cannot say."""
    from types import SimpleNamespace
    from nanobert.data import Example
    from nanobert.finetune import classify_check
    model = SimpleNamespace(config=SimpleNamespace(id2label={0: "neg", 1: "pos"}))
    classify_check([Example("a", label="neg"), Example("b", label="neg")], model, "n.tsv")
    assert capsys.readouterr().err == (
        "nanobert: note: n.tsv: every example is labelled 'neg': mcc is 0 whatever the model "
        "predicts (it needs two classes), and f1 (of 'pos', which it lacks) is 0\n")
    classify_check([Example("a", label="pos")], model, "p.tsv")
    assert capsys.readouterr().err.endswith("predicts (it needs two classes)\n")
    classify_check([Example("a", label="pos"), Example("b", label="neg")], model, "t.tsv")
    assert capsys.readouterr().err == ""


def test_the_default_length_fits_a_model_of_fewer_positions(tiny_dir, tmp_path, capsys):
    """A model of 64 positions: the default --max-length 128, never given, was refused as
    if the user had asked for it; it is cut to the model's 64 (qa: 384, and its default
    doc stride to half of that). An explicit --max-length 128 is still refused."""
    train = write_tsv(tmp_path / "train.tsv", sentiment_rows(8, 0))
    common = ["--model", str(tiny_dir), "--train", str(train), "--dev", str(train),
              "--epochs", "1", "--no-progress"]
    assert cli.main(["finetune", "--task", "classify", "--out", str(tmp_path / "a")] + common) == 0
    assert (f"note: {tiny_dir} reads at most 64 positions: --max-length 64 (the default, 128, "
            "is longer)") in capsys.readouterr().err
    assert json.loads((tmp_path / "a" / "nanobert.json").read_text())["max_length"] == 64
    assert cli.main(["finetune", "--task", "classify", "--out", str(tmp_path / "b"),
                     "--max-length", "128"] + common) == 2
    assert "--max-length 128 is longer than the model's 64 positions" in capsys.readouterr().err
    qa = tmp_path / "qa.jsonl"
    qa.write_text("".join(json.dumps({"id": str(i), "question": "who lives in rome ?",
                                      "context": "anna lives in rome .", "answers": ["anna"]})
                          + "\n" for i in range(4)))
    assert cli.main(["finetune", "--task", "qa", "--model", str(tiny_dir), "--train", str(qa),
                     "--dev", str(qa), "--out", str(tmp_path / "q"), "--epochs", "1",
                     "--no-progress"]) == 0
    saved = json.loads((tmp_path / "q" / "nanobert.json").read_text())
    assert (saved["max_length"], saved["doc_stride"]) == (64, 32)


def test_a_qa_input_whose_id_is_null_gets_its_position():
    """{"id": None} read as the id 'None'; a null id is no id, as when it is left out."""
    from nanobert.finetune import qa_input
    given = {"question": "who?", "context": "Ada wrote it."}
    assert qa_input(3, dict(given, id=None)).id == qa_input(3, given).id == "3"
    assert qa_input(3, dict(given, id="q7")).id == "q7"


def test_a_sample_larger_than_the_file_is_noted(tiny_dir, tmp_path, capsys):
    """--max-train-examples 1000000 on a file of 24 trained on all 24 without a word."""
    train = write_tsv(tmp_path / "train.tsv", sentiment_rows(24, 0))
    dev = write_tsv(tmp_path / "dev.tsv", sentiment_rows(8, 1))
    rc = cli.main(["finetune", "--task", "classify", "--model", str(tiny_dir), "--train",
                   str(train), "--dev", str(dev), "--out", str(tmp_path / "m"), "--max-steps", "1",
                   "--max-train-examples", "1000000", "--max-dev-examples", "5", "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 0 and f"--max-train-examples 1000000 is over the 24 examples of {train}: all " \
        "of them are used" in err
    assert "--max-dev-examples" not in err                 # (5 of 8: a sample, as asked)


def test_a_metric_named_in_python_picks_the_best_model_and_a_misspelt_one_is_refused(
        tiny_dir, tmp_path):
    from nanobert.files import NanobertError
    ft = importlib.import_module("nanobert.finetune")
    train = write_tsv(tmp_path / "train.tsv", sentiment_rows(16, 0))
    cfg = ft.FinetuneConfig(task="classify", model=str(tiny_dir), train=str(train),
                            dev=str(train)).replace(max_length=16, batch_size=8,
                                                    progress=False, epochs=1)
    with pytest.raises(NanobertError, match="metric 'f1_mcaro'"):
        ft.finetune(cfg.replace(out_dir=str(tmp_path / "a"), metric="f1_mcaro"))
    task = ft.get_task("classify")
    assert ft.dev_metric(task, [], cfg.trainer) == ("accuracy", True)
    assert ft.dev_metric(task, [], cfg.trainer.replace(metric="mcc")) == ("mcc", True)
    assert ft.dev_metric(task, [], cfg.trainer.replace(metric="dev_loss")) == ("dev_loss", False)
    assert ft.dev_metric(task, [], cfg.trainer.replace(metric="mse")) == ("mse", False)
    best = ft.finetune(cfg.replace(out_dir=str(tmp_path / "b"), metric="mcc"))
    assert "mcc" in best


def test_torchrun_two_processes_fine_tune_as_one(tiny_dir, tmp_path):
    """finetune under torchrun ran whole in each worker, which fought over --out. Now
    it runs under DDP (or FSDP, --fsdp) with the same command line: each process takes
    every other example of each batch, and the model is the one a single process trains
    (with --grad-accum 2 and --ema too). Rank 0 alone prints, evaluates and
    writes."""
    train = write_tsv(tmp_path / "train.tsv", sentiment_rows(70, 0))   # 8 batches of 8, 1 of 6
    flags = ["finetune", "--task", "classify", "--model", str(tiny_dir), "--train", str(train),
             "--dev", str(train), "--max-length", "16", "--batch-size", "8", "--epochs", "2",
             "--lr", "1e-3", "--grad-accum", "2", "--ema", "0.9", "--no-progress", "--threads", "1"]
    runs = alone_and_torchrun(tmp_path, flags, [], ["--fsdp"])
    for run in runs[1:]:
        best = [line for line in run.stdout.splitlines() if line.startswith("best dev:")]
        assert len(best) == 1 and run.stdout.count("training examples") == 1
    same_model(tmp_path, "one", "two", "two--fsdp")
    for out in ("two", "two--fsdp"):
        assert [r["loss"] for r in records(tmp_path / out)] == pytest.approx(
            [r["loss"] for r in records(tmp_path / "one")], abs=1e-5)
        assert json.loads((tmp_path / out / "nanobert-run.json").read_text())["status"] == "finished"


def test_torchrun_fsdp_tags_as_one_process(tiny_dir, tmp_path):
    """NER under FSDP: the pooler, which no token loss reaches, is frozen first, as under
    DDP; the model is the one a single process trains."""
    flags = ["finetune", "--task", "ner", "--model", str(tiny_dir), "--train",
             str(ner_files(tmp_path)), "--dev", str(tmp_path / "ner.txt"), "--batch-size", "4",
             "--epochs", "2", "--lr", "1e-3", "--no-progress", "--threads", "1"]
    alone_and_torchrun(tmp_path, flags, ["--fsdp"])
    same_model(tmp_path, "one", "two--fsdp")


def alone_and_torchrun(tmp_path, flags, *torchrun_flags) -> list:
    """`flags` run in one process ("one"), then under torchrun with 2 processes and each of
    `torchrun_flags` ("two" + the flags): the finished runs."""
    import subprocess
    import sys
    from test_pretrain import failed_ranks, free_port, subprocess_env
    env = subprocess_env(tmp_path)
    runs = [subprocess.run([sys.executable, "-m", "nanobert.cli", *flags, "--out",
                            str(tmp_path / "one")], env=env, capture_output=True, text=True)]
    assert runs[0].returncode == 0, runs[0].stderr
    for more in torchrun_flags:
        runs.append(subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
             "--master_port", str(free_port()), "-m", "nanobert.cli", *flags, *more, "--out",
             str(tmp_path / ("two" + "".join(more)))], env=env, capture_output=True, text=True,
            timeout=300))
        assert runs[-1].returncode == 0, failed_ranks(runs[-1].stderr)
    return runs


def test_a_training_set_under_the_processes_is_refused(tiny_dir, tmp_path, monkeypatch, capsys):
    """One NER sentence under torchrun with 2 processes: the second process's share of
    the only batch was empty, and collating it raised a traceback."""
    from nanobert.cli import main
    ft = importlib.import_module("nanobert.finetune")
    one, dev = tmp_path / "one.txt", tmp_path / "dev.txt"
    one.write_text("Alice B-PER\nlives O\n")
    dev.write_text("Bob B-PER\nlives O\n\nin O\nParis B-PER\n")
    monkeypatch.setattr(ft, "processes", lambda: (1, 2))        # the second of two processes
    flags = ["finetune", "--task", "ner", "--model", str(tiny_dir), "--train", str(one),
             "--dev", str(dev), "--batch-size", "2", "--max-length", "16", "--no-progress",
             "--threads", "1"]
    assert main(flags + ["--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.strip() == (
        "nanobert: error: the training set makes 1 training row(s) (examples, or windows of "
        "QA contexts), under the 2 processes torchrun started (each takes a share of each "
        "batch); run it in 1 process(es) or fewer, or give more examples")
    assert not (tmp_path / "o" / "model.safetensors").exists()


def same_model(tmp_path, *outs):
    from safetensors.torch import load_file
    first, *rest = (load_file(tmp_path / d / "model.safetensors") for d in outs)
    for other in rest:
        assert first.keys() == other.keys()
        assert max((first[k] - other[k]).abs().max().item() for k in first) < 1e-5


def records(out, kind="train"):
    return [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
            if r["type"] == kind]


def test_each_process_takes_a_share_of_each_batch_and_short_batches_join(monkeypatch):
    ft = importlib.import_module("nanobert.finetune")
    plan = [[0, 1, 2, 3], [4], [5, 6, 7], [8, 9, 10, 11]]
    assert ft.process_share(plan) == plan                      # one process: as it is
    shares = []
    for rank in (0, 1):
        monkeypatch.setattr(ft, "processes", lambda: (rank, 2))
        shares.append(ft.process_share(plan))
    assert shares == [[[0, 2, 4], [5, 7], [8, 10]], [[1, 3], [6], [9, 11]]]
    assert ft.process_share([[3], [1, 2]]) == [[1]]            # a short first batch: joined
    cfg = ft.FinetuneConfig(task="embed", model="m", train="t", dev="d")
    with pytest.raises(ft.NanobertError, match="--task embed under torchrun"):
        ft.check_processes(cfg, ft.get_task("embed"), 2)
    cfg = ft.FinetuneConfig(task="classify", model="m", train="t", dev="d", batch_size=3)
    with pytest.raises(ft.NanobertError, match="--batch-size 3 is under the 4 processes"):
        ft.check_processes(cfg, ft.get_task("classify"), 4)


def test_ner_evaluation_says_which_gold_words_no_model_can_tag(minilm, capsys, monkeypatch):
    """`finetune` said that a word maps to no token (its gold tag a miss no model could
    fix); `evaluate` on the same file did not (badinputs3). Said once per tokenizer: the
    dev set is evaluated again and again."""
    import copy
    import sys
    FT = sys.modules["nanobert.finetune"]
    tok = copy.copy(minilm[1])
    tok.__dict__.pop("_notes", None)
    s = Sentence(["John", "\u200b", "lives"], ["B-PER", "B-LOC", "O"], line=1, word_a_line=True)
    monkeypatch.setattr(FT, "predict_ner_words", lambda *a: [["B-PER", "O", "O"]])
    for _ in range(2):
        got = FT.ner_evaluate(None, tok, [s], {"max_length": 32})
    assert got["recall"] == 0.5
    assert capsys.readouterr().err == (
        "nanobert: note: 1 word maps to no token (only characters the tokenizer drops: "
        "zero-width, control, a lone accent; first '\\u200b', line 2): their tags are neither "
        "learned nor predicted\n")


def test_a_column_given_as_the_int_0_is_column_0():
    """text_column=1, label_column=0 from Python: the falsy int 0 was dropped, and the
    error then asked for --label-column (api4); a list is refused."""
    from nanobert.finetune import ColumnsConfig
    assert ColumnsConfig(text_column=1, label_column=0).given() == {"text_column": "1",
                                                                    "label_column": "0"}
    with pytest.raises(TypeError, match=r"^text_column must be a column name or a 0-based "
                                        r"index, got list \['a'\]"):
        ColumnsConfig(text_column=["a"])
