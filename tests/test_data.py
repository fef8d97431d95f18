"""Data readers: every format, well-formed and malformed (file and line in the error)."""
import json

import pytest

from nanobert import cli
from nanobert import data as D
from nanobert.data import (detect_format, iob1_to_iob2, label_set, read_classification,
                           read_conll, read_squad, read_text_lines, tsv_uses_quoting)
from nanobert.files import NanobertError


def write(tmp_path, name, text, encoding="utf-8"):
    p = tmp_path / name
    p.write_bytes(text.encode(encoding) if isinstance(text, str) else text)
    return p


# ---- classification ---------------------------------------------------------------

def test_glue_single_sentence_with_literal_quotes(tmp_path):
    # SST-2 style: quotes are ordinary characters, even unbalanced ones
    p = write(tmp_path, "sst.tsv", 'sentence\tlabel\n"a film that " hurts \t1\nplain one \t0\n'
              'it \'s " the best\t1\n')
    assert detect_format(p) == "tsv" and not tsv_uses_quoting(p)
    ex = read_classification(p)
    assert [e.text_a for e in ex] == ['"a film that " hurts ', "plain one ", 'it \'s " the best']
    assert [e.label for e in ex] == ["1", "0", "1"] and ex[0].text_b is None
    assert [e.line for e in ex] == [2, 3, 4]


def test_glue_pair_with_csv_quoting_and_extra_columns(tmp_path):
    # RTE style: a field containing quotes is wrapped in quotes, inner quotes doubled
    p = write(tmp_path, "rte.tsv", 'sentence1\tsentence2\tlabel\tidx\n'
              '"He said ""hi"" today."\tHe spoke.\tentailment\t0\n'
              'No quotes here.\tNone.\tnot_entailment\t1\n')
    assert tsv_uses_quoting(p)
    ex = read_classification(p)
    assert ex[0].text_a == 'He said "hi" today.' and ex[0].text_b == "He spoke."
    assert label_set(ex) == ["entailment", "not_entailment"]


def test_question_headers_qnli_and_qqp(tmp_path):
    p = write(tmp_path, "qnli.tsv", "index\tquestion\tsentence\tlabel\n0\tWho?\tMe.\tentailment\n")
    e = read_classification(p)[0]
    assert (e.text_a, e.text_b, e.label) == ("Who?", "Me.", "entailment")
    p = write(tmp_path, "qqp.tsv", "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n"
              "1\t2\t3\tHow to cook?\tHow do I cook?\t1\n")
    e = read_classification(p)[0]
    assert (e.text_a, e.text_b, e.label) == ("How to cook?", "How do I cook?", "1")


def test_msrp_layout_with_bom_and_no_trailing_newline(tmp_path):
    text = ("\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
            '1\t11\t12\tHe called it "odd".\tIt was "odd", he said.\n'
            "0\t13\t14\tA cat.\tA dog.")
    p = write(tmp_path, "msr.txt", text)
    assert detect_format(p) == "msrp"
    ex = read_classification(p)
    assert [(e.text_a, e.text_b, e.label) for e in ex] == [
        ('He called it "odd".', 'It was "odd", he said.', "1"), ("A cat.", "A dog.", "0")]


def test_csv_and_jsonl(tmp_path):
    p = write(tmp_path, "d.csv", 'text,label\n"Hello, world",positive\nbye,negative\n')
    ex = read_classification(p)
    assert [(e.text_a, e.label) for e in ex] == [("Hello, world", "positive"), ("bye", "negative")]
    p = write(tmp_path, "d.jsonl", '{"text_a": "a", "text_b": "b", "label": 2}\n\n'
              '{"text_a": "c", "text_b": "d", "label": 10}\n')
    ex = read_classification(p)
    assert [(e.text_a, e.text_b, e.label) for e in ex] == [("a", "b", "2"), ("c", "d", "10")]
    assert label_set(ex) == ["2", "10"]  # integers sort numerically


def test_a_missing_value_among_word_labels_and_a_stray_class_are_noted(tmp_path,
                                                                               capsys):
    """'NaN' (a missing value written out) among pos/neg trained a third class 'NaN' without
    a word; a lone '2' among 60 rows of 0/1 trained a 3-class model, said as '3 labels'."""
    p = write(tmp_path, "d.csv", "text,label\n" + "a,pos\nb,neg\n" * 3 + "c,NaN\n")
    assert label_set(read_classification(p), p) == ["NaN", "neg", "pos"]
    assert capsys.readouterr().err == (f"nanobert: note: {p}: label 'NaN' (line 8) is what a "
                                       "table writes for a missing value; it is a class here "
                                       "(fill it in, or leave the row out, if it is not one)\n")
    p = write(tmp_path, "s.tsv", "sentence\tlabel\n" + "a\t0\nb\t1\n" * 30 + "c\t2\n")
    assert label_set(read_classification(p), p) == ["0", "1", "2"]
    assert capsys.readouterr().err == (f"nanobert: note: {p}: 1 label of a single row (first "
                                       "'2', line 62) of 61: a class each, or a typo?\n")
    p = write(tmp_path, "s.tsv", "sentence\tlabel\n" + "a\t0\nb\t1\n" * 30 + "c\t2\nd\t11\n")
    label_set(read_classification(p), p)              # (two typos in a binary file too)
    assert "2 labels of a single row (first '2', line 62)" in capsys.readouterr().err
    # a class per row: swapped columns (badinputs3), said only as '4 labels'
    p = write(tmp_path, "w.tsv", "text\tlabel\n1\tgood movie\n0\tbad movie\n1\tgreat fun\n"
                                 "0\tawful film\n")
    label_set(read_classification(p), p)
    assert capsys.readouterr().err == (f"nanobert: note: {p}: 4 of the 4 labels are on a single "
                                       "row each (first 'good movie', line 2): is the label "
                                       "column a text or an id? (choose it with --label-column)\n")


def test_columns_named_by_flags(tmp_path):
    p = write(tmp_path, "d.csv", "review,stars,other\ngood,5,x\nbad,1,y\n")
    with pytest.raises(NanobertError, match=r"d\.csv:1: no text column"):
        read_classification(p)
    ex = read_classification(p, text_column="review", label_column="stars")
    assert [(e.text_a, e.label) for e in ex] == [("good", "5"), ("bad", "1")]
    with pytest.raises(NanobertError, match=r"no label column 'score'"):
        read_classification(p, text_column="review", label_column="score")
    # a file without a header: its first row named the "columns", and nothing said to give
    # their indices instead
    p = write(tmp_path, "n.tsv", "1\tI thought the ending was brilliant and I said so\n0\tdull\n")
    with pytest.raises(NanobertError, match=r"its first row reads as data, not names: a file "
                       r"without a header takes 0-based indices \(--text-column 1 "
                       r"--label-column 0\)$"):
        read_classification(p)
    ex = read_classification(p, text_column="1", label_column="0")
    assert [e.label for e in ex] == ["1", "0"]
    p = write(tmp_path, "cola.tsv", "gj04\t1\t\tOur friends won't buy this analysis, let alone "
                                   "the next one we propose.\n")           # GLUE CoLA's layout
    with pytest.raises(NanobertError, match=r"\(--text-column 3 --label-column 1\)$"):
        read_classification(p)


@pytest.mark.parametrize("name,content,where,msg", [
    ("ragged.tsv", "sentence\tlabel\nfine\t1\nno label here\n", "ragged.tsv:3", "expected 2 fields"),
    ("nolabel.tsv", "sentence\tscore\nfine\t1\n", "nolabel.tsv:1", "no label column"),
    ("empty.tsv", "", "empty.tsv", "empty file"),
    ("blank.csv", "\n\n  \n", "blank.csv", "no text (only blank lines)"),
    ("header_only.tsv", "sentence\tlabel\n", "header_only.tsv", "no examples"),
    ("bad.jsonl", '{"text": "a", "label": 1}\n{"text": "b", "label": \n', "bad.jsonl:2",
     "not valid JSON"),
    ("missing.jsonl", '{"text": "a", "label": 1}\n{"text": "b"}\n', "missing.jsonl:2",
     "missing field 'label'"),
    ("unknown.txt", "justoneword\n", "unknown.txt:1", "unknown format"),
    ("badquote.csv", 'text,label\n"never closed,1\n', "badquote.csv", "malformed CSV"),
])
def test_malformed_classification_files(tmp_path, name, content, where, msg):
    p = write(tmp_path, name, content)
    with pytest.raises(NanobertError) as e:
        read_classification(p)
    assert str(e.value).startswith(str(tmp_path / where)) and msg in str(e.value)


def test_bad_utf8_names_the_line(tmp_path):
    p = write(tmp_path, "bad.tsv", b"sentence\tlabel\ngood\t1\nbad \xff byte\t0\n")
    with pytest.raises(NanobertError, match=r"bad\.tsv:3: not valid UTF-8"):
        read_classification(p)


def test_cli_exit_status_2_on_bad_data(tmp_path, capsys):
    bad = write(tmp_path, "bad.tsv", "sentence\tlabel\nok\t1\nragged\n")
    good = write(tmp_path, "good.tsv", "sentence\tlabel\nok\t1\n")
    rc = cli.main(["finetune", "--task", "classify", "--model", "minilm", "--train", str(bad),
                   "--dev", str(good), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2 and f"{bad}:3:" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()        # nothing half-written: not even the directory


# ---- NER ----------------------------------------------------------------------------

CONLL = """-DOCSTART- -X- -X- O

John NNP B-NP B-PER
Smith NNP I-NP I-PER
lives VBZ B-VP O
in IN B-PP O
New NNP B-NP B-LOC
York NNP I-NP I-LOC
. . O O

-DOCSTART- -X- -X- O

Acme NNP B-NP B-ORG
rocks VBZ B-VP O
"""


def test_conll_iob2(tmp_path):
    s = read_conll(write(tmp_path, "a.txt", CONLL))
    assert len(s) == 2
    assert s[0].words == ["John", "Smith", "lives", "in", "New", "York", "."]
    assert s[0].tags == ["B-PER", "I-PER", "O", "O", "B-LOC", "I-LOC", "O"]
    assert s[1].words == ["Acme", "rocks"] and s[1].line == 13


def test_iob1_is_converted_to_iob2(tmp_path):
    # IOB1: I- everywhere, B- only between two adjacent entities of the same type
    text = "John I-PER\nSmith I-PER\nMary B-PER\nin O\nParis I-LOC\nBerlin I-ORG\n"
    s = read_conll(write(tmp_path, "iob1.txt", text))
    assert s[0].tags == ["B-PER", "I-PER", "B-PER", "O", "B-LOC", "B-ORG"]
    assert iob1_to_iob2(["B-X", "I-X", "O", "B-Y"]) == ["B-X", "I-X", "O", "B-Y"]  # IOB2 kept


@pytest.mark.parametrize("content,line,msg", [
    ("John B-PER\nSmith\n", 2, "expected a token and a tag"),
    ("John B-PER\nSmith X-PER\n", 2, "not IOB"),
])
def test_malformed_conll(tmp_path, content, line, msg):
    p = write(tmp_path, "bad.conll", content)
    with pytest.raises(NanobertError, match=rf"bad\.conll:{line}: .*{msg}"):
        read_conll(p)


# ---- QA -----------------------------------------------------------------------------

def squad_doc():
    ctx = "The cat sat on the mat. It was warm."
    return {"version": "1.1", "data": [{"title": "Cats", "paragraphs": [{"context": ctx, "qas": [
        {"id": "q1", "question": "Where did the cat sit?",
         "answers": [{"text": "on the mat", "answer_start": 12}, {"text": "the mat", "answer_start": 15}]},
        {"id": "q2", "question": "How was it?", "answers": [{"text": "warm", "answer_start": 31}]},
    ]}]}]}


def test_squad_reader(tmp_path):
    p = write(tmp_path, "s.json", json.dumps(squad_doc(), indent=1))
    ex = read_squad(p)
    assert [e.id for e in ex] == ["q1", "q2"] and ex[0].title == "Cats"
    assert ex[0].answers == [("on the mat", 12), ("the mat", 15)]
    assert ex[1].context[31:35] == "warm"
    # the same on one line (as some dumps are written)
    p = write(tmp_path, "s1.json", json.dumps(squad_doc()))
    assert len(read_squad(p)) == 2


def test_qa_jsonl_and_bad_squad(tmp_path):
    p = write(tmp_path, "q.jsonl", '{"question": "Who?", "context": "Me and you."}\n')
    ex = read_squad(p, require_answers=False)
    assert ex[0].question == "Who?" and ex[0].answers == []
    p = write(tmp_path, "bad.json", '{"version": "1.1",\n "data": [\n  {"title": }\n]}\n')
    with pytest.raises(NanobertError, match=r"bad\.json:3: not valid JSON"):
        read_squad(p)
    doc = squad_doc()
    del doc["data"][0]["paragraphs"][0]["qas"][1]["question"]
    p = write(tmp_path, "noq.json", json.dumps(doc))
    with pytest.raises(NanobertError, match=r"noq\.json: data\[0\].*'question'"):
        read_squad(p)


# ---- lone surrogate escapes, empty texts in one-column tables, blank files -----------

SURROGATE_FILES = [   # (name, content, reader, expected message after the path)
    ("c.jsonl", '{"text": "ok", "label": 1}\n{"text": "fine \\ud800 x", "label": 0}\n',
     lambda p: read_classification(p), ":2: field 'text'"),
    ("arr.json", '[{"text": "ok", "label": 1},\n {"text": "b", "label": "\\udfff"}]\n',
     lambda p: read_classification(p), ":2: field 'label'"),
    ("in.jsonl", '{"text": "x \\uDC00"}\n', lambda p: D.read_inputs(p), ":1: field 'text'"),
    ("ner.jsonl", '{"tokens": ["John", "\\ud800"], "ner_tags": ["B-PER", "O"]}\n',
     lambda p: read_conll(p), ":1: field 'tokens[1]'"),
    ("q.jsonl", '{"question": "who \\ud800?", "context": "John"}\n',
     lambda p: read_squad(p, require_answers=False), ":1: field 'question'"),
    ("sq.json", json.dumps({"data": [{"paragraphs": [{"context": "a", "qas": []}, {
        "context": "John \ud800 here", "qas": []}]}]}),
     lambda p: read_squad(p, require_answers=False),
     ": field 'data[0].paragraphs[1].context'"),
    ("rows.jsonl", '{"anchor": "a", "positive": "b"}\n{"anchor": "a", "positive": "\\ud83d"}\n',
     lambda p: D.read_text_rows(p), ":2: field 'positive'"),
    ("key.jsonl", '{"text": "a", "\\ud800": 1}\n', lambda p: D.read_inputs(p),
     ":1: a field name"),
]


@pytest.mark.parametrize("name,content,read,where", SURROGATE_FILES,
                         ids=[f[0] for f in SURROGATE_FILES])
def test_a_lone_surrogate_escape_in_json_names_file_line_and_field(tmp_path, name, content,
                                                                   read, where):
    # the string reached the tokenizer: a TypeError traceback, or a misleading message
    p = write(tmp_path, name, content)
    with pytest.raises(NanobertError) as e:
        read(p)
    assert str(e.value) == f"{p}{where} is not valid Unicode (a lone surrogate escape)"


def test_a_surrogate_pair_and_an_escaped_backslash_are_text(tmp_path):
    p = write(tmp_path, "ok.jsonl", '{"text": "smile \\ud83d\\ude00", "label": 1}\n'
              '{"text": "path C:\\\\ud800", "label": 0}\n')
    assert [e.text_a for e in read_classification(p)] == ["smile \U0001F600", "path C:\\ud800"]


def test_a_beir_corpus_or_queries_with_a_lone_surrogate_is_refused(tmp_path):
    root = tmp_path / "beir"
    (root / "qrels").mkdir(parents=True)
    (root / "corpus.jsonl").write_text('{"_id": "d1", "title": "t", "text": "bad \\ud800 doc"}\n')
    (root / "queries.jsonl").write_text('{"_id": "q1", "text": "who"}\n')
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    with pytest.raises(NanobertError, match=r"corpus\.jsonl:1: field 'text' is not valid Unicode"):
        D.read_beir(root)
    (root / "corpus.jsonl").write_text('{"_id": "d1", "title": "t", "text": "doc"}\n')
    (root / "queries.jsonl").write_text('{"_id": "q1", "text": "who \\udbff"}\n')
    with pytest.raises(NanobertError, match=r"queries\.jsonl:1: field 'text' is not valid"):
        D.read_beir(root)


@pytest.mark.parametrize("name,text", [
    ("one.csv", 'text\n""\nok\n"x"\n'), ("one.tsv", 'sentence\n""\nok\n"x"\n'),
    ("blank_line.csv", 'Text\n""\nok\n\n"x"\n')])
def test_a_one_column_table_keeps_its_empty_texts(tmp_path, name, text):
    # the "" row was dropped: row i of the output was no longer row i of the file
    p = write(tmp_path, name, text)
    got = D.read_inputs(p)
    assert [e.text_a for e in got] == ["", "ok", "x"] and got[0].line == 2
    assert [r.texts for r in D.read_text_rows(p)] == [("",), ("ok",), ("x",)]


def test_empty_rows_of_wider_tables_are_still_skipped(tmp_path):
    p = write(tmp_path, "two.csv", 'text,label\n""\n,\nok,1\n\n"",0\n')
    # (an input file keeps a row with an empty text; a labelled one too, with a note)
    assert [(e.text_a, e.label) for e in read_classification(p, require_label=False)] == \
        [("ok", "1"), ("", "0")]
    q = write(tmp_path, "lead.csv", '""\ntext\nok\n')   # an empty row before the header
    assert [e.text_a for e in D.read_inputs(q)] == ["ok"]


@pytest.mark.parametrize("content,msg", [("", "empty file"),
                                         ("\n \n\t\n", "no text (only blank lines)")])
def test_a_file_of_blank_lines_is_not_called_empty(tmp_path, content, msg):
    for name in ("blank.txt", "blank.jsonl", "blank.json"):
        p = write(tmp_path, name, content)
        for read in (D.read_inputs, read_squad, read_conll):
            with pytest.raises(NanobertError) as e:
                read(p)
            assert str(e.value) == f"{p}: {msg}"


def test_blank_lines_skipped_in_plain_text_are_noted_for_every_reader(tmp_path, capsys):
    p = write(tmp_path, "s.txt", "a man\n\n  \nthe sky\n\n\n")
    assert [(e.text_a, e.line) for e in D.read_inputs(p)] == [("a man", 1), ("the sky", 4)]
    assert capsys.readouterr().err == (f"nanobert: note: {p}: 2 blank lines skipped (row i of "
                                       "the output is the i-th sentence, not line i)\n")
    q = write(tmp_path, "t.txt", "a man\nthe sky\n\n\n")   # blank lines after the last text
    assert len(D.read_inputs(q)) == 2 and capsys.readouterr().err == ""


def test_plain_lines_that_all_hold_tabs_are_noted_as_a_headerless_table(tmp_path, capsys):
    """Dataset rows piped to predict without their header: each label was read as part of
    its text, which moved the prediction, without a word."""
    from nanobert.biencoder import text_rows_input
    p = write(tmp_path, "rows.txt", "a good film\t1\na bad film\t0\n")
    for read in (D.read_inputs, text_rows_input):
        assert len(read(p)) == 2
        assert capsys.readouterr().err == (
            f"nanobert: note: {p}: read as one text a line, but every line holds 1 tab(s): a "
            "table without its header? Give it a header line naming its columns (or "
            "--text-column 0 for the first), or the tabs are part of each text\n")
    assert [e.text_a for e in D.read_inputs(p, {"text_column": "0"})] == ["a good film",
                                                                          "a bad film"]
    some = write(tmp_path, "some.txt", "a good\tfilm\nno tab here\n")   # (not every line)
    assert len(D.read_inputs(some)) == 2 and capsys.readouterr().err == ""


# ---- columns that could each be the one meant; empty texts -----------------------------

@pytest.mark.parametrize("name, content, line, msg", [
    ("both.tsv", "text\tsentence\tlabel\ngood\tbad\t1\n", 1,
     "two text columns, 'text' and 'sentence': which one holds the texts would be a guess; "
     "pick one with --text-column"),
    ("case.csv", "Text,text,label\ngood,bad,1\n", 1, "two text columns, 'text' and 'Text'"),
    ("pair.jsonl", '{"sentence1": "a", "sentence2": "b", "text": "c", "label": 1}\n', 1,
     "two text columns, 'sentence1' and 'text'"),
    ("labels.tsv", "sentence\tlabel\tclass\ngood\t1\tpos\n", 1,
     "two label columns, 'label' and 'class': which one holds the labels would be a guess; "
     "pick one with --label-column"),
    # another text's pair column: the second texts were dropped and a single-text model
    # trained, without a word
    ("tb.tsv", "text\ttext_b\tlabel\ngood\tbad\t1\n", 1,
     "column 'text_b' looks like the second text of pairs, but 'text' is not its first text "
     "column; name the pair with --text-pair-column text_b (or --text-column text for single "
     "texts)"),
    ("s2.jsonl", '{"sentence": "a", "sentence2": "b", "label": 1}\n', 1,
     "column 'sentence2' looks like the second text of pairs, but 'sentence'"),
    ("tp.csv", "Text_A,TEXT_PAIR,label\ngood,bad,1\n", 1, "column 'TEXT_PAIR' looks like"),
])
def test_two_candidate_columns_are_refused_unless_one_is_named(tmp_path, name, content, line,
                                                                msg):
    """The reader took the first of its candidate names, without a word."""
    p = write(tmp_path, name, content)
    with pytest.raises(NanobertError) as e:
        read_classification(p)
    assert str(e.value).startswith(f"{p}:{line}: {msg}")


def test_a_named_column_settles_which_one(tmp_path):
    p = write(tmp_path, "both.tsv", "text\tsentence\tlabel\tclass\ngood\tbad\t1\tpos\n")
    e = read_classification(p, text_column="sentence", label_column="class")[0]
    assert (e.text_a, e.text_b, e.label) == ("bad", None, "pos")
    # a text column and its pair column are one choice (QNLI: question, sentence)
    q = write(tmp_path, "qnli.tsv", "question\tsentence\tlabel\nWho?\tMe.\t1\n")
    assert read_classification(q)[0].text_b == "Me."
    # an input file's labels are not read: two label columns are no question there
    assert D.read_inputs(p, {"text_column": "text"})[0].text_a == "good"
    # a stray pair column, named either way
    t = write(tmp_path, "tb.tsv", "text\ttext_b\tlabel\ngood\tbad\t1\n")
    assert read_classification(t, pair_column="text_b")[0].text_b == "bad"
    assert read_classification(t, text_column="text")[0].text_b is None
    # one column in two roles (GLUE CoLA's sentences taken for labels too)
    cola = write(tmp_path, "cola.tsv", "gj04\t1\t\tOur friends wont buy this.\n")
    for kw, flags in (({"text_column": "3", "label_column": "3"}, "--text-column and --label-column"),
                      ({"text_column": "3", "pair_column": "3", "label_column": "1"},
                       "--text-column and --text-pair-column")):
        with pytest.raises(NanobertError, match=f"^{cola}:1: {flags} both take column '3'"):
            read_classification(cola, **kw)
    assert read_classification(cola, text_column="3", label_column="1")[0].label == "1"


@pytest.mark.parametrize("name, content, line", [
    ("e.tsv", "sentence\tlabel\ngood\t1\n\t0\n", 3),
    ("w.csv", 'text,label\nok,1\n"  ",0\n', 3),
    ("p.tsv", "sentence1\tsentence2\tlabel\na\tb\t1\nc\t \t0\n", 3),
    ("e.jsonl", '{"text": "ok", "label": 1}\n{"text": "", "label": 0}\n', 2),
])
def test_an_empty_text_in_labelled_data_is_kept_with_a_note(tmp_path, capsys, name, content,
                                                           line):
    """A label learnt, or scored, for no input: kept (QQP's train file has a few, and
    other tools read them), with one note naming the first."""
    p = write(tmp_path, name, content)
    assert len(read_classification(p)) == 2
    assert capsys.readouterr().err == (f"nanobert: note: {p}:{line}: 1 labelled example(s) "
                                       "with an empty text (kept; fill the cells or remove "
                                       "the rows if they were lost on the way)\n")
    assert len(read_classification(p, require_label=False)) == 2   # an input file: inputs
    assert capsys.readouterr().err == (f"nanobert: note: {p}:{line}: 1 input(s) with an empty "
                                       "text (kept; fill the cells or remove the rows if they "
                                       "were lost on the way)\n")


def test_an_empty_question_or_context_is_refused(tmp_path):
    doc = squad_doc()
    doc["data"][0]["paragraphs"][0]["qas"][1]["question"] = "  "
    p = write(tmp_path, "s.json", json.dumps(doc))
    for require in (True, False):
        with pytest.raises(NanobertError) as e:
            read_squad(p, require_answers=require)
        assert str(e.value) == f"{p}: question 'q2' is empty (fill it in or remove the question)"
    p = write(tmp_path, "q.jsonl", '{"question": "Who?", "context": "Me."}\n'
              '{"id": "b", "question": "", "context": "You."}\n')
    with pytest.raises(NanobertError, match=r"q\.jsonl:2: question 'b' is empty"):
        read_squad(p, require_answers=False)
    p = write(tmp_path, "q.csv", "question,context\nWho?,\n")
    with pytest.raises(NanobertError, match=r"q\.csv:2: question '2': its context is empty"):
        read_squad(p, require_answers=False)


def test_a_text_of_invisible_characters_is_empty(tmp_path, capsys):
    """Zero-width spaces, joiners and a byte-order mark tokenize to [CLS] [SEP]: such a
    text was trained on without a word, and such a question read as asked."""
    from nanobert.data import blank
    assert blank("\u200b\u200c\u200d\ufeff") and blank(" \xad\t") and blank("")
    assert not blank("e\u0301") and not blank("\u200ba")
    assert all(map(blank, ("\ufe0f", "\u034f", "\u3164", "\u2800", "\u180b")))   # drawn as nothing
    assert not any(map(blank, ("\u0600", "\u06dd", "\U0001F468\u200d\U0001F469")))  # drawn
    p = write(tmp_path, "t.tsv", "sentence\tlabel\nfine\t1\n\u200b\u200d\t0\n")
    assert len(read_classification(p)) == 2
    assert f"{p}:3: 1 labelled example(s) with an empty text" in capsys.readouterr().err
    doc = squad_doc()
    doc["data"][0]["paragraphs"][0]["qas"][1]["question"] = "\ufeff\u200b"
    p = write(tmp_path, "s.json", json.dumps(doc))
    with pytest.raises(NanobertError) as e:
        read_squad(p)
    assert str(e.value) == (f"{p}: question 'q2' is empty (only invisible characters, such "
                            "as U+FEFF) (fill it in or remove the question)")
    lines = write(tmp_path, "in.txt", "good film\n\u200b\n\nbad\n")   # skipped as blank
    assert [e.text_a for e in read_text_lines(lines)] == ["good film", "bad"]
    assert "in.txt: 2 blank lines skipped" in capsys.readouterr().err


def test_an_unknown_label_lists_a_dozen_of_the_known_ones(tmp_path):
    """A training file of 1,000 classes made the error one line of 10,000 characters."""
    p = write(tmp_path, "dev.tsv", "sentence\tlabel\na\tc0007\nb\tnew\n")
    many = {f"c{i:04d}": i for i in range(1000)}
    with pytest.raises(NanobertError) as e:
        D.check_labels(read_classification(p), many, p)
    assert str(e.value) == (f"{p}:3: unknown label 'new' (the model knows " +
                            ", ".join(f"c{i:04d}" for i in range(12)) + ", ... (1000 in all))")
    with pytest.raises(NanobertError, match=r"\(the model knows a, b\)$"):
        D.check_labels(read_classification(p), {"a": 0, "b": 1}, p)
    # "01" is a code (leading zero), unlike "1.0" or "1e0": the refusal says why
    codes = write(tmp_path, "codes.tsv", "sentence\tlabel\na\t1e0\nb\t01\n")
    with pytest.raises(NanobertError) as e:
        D.check_labels(read_classification(codes), {"0": 0, "1": 1}, codes)
    assert str(e.value) == (f"{codes}:3: unknown label '01' (the model knows 0, 1); with its "
                            "leading zero '01' is read as a code, not the number 1")


def test_a_column_name_alone_on_the_first_line_is_a_header_not_a_text(tmp_path, capsys):
    """`cut -f1 dev.tsv | nanobert predict --input -`: the GLUE header 'sentence' had been
    predicted as the first text, every output row one below its input, silently."""
    from nanobert.data import read_inputs
    f = tmp_path / "in.txt"
    f.write_text("sentence\ngood movie\nbad movie\n")
    assert [e.text_a for e in read_inputs(f)] == ["good movie", "bad movie"]
    assert f"{f}:1: 'sentence' read as the name of the text column" in capsys.readouterr().err
    f.write_text("Text\nfine\n")
    assert [e.text_a for e in read_inputs(f)] == ["fine"]
    for kept in ("text\n", "sentences\ngood\n", "the text\ngood\n"):   # one line; not a name
        f.write_text(kept)
        assert [e.text_a for e in read_inputs(f)] == kept.split("\n")[:-1]
    assert capsys.readouterr().err.count("read as the name") == 1


def test_a_table_under_a_data_key_is_not_taken_for_squad(tmp_path):
    """{"data": [{"text", "label"}]} was named 'QA data (SQuAD JSON ...)' in the hint of
    its error; a pretty-printed SQuAD file (its first line '{') was not known as QA."""
    from nanobert.data import task_of_file
    f = tmp_path / "t.json"
    f.write_text('{"data": [{"text": "fine", "label": 1}]}')
    assert task_of_file(f) is None
    squad = {"version": "1.1", "data": [{"title": "t", "paragraphs": [
        {"context": "a b", "qas": [{"id": "1", "question": "a?",
                                    "answers": [{"text": "a", "answer_start": 0}]}]}]}]}
    f.write_text(json.dumps(squad))
    assert task_of_file(f) == "qa"
    f.write_text(json.dumps(squad, indent=2))
    assert task_of_file(f) == "qa"


def test_squad_v2_unanswerable_questions_read_for_prediction_get_a_note(tmp_path, capsys):
    from nanobert.data import read_squad
    f = tmp_path / "v2.json"
    f.write_text(json.dumps({"version": "v2.0", "data": [{"title": "t", "paragraphs": [
        {"context": "the cat sat", "qas": [
            {"id": "a", "question": "who sat?", "answers": [{"text": "the cat", "answer_start": 0}],
             "is_impossible": False},
            {"id": "b", "question": "who flew?", "answers": [], "is_impossible": True}]}]}]}))
    assert [q.id for q in read_squad(f, require_answers=False)] == ["a", "b"]
    assert "1 question(s) are marked is_impossible" in capsys.readouterr().err
    with pytest.raises(NanobertError, match="question 'b' has no answers .SQuAD v2.0"):
        read_squad(f)


def test_an_sts_release_file_read_by_column_index_ignores_trailing_fields(tmp_path):
    """`embed --text-column 5` on sts-dev.csv, as its error advised: refused at the first
    line with 9 fields (a source named twice), which the STS reader reads by its first 7."""
    from nanobert.data import read_classification, read_inputs
    f = tmp_path / "sts-dev.csv"
    f.write_text("main-captions\tMSRvid\t2012test\t0000\t5.000\tA man plays.\tA man is playing.\n"
                 "main-news\theadlines\t2016\t0001\t1.5\tA \"quoted\" one.\tAnother.\tsrc\tsrc\n")
    rows = read_inputs(f, {"text_column": "5"})
    assert [(e.text_a, e.line) for e in rows] == [("A man plays.", 1), ('A "quoted" one.', 2)]
    rows = read_classification(f, text_column="5", pair_column="6", label_column="4")
    assert [(e.text_b, e.label) for e in rows] == [("A man is playing.", "5"), ("Another.", "1.5")]
    with pytest.raises(NanobertError, match="--text-column sentence1: it has no header"):
        read_inputs(f, {"text_column": "sentence1"})
    with pytest.raises(NanobertError, match="no class labels; name the column to read as one"):
        read_classification(f, text_column="5")
    with pytest.raises(NanobertError, match=":1: expected at least 10 tab-separated fields"):
        read_inputs(f, {"text_column": "9"})
    with pytest.raises(NanobertError, match="finetune --task embed or rerank, read them"):
        read_inputs(f)


def test_inputs_with_an_empty_text_get_the_note_labelled_rows_get(tmp_path, capsys):
    """embed/predict kept a table's empty-text rows silently (their vectors are those of
    [CLS] [SEP]); training and tsne said so."""
    from nanobert.data import read_inputs
    f = tmp_path / "t.tsv"
    f.write_text("sentence\tlabel\nhello\t1\n\t0\nworld\t\n")
    assert [e.text_a for e in read_inputs(f)] == ["hello", "", "world"]
    assert f"{f}:3: 1 input(s) with an empty text (kept" in capsys.readouterr().err


def test_a_files_repeated_labels_are_one_string_each(tmp_path):
    """Each row kept its own copy of its label ("0", "1": 50 bytes and a number parse a
    row; a million SST-2 rows read in 302 MB, 240 MB with one string per label)."""
    p = tmp_path / "t.tsv"
    p.write_text("sentence\tlabel\n" + "".join(f"text {i}\t{i % 2}.0\n" for i in range(500)))
    labels = [e.label for e in read_classification(p)]
    assert labels[:4] == ["0", "1", "0", "1"] and len({id(x) for x in labels}) == 2
