"""Command-line inputs given two ways at once: `predict` with --input FILE and TEXT
arguments read the file and dropped the texts without a word."""
from __future__ import annotations

import json

import pytest

from nanobert.cli import main
from nanobert.files import with_article


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


@pytest.mark.parametrize("texts,what", [([""], ""), (["a text", "  "], ""),
                                        (["\u200b"], " (only invisible characters, such as "
                                                      "U+200B)")])
def test_predict_refuses_an_empty_text_argument_before_loading(tmp_path, capsys, texts, what):
    """`predict ""` (a TEXT from an unset shell variable) answered with a label for
    nothing; a file's blank lines are skipped with a note, the command line's refused."""
    assert main(["predict", "--model", str(tmp_path / "none"), *texts]) == 2
    assert capsys.readouterr().err == (f"nanobert: error: TEXT argument {len(texts)} is empty"
                                       f"{what}: "
                                       "give the text to predict on (a file's blank lines are "
                                       "skipped; the command line's are refused)\n")


@pytest.mark.parametrize("flag", ["--text-column", "--text-pair-column", "--label-column"])
def test_predict_refuses_column_flags_without_an_input_file(tmp_path, capsys, flag):
    """The columns of --input FILE: with TEXT arguments they were dropped without a word."""
    assert main(["predict", "--model", str(tmp_path / "none"), "a text", flag, "body"]) == 2
    assert capsys.readouterr().err == (f"nanobert: error: {flag} names a column of an --input "
                                       "table; TEXT arguments have no columns (leave it out)\n")


# ---- a fine-tuned model's nanobert.json with values of the wrong type or range --------

@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    """A tiny random two-label classifier of 32 positions (its nanobert.json is written
    by each test), and a corpus to search."""
    import nanobert
    from conftest import tiny_model_dir
    from nanobert.checkpoint import save_model
    d = tmp_path_factory.mktemp("clf")
    base, tok = nanobert.load(tiny_model_dir(d / "base", ["good", "bad", "film", "plot", "was",
                                                         "the", "fine", "dull"], 40, "."))
    config = nanobert.preset("tiny", vocab_size=base.config.vocab_size, num_hidden_layers=1,
                             id2label={0: "bad", 1: "good"}, max_position_embeddings=32)
    save_model(nanobert.Bert(config, "classify"), d / "clf", tokenizer=tok)
    (d / "corpus.txt").write_text("the film was good\nthe plot was dull\n")
    return d


@pytest.mark.parametrize("settings, says", [
    # each was a traceback (TypeError, OverflowError, ValueError) where the value was used
    ({"task": "classify", "max_length": "x"}, "max_length must be an integer >= 4, got 'x'"),
    ({"task": "classify", "max_length": -5}, "max_length must be an integer >= 4, got -5"),
    ({"task": "classify", "max_length": 2.5}, "max_length must be an integer >= 4, got 2.5"),
    # 0 and true were read as 'no limit' and 1
    ({"task": "classify", "max_length": 0}, "max_length must be an integer >= 4, got 0"),
    ({"task": "classify", "max_length": True}, "max_length must be an integer >= 4, got True"),
    # longer than the model's positions: a traceback on the first long text
    ({"task": "classify", "max_length": 10 ** 6},
     "max_length 1000000 is longer than the model's 32 positions"),
    ({"task": "classify", "columns": {"foo": "x"}}, "columns must be an object of column names"),
    ({"task": "classify", "pooling": "zzz"}, "pooling must be one of mean, cls"),
    ({"task": 5}, "task must be a string, got 5"),
])
def test_bad_settings_of_a_model_are_one_line(classifier, capsys, settings, says):
    model = classifier / "clf"
    (model / "nanobert.json").write_text(json.dumps(settings))
    assert main(["predict", "--model", str(model), "a good film"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"nanobert: error: {model / 'nanobert.json'}: {says}") and \
        err.count("\n") == 1, err


@pytest.mark.parametrize("content, says", [(b"{", ":1: not valid JSON"),
                                           (b"\xff\xfe{", ":1: not valid UTF-16"),
                                           (b"[1]", ": not a JSON object of settings")])
def test_a_reranker_with_broken_settings_is_one_line(classifier, capsys, content, says):
    """search --rerank read nanobert.json unchecked: JSONDecodeError, UnicodeDecodeError,
    AttributeError tracebacks."""
    model = classifier / "clf"
    (model / "nanobert.json").write_bytes(content)
    assert main(["search", "--model", str(classifier / "base"), "--corpus",
                 str(classifier / "corpus.txt"), "--query", "good", "--rerank", str(model)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"nanobert: error: {model / 'nanobert.json'}{says}") and \
        err.count("\n") == 1, err


def test_null_settings_count_as_not_given(classifier, capsys):
    model = classifier / "clf"
    (model / "nanobert.json").write_text(json.dumps({"task": "classify", "max_length": None,
                                                     "split": None, "pairs": False}))
    assert main(["predict", "--model", str(model), "a good film"]) == 0


# ---- finetune flags of other tasks: read by none of this run's code ----------------------

@pytest.mark.parametrize("task, flag, value, only", [
    ("classify", "--doc-stride", "4", "--task qa"),
    ("ner", "--n-best", "3", "--task qa"),
    ("classify", "--loss", "mnrl", "--task embed"),
    ("regress", "--scale", "5", "--task embed"),
    ("rerank", "--mini-batch-size", "2", "--task embed"),
    ("qa", "--split", "test", "--task embed and rerank"),
    ("embed", "--retriever", "x", "--task rerank"),
    ("classify", "--rerank-k", "5", "--task rerank"),
])
def test_finetune_refuses_a_flag_of_another_task(tmp_path, capsys, task, flag, value, only):
    """Each was dropped without a word (the run trained as if it were not given)."""
    err = finetune_error(tmp_path, capsys, task, "sentence\tlabel\ngood\t1\nbad\t0\n",
                         flag, value)
    assert err == (f"nanobert: error: {flag}: only for {only}; {with_article(task)} run "
                   "does not use it\n")


@pytest.mark.parametrize("task, flag, only", [
    ("classify", "--doc-stride", "--task qa"),
    ("classify", "--scale", "--task embed"),
    ("embed", "--rerank-k", "--task rerank"),
    ("embed", "--retriever", "--task rerank"),
    ("qa", "--holdout", "--task embed and rerank"),
    ("ner", "--n-best", "--task qa"),
])
def test_finetune_refuses_a_flag_of_another_task_at_its_default_value(tmp_path, capsys, task,
                                                                     flag, only):
    """Given at its default value, the flag was taken for not given (the check compared
    values with defaults), and dropped."""
    from nanobert.config import _get
    from nanobert.finetune import FinetuneConfig
    path = next(path for path, _, f in FinetuneConfig.flags() if f == flag)
    default = _get(FinetuneConfig.create(task=task, model="m", train="t", dev="d"), path)
    err = finetune_error(tmp_path, capsys, task, "sentence\tlabel\ngood\t1\nbad\t0\n",
                         flag, str(default))
    assert err == (f"nanobert: error: {flag}: only for {only}; {with_article(task)} run "
                   "does not use it\n")


@pytest.mark.parametrize("argv, said", [
    (["--retriever", "x"], "--retriever: only for --task rerank; an embed run does not use it"),
    (["--teacher", "t"], "--teacher: an embed run cannot learn from teachers"),
])
def test_an_embed_run_is_spelt_with_an(tmp_path, capsys, argv, said):
    """The messages read "a embed run" (a task's name after a fixed "a")."""
    err = finetune_error(tmp_path, capsys, "embed", "anchor\tpositive\na\tb\n", *argv)
    assert err.startswith(f"nanobert: error: {said}"), err


def test_finetune_refuses_teacher_settings_without_a_teacher_at_any_value(tmp_path, capsys):
    err = finetune_error(tmp_path, capsys, "classify", "sentence\tlabel\ngood\t1\n",
                         "--temperature", "2.0")
    assert err == "nanobert: error: --temperature: only with --teacher\n"


def finetune_error(tmp_path, capsys, task, table, flag, *values) -> str:
    """What `finetune --task TASK FLAG VALUE` on a training file `table` says: it must
    refuse (status 2) before making its output directory."""
    train = tmp_path / "train.tsv"
    train.write_text(table)
    out = tmp_path / "out"
    assert main(["finetune", "--task", task, "--model", str(tmp_path / "none"), "--train",
                 str(train), "--dev", str(train), "--out", str(out), flag, *values]) == 2
    assert not out.exists()
    return capsys.readouterr().err


@pytest.mark.parametrize("task, flag, value", [("embed", "--holdout", "0.3"),
                                               ("embed", "--hard-negatives", "2"),
                                               ("rerank", "--rerank-k", "5")])
def test_finetune_refuses_beir_flags_on_a_table(tmp_path, capsys, task, flag, value):
    """--holdout on scored pairs held nothing out (every row trained on, every row scored)."""
    err = finetune_error(tmp_path, capsys, task,
                         "sentence1\tsentence2\tscore\na b\tc d\t0.5\ne f\tg h\t1\n", flag, value)
    assert err == (f"nanobert: error: {flag}: only for a BEIR folder (corpus.jsonl, "
                   f"queries.jsonl, qrels/), and {tmp_path / 'train.tsv'} is not one\n")


# ---- column flags of tasks whose files have fixed fields --------------------------------

@pytest.mark.parametrize("task", ["ner", "qa"])
@pytest.mark.parametrize("flag", ["--text-column", "--text-pair-column", "--label-column"])
def test_finetune_refuses_column_flags_of_a_fixed_field_task(tmp_path, capsys, task, flag):
    """CoNLL/SQuAD readers take no column names: the flag was saved in nanobert.json and
    dropped at training time."""
    err = finetune_error(tmp_path, capsys, task, "John B-PER\nlives O\n", flag, "body")
    assert err.startswith(f"nanobert: error: {flag}: only for --task classify, regress, embed "
                          f"and rerank; {with_article(task)} run reads fixed fields (") and \
        err.endswith(") and does not use it\n") and err.count("\n") == 1, err


@pytest.fixture(scope="module")
def span_models(classifier):
    """A tiny random tagger and QA model beside the classifier (same vocabulary)."""
    import nanobert
    from nanobert.checkpoint import save_model
    base, tok = nanobert.load(classifier / "base")
    out = {}
    for head, task, labels in (("token", "ner", {0: "O", 1: "B-PER", 2: "I-PER"}),
                               ("qa", "qa", None)):
        config = nanobert.preset("tiny", vocab_size=base.config.vocab_size, num_hidden_layers=1,
                                 id2label=labels, max_position_embeddings=32)
        d = classifier / task
        save_model(nanobert.Bert(config, head), d, tokenizer=tok)
        (d / "nanobert.json").write_text(json.dumps({"task": task, "max_length": 32,
                                                     "doc_stride": 8}))
        out[task] = d
    (classifier / "ner.txt").write_text("the B-PER\nfilm O\n")
    (classifier / "qa.jsonl").write_text('{"question": "the film", "context": "the plot was '
                                         'good", "answers": [{"text": "good", '
                                         '"answer_start": 13}]}\n')
    return out


@pytest.mark.parametrize("task, command", [("ner", "evaluate"), ("qa", "evaluate"),
                                           ("qa", "predict"), ("ner", "predict")])
def test_evaluate_and_predict_refuse_column_flags_of_fixed_fields(classifier, span_models,
                                                                   capsys, task, command):
    data = classifier / ("ner.txt" if task == "ner" else "qa.jsonl")
    where = ["--data", str(data)] if command == "evaluate" else ["--input", str(data)]
    assert main([command, "--model", str(span_models[task]), *where,
                 "--text-column", "text"]) == 2
    doing = "evaluation" if command == "evaluate" else "prediction"
    err = capsys.readouterr().err
    assert err.startswith("nanobert: error: --text-column: only for classify, regress, embed "
                          f"and rerank models; {with_article(task)} {doing} reads fixed "
                          "fields (") and err.count("\n") == 1, err


def test_a_tagger_still_reads_the_text_column_of_an_input_table(classifier, span_models,
                                                                 capsys):
    table = classifier / "in.tsv"
    table.write_text("id\tbody\n1\tthe film was good\n")
    assert main(["predict", "--model", str(span_models["ner"]), "--input", str(table),
                 "--text-column", "body"]) == 0
    assert capsys.readouterr().out.startswith("the film was good")


# ---- a model whose id2label gives two ids one name ----------------------------------------

def test_a_model_with_one_label_name_twice_is_refused(classifier, tmp_path, capsys):
    import shutil
    model = tmp_path / "dup"
    shutil.copytree(classifier / "clf", model)
    (model / "nanobert.json").write_text(json.dumps({"task": "classify"}))
    config = json.loads((model / "config.json").read_text())
    config["id2label"], config["label2id"] = {"0": "good", "1": "good"}, {"good": 1}
    (model / "config.json").write_text(json.dumps(config))
    says = (f"nanobert: error: {model / 'config.json'}: id2label names 'good' for ids 0 and 1: "
            "each of the classify head's labels needs its own name\n")
    assert main(["predict", "--model", str(model), "a good film"]) == 2
    assert capsys.readouterr().err == says
    (tmp_path / "dev.tsv").write_text("sentence\tlabel\ngood film\tgood\n")
    assert main(["evaluate", "--model", str(model), "--data", str(tmp_path / "dev.tsv")]) == 2
    assert capsys.readouterr().err == says


@pytest.mark.parametrize("flag, value", [("--rerank-k", "5"), ("--retriever", "minilm")])
def test_evaluate_refuses_a_rerankers_flags_for_other_models(tmp_path, capsys, flag, value):
    """An embedding model evaluated on BEIR with --rerank-k or --retriever gave its plain
    retrieval metrics, the flag dropped without a word."""
    beir = tmp_path / "beir"
    (beir / "qrels").mkdir(parents=True)
    (beir / "corpus.jsonl").write_text('{"_id": "d1", "text": "one"}\n')
    (beir / "queries.jsonl").write_text('{"_id": "q1", "text": "first"}\n')
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    assert main(["evaluate", "--model", "minilm", "--data", str(beir), flag, value]) == 2
    assert capsys.readouterr().err == (f"nanobert: error: {flag}: only for a reranker (it sets "
                                       "the candidates a reranker orders), and minilm is an "
                                       "embed model\n")


def test_finetune_on_another_tasks_file_says_what_the_file_holds(tmp_path, capsys):
    """A table of texts for --task ner said only "tag 'label' is not IOB"; CoNLL columns
    for a classifier, only that there was no header."""
    table = tmp_path / "cls.tsv"
    table.write_text("sentence\tlabel\nEU rejects\tx\nPeter\ty\n")
    conll = tmp_path / "tags.txt"
    conll.write_text("EU B-ORG\nrejects O\n\nPeter B-PER\n")
    for task, data, hint in (
            ("ner", table, f"({table} holds a table of texts (a header of named columns), but "
                           "--task ner reads NER data (CoNLL columns))"),
            ("classify", conll, f"({conll} holds NER data (CoNLL columns), but this is a "
                                "classify run)")):
        out = tmp_path / f"out-{task}"
        assert main(["finetune", "--task", task, "--model", "minilm", "--train", str(data),
                     "--dev", str(data), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"nanobert: error: {data}:1: ") and err.endswith(hint + "\n"), err
        assert not out.exists()
    # a question/context table is QA data: a faulty one given to a QA run is not said to
    # be "a table of texts" (the hint misled), and one given to a classifier says QA
    qa_table = tmp_path / "qa.tsv"
    qa_table.write_text("question\tcontext\tanswer\nwho?\tbob is here\tbob\nwhere?\n")
    for task, says in (("qa", None), ("classify", "holds QA data (SQuAD JSON or a "
                                                  "question/context table), but this is a "
                                                  "classify run")):
        assert main(["finetune", "--task", task, "--model", "minilm", "--train",
                     str(qa_table), "--dev", str(qa_table), "--out", str(tmp_path / "q")]) == 2
        err = capsys.readouterr().err
        assert "table of texts" not in err and (says is None or says in err), err


@pytest.mark.parametrize("task, extra, message", [
    ("classify", ["--teacher", "T", "--teacher-weight", "0"],
     "--teacher-weight 0 gives the teachers' predictions no share of the loss (they would "
     "still run every step): drop --teacher"),
    ("classify", ["--teacher", "T", "U", "T/"],
     "--teacher: T/ is named twice (its vote would count double); name each teacher once"),
    ("embed", ["--batch-size", "4", "--mini-batch-size", "4"],
     "--mini-batch-size 4 is not smaller than --batch-size 4: gradient caching would change "
     "nothing; give a smaller one, or leave it out"),
])
def test_finetune_refuses_settings_that_cost_time_and_change_nothing(tmp_path, capsys, task,
                                                                   extra, message):
    """Each was accepted: a teacher run every step for a loss of weight 0, a teacher's
    vote counted twice, gradient caching in one piece."""
    (tmp_path / "T").mkdir()
    (tmp_path / "U").mkdir()
    extra = [str(tmp_path / x) if x in ("T", "U", "T/") else x for x in extra]
    err = finetune_error(tmp_path, capsys, task, "sentence\tlabel\ngood\t1\n", extra[0],
                         *extra[1:])
    assert err == "nanobert: error: " + message.replace("T/", str(tmp_path / "T/")) + "\n"


def test_a_teacher_that_does_not_exist_is_named_before_the_data_is_read(tmp_path, capsys):
    """--teacher ./nothere was found out after the training file was read and tokenized
    (its errors, or two lines of progress, came first); --model is checked at the start."""
    train = tmp_path / "train.tsv"
    train.write_text("")                                    # read first, it would be refused
    out = tmp_path / "out"
    assert main(["finetune", "--task", "classify", "--model", "minilm", "--train", str(train),
                 "--dev", str(train), "--out", str(out), "--teacher",
                 str(tmp_path / "nothere")]) == 2
    assert capsys.readouterr().err == (f"nanobert: error: --teacher {tmp_path / 'nothere'}: no "
                                       "such model directory\n")
    assert not out.exists()
    (tmp_path / "empty").mkdir()            # a folder, but no model's: found out then too
    assert main(["finetune", "--task", "classify", "--model", "minilm", "--train", str(train),
                 "--dev", str(train), "--out", str(out), "--teacher", str(tmp_path / "empty")]) == 2
    assert capsys.readouterr().err == (f"nanobert: error: --teacher {tmp_path / 'empty'}/"
                                       "config.json: missing (not a model directory)\n")


class FakeFrame:
    """What matters of a pandas DataFrame here (pandas is not a dependency): iterating it
    gives its column names."""
    columns = ["text"]
    iloc = None

    def __iter__(self):
        return iter(self.columns)


def test_a_dataframe_is_refused_not_read_as_its_column_names(classifier):
    """encode(df), Predictor.predict(df), search(.., df): one result for "text", the
    column's name, without a word (a dict is refused for the same reason). A Predictor
    pickles now too (spawn pools, joblib), with the same answers."""
    import pickle
    from nanobert import Encoder, Predictor
    model = classifier / "clf"
    (model / "nanobert.json").write_text(json.dumps({"task": "classify", "max_length": 16}))
    pred = Predictor(str(model))
    enc = Encoder(str(model), device="cpu")
    for call, name in ((lambda: enc.encode(FakeFrame()), "texts"),
                       (lambda: pred.predict(FakeFrame()), "inputs"),
                       (lambda: enc.search("good", FakeFrame()), "corpus")):
        with pytest.raises(TypeError, match=f"^{name} must be a list of strings, got a "
                                            r"FakeFrame \(its column names would be read"):
            call()
    again = pickle.loads(pickle.dumps(pred))
    assert again.predict(["a good film", "dull"]) == pred.predict(["a good film", "dull"])
