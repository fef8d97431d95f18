"""Files a tester found misread: plain text taken for CSV, STS-B test pairs evaluated as
retrieval, constant predictions blamed on the scores, column indices, CoNLL tokens with
spaces in tab-separated files."""
from __future__ import annotations

import json

import numpy as np
import pytest

from nanobert import data as D
from nanobert import retrieval as R
from nanobert.biencoder import read_embed_data, regress_evaluate, text_rows_input
from nanobert.files import NanobertError


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def error_of(fn, *args, **kw) -> str:
    with pytest.raises(NanobertError) as e:
        fn(*args, **kw)
    assert "\n" not in str(e.value)
    return str(e.value)


# ---- 1. plain text whose first line has a comma ---------------------------------------

@pytest.mark.parametrize("first", ["Sentence, paragraph", "Text, images and video all failed to load",
                                   "Question, comment or complaint?", "text, label"])
def test_a_text_with_commas_in_line_1_is_not_a_csv_header(tmp_path, first, capsys):
    # line 1 was dropped and texts cut at their first comma ('great movie'), or the file
    # failed with 'expected 2 fields like the header'
    p = write(tmp_path, "in.txt", f"{first}\ngreat movie, truly\nawful, really\n")
    lines = [first, "great movie, truly", "awful, really"]
    assert [e.text_a for e in D.read_inputs(p)] == lines
    assert [r.texts for r in text_rows_input(p)] == [(t,) for t in lines]
    assert "note" not in capsys.readouterr().err


def test_a_real_csv_header_in_a_txt_file_is_read_with_a_note(tmp_path, capsys):
    p = write(tmp_path, "in.txt", "Text,label\n\"great movie, truly\",1\n")
    assert [(e.text_a, e.label) for e in D.read_inputs(p)] == [("great movie, truly", "1")]
    err = capsys.readouterr().err
    assert f"{p}: line 1 read as the header of a comma-separated table (Text, label)" in err
    q = write(tmp_path, "q.txt", "query,document\nwho,him\n")
    assert [r.texts for r in text_rows_input(q)] == [("who", "him")]
    assert "line 1 read as the header" in capsys.readouterr().err
    named = write(tmp_path, "n.txt", "my review,stars\nok, fine,2\n")   # named by flag: a table
    assert "expected 2 fields" in error_of(D.read_inputs, named, {"text_column": "my review"})
    csv = write(tmp_path, "in.csv", "Sentence, paragraph\na,b\n")   # a .csv is a table
    assert [e.text_a for e in D.read_inputs(csv)] == ["a"]
    tsv = write(tmp_path, "t.txt", "sentence\tlabel\ngood\t1\n")
    assert [e.text_a for e in D.read_inputs(tsv)] == ["good"]
    msrp = write(tmp_path, "msr_paraphrase_test.txt",
                 "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t1\t2\tA, b.\tC, d.\n")
    assert [(e.text_a, e.text_b) for e in D.read_inputs(msrp)] == [("A, b.", "C, d.")]
    j = write(tmp_path, "in.jsonl", json.dumps({"text": "a, b"}) + "\n")
    assert [e.text_a for e in D.read_inputs(j)] == ["a, b"]


def test_a_csv_file_predicted_by_an_embedding_model_is_a_table(tmp_path):
    # a .csv without a text column was read line by line, its header an input
    p = write(tmp_path, "in.csv", "review,stars\nnice one,5\n")
    assert error_of(text_rows_input, p).startswith(f"{p}:1: no text column")
    assert [r.texts for r in text_rows_input(p, {"text_column": "review"})] == [("nice one",)]


# ---- 2. STS/NLI pairs without a score are no retrieval set ----------------------------

def test_sts_pairs_without_scores_are_refused_by_the_bi_encoder(tmp_path):
    # GLUE STS-B test: evaluated as retrieval, every pair (score-0 ones too) a match
    head = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\n"
    p = write(tmp_path, "g_test.tsv", head + "0\tm\tv\t2012\t1\tn\tn\tA cat.\tA man.\n")
    msg = error_of(read_embed_data, p)
    assert msg.startswith(f"{p}:1: no score column (expected one of score, similarity")
    assert "'sentence1'/'sentence2'" in msg
    for cols in ("text_a\ttext_b", "premise\thypothesis", "Sentence1\tSentence2"):
        q = write(tmp_path, "q.tsv", f"{cols}\na\tb\n")
        assert error_of(read_embed_data, q).startswith(f"{q}:1: no score column")
    assert D.read_text_rows(p)[0].score is None         # the plain reader still reads it
    scored = write(tmp_path, "s.tsv", "sentence1\tsentence2\tscore\na\tb\t4\nc\td\t1\n")
    assert read_embed_data(scored)[0].score == 4.0


@pytest.mark.parametrize("text", ["anchor\tpositive\na\tb\n", "query\tdocument\na\tb\n",
                                  "question\tanswer\na\tb\n", "query\tpassage\na\tb\n",
                                  "sentence1\tsentence2\tnegative\na\tb\tc\n"])
def test_query_positive_pairs_keep_their_retrieval_evaluation(tmp_path, text):
    rows = read_embed_data(write(tmp_path, "p.tsv", text))
    assert rows[0].texts[:2] == ("a", "b") and rows[0].score is None


def test_pairs_named_by_flag_are_taken_as_positives(tmp_path):
    p = write(tmp_path, "p.tsv", "sentence1\tsentence2\na\tb\n")
    assert read_embed_data(p, {"pair_column": "sentence2"})[0].texts == ("a", "b")


# ---- 3. constant predictions ------------------------------------------------------------

def test_constant_similarities_are_blamed_on_the_model_naming_the_file(tmp_path):
    # 'correlation needs at least two examples and scores that vary', no file named
    p = write(tmp_path, "sts-range.csv", "main\tx\t2012\t0001\t7.5\tA cat.\tA dog.\n"
                                         "main\tx\t2012\t0002\t1\tA cat.\tA dog.\n")
    rows = D.read_text_rows(p)

    def same(texts):
        return np.tile(np.array([[0.6, 0.8]], dtype=np.float32), (len(texts), 1))
    assert error_of(R.evaluate_sts, same, rows) == (
        f"{p}: the model gives every pair the same similarity (1.0000); correlation is "
        "undefined")

    sides = iter([np.eye(2, dtype=np.float32)[[0, 0]], np.eye(2, dtype=np.float32)])
    got = R.evaluate_sts(lambda texts: next(sides), rows)    # cosines 1 and 0
    assert got["n"] == 2 and got["spearman"] == pytest.approx(1.0)   # any score scale


def test_constant_regression_scores_name_the_file(tmp_path, monkeypatch):
    p = write(tmp_path, "r.tsv", "sentence1\tsentence2\tscore\na\tb\t7.5\na\tb\t1\n")
    rows = D.read_text_rows(p)
    monkeypatch.setattr(R, "pair_scores", lambda model, tok, pairs, *a: [0.25] * len(pairs))
    assert error_of(regress_evaluate, None, None, rows, {"max_length": 8}) == (
        f"{p}: the model gives every pair the same score (0.2500); correlation is undefined")


# ---- 4. columns given by index ----------------------------------------------------------

COLA = ("gj04\t1\t\tOur friends won't buy this analysis.\n"
        "gj04\t0\t*\tThey drank the pub.\n")


def test_column_indices_read_a_headerless_table(tmp_path):
    # CoLA: "no text column ... columns: 'gj04','1',..."
    p = write(tmp_path, "in_domain_train.tsv", COLA)
    got = D.read_classification(p, text_column="3", label_column="1")
    assert [(e.text_a, e.label, e.line) for e in got] == [
        ("Our friends won't buy this analysis.", "1", 1), ("They drank the pub.", "0", 2)]
    assert [e.text_a for e in D.read_inputs(p, {"text_column": "3"})][1] == "They drank the pub."
    txt = write(tmp_path, "cola.txt", COLA)
    assert len(D.read_inputs(txt, {"text_column": "3"})) == 2
    pair = write(tmp_path, "p.csv", "x,a,b\ny,c,d\n")
    assert [(e.text_a, e.text_b) for e in D.read_inputs(
        pair, {"text_column": "1", "pair_column": "2"})] == [("a", "b"), ("c", "d")]
    assert "no text column '7'" in error_of(D.read_classification, p, text_column="7",
                                            label_column="1")
    rows = D.read_text_rows(write(tmp_path, "s.tsv", "a\tb\t0.5\nc\td\t1\n"),
                            columns={"text": "0", "pair": "1", "score": "2"})
    assert [(r.texts, r.score) for r in rows] == [(("a", "b"), 0.5), (("c", "d"), 1.0)]


def test_predict_reads_json_lines_of_which_some_have_no_label(tmp_path):
    """Unlabelled reading (predict --input): a line without the label field was refused
    ("missing field 'label' (other lines have it)"), though a null label was read."""
    p = write(tmp_path, "u.jsonl", '{"text": "a", "label": null}\n{"text": "b"}\n'
                                   '{"text": "c", "label": "pos"}\n')
    assert [(e.text_a, e.label) for e in D.read_classification(p, require_label=False)] == [
        ("a", None), ("b", None), ("c", "pos")]
    p = write(tmp_path, "l.jsonl", '{"text": "a", "label": "neg"}\n{"text": "b"}\n')
    assert "l.jsonl:2: missing field 'label', which 1 of 2 records have (the first, line 1)" in error_of(
        D.read_classification, p)                           # training data needs them all


def test_a_header_of_unknown_names_is_told_from_data_by_the_rows_after_it(tmp_path, capsys):
    """Given columns by index, a header naming no column a reader knows was read as a row:
    finetune made its `sentiment` a third class, predict answered its `body`. A first
    row of data whose label is `neg` or `positive` (names of triplet columns) was read as
    a header instead, and lost."""
    labels = ["pos", "neg", "neg", "pos", "pos", "neg", "pos", "neg", "neg", "pos"]
    body = "".join(f"{i}\tweb\t{y}\treview {i}\n" for i, y in enumerate(labels))
    p = write(tmp_path, "h.tsv", "id\tsrc\tsentiment\treview\n" + body)
    got = D.read_classification(p, text_column="3", label_column="2")
    assert [(e.text_a, e.label, e.line) for e in got][:2] == [("review 0", "pos", 2),
                                                             ("review 1", "neg", 3)]
    assert len(got) == 10 and "sentiment" not in {e.label for e in got}
    assert f"{p}:1: read as the header (its column 0 'id' is no number" in capsys.readouterr().err
    words = write(tmp_path, "w.tsv", "src\tsentiment\treview\n" + "".join(
        f"web\t{y}\tgood film {i}\n" for i, y in enumerate(labels)))
    assert len(D.read_classification(words, text_column="2", label_column="1")) == 10
    assert "its column 0 'src' is none of the 1 values the rows after it repeat" in capsys.readouterr().err
    csv = write(tmp_path, "u.csv", "review_id,body\n" + "".join(f"{i},film {i}\n" for i in range(9)))
    assert [e.text_a for e in D.read_inputs(csv, {"text_column": "1"})][0] == "film 0"
    assert "u.csv:1: read as the header (its column 0 'review_id'" in capsys.readouterr().err
    for first in ("neg", "positive"):                          # data, not a header
        names = [{"pos": first, "neg": "negative"}[y] if first == "positive" else y for y in labels]
        data = write(tmp_path, f"{first}.tsv", "".join(
            f"{y}\tgood film {i}\n" for i, y in enumerate([first] + names)))
        got = D.read_classification(data, text_column="1", label_column="0")
        assert len(got) == 11 and got[0].label == first and got[0].line == 1
    assert capsys.readouterr().err == ""
    cola = write(tmp_path, "cola.tsv", "".join(f"gj04\t{i % 2}\t\tsentence {i}\n"
                                               for i in range(20)))
    assert D.read_classification(cola, text_column="3", label_column="1")[0].line == 1
    # a first row of a class seen nowhere else, whose text is a sentence: data (TREC)
    trec = write(tmp_path, "trec.csv", "ABBR,What is the full form of .com ?\n" + "".join(
        f"{y},what is question number {i} about ?\n" for i, y in enumerate(labels)))
    got = D.read_classification(trec, text_column="1", label_column="0")
    assert len(got) == 11 and (got[0].label, got[0].line) == ("ABBR", 1)
    assert capsys.readouterr().err == ""
    # ... but a name above a column of numbers is a header, sentence or not (a survey)
    survey = write(tmp_path, "survey.csv", "respondent,rating,What did you think of the film "
                   "overall?\n" + "".join(f"{i},{y},great film {i}\n" for i, y in enumerate(labels)))
    got = D.read_classification(survey, text_column="2", label_column="1")
    assert len(got) == 10 and got[0].text_a == "great film 0"
    assert "survey.csv:1: read as the header (its column 0 'respondent'" in capsys.readouterr().err


def test_column_indices_count_the_columns_of_a_header(tmp_path):
    p = write(tmp_path, "h.tsv", "id\tsentence\tlabel\n7\tgood\t1\n")
    got = D.read_classification(p, text_column="1", label_column="2")
    assert [(e.text_a, e.label, e.line) for e in got] == [("good", "1", 2)]
    pandas = write(tmp_path, "pd.csv", ",0,1\n0,good,1\n")   # to_csv of unnamed columns
    got = D.read_classification(pandas, text_column="0", label_column="1")
    assert [(e.text_a, e.label) for e in got] == [("good", "1")]


# ---- 5. CoNLL tokens with spaces --------------------------------------------------------

def test_tab_separated_conll_tokens_may_hold_spaces(tmp_path):
    # 'New York<TAB>B-LOC' was 'expected 2 columns like line 1, found 3'
    p = write(tmp_path, "n.txt", "John\tB-PER\nNew York\tB-LOC\n\n-DOCSTART- -X- O\n\nHi\tO\n")
    got = D.read_conll(p)
    assert [(s.words, s.tags) for s in got] == [(["John", "New York"], ["B-PER", "B-LOC"]),
                                                (["Hi"], ["O"])]
    four = write(tmp_path, "f.txt", "EU\tNNP\tB-NP\tB-ORG\nSão Paulo\tNNP\tI-NP\tB-LOC\n")
    assert D.read_conll(four)[0].words == ["EU", "São Paulo"]
    spaces = write(tmp_path, "s.txt", "John B-PER\nNew York B-LOC\n")
    assert "expected 2 columns like line 1, found 3" in error_of(D.read_conll, spaces)


# ---- 6. hostile text in data files (lone surrogates, empty texts, blank files) ------------

def embed_cli(tmp_path, capsys, name, text):
    """(exit status, stderr, the .npy written or None) of `nanobert embed` on a file."""
    from nanobert.cli import main
    p = write(tmp_path, name, text)
    out = tmp_path / f"{name}.npy"
    try:
        rc = main(["embed", "--model", "minilm", "--input", str(p), "--out", str(out),
                   "--threads", "1"])
    except SystemExit as e:
        rc = e.code
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return rc, err, (np.load(out) if out.exists() else None), p


def test_embed_refuses_a_lone_surrogate_naming_file_line_and_field(tmp_path, capsys):
    # ValueError traceback: 'texts[0] is not valid Unicode', no file named
    rc, err, arr, p = embed_cli(tmp_path, capsys, "sur.jsonl",
                                '{"text": "ok", "label": 1}\n{"text": "fine \\ud800 x"}\n')
    assert rc == 2 and arr is None
    assert err == (f"nanobert: error: {p}:2: field 'text' is not valid Unicode (a lone "
                   "surrogate escape)\n")


def test_embed_keeps_the_empty_rows_of_a_one_column_csv(tmp_path, capsys):
    # 2 rows for 3 data rows: the "" row was dropped, the rows no longer lined up
    rc, err, arr, _ = embed_cli(tmp_path, capsys, "je7.csv", 'text\n""\nok\n"x"\n')
    assert rc == 0 and arr.shape == (3, 384)
    rc, _, alone, _ = embed_cli(tmp_path, capsys, "ok.csv", 'text\nok\n')
    assert np.allclose(arr[1], alone[0], atol=1e-5)


def test_embed_says_a_file_of_blank_lines_has_no_text(tmp_path, capsys):
    rc, err, arr, p = embed_cli(tmp_path, capsys, "blank.txt", "\n   \n\t\n")
    assert rc == 2 and err == f"nanobert: error: {p}: no text (only blank lines)\n"
    rc, err, arr, p = embed_cli(tmp_path, capsys, "empty.txt", "")
    assert rc == 2 and err == f"nanobert: error: {p}: empty file\n"


def test_a_pretraining_corpus_of_blank_lines_is_not_called_empty(tmp_path):
    from nanobert.corpus import iter_documents
    blank = write(tmp_path, "blank.txt", "\n  \n")
    assert error_of(lambda: list(iter_documents([blank]))) == (
        f"{blank}: no text to pretrain on (only blank lines)")
    empty = write(tmp_path, "empty.txt", "")
    assert error_of(lambda: list(iter_documents([empty]))) == (
        f"{empty}: empty file (no text to pretrain on)")


# ---- labels that differ only in capitals ------------------------------------------------

def test_labels_differing_only_in_capitals_are_refused(tmp_path):
    # 'Positive' and 'positive' silently became two classes (a classifier of three)
    p = write(tmp_path, "d.tsv", "sentence\tlabel\na\tpositive\nb\tnegative\nc\tPositive\n")
    assert error_of(D.label_set, D.read_classification(p), p) == (
        f"{p}:4: labels 'positive' and 'Positive' differ only in capitals: one class or two? "
        "write each class one way")
    one_way = write(tmp_path, "e.tsv", "sentence\tlabel\na\tPOS\nb\tneg\nc\tPOS\n")
    assert D.label_set(D.read_classification(one_way), one_way) == ["POS", "neg"]


# ---- an STS Benchmark file whose first line is off the layout ---------------------------

STS_ROW = "main-captions\tMSRvid\t2012test\t0001\t{}\tA man is dancing.\tA man dances.\n"


@pytest.mark.parametrize("name, first, msg", [
    # taken for a header: "no text column" (and its "columns" were the first row's cells)
    ("sts-dev.csv", STS_ROW.format("x.5"), "score 'x.5' is not a finite number"),
    ("pairs.tsv", STS_ROW.format("x.5"), "score 'x.5' is not a finite number"),
    # taken for a header of 6 columns: line 2 was blamed for having 7 fields
    ("sts-dev.csv", STS_ROW.format("5.0").rsplit("\t", 1)[0] + "\n",
     "expected at least 7 tab-separated fields (genre file year id score sentence1 "
     "sentence2), found 6"),
])
def test_a_bad_first_sts_row_is_named_with_its_fault(tmp_path, name, first, msg):
    p = write(tmp_path, name, first + STS_ROW.format("4.0") + STS_ROW.format("3.5"))
    with pytest.raises(NanobertError) as e:
        D.read_text_rows(p, require_score=True)
    assert str(e.value).startswith(f"{p}:1: {msg} (read as a row of the STS Benchmark layout")
    # a header that names its columns is still one
    q = write(tmp_path, "h.tsv", "genre\tfile\tyear\tid\tscore\tsentence1\tsentence2\n"
              + STS_ROW.format("4.0"))
    assert [r.score for r in D.read_text_rows(q, require_score=True)] == [4.0]


# ---- a data-format probe (2026-11-29) ----------------------------------------------------

@pytest.mark.parametrize("bom", ["", "\ufeff"])
def test_a_header_repeated_mid_file_is_refused_naming_its_line(tmp_path, bom):
    """Two files joined with cat: the second header was read as an example, and with word
    labels its column name became a class ('label')."""
    one = "text,label\ngood film,pos\nbad film,neg\n"
    p = write(tmp_path, "joined.csv", one + bom + one)
    msg = error_of(D.read_classification, p)
    assert msg.startswith(f"{p}:4: repeats the header of line 1")
    # a text that merely starts like a column name is a row
    ok = write(tmp_path, "ok.csv", one + "text,pos\n")
    assert [e.text_a for e in D.read_classification(ok)][-1] == "text"


@pytest.mark.parametrize("second", ["passage", "answer", "document", "context"])
def test_a_second_text_column_of_other_layouts_is_not_dropped(tmp_path, second):
    """BoolQ's question/passage (and question/answer tables) trained on the questions
    alone, the passages dropped without a word; now refused with the flag to name them,
    and read as pairs when named."""
    rows = [{"question": "is it wet", second: "rain fell all day", "label": True},
            {"question": "is it dry", second: "no rain for weeks", "label": False}]
    p = write(tmp_path, "boolq.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    msg = error_of(D.read_classification, p)
    assert f"column {second!r} looks like the second text of pairs; name the pair with " \
           f"--text-pair-column {second}" in msg
    ex = D.read_classification(p, pair_column=second)
    assert [(e.text_a, e.text_b) for e in ex] == [("is it wet", "rain fell all day"),
                                                 ("is it dry", "no rain for weeks")]
    assert D.read_classification(p, text_column="question")[0].text_b is None


def test_snli_rows_without_a_gold_label_are_skipped_with_a_note(tmp_path, capsys):
    """SNLI's '-' (no annotator consensus) became a fourth class."""
    rows = [("a", "b", "entailment"), ("c", "d", "-"), ("e", "f", "neutral"),
            ("g", "h", "-"), ("i", "j", "contradiction")]
    p = write(tmp_path, "snli.tsv", "sentence1\tsentence2\tgold_label\n"
              + "".join("\t".join(r) + "\n" for r in rows))
    ex = D.read_classification(p)
    assert [e.label for e in ex] == ["entailment", "neutral", "contradiction"]
    assert f"{p}:3: 2 row(s) labelled '-' (no gold label, as SNLI marks them) were skipped" \
        in capsys.readouterr().err
    only = write(tmp_path, "none.tsv", "sentence1\tsentence2\tgold_label\na\tb\t-\n")
    assert "every row is labelled '-'" in error_of(D.read_classification, only)
    # Hugging Face's -1 is kept (a class in some data), with a note
    hf = write(tmp_path, "hf.tsv", "sentence\tlabel\na\t0\nb\t-1\nc\t1\nd\t2\n")
    assert [e.label for e in D.read_classification(hf)] == ["0", "-1", "1", "2"]
    assert "1 row(s) labelled -1, kept as a class" in capsys.readouterr().err


def test_qa_inputs_to_predict_do_not_read_their_gold_answers(tmp_path):
    """predict refused a whole SQuAD file for one answer_start it never uses."""
    squad = {"data": [{"title": "t", "paragraphs": [{"context": "Paris is in France.", "qas": [
        {"id": "q1", "question": "Where is Paris?",
         "answers": [{"text": "Spain", "answer_start": 3}]}]}]}]}
    p = write(tmp_path, "wrong.json", json.dumps(squad))
    assert "answer 'Spain' does not occur in the context" in error_of(D.read_squad, p)
    ex = D.read_squad(p, require_answers=False)
    assert [(e.id, e.answers) for e in ex] == [("q1", [])]


def test_a_document_judged_relevant_to_the_query_of_its_own_id_is_kept(capsys):
    """Queries and documents numbered apart (1, 2, 3 each): the qrels' own (1, 1) answer
    was dropped as BEIR's identical-id rule drops a query found in the corpus, and a
    perfect ranking scored 0.667."""
    def encode(texts):
        return np.array([[t.count(ch) for ch in "abc"] for t in texts], dtype=np.float32) + 1e-3
    beir = D.Beir({"1": ("", "aaa"), "2": ("", "bbb"), "3": ("", "ccc")},
                  {"1": "aa", "2": "cc", "3": "bb"}, {"1": {"1": 1}, "2": {"3": 1}, "3": {"2": 1}},
                  "test")
    m = R.evaluate_beir(encode, beir)
    assert m["ndcg_at_10"] == pytest.approx(1.0)
    assert "judge 1 document(s) relevant to the query of the same id (query '1')" \
        in capsys.readouterr().err
    # an unjudged document of the query's id is still dropped (a query found in the corpus)
    run = {"q": {"q": 0.9, "d": 0.5}}
    assert R.retrieval_metrics({"q": {"d": 1}}, run)["mrr_at_10"] == 1.0


def test_a_holdout_that_holds_out_no_query_is_refused(tmp_path):
    """evaluate --holdout 0.01 on 28 queries scored all of them (the training queries too),
    as if no holdout were asked."""
    from nanobert.biencoder import scored_queries
    beir = D.Beir({f"d{i}": ("", "x") for i in range(3)}, {f"q{i}": "y" for i in range(3)},
                  {f"q{i}": {"d0": 1} for i in range(3)}, "test")
    assert scored_queries(beir, {}) is None and scored_queries(beir, {"holdout": 0}) is None
    msg = error_of(scored_queries, beir, {"holdout": 0.001})
    assert "--holdout 0.001 holds out none of its 3 judged queries" in msg
    held = next(h for h in (0.3, 0.5, 0.7, 0.9) if scored_queries(beir, {"holdout": h}))
    assert 0 < len(scored_queries(beir, {"holdout": held})) <= 3


def test_nli_classes_are_not_read_as_similarity_scores(tmp_path):
    """premise/hypothesis with 0/1/2 labels (SNLI/MNLI as Hugging Face exports them) were
    read as scores: entailment (0) became the least similar pair, and CoSENT trained on
    inverted targets without a word. A label column named by flag is taken as scores."""
    rows = [("A man eats.", "A person eats.", 0), ("A man eats.", "Someone is hungry.", 1),
            ("A man eats.", "Nobody eats.", 2)]
    p = tmp_path / "snli.jsonl"
    p.write_text("".join(json.dumps({"premise": a, "hypothesis": b, "label": y}) + "\n"
                         for a, b, y in rows))
    with pytest.raises(NanobertError, match=r"snli.jsonl:1: 'label' holds NLI classes"):
        read_embed_data(p)
    assert [r.score for r in D.read_text_rows(p, columns={"score": "label"})] == [0, 1, 2]
    words = tmp_path / "words.tsv"
    words.write_text("premise\thypothesis\tlabel\nA man eats.\tA person eats.\tentailment\n"
                     "A man eats.\tNobody eats.\tcontradiction\n")
    with pytest.raises(NanobertError, match=r"words.tsv:2: score 'entailment' is not a finite "
                                            r"number: the 'label' column holds class labels"):
        read_embed_data(words)
    # STS scores under sentence1/sentence2 stay scores, integers or not
    sts = tmp_path / "sts.tsv"
    sts.write_text("sentence1\tsentence2\tlabel\na\tb\t0\nc\td\t2\ne\tf\t1\n")
    assert [r.score for r in read_embed_data(sts)] == [0, 2, 1]


def test_json_lines_of_bare_strings_are_decoded(tmp_path):
    """A .jsonl file of JSON strings (pandas' Series.to_json(lines=True)) was read as text:
    the model saw the quotes and the escapes."""
    p = tmp_path / "texts.jsonl"
    p.write_text('"caf\\u00e9 is \\"nice\\""\n\n"bad\\nfilm"\n')
    got = D.read_inputs(p)
    assert [(e.text_a, e.line) for e in got] == [('café is "nice"', 1), ("bad\nfilm", 3)]
    q = tmp_path / "mixed.jsonl"
    q.write_text('"ok"\n{"text": "x"}\n')
    with pytest.raises(NanobertError, match=r"mixed.jsonl:2: is not a JSON string"):
        D.read_inputs(q)
    plain = tmp_path / "quotes.txt"      # a text file of quoted lines stays as written
    plain.write_text('"I love it," she said.\n')
    assert D.read_inputs(plain)[0].text_a == '"I love it," she said.'


def test_a_column_index_given_as_an_int_names_the_column(tmp_path):
    """From Python, text_column=3 found the header name '3' and then looked for the int."""
    p = tmp_path / "cola.tsv"
    p.write_text("gj04\t1\t\tOur friends will buy this.\ngj04\t0\t*\tThey drank the pub.\n")
    got = D.read_classification(p, text_column=3, label_column=1)
    assert [(e.text_a, e.label) for e in got] == [("Our friends will buy this.", "1"),
                                                  ("They drank the pub.", "0")]


def test_a_tsv_without_tabs_is_one_column_unless_its_first_line_is_a_csv_header(tmp_path):
    """A one-column .tsv of texts holding commas was split on its commas (its error named
    two columns, 'smart' and 'witty and touching'); a CSV named .tsv (a header of bare
    names) is still read as CSV."""
    from nanobert.data import detect_format, read_classification
    texts = tmp_path / "texts.tsv"
    texts.write_text("text\nsmart, witty and touching\nthe cat, the dog\n")
    assert detect_format(texts) == "tsv"
    assert [e.text_a for e in read_classification(texts, require_label=False)] == \
        ["smart, witty and touching", "the cat, the dog"]
    headless = tmp_path / "headless.tsv"
    headless.write_text("smart, witty and touching\nthe cat, the dog\n")
    with pytest.raises(NanobertError, match="columns: 'smart, witty and touching'"):
        read_classification(headless, require_label=False)
    misnamed = tmp_path / "misnamed.tsv"
    misnamed.write_text("sentence,label\nhello world,1\nbad film,0\n")
    assert detect_format(misnamed) == "csv"
    assert [(e.text_a, e.label) for e in read_classification(misnamed)] == \
        [("hello world", "1"), ("bad film", "0")]


def test_a_header_naming_neither_text_nor_label_says_both_at_once(tmp_path):
    """IMDB's `review,sentiment`: the missing text column was said, and after a second run
    the missing label column; both are said in one line (predict needs no label)."""
    from nanobert.data import read_classification
    data = tmp_path / "imdb.csv"
    data.write_text("review,sentiment\ngreat film,positive\nbad film,negative\n")
    with pytest.raises(NanobertError, match=r"imdb.csv:1: no text column .*name it with "
                                            r"--text-column \(and the label column with "
                                            r"--label-column: none is named 'label' either\)$"):
        read_classification(data)
    with pytest.raises(NanobertError, match=r"name it with --text-column$"):
        read_classification(data, require_label=False)
    with pytest.raises(NanobertError, match=r"name it with --text-column$"):
        read_classification(data, label_column="sentiment")
