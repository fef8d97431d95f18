"""Readers read valid data correctly and refuse odd data with one line naming the file
and line (issue 11, class 5)."""
from __future__ import annotations

import json
import os

import pytest

from nanobert import data as D
from nanobert.files import NanobertError


def write(tmp_path, name, text, encoding="utf-8"):
    p = tmp_path / name
    p.write_bytes(text.encode(encoding) if isinstance(text, str) else text)
    return p


def jsonl(tmp_path, rows, name="d.jsonl"):
    return write(tmp_path, name, "".join(json.dumps(r) + "\n" for r in rows))


def error_of(fn, *args, **kw) -> str:
    with pytest.raises(NanobertError) as e:
        fn(*args, **kw)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


# ---- labels ---------------------------------------------------------------------------

def test_null_label_is_a_clean_error_for_training_and_ignored_for_prediction(tmp_path):
    p = jsonl(tmp_path, [{"text": "a", "label": 1}, {"text": "b", "label": None}])
    assert error_of(D.read_classification, p).startswith(f"{p}:2: the label is null")
    got = D.read_classification(p, require_label=False)
    assert [e.label for e in got] == ["1", None]


@pytest.mark.parametrize("values", [["1.0", "1", "0", "0.0"], [1.0, 1, 0, 0.0],
                                    ["+1", "1e0", "-0", "0."], ["1.", "10E-1", "0e5", "+0.0"]])
def test_integral_labels_are_one_class_whatever_their_spelling(tmp_path, values):
    if isinstance(values[0], str):
        p = write(tmp_path, "d.tsv", "sentence\tlabel\n" + "".join(
            f"text {i}\t{v}\n" for i, v in enumerate(values)))
    else:
        p = jsonl(tmp_path, [{"text": f"text {i}", "label": v} for i, v in enumerate(values)])
    ex = D.read_classification(p)
    assert [e.label for e in ex] == ["1", "1", "0", "0"]
    assert D.label_set(ex, p) == ["0", "1"]


def test_one_number_written_two_ways_is_refused_not_a_crash(tmp_path):
    # '01' and '1' were two labels, and label_set's int() made both '1': a KeyError
    p = write(tmp_path, "d.tsv", "sentence\tlabel\na\t1\nb\t0\nc\t01\nd\t00\n")
    assert error_of(D.label_set, D.read_classification(p), p) == (
        f"{p}:4: labels '1' and '01' are the same number written two ways; write each class "
        "one way")
    codes = write(tmp_path, "c.tsv", "sentence\tlabel\na\t010\nb\t007\nc\t2\n")  # codes stay
    assert D.label_set(D.read_classification(codes), codes) == ["2", "007", "010"]
    assert D.integral_label("1.5") == "1.5" and D.integral_label("9" * 80) == "9" * 80


def test_non_finite_labels_are_missing_values_not_classes(tmp_path):
    # JSON NaN / Infinity (and 'nan' among numbers in a table) became classes 'nan', 'inf'
    p = write(tmp_path, "d.jsonl", '{"text": "a", "label": 1}\n{"text": "b", "label": NaN}\n')
    assert error_of(D.read_classification, p).startswith(f"{p}:2: label nan is not a finite number")
    q = write(tmp_path, "d.jsonl", '{"text": "a", "label": 1}\n{"text": "b", "label": -Infinity}\n')
    assert "not a finite number" in error_of(D.read_classification, q)
    t = write(tmp_path, "d.tsv", "sentence\tlabel\na\t1\nb\t0\nc\tnan\n")
    assert error_of(D.label_set, D.read_classification(t), t) == \
        f"{t}:4: label 'nan' is not a number like the other labels (a missing value?)"
    # a number past float range: it was written out as 401 digits and called no number
    big = write(tmp_path, "b.tsv", "sentence\tlabel\na\t1\nb\t0\nc\t1e400\n")
    assert error_of(D.label_set, D.read_classification(big), big) == \
        f"{big}:4: label '1e400' is too large a number (beyond float range)"
    assert D.integral_label("1e3") == "1000" and D.integral_label("1e400") == "1e400"
    words = write(tmp_path, "w.tsv", "sentence\tlabel\na\tnan\nb\tpos\n")   # a name, not a number
    assert D.label_set(D.read_classification(words), words) == ["nan", "pos"]


def test_empty_labels_are_unlabelled_rows_for_prediction(tmp_path):
    # an unlabelled `text,label` file (label cells left empty) was "empty label" for
    # predict and embed, which never read the labels
    for name, text, line in (("u.csv", "text,label\ngood film,\nbad film, \n", 2),
                             ("u.jsonl", '{"text": "good film", "label": ""}\n'
                                         '{"text": "bad film", "label": null}\n', 1)):
        p = write(tmp_path, name, text)
        assert [(e.text_a, e.label) for e in D.read_inputs(p)] == \
            [("good film", None), ("bad film", None)]
        assert error_of(D.read_classification, p).startswith(f"{p}:{line}: empty label")


def test_scores_too_large_for_float32_training_are_refused_at_their_line(tmp_path):
    # 1e20 was taken as finite, and training stopped with 'training diverged at step 1:
    # loss inf ...; try a lower --lr': the data were the cause
    for score in ("1e20", "-1e39", "1e16"):
        p = write(tmp_path, "s.tsv", f"sentence1\tsentence2\tscore\na\tb\t0.5\nc\td\t{score}\n")
        assert error_of(D.read_text_rows, p).startswith(f"{p}:3: score {score!r} is too large")
    p = write(tmp_path, "ok.tsv", "sentence1\tsentence2\tscore\na\tb\t1e15\nc\td\t-3\n")
    assert [r.score for r in D.read_text_rows(p)] == [1e15, -3.0]
    # a JSON integer too large for a float: OverflowError, a traceback
    big = jsonl(tmp_path, [{"sentence1": "a", "sentence2": "b", "score": 10 ** 400}])
    assert error_of(D.read_text_rows, big).startswith(f"{big}:1: score")


def test_float_scores_point_to_regression(tmp_path):
    p = write(tmp_path, "sts.tsv", "sentence1\tsentence2\tlabel\n"
              "a\tb\t4.0\nc\td\t3.8\ne\tf\t0.5\n")
    msg = error_of(D.label_set, D.read_classification(p), p)
    assert msg.startswith(f"{p}:3: label '3.8' is a real number") and "--task regress" in msg


def test_one_label_training_file_is_refused(tmp_path):
    p = write(tmp_path, "one.csv", "text,label\ngood,pos\nfine,pos\n")
    msg = error_of(D.label_set, D.read_classification(p), p)
    assert msg == f"{p}: a classifier needs at least two labels in the training data, found only 'pos'"


def test_labels_sort_numerically_when_integral(tmp_path):
    p = jsonl(tmp_path, [{"text": "x", "label": v} for v in (10, 2, "1.0")])
    assert D.label_set(D.read_classification(p)) == ["1", "2", "10"]


# ---- tables ---------------------------------------------------------------------------

def test_quoted_tsv_field_with_a_tab_is_one_field(tmp_path):
    p = write(tmp_path, "q.tsv", 'sentence\tlabel\n"a tab\there"\t1\n"say ""hi"""\t0\n')
    ex = D.read_classification(p)
    assert [(e.text_a, e.label) for e in ex] == [("a tab\there", "1"), ('say "hi"', "0")]


def test_literal_quotes_stay_literal(tmp_path):
    p = write(tmp_path, "sst.tsv", 'sentence\tlabel\nthe "best" film\t1\n"quoted" start\t0\n')
    assert [e.text_a for e in D.read_classification(p)] == ['the "best" film', '"quoted" start']


def test_a_quoted_tsv_field_may_span_lines_as_csv_writers_write_it(tmp_path):
    # csv.writer(delimiter="\t") and pandas' to_csv(sep="\t") quote a text with a line
    # break; it was 'expected 2 fields like the header, found 1' where the CSV read fine
    import csv
    rows = [["text", "label"], ['good "quoted" film', "pos"], ["bad, really", "neg"],
            ["multi\nline", "pos"], ["x", "neg"]]
    for name, delimiter in (("w.tsv", "\t"), ("w.csv", ",")):
        with open(tmp_path / name, "w", newline="") as f:
            csv.writer(f, delimiter=delimiter).writerows(rows)
    got = [(e.text_a, e.label, e.line) for e in D.read_classification(tmp_path / "w.tsv")]
    assert got == [('good "quoted" film', "pos", 2), ("bad, really", "neg", 3),
                   ("multi\nline", "pos", 4), ("x", "neg", 6)]
    assert got == [(e.text_a, e.label, e.line) for e in D.read_classification(tmp_path / "w.csv")]
    # an error after a field spanning lines names the line its row starts on
    p = write(tmp_path, "r.tsv", 'text\tlabel\n"multi\nline"\tpos\n"two\nlines"\tneg\tx\n')
    assert error_of(D.read_classification, p).startswith(
        f"{p}:4: expected 2 fields like the header, found 3")


def test_stray_quotes_that_pair_up_across_lines_stay_literal(tmp_path):
    # each line reads as a row, so the quotes are SST-2's literal ones, not one field
    p = write(tmp_path, "s.tsv", 'sentence\tlabel\n"a film\t1\nthat ends"\t0\n')
    assert [(e.text_a, e.label) for e in D.read_classification(p)] == \
        [('"a film', "1"), ('that ends"', "0")]
    assert not D.tsv_uses_quoting(p)


def test_ragged_row_names_the_line(tmp_path):
    p = write(tmp_path, "r.tsv", "sentence\tlabel\nok\t1\nno label here\n")
    assert error_of(D.read_classification, p).startswith(f"{p}:3: expected 2 fields")


def test_an_unclosed_quote_is_reported_on_the_row_it_opens(tmp_path):
    # the reader ran to the end of the file and blamed the last line
    p = write(tmp_path, "q.csv", 'text,label\nok,1\n"never closed,1\nmore,0\nrows,1\n')
    assert error_of(D.read_classification, p) == \
        f"{p}:3: malformed CSV row (a quoted field that starts in this row is never closed)"


def test_a_column_named_twice_is_refused_not_guessed(tmp_path):
    p = write(tmp_path, "d.tsv", "sentence\tlabel\tlabel\na\t1\t0\nb\t0\t1\n")
    assert error_of(D.read_classification, p) == \
        f"{p}:1: column 'label' appears 2 times in the header; rename the one not meant"
    s = write(tmp_path, "s.tsv", "sentence1\tsentence2\tscore\tscore\na\tb\t1\t4\n")
    assert "column 'score' appears 2 times" in error_of(D.read_text_rows, s)
    ok = write(tmp_path, "ok.tsv", "sentence\tlabel\t\t\na\t1\t\t\nb\t0\t\t\n")  # unused blanks
    assert len(D.read_classification(ok)) == 2


def test_lone_cr_line_endings_are_line_breaks(tmp_path):
    # old-Mac / some spreadsheet exports: a TSV was a csv error, texts were one input
    # 'good\rbad', a corpus one document
    t = write(tmp_path, "cr.tsv", b"sentence\tlabel\rgood\t1\rbad\t0\r")
    assert [(e.text_a, e.label, e.line) for e in D.read_classification(t)] == \
        [("good", "1", 2), ("bad", "0", 3)]
    assert [e.text_a for e in D.read_inputs(write(tmp_path, "in.txt", b"good\rbad\r"))] == \
        ["good", "bad"]
    from nanobert.corpus import iter_documents
    c = write(tmp_path, "c.txt", b"one. two.\rthree.\r\rfour.\r")
    assert list(iter_documents([c])) == [["one. two.", "three."], ["four."]]
    mixed = write(tmp_path, "m.txt", b"a\r\nb\rc\n\nd")
    from nanobert.files import read_lines
    assert list(read_lines(mixed)) == [(1, "a"), (2, "b"), (3, "c"), (4, ""), (5, "d")]
    # in a file of LF lines, a lone CR inside a row's text breaks it: said so
    short = write(tmp_path, "s.tsv", b"sentence\tlabel\ngood\rfilm\t1\nbad\t0\n")
    assert error_of(D.read_classification, short) == (
        f"{short}:2: expected 2 fields like the header, found 1 (it ends in a lone CR, which "
        "breaks a line: a line break inside the text? remove it, or quote the field)")
    bad = write(tmp_path, "bad.txt", b"ok\rcaf\xe9\r")
    assert error_of(list, read_lines(bad)) == f"{bad}:2: not valid UTF-8 (invalid continuation " \
        "byte at byte 3)"


@pytest.mark.parametrize("encoding", ["utf-8", "utf-16"])
def test_a_line_break_inside_a_quoted_field_is_kept_as_written(tmp_path, encoding):
    """csv.writer keeps 'one\rtwo' and 'three\r\nfour' inside quotes; read line by line
    with universal newlines they came back as 'one\ntwo' and 'three\nfour', so predict
    echoed another text than the file's."""
    import csv
    import io
    rows = [("sentence", "label"), ("one\rtwo", 1), ("three\r\nfour", 0), ("plain", 1)]
    for delimiter, name in (("\t", "q.tsv"), (",", "q.csv")):
        buf = io.StringIO(newline="")
        csv.writer(buf, delimiter=delimiter).writerows(rows)
        p = write(tmp_path, name, buf.getvalue().encode(encoding))
        assert [(e.text_a, e.label, e.line) for e in D.read_classification(p)] == \
            [("one\rtwo", "1", 2), ("three\r\nfour", "0", 4), ("plain", "1", 6)]
    from nanobert.files import read_lines
    mixed = write(tmp_path, "m.txt", "a\r\nb\rc\n\nd".encode(encoding))
    assert list(read_lines(mixed, keep_ends=True)) == [
        (1, "a\r\n"), (2, "b\r"), (3, "c\n"), (4, "\n"), (5, "d")]


@pytest.mark.parametrize("kind", ["gzip", "bz2", "lzma", "zip"])
def test_compressed_files_are_named_not_called_bad_utf8(tmp_path, kind):
    import bz2
    import gzip
    import lzma
    import zipfile
    text = b"sentence\tlabel\ngood\t1\nbad\t0\n"
    p = tmp_path / "d.tsv.x"
    if kind == "zip":
        with zipfile.ZipFile(p, "w") as z:
            z.writestr("d.tsv", text)
    else:
        p.write_bytes({"gzip": gzip, "bz2": bz2, "lzma": lzma}[kind].compress(text))
    name = {"bz2": "bzip2", "lzma": "xz"}.get(kind, kind)
    for read in (D.read_classification, D.read_inputs, D.read_conll, D.read_qrels):
        assert error_of(read, p) == f"{p}: compressed ({name}), not a text file; decompress " \
            "it first and pass the result"
    word = write(tmp_path, "w.txt", "BZh is not a bzip2 header\n")   # text that starts alike
    assert [e.text_a for e in D.read_inputs(word)] == ["BZh is not a bzip2 header"]


def test_bad_utf8_empty_and_unknown_formats(tmp_path):
    bad = write(tmp_path, "bad.tsv", b"sentence\tlabel\nok\t1\ncaf\xe9\t0\n")
    assert error_of(D.read_classification, bad).startswith(f"{bad}:3: not valid UTF-8")
    empty = write(tmp_path, "empty.tsv", "\n  \n")
    assert error_of(D.read_classification, empty) == f"{empty}: no text (only blank lines)"
    odd = write(tmp_path, "odd.txt", "justoneword\n")
    assert error_of(D.read_classification, odd).startswith(f"{odd}:1: unknown format")
    header = write(tmp_path, "h.tsv", "sentence\tlabel\n")
    assert "no examples" in error_of(D.read_classification, header)


def test_utf16_with_bom_is_read_and_a_directory_is_named(tmp_path):
    # spreadsheets save "Unicode text" as UTF-16 with a byte-order mark, CRLF line ends
    text = "sentence\tlabel\r\ncafé au lait\t1\r\nnaïve\t0\r\n"
    for enc in ("utf-16-le", "utf-16-be"):
        bom = "\ufeff".encode(enc)
        p = write(tmp_path, f"{enc}.tsv", bom + text.encode(enc))
        ex = D.read_classification(p)
        assert [(e.text_a, e.label, e.line) for e in ex] == [("café au lait", "1", 2),
                                                             ("naïve", "0", 3)]
    odd = write(tmp_path, "odd16.tsv", "\ufeffsentence\tlabel\n".encode("utf-16-le") + b"\x00")
    assert "not valid UTF-16" in error_of(D.read_classification, odd)
    assert error_of(D.read_classification, tmp_path) == f"{tmp_path}: is a directory, expected a file"


def test_nul_bytes_and_pipes_are_refused_not_read_as_text(tmp_path):
    # UTF-16 without its byte-order mark is 'valid' UTF-8 with a NUL between letters:
    # it was read as texts like 'g\x00o\x00o\x00d' (predict, embed) or a bogus header
    utf16 = write(tmp_path, "in.txt", "good movie\nbad movie\n".encode("utf-16-le"))
    msg = error_of(D.read_inputs, utf16)
    assert msg.startswith(f"{utf16}:1: binary data (NUL byte)") and "UTF-16" in msg
    nul = write(tmp_path, "nul.tsv", b"sentence\tlabel\nok\x00\t1\n")
    assert error_of(D.read_classification, nul).startswith(f"{nul}:2: binary data")
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)  # `--data <(...)` was 'no such file'
    assert "not a regular file" in error_of(D.read_inputs, fifo)
    from nanobert.corpus import corpus_files
    assert "not a regular file" in error_of(corpus_files, [fifo])


def test_looks_like_conll_tells_columns_from_text(tmp_path):
    assert D.looks_like_conll(write(tmp_path, "a.txt", "-DOCSTART- -X- O\n\nEU NNP B-ORG\n"))
    assert D.looks_like_conll(write(tmp_path, "b.txt", "\nEU B-ORG\nrejects O\n\nPeter I-PER\n"))
    assert not D.looks_like_conll(write(tmp_path, "c.txt", "EU rejects German call\nPeter O\n"))
    assert not D.looks_like_conll(write(tmp_path, "d.txt", "EU B-ORG\nrejects\n"))
    # CoNLL with a faulty line is CoNLL, for its reader to refuse by line: read as plain
    # text, its POS and tag columns were tagged as words
    ragged = write(tmp_path, "r.txt", "EU NNP B-ORG\nrejects\n\nPeter NNP B-PER\n")
    assert D.looks_like_conll(ragged)
    with pytest.raises(NanobertError, match=f"^{ragged}:2: expected a token and a tag"):
        D.read_conll(ragged)
    assert not D.looks_like_conll(write(tmp_path, "s.txt", "rejects\nEU NNP B-ORG\nPeter B-PER\n"))
    # sentences whose last word looks like a tag are text (their other words were
    # dropped as columns); tags as datasets write them are columns
    assert not D.looks_like_conll(write(tmp_path, "e.txt", "Alice sent an E-mail\nA U-turn\n"))
    assert not D.looks_like_conll(write(tmp_path, "f.txt", "Peter needs vitamin B-12\n"))
    assert D.looks_like_conll(write(tmp_path, "g.txt", "Paris B-LOC\nBerlin B-LOC\n"))
    assert D.looks_like_conll(write(tmp_path, "h.txt", "wnut I-person\nx O\n"))


def test_a_token_a_line_with_blank_lines_between_sentences_is_read_as_sentences(tmp_path):
    """CoNLL without its tag column (an unlabelled test set: one token a line, a blank
    line between sentences) is a tagger's sentences: predict read each token as a text
    of its own and tagged it out of its sentence."""
    from nanobert.finetune import ner_inputs
    p = write(tmp_path, "test.txt", "\ufeffEU\r\nrejects\r\nGerman\r\n\r\n-DOCSTART-\r\n\r\nEU\r\nrejects\r\nGerman\r\n\r\n"
              "Peter\r\nBlackburn\r\n\r\n\r\n")
    assert D.token_lines(p)
    got = ner_inputs(p)
    assert [s.words for s in got] == [["EU", "rejects", "German"]] * 2 + [["Peter", "Blackburn"]]
    assert [s.line for s in got] == [1, 7, 11]
    # one text a line stays so: texts with spaces, one-word texts without a blank line
    # between them, single words each a sentence, a one-column table
    for name, text in [("a.txt", "EU rejects German call\n\nPeter Blackburn\n"),
                       ("b.txt", "Excellent\nTerrible\n\n"), ("c.txt", "Paris\n\nLondon\n"),
                       ("d.csv", "text\nhello\nworld\n\nagain\n")]:
        assert not D.token_lines(write(tmp_path, name, text)), name
    assert [e.text_a for e in ner_inputs(write(tmp_path, "e.txt", "Excellent\nTerrible\n"))] == [
        "Excellent", "Terrible"]


def test_one_column_table_is_read_by_its_suffix(tmp_path):
    # no delimiter on the header line: the .csv/.tsv suffix says it is a table
    p = write(tmp_path, "texts.csv", "text\nhello there\nworld\n")
    assert D.detect_format(p) == "csv"
    assert [e.text_a for e in D.read_classification(p, require_label=False)] == ["hello there", "world"]
    assert "no label column" in (e := error_of(D.read_classification, p))
    assert e.endswith("for a file without labels (a test split), run `nanobert predict "
                      "--input` on it")
    assert D.detect_format(write(tmp_path, "texts.tsv", "sentence\nhi\n")) == "tsv"


# ---- JSON Lines -----------------------------------------------------------------------

def test_jsonl_pair_column_is_decided_over_all_lines(tmp_path):
    p = jsonl(tmp_path, [{"text_a": "a", "label": 0}, {"text_a": "b", "text_b": "c", "label": 1}])
    assert error_of(D.read_classification, p) == \
        f"{p}:1: missing field 'text_b', which 1 of 2 records have (the first, line 2); give " \
        "every record the same fields"
    ok = jsonl(tmp_path, [{"text_a": "a", "label": 0}, {"text_a": "b", "text_b": "c", "label": 1},
                          {"label": 1, "text_b": "e", "text_a": "d"}], "ok.jsonl")
    ok.write_text(ok.read_text().replace('{"text_a": "a", "label": 0}',
                                         '{"text_a": "a", "text_b": "z", "label": 0}'))
    assert [(e.text_a, e.text_b) for e in D.read_classification(ok)] == \
        [("a", "z"), ("b", "c"), ("d", "e")]


def test_jsonl_deep_nesting_and_huge_numbers_are_file_errors(tmp_path):
    deep = write(tmp_path, "deep.jsonl", '{"text": "a", "label": ' + "[" * 100000 + "]" * 100000 + "}\n")
    assert error_of(D.read_classification, deep).startswith(f"{deep}:1:")
    big = write(tmp_path, "big.jsonl", '{"text": "a", "label": ' + "9" * 5000 + "}\n")
    assert error_of(D.read_classification, big).startswith(f"{big}:1:")


def test_a_json_array_of_records_reads_as_json_lines(tmp_path):
    """pandas' to_json(orient="records"): one line or pretty-printed; errors name the line
    where the bad record starts."""
    rows = [{"text": "good movie", "label": "pos"}, {"text": "bad, bad movie", "label": "neg"}]
    for name, text in [("one.json", json.dumps(rows)), ("pretty.json", json.dumps(rows, indent=2))]:
        p = write(tmp_path, name, text)
        got = D.read_classification(p)
        assert [(e.text_a, e.label) for e in got] == [("good movie", "pos"), ("bad, bad movie", "neg")]
        assert [e.text_a for e in D.read_inputs(p)] == ["good movie", "bad, bad movie"]
    pretty = json.dumps(rows, indent=2).splitlines()          # record 2 starts on line 6
    assert [e.line for e in D.read_classification(write(tmp_path, "p.json", "\n".join(pretty)))] == [2, 6]
    missing = write(tmp_path, "m.json", '[\n {"text": "a", "label": 1},\n\n {"text": "b"}\n]')
    assert error_of(D.read_classification, missing).startswith(
        f"{missing}:4: missing field 'label', which 1 of 2 records have (the first, line 2)")
    for text, line, what in [('[\n{"text": "a", "label": 1},\n{"text": "b" "label": 0}\n]', 3, "not valid JSON"),
                             ('[{"text": "a", "label": 1},\n 7]', 2, "JSON objects"),
                             ('[{"text": "a", "label": 1}] and more', 1, "after the closing"),
                             ('[{"text": "a", "label": 1},]', 1, "not valid JSON"),
                             ("[]", 1, "empty JSON array")]:
        p = write(tmp_path, "bad.json", text)
        msg = error_of(D.read_classification, p)
        assert msg.startswith(f"{p}:{line}: ") and what in msg, msg
    assert [e.text_a for e in D.read_inputs(write(tmp_path, "t.txt", "[1, 2]\n[Music] hi\n"))] == \
        ["[1, 2]", "[Music] hi"]                             # plain text that starts with '['
    rows_of_lists = write(tmp_path, "l.jsonl", "[1, 2]\n[3, 4]\n")       # not read as a CSV
    assert "not a classification file" in error_of(D.read_classification, rows_of_lists)
    import time
    many = write(tmp_path, "many.json", json.dumps([{"text": f"row {i}", "label": i % 2}
                                                    for i in range(40_000)], indent=1))
    start = time.perf_counter()                  # linear: a copy of the rest per record,
    assert len(D.read_classification(many)) == 40_000   # as once written, took minutes
    assert time.perf_counter() - start < 10


def test_json_lines_under_a_comment_line_are_not_read_as_texts(tmp_path):
    """predict, embed and search read a .jsonl file whose first line is a comment as one
    text a line: each record's raw JSON was an input, exit 0."""
    f = write(tmp_path, "c.jsonl", '// my data\n{"text": "good", "label": "pos"}\n'
              '{"text": "bad", "label": "neg"}\n')
    for read in (D.read_inputs, D.read_text_lines):
        assert error_of(read, f).startswith(f"{f}:1: not valid JSON, but the lines from line 2 "
                                            "on are JSON Lines")
    # text lines of which some merely start like JSON stay texts
    mixed = write(tmp_path, "m.txt", 'a title\n{"x": 1} is how it looks\nplain again\n')
    assert len(D.read_text_lines(mixed)) == 3


def test_json_that_is_not_json_lines_says_what_is_wrong(tmp_path):
    # a comma after each record was 'SQuAD-style JSON' to the classifier, and predict,
    # NER predict and the embedding tasks' predict read each raw line as a text
    commas = write(tmp_path, "c.jsonl", '{"text": "a", "label": 1},\n{"text": "b", "label": 0},\n')
    msg = error_of(D.read_classification, commas)
    assert msg.startswith(f"{commas}:1: not a classification file (a comma after the JSON object")
    assert "SQuAD" not in msg
    for read in (D.read_inputs, D.read_text_lines, D.read_text_rows):
        assert error_of(read, commas).startswith(f"{commas}:1: a comma after the JSON object")
    rows = write(tmp_path, "r.jsonl", '{"text": "a"}\n{"text": "b"}\n')
    assert error_of(D.read_text_lines, rows).startswith(f"{rows}:1: JSON Lines (expected one")
    one = write(tmp_path, "o.json", '{\n  "text": "a",\n  "label": 1\n}\n')
    for read in (D.read_classification, D.read_inputs):
        assert "one JSON object over several lines, not JSON Lines" in error_of(read, one)
    cut = write(tmp_path, "t.jsonl", '{"text": "a", "lab\n{"text": "b", "label": 0}\n')
    assert error_of(D.read_inputs, cut).startswith(f"{cut}:1: not valid JSON")
    nums = write(tmp_path, "n.json", "[1, 2]\n")
    assert "array of values that are not objects" in error_of(D.read_classification, nums)
    assert "SQuAD-style JSON" in error_of(D.read_classification, write(
        tmp_path, "s.json", json.dumps({"data": []}, indent=1)))
    for read in (D.read_conll, lambda p: D.read_conll(p, require_tags=False)):
        assert error_of(read, commas).startswith(f"{commas}:1: JSON, not CoNLL columns")
    assert [e.text_a for e in D.read_inputs(write(tmp_path, "b.txt", "[Music] hi\n{curly} x\n"))] \
        == ["[Music] hi", "{curly} x"]                     # text that starts with a bracket


def test_conll_file_is_not_read_as_one_text_a_line(tmp_path):
    p = write(tmp_path, "t.conll", "-DOCSTART- -X- O\n\nEU NNP B-ORG\nrejects VBZ O\n")
    assert error_of(D.read_inputs, p).startswith(f"{p}:1: CoNLL columns (a token and its tag")


def test_predict_input_of_an_embedding_model_reads_plain_text(tmp_path):
    # one word a line was 'unknown format' for regress / embed / rerank models
    from nanobert.biencoder import text_rows_input
    p = write(tmp_path, "in.txt", "good\nbad\n")
    assert [(r.texts, r.line) for r in text_rows_input(p)] == [(("good",), 1), (("bad",), 2)]


# ---- prediction inputs ----------------------------------------------------------------

@pytest.mark.parametrize("first", ["Excellent!", "很好", "Hello, world", "a\tb"])
def test_plain_text_predict_input_whatever_its_first_line(tmp_path, first):
    p = write(tmp_path, "in.txt", f"{first}\nsecond line here\n\n")
    assert [e.text_a for e in D.read_inputs(p)] == [first, "second line here"]


def test_a_lone_cr_in_plain_text_or_conll_is_refused_with_its_line(tmp_path):
    """'bad\\rfilm' among LF lines was two inputs: every output row after it answered the
    line before, unsaid (a CR at a CoNLL token broke its sentence in two). A file whose
    every line ends in a CR (old Mac) or CRLF is read as it is."""
    for name, body, read in (("in.txt", b"good movie\nbad\rfilm\nok then\n", D.read_inputs),
                             ("n.conll", b"EU B-ORG\n\rrejects O\n", D.read_conll)):
        p = write(tmp_path, name, body)
        assert error_of(read, p).startswith(f"{p}:2: holds a lone CR (a carriage return "
                                            "inside the line?)")
    # CRs that only end lines (old Mac, with a final LF or not; CR CR LF; a stray CR at
    # the end) are read as they were
    for body in (b"a\rb\rc\r", b"a\rb\rc\r\n", b"a\r\nb\r\nc\r", b"a\r\r\nb\r\r\nc\r\r\n"):
        assert [e.text_a for e in D.read_inputs(write(tmp_path, "ok.txt", body))] == \
            ["a", "b", "c"], body


def test_predict_input_with_a_header_is_a_table(tmp_path):
    p = write(tmp_path, "in.tsv", "sentence\tlabel\ngreat\t1\n")
    assert [(e.text_a, e.label) for e in D.read_inputs(p)] == [("great", "1")]
    q = write(tmp_path, "in.csv", "review,stars\nnice one,5\n")
    assert [e.text_a for e in D.read_inputs(q, {"text_column": "review"})] == ["nice one"]


def test_predict_input_tsv_or_csv_without_a_text_column_is_refused(tmp_path):
    # its header was predicted as a text, and every row with its id ("1,good film")
    for name, text in (("in.csv", "id,review\n1,good film\n"), ("in.tsv", "id\treview\n1\tgood\n"),
                       ("one.csv", "review\ngood film\n")):
        p = write(tmp_path, name, text)
        assert error_of(D.read_inputs, p).startswith(f"{p}:1: no text column")
    assert [e.text_a for e in D.read_inputs(write(tmp_path, "in.txt", "id,review\n1,good\n"))] \
        == ["id,review", "1,good"]                     # no table suffix: lines of text


# ---- SQuAD ----------------------------------------------------------------------------

def squad(tmp_path, answers, qid="q7"):
    doc = {"data": [{"title": "t", "paragraphs": [{"context": "Paris is the capital of France.",
                                                  "qas": [{"id": qid, "question": "What?",
                                                           "answers": answers}]}]}]}
    return write(tmp_path, "s.json", json.dumps(doc, indent=1))


def test_squad_answer_start_is_checked_against_the_context(tmp_path, capsys):
    ok = squad(tmp_path, [{"text": "France", "answer_start": 24}])
    assert D.read_squad(ok)[0].answers == [("France", 24)]
    assert capsys.readouterr().err == ""
    # an offset a few characters off (converted datasets), or none: the nearest occurrence
    # of the text, with a note (the official EM/F1 reads only the texts); a text that is not
    # in the context is another context's answer: refused
    p = squad(tmp_path, [{"text": "France", "answer_start": 20}, {"text": "Paris"}])
    assert D.read_squad(p)[0].answers == [("France", 24), ("Paris", 0)]
    assert capsys.readouterr().err == (
        f"nanobert: note: {p}: 1 answer was not at its answer_start, and taken at the nearest "
        "occurrence of the text, or where answer_start points counted in UTF-16 units or "
        "UTF-8 bytes when the text is there (first: question 'q7': 20 -> 24)\n")
    # an answer_start in UTF-16 units (JavaScript tools: an emoji counts 2) or in UTF-8
    # bytes: the nearest occurrence from there was the second 'Rome', not the one meant
    for start, units in ((21, "UTF-16 code units"), (41, "UTF-8 bytes")):
        doc = {"data": [{"paragraphs": [{"context": "\U0001f600" * 10 + " Rome, Rome!", "qas": [
            {"id": "r", "question": "?", "answers": [{"text": "Rome", "answer_start": start}]}]}]}]}
        assert D.read_squad(write(tmp_path, "r.json", json.dumps(doc)))[0].answers == [("Rome", 11)]
        assert f"'r': {start} -> 11, answer_start counted in {units})" in capsys.readouterr().err
    two = write(tmp_path, "two.json", json.dumps({"data": [{"paragraphs": [{
        "context": "a b a b a", "qas": [{"id": "x", "question": "?",
                                         "answers": [{"text": "a", "answer_start": 5}]}]}]}]}))
    assert D.read_squad(two)[0].answers == [("a", 4)]     # the nearest of three
    far = squad(tmp_path, [{"text": "Berlin", "answer_start": 900}])
    assert error_of(D.read_squad, far) == (f"{far}: question 'q7': answer 'Berlin' does not "
                                           "occur in the context (answer_start 900)")


@pytest.mark.parametrize("answers", [[{"text": "x"}], [{"answer_start": 0}], ["Berlin"],
                                     [{"text": "", "answer_start": 0}], "Paris",
                                     [{"text": "Paris", "answer_start": "zero"}]])
def test_squad_bad_answers_name_the_question(tmp_path, answers):
    assert "question 'q7'" in error_of(D.read_squad, squad(tmp_path, answers))


def test_squad_structure_errors_name_the_place(tmp_path):
    p = write(tmp_path, "s.json", json.dumps({"data": [{"paragraphs": [{"context": 3, "qas": []}]}]}))
    assert error_of(D.read_squad, p) == (f"{p}: data[0].paragraphs[0]: not SQuAD v1.1 structure "
                                         "(expected str field 'context')")
    q = write(tmp_path, "q.json", json.dumps({"data": ["text"]}))
    assert "data[0]" in error_of(D.read_squad, q)


def test_squad_jsonl_answers_are_found_or_refused(tmp_path):
    p = jsonl(tmp_path, [{"id": "a1", "question": "Who?", "context": "Ann met Bob.",
                          "answers": ["Bob"]},
                         {"id": "a2", "question": "Who?", "context": "Ann met Bob.",
                          "answers": ["Carl"]}])
    assert error_of(D.read_squad, p).startswith(f"{p}:2: question 'a2': answer 'Carl' does not occur")


def test_squad_answers_in_the_hugging_face_layout(tmp_path):
    # SQuAD saved by `datasets` (answers: {"text": [...], "answer_start": [...]}) was
    # "'answers' must be a list"
    row = {"id": "a", "question": "Capital?", "context": "Paris is the capital of France.",
           "answers": {"text": ["Paris", "Paris"], "answer_start": [0, 0]}}
    assert D.read_squad(jsonl(tmp_path, [row]))[0].answers == [("Paris", 0), ("Paris", 0)]
    row["answers"]["answer_start"] = [0]
    assert "lists of different lengths" in error_of(D.read_squad, jsonl(tmp_path, [row]))
    row["answers"] = {"text": ["Rome", "Rome"], "answer_start": [0, 0]}
    assert "answer 'Rome' does not occur in the context (answer_start 0)" in \
        error_of(D.read_squad, jsonl(tmp_path, [row]))


def test_squad_repeated_question_ids_are_refused(tmp_path):
    # answers are matched to questions by id: a repeat would silently drop a question
    rows = [dict(id="a1", question=q, context="Ann met Bob.", answers=[a])
            for q, a in [("Who?", "Bob"), ("Who met?", "Ann")]]
    p = jsonl(tmp_path, rows)
    assert error_of(D.read_squad, p).startswith(f"{p}:2: question id 'a1' is used twice "
                                                "(lines 1 and 2) (ids must be unique")
    no_ids = jsonl(tmp_path, [{"question": "Who?", "context": "Ann met Bob.", "answers": ["Bob"]}] * 2,
                   name="n.jsonl")
    assert [e.id for e in D.read_squad(no_ids)] == ["1", "2"]   # line numbers stand in
    # ... and may be another row's id, written once: the error says where the twin came from
    # (it named no line, and an id the user wrote once "used twice"); a null id is none
    both = jsonl(tmp_path, [dict(rows[0], id="2"), dict(rows[1], id=None)], name="b.jsonl")
    assert error_of(D.read_squad, both) == (
        f"{both}:2: question id '2' is used twice (lines 1 and 2); line 2 has no id and takes "
        "its line number as its id: give it one (ids must be unique: answers are matched to "
        "questions by id)")
    table = write(tmp_path, "t.tsv", "id\tquestion\tcontext\tanswer\n3\tWho?\tAnn met Bob.\tBob\n"
                                     "\tWho met?\tAnn met Bob.\tAnn\n")
    assert "line 3 has no id and takes its line number" in error_of(D.read_squad, table)


# ---- CoNLL ----------------------------------------------------------------------------

def test_conll_bad_tag_and_missing_tag_name_the_line(tmp_path):
    p = write(tmp_path, "n.conll", "EU B-ORG\nrejects O\n\nGerman X-MISC\n")
    assert error_of(D.read_conll, p).startswith(f"{p}:4: tag 'X-MISC' is not IOB")
    q = write(tmp_path, "m.conll", "EU B-ORG\nrejects\n")
    assert error_of(D.read_conll, q).startswith(f"{q}:2: expected a token and a tag")


def test_conll_comment_lines_are_skipped_with_a_note(tmp_path, capsys):
    """'# sent_id = 1' (CoNLL-U, MultiCoNER) was refused as "tag '1' is not IOB", which
    sent the user looking for a bad tag; a token '#' tagged O stays a token."""
    p = write(tmp_path, "c.conll", "# sent_id = 1\nEU B-ORG\n# O\n\n# id 3a domain=en\n"
                                   "#\nParis B-LOC\n")
    got = D.read_conll(p)
    assert [(s.words, s.tags) for s in got] == [(["EU", "#"], ["B-ORG", "O"]),
                                                (["Paris"], ["B-LOC"])]
    assert capsys.readouterr().err == (f"nanobert: note: {p}: 3 comment lines ('# ...', first "
                                       "line 1) skipped\n")
    # read without its tags (predict): still CoNLL, comments skipped; '#Paris' alone is a
    # token (a file starting with a comment had been read as plain text, tags tagged)
    q = write(tmp_path, "u.conll", "# sent_id = 1\nEU B-ORG\nrejects O\n\n# sent_id = 2\n"
                                   "#Paris B-LOC\n")
    assert D.looks_like_conll(q)
    assert [s.words for s in D.read_conll(q, require_tags=False)] == [["EU", "rejects"],
                                                                      ["#Paris"]]


def test_conll_rows_keep_one_column_count(tmp_path):
    # 'New York B-LOC' among two-column rows silently lost 'York'; a no-break space inside
    # a token cut it in two
    p = write(tmp_path, "n.conll", "EU B-ORG\nNew York B-LOC\n\nPeter B-PER\n")
    assert error_of(D.read_conll, p) == (f"{p}:2: expected 2 columns like line 1, found 3 (CoNLL "
                                         "columns are separated by spaces or tabs; a token "
                                         "holds a space only where tabs separate the columns)")
    assert error_of(D.read_conll, p, require_tags=False).startswith(f"{p}:2: expected 2 columns")
    nbsp = write(tmp_path, "b.conll", "New\u00a0York B-LOC\nis O\n")
    assert D.read_conll(nbsp)[0].words == ["New\u00a0York", "is"]
    tabs = write(tmp_path, "t.conll", "-DOCSTART- -X- -X- O\n\nEU\tNNP\tB-ORG\n( \tPUNC O\n")
    assert D.read_conll(tabs)[0].words == ["EU", "("]


def test_squad_v2_unanswerable_questions_are_named_as_such(tmp_path):
    qas = [{"id": "u", "question": "Why?", "answers": [], "is_impossible": True}]
    p = write(tmp_path, "v2.json", json.dumps({"data": [{"paragraphs": [{"context": "Paris.",
                                                                         "qas": qas}]}]}))
    assert "SQuAD v2.0 'is_impossible'" in (e := error_of(D.read_squad, p))
    assert e.endswith("remove the questions marked is_impossible to train or evaluate on the "
                      "others)")
    assert D.read_squad(p, require_answers=False)[0].id == "u"


# ---- retrieval and embedding data -----------------------------------------------------

def beir_dir(tmp_path, qrels, name="b"):
    root = tmp_path / name
    (root / "qrels").mkdir(parents=True)
    (root / "corpus.jsonl").write_text('{"_id": "d1", "text": "Paris."}\n'
                                       '{"_id": "d2", "text": "Rome."}\n')
    (root / "queries.jsonl").write_text('{"_id": "q1", "text": "France?"}\n'
                                        '{"_id": "q2", "text": "Italy?"}\n')
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + qrels)
    return root


@pytest.mark.parametrize("grade", ["inf", "1e999", "0.5", "nan", "high"])
def test_qrels_grades_are_integers(tmp_path, grade):
    # 'inf' was an OverflowError traceback; '0.5' silently became 0
    root = beir_dir(tmp_path, f"q1\td1\t1\nq2\td2\t{grade}\n")
    assert error_of(D.read_beir, root) == (f"{root / 'qrels' / 'test.tsv'}:3: score {grade!r} is "
                                           "not an integer relevance grade")


def test_qrels_without_a_relevant_document_or_with_two_grades(tmp_path, capsys):
    zero = beir_dir(tmp_path, "q1\td1\t0\nq2\td2\t0\n")
    assert "no relevant documents" in error_of(D.read_beir, zero)   # every metric was 0
    twice = beir_dir(tmp_path, "q1\td1\t1\nq2\td2\t1\nq1\td1\t2\n", "t")
    assert D.read_beir(twice).qrels["q1"] == {"d1": 2}               # the last, as BEIR reads
    assert "judged twice with different grades (e.g. 'q1', 'd1' on lines 2 and 4)" in \
        capsys.readouterr().err
    trec = beir_dir(tmp_path, "q1\t0\td1\t1\n", "trec")
    assert "TREC qrels" in error_of(D.read_beir, trec)
    # integer doc ids in TREC's layout had read as grades, every query judging document
    # '0' (a corpus numbered from 0): nDCG 0.05 where it was 0.88; extra fields are refused
    numbered = beir_dir(tmp_path, "q1\t0\t1\t1\n", "numbered")
    (numbered / "corpus.jsonl").write_text('{"_id": "0", "text": "Paris."}\n'
                                           '{"_id": "1", "text": "Rome."}\n')
    assert error_of(D.read_beir, numbered) == (
        f"{numbered / 'qrels' / 'test.tsv'}:2: expected 3 fields (query-id, corpus-id, score), "
        "found 4 (4 columns, as TREC qrels `query-id iteration doc-id grade` have? BEIR qrels "
        "are query-id, corpus-id, score)")
    extra = beir_dir(tmp_path, "q1\td1\t1\tnote\n", "extra")
    assert error_of(D.read_beir, extra).endswith(":2: expected 3 fields (query-id, corpus-id, "
                                                 "score), found 4")


def test_beir_folder_says_what_is_wrong_with_it(tmp_path):
    import gzip
    root = beir_dir(tmp_path, "q1\td1\t1\n")
    packed = root / "corpus.jsonl.gz"
    packed.write_bytes(gzip.compress((root / "corpus.jsonl").read_bytes()))
    (root / "corpus.jsonl").unlink()
    assert "missing corpus.jsonl (corpus.jsonl.gz is there: decompress it)" in \
        error_of(D.read_beir, root)
    (root / "corpus.jsonl").mkdir()
    assert "corpus.jsonl is a folder, not a file" in error_of(D.read_beir, root)


def test_embedding_and_reranking_rows_are_checked_when_read(tmp_path):
    # single texts as dev data were an IndexError after a whole epoch of training; the
    # shape errors named no file
    from nanobert.biencoder import read_embed_data, read_rerank_data
    single = write(tmp_path, "s.tsv", "anchor\na\nb\n")
    assert error_of(read_embed_data, single).startswith(f"{single}:2: a bi-encoder needs pairs")
    scored3 = write(tmp_path, "t.tsv", "anchor\tpositive\tnegative\tscore\na\tb\tc\t1\n")
    assert "not triplets" in error_of(read_embed_data, scored3)
    pairs = write(tmp_path, "p.tsv", "query\tdocument\na\tb\n")
    assert error_of(read_rerank_data, pairs).startswith(f"{pairs}:1: no score column")
    neg = write(tmp_path, "n.tsv", "query\tdocument\tlabel\nq\td\t1\nq\te\t-1\n")
    assert error_of(read_rerank_data, neg).startswith(f"{neg}:3: label -1 is negative")
    zero = write(tmp_path, "z.tsv", "query\tdocument\tlabel\nq\td\t0\n")
    assert "every label is 0" in error_of(read_rerank_data, zero)
    ok = write(tmp_path, "ok.tsv", "query\tdocument\tlabel\nq\td\t1\nq\te\t0\n")
    assert [r.score for r in read_rerank_data(ok)] == [1.0, 0.0]


# ---- pretraining corpora --------------------------------------------------------------

def test_a_corpus_file_named_twice_is_refused(tmp_path):
    # its documents counted twice, and could be held out and trained on at once
    from nanobert.corpus import corpus_files
    d = tmp_path / "c"
    d.mkdir()
    f = write(d, "a.txt", "one.\n\ntwo.\n")
    assert error_of(corpus_files, [f, f]) == f"{f}: given twice in the corpus; name each file once"
    assert "given twice in the corpus" in error_of(corpus_files, [d, f])


@pytest.mark.parametrize("text, line", [
    ('{"text": "a document.", "id": 1}\n{"text": "another."}\n', 1),
    ('\n[\n {"text": "a document."}\n]\n', 2)])
def test_a_json_corpus_is_refused_not_learnt_as_text(tmp_path, text, line):
    # a JSON Lines corpus (or a BEIR folder's corpus.jsonl) trained on its keys and brackets
    from nanobert.corpus import iter_documents
    f = write(tmp_path, "c.jsonl", text)
    assert error_of(list, iter_documents([f])).startswith(f"{f}:{line}: JSON, not plain text")
    brackets = write(tmp_path, "t.txt", "[Music] plays.\n\n{curly} text.\n")
    assert list(iter_documents([brackets])) == [["[Music] plays."], ["{curly} text."]]


def test_a_single_document_corpus_error_names_the_file(tmp_path):
    from nanobert.corpus import load_corpus
    f = write(tmp_path, "one.txt", "just one document here.\n")
    assert error_of(load_corpus, [f], log=lambda *a: None).startswith(f"{f}: the corpus has a "
                                                                       "single document")


def test_a_key_given_twice_in_one_json_object_is_refused(tmp_path):
    """json keeps the last of two equal keys silently; which text or label was meant is
    a guess, so the reader names the key and the line (JSON Lines, a JSON array, SQuAD)."""
    lines = tmp_path / "dup.jsonl"
    lines.write_text('{"text": "fine", "label": 1}\n{"text": "a", "label": 0, "text": "b"}\n')
    with pytest.raises(NanobertError, match=r"dup.jsonl:2: the key 'text' appears twice"):
        D.read_classification(lines)
    array = tmp_path / "dup.json"
    array.write_text('[\n {"text": "x", "label": 1},\n {"label": 1, "text": "y", "label": 0}\n]\n')
    with pytest.raises(NanobertError, match=r"dup.json:3: the key 'label' appears twice"):
        D.read_classification(array)
    fine = tmp_path / "fine.jsonl"
    fine.write_text('{"text": "a", "label": 1, "meta": {"text": "nested is its own object"}}\n'
                    '{"text": "b", "label": 0}\n')
    assert [e.text_a for e in D.read_classification(fine)] == ["a", "b"]


# ---- paths that cannot be read --------------------------------------------------------

def test_paths_the_system_cannot_look_up_or_open_are_named_not_tracebacks(tmp_path, monkeypatch):
    # a name over 255 bytes raised OSError from Path.is_dir (a traceback); a link loop
    # was 'no such file'; a file without read permission raised PermissionError
    from nanobert import files
    from nanobert.corpus import corpus_files
    long = tmp_path / ("x" * 300)
    assert error_of(D.read_classification, long) == f"{long}: cannot be read (File name too long)"
    assert error_of(corpus_files, [long]) == f"{long}: cannot be read (File name too long)"
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    assert "Too many levels of symbolic links" in error_of(D.read_inputs, loop)
    assert error_of(D.read_classification, "") == "an empty path was given where a file is expected"
    assert error_of(corpus_files, [""]) == "--corpus: an empty path was given"

    p = write(tmp_path, "d.tsv", "sentence\tlabel\na\t1\n")

    def refuse(path, mode="r", *a, **k):
        raise PermissionError(13, "Permission denied", str(path))
    monkeypatch.setattr(files, "open", refuse, raising=False)   # (root may read any file)
    assert error_of(D.read_classification, p) == f"{p}: cannot be read (Permission denied)"


# ---- tables as real tools write them -------------------------------------------------

def test_empty_fields_past_the_header_are_dropped_other_extra_fields_are_not(tmp_path):
    # a tab at the end of each row (or of the header too) was 'expected 2 fields, found 3'
    body = write(tmp_path, "b.tsv", "sentence\tlabel\ngood film\t1\t\nbad film\t0\t \n")
    both = write(tmp_path, "h.tsv", "sentence\tlabel\t\ngood film\t1\t\nbad film\t0\n")
    for p in (body, both):
        assert [(e.text_a, e.label) for e in D.read_classification(p)] == \
            [("good film", "1"), ("bad film", "0")]
    tab = write(tmp_path, "t.tsv", "sentence\tlabel\ngood\tfilm\t1\n")
    assert error_of(D.read_classification, tab) == (
        f"{tab}:2: expected 2 fields like the header, found 3 (a tab inside a text, which "
        "must then be quoted? or columns the header does not name?)")
    csv = write(tmp_path, "c.csv", "text,label\ngood,film,1\n")
    assert "(a comma inside a text," in error_of(D.read_classification, csv)


def test_a_row_broken_by_a_line_break_says_where_the_rest_is(tmp_path):
    """GLUE's QQP train.tsv has a question with a line break in it (line 97,931): the row
    was 'expected 6 fields like the header, found 4', with no way forward. A row as short
    as the next line is long names the line that holds its rest."""
    p = write(tmp_path, "train.tsv", "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n"
              "1\t2\t3\tHow do I cook?\tWhat is cooking?\t0\n"
              '4\t5\t6\tIs it\n\tWas it "real"?\t1\n7\t8\t9\ta\tb\t0\n')
    assert error_of(D.read_classification, p, text_column="question1",
                    pair_column="question2", label_column="is_duplicate") == (
        f"{p}:3: expected 6 fields like the header, found 4 (a line break inside a text? line "
        "4 holds the rest of the row: join the two lines, or remove the row)")
    short = write(tmp_path, "s.tsv", "sentence\tlabel\tid\ngood\t1\nbad\t0\t2\n")
    assert error_of(D.read_classification, short).endswith("found 2")   # (no such rest)
    lost = write(tmp_path, "l.tsv", "sentence\tlabel\nsome text\nother text\t1\n")
    assert error_of(D.read_classification, lost).endswith("found 1")   # (a lost label as likely)


def test_semicolon_csv_and_capitalised_headers(tmp_path):
    # Excel in comma-decimal locales writes 'Text;Label': it was one column 'text;label'
    semi = write(tmp_path, "s.csv", "\ufeffText;Label\r\ngood film;1\r\n\"a; b\";0\r\n")
    assert [(e.text_a, e.label) for e in D.read_classification(semi)] == \
        [("good film", "1"), ("a; b", "0")]
    pair = write(tmp_path, "p.tsv", "Sentence1\tSentence2\tLabel\na\tb\t1\n")
    assert [(e.text_a, e.text_b, e.label) for e in D.read_classification(pair)] == [("a", "b", "1")]
    assert [e.text_a for e in D.read_inputs(write(tmp_path, "in.txt", "Text\tid\nhi\t1\n"))] == ["hi"]
    rows = D.read_text_rows(write(tmp_path, "sts.tsv", "Sentence1\tSentence2\tScore\na\tb\t0.5\n"))
    assert [(r.texts, r.score) for r in rows] == [(("a", "b"), 0.5)]
    two = write(tmp_path, "two.tsv", "Text\tTEXT\tlabel\na\tb\t1\n")   # which one? neither
    assert "no text column" in error_of(D.read_classification, two)
    # two label columns ('class' spelt exactly was taken over 'Label'): a guess, refused
    exact = write(tmp_path, "e.tsv", "Label\tclass\ttext\na\tb\tc\n")
    assert "two label columns, 'class' and 'Label'" in error_of(D.read_classification, exact)
    assert [(e.text_a, e.label) for e in D.read_classification(exact, label_column="Label")] \
        == [("c", "a")]


def test_mixed_label_types_are_refused_and_booleans_are_one_class(tmp_path):
    # 1, 0 and 'positive' trained a three-class model without a word
    p = jsonl(tmp_path, [{"text": "a", "label": 1}, {"text": "b", "label": 0},
                         {"text": "c", "label": "positive"}, {"text": "d", "label": "0"}])
    assert error_of(D.label_set, D.read_classification(p), p) == (
        f"{p}:3: label 'positive' is a word but other labels are numbers (e.g. '0'): mixed "
        "label types; write every class one way")
    q = write(tmp_path, "q.tsv", "sentence\tlabel\na\tpos\nb\tneg\nc\t1\n")
    assert error_of(D.label_set, D.read_classification(q), q).startswith(f"{q}:4: label '1' is a number")
    # JSON booleans were refused ('not a number or a string'); pandas writes True/False
    b = jsonl(tmp_path, [{"text": "a", "label": True}, {"text": "b", "label": False}], "b.jsonl")
    t = write(tmp_path, "b.tsv", "sentence\tlabel\na\tTrue\nb\tFalse\n")
    assert [e.label for e in D.read_classification(b)] == ["True", "False"]
    assert [e.label for e in D.read_classification(t)] == ["True", "False"]
    assert D.label_set(D.read_classification(b)) == ["False", "True"]
    multi = jsonl(tmp_path, [{"text": "a", "label": [1, 2]}], "m.jsonl")
    assert "a multi-label list?" in error_of(D.read_classification, multi)


@pytest.mark.parametrize("doc", [
    {"text": {"0": "good", "1": "bad"}, "label": {"0": 1, "1": 0}},          # orient='columns'
    {"0": {"text": "good", "label": 1}, "1": {"text": "bad", "label": 0}},   # orient='index'
    {"columns": ["text", "label"], "index": [0, 1], "data": [["good", 1], ["bad", 0]]},
])
def test_a_whole_table_in_one_json_object_is_named(tmp_path, doc):
    # pandas' default to_json: 'text fields must be strings' or 'no text column ('0', '1')'
    p = write(tmp_path, "d.json", json.dumps(doc))
    for read in (D.read_classification, D.read_text_rows):
        msg = error_of(read, p)
        assert msg.startswith(f"{p}:1: one JSON object holding a whole table") and \
            "orient='records', lines=True" in msg
    q = jsonl(tmp_path, [{"text": "a", "label": 1}, {"text": {"x": 1}, "label": 0}], "q.jsonl")
    assert error_of(D.read_classification, q).startswith(
        f"{q}:2: field 'text' holds an object, not a text")


def test_json_errors_name_the_column(tmp_path):
    # 'Unterminated string starting at' ended the message: at what?
    p = write(tmp_path, "d.jsonl", '{"text": "a", "label": 1}\n{"text": "b, "label": 0}\n')
    assert error_of(D.read_classification, p) == \
        f"{p}:2: not valid JSON (Expecting ',' delimiter at column 15)"
    q = write(tmp_path, "a.json", '[{"text": "a", "label": 1},\n {"text": "b')
    assert error_of(D.read_classification, q).endswith("Unterminated string starting at column 11)")


def test_bioes_and_bilou_tags_are_read_as_iob2(tmp_path):
    # S-/E- (BIOES) and U-/L- (BILOU) were 'not IOB'
    bioes = write(tmp_path, "b.conll", "Ann S-PER\nmet O\nNew B-LOC\nYork I-LOC\nCity E-LOC\n"
                                       "\nBob S-PER\nBob S-PER\n")
    bilou = write(tmp_path, "u.conll", "Ann U-PER\nmet O\nNew B-LOC\nYork L-LOC\n")
    got = D.read_conll(bioes)
    assert [s.tags for s in got] == [["B-PER", "O", "B-LOC", "I-LOC", "I-LOC"], ["B-PER", "B-PER"]]
    assert D.read_conll(bilou)[0].tags == ["B-PER", "O", "B-LOC", "I-LOC"]
    assert D.looks_like_conll(bioes) and D.task_of_file(bilou) == "ner"
    assert D.to_iob2(["I-X", "I-X", "O", "E-Y"]) == ["B-X", "I-X", "O", "B-Y"]   # IOB1 too


def test_squad_answer_start_written_as_a_float(tmp_path):
    # pandas writes an integer column that once held a NaN as 13.0
    p = jsonl(tmp_path, [{"id": "a", "question": "Who?", "context": "Ann met Bob.",
                          "answers": [{"text": "Bob", "answer_start": 8.0}]}])
    assert D.read_squad(p)[0].answers == [("Bob", 8)]
    q = jsonl(tmp_path, [{"id": "a", "question": "Who?", "context": "Ann met Bob.",
                          "answers": [{"text": "Bob", "answer_start": 8.5}]}], "q.jsonl")
    assert "answer_start 8.5 is not a character offset" in error_of(D.read_squad, q)


def test_a_json_lines_question_with_one_answer_field(tmp_path):
    """A table's `answer` column was read, a JSON Lines line's `answer` field was not:
    "question '1' has no answers" for a line that had one."""
    p = jsonl(tmp_path, [{"question": "Who won?", "context": "The Broncos won it.",
                          "answer": "Broncos"}], "one.jsonl")
    assert D.read_squad(p)[0].answers == [("Broncos", 4)]
    none = jsonl(tmp_path, [{"question": "Who won?", "context": "The Broncos won it."}], "no.jsonl")
    assert error_of(D.read_squad, none) == (
        f"{none}:1: question '1' has no answers (expected 'answers': a list of answer texts or "
        "of {text, answer_start}, or one 'answer')")


def test_qa_questions_in_a_table(tmp_path):
    # a spreadsheet of questions was 'expected SQuAD JSON or JSON Lines'
    p = write(tmp_path, "q.csv", "Question,Context,id\r\nWho?,\"Ann met Bob, then left.\",a\r\n"
                                 "Where?,In Paris.,\r\n")
    got = D.read_squad(p, require_answers=False)
    assert [(e.id, e.question, e.context) for e in got] == [
        ("a", "Who?", "Ann met Bob, then left."), ("3", "Where?", "In Paris.")]
    assert error_of(D.read_squad, p).startswith(f"{p}:2: question 'a' has no answers")
    t = write(tmp_path, "q.tsv", "question\tcontext\tanswer\nWho?\tAnn met Bob.\tBob\n")
    assert D.read_squad(t)[0].answers == [("Bob", 8)]
    other = write(tmp_path, "c.tsv", "sentence\tlabel\na\t1\n")
    assert error_of(D.read_squad, other) == (
        f"{other}:1: no 'question' and 'context' columns (columns: 'sentence', 'label'); "
        "expected SQuAD JSON, or JSON Lines or a table with question and context")
    # an answer_start column (or field) puts a text found twice where it says (the first
    # occurrence had been taken without a word: formats4, 252 of SQuAD's 8,582 answers)
    ctx = "The cat sat. The dog ran. The cat slept."
    t = write(tmp_path, "s.csv", f'question,context,answer,answer_start\nWhich slept?,"{ctx}",'
                                 "The cat,26\n")
    j = write(tmp_path, "s.jsonl", json.dumps({"question": "Which slept?", "context": ctx,
                                               "answer": "The cat", "answer_start": 26}) + "\n")
    assert D.read_squad(t)[0].answers == D.read_squad(j)[0].answers == [("The cat", 26)]
    # as pandas writes an integer column that once held a NaN: 26.0 (regress5)
    f = write(tmp_path, "f.csv", f'question,context,answer,answer_start\nWhich slept?,"{ctx}",'
                                 "The cat,26.0\n")
    assert D.read_squad(f)[0].answers == [("The cat", 26)]
    bad = write(tmp_path, "b.csv", f'question,context,answer,answer_start\nWhich?,"{ctx}",'
                                   "The cat,abc\n")
    assert error_of(D.read_squad, bad).endswith("answer_start 'abc' is not a character offset "
                                                "(an integer, or none)")
    # a datasets export's 'answers' column is not read from a table: said so
    h = write(tmp_path, "h.csv", "question,context,answers\nWho?,Ann.,\"{'text': ['Ann']}\"\n")
    assert error_of(D.read_squad, h).startswith(f"{h}:1: a table's 'answers' column")
    # SQuAD v2's unanswerable question in JSON Lines: said as the SQuAD JSON reader says it
    v2 = write(tmp_path, "v2.jsonl", json.dumps({"question": "Who?", "context": "Ann.",
                                                 "answers": {"text": [], "answer_start": []}}) + "\n")
    assert "SQuAD v2.0's unanswerable question" in error_of(D.read_squad, v2)


def test_a_quoted_header_over_literal_quotes_is_read(tmp_path):
    # quoting is off for SST-2-like literal quotes, and the quoted header's names kept
    # their quotes: 'no text column ('"sentence"', '"label"')'
    p = write(tmp_path, "q.tsv", '"sentence"\t"label"\nthe "best" film\t1\nbad\t0\n')
    assert [(e.text_a, e.label) for e in D.read_classification(p)] == \
        [('the "best" film', "1"), ("bad", "0")]


def test_ner_json_lines_of_tokens_and_tags(tmp_path):
    # what Hugging Face datasets' to_json writes for a tagger was 'JSON, not CoNLL columns'
    p = jsonl(tmp_path, [{"id": "0", "tokens": ["EU", "rejects", "German", "call"],
                          "ner_tags": ["S-ORG", "O", "B-MISC", "O"]},
                         {"id": "1", "tokens": [], "ner_tags": []},
                         {"id": "2", "tokens": ["Peter", "Blackburn"], "ner_tags": ["I-PER", "I-PER"]}])
    got = D.read_conll(p)
    assert [(s.words, s.tags, s.line) for s in got] == [
        (["EU", "rejects", "German", "call"], ["B-ORG", "O", "B-MISC", "O"], 1),
        (["Peter", "Blackburn"], ["B-PER", "I-PER"], 3)]
    assert [e.text_a for e in D.read_inputs(p)] == ["EU rejects German call", "Peter Blackburn"]
    ints = jsonl(tmp_path, [{"tokens": ["EU"], "ner_tags": [3]}], "i.jsonl")
    assert error_of(D.read_conll, ints).startswith(f"{ints}:1: tags are numbers (a ClassLabel")
    assert D.read_conll(ints, require_tags=False)[0].words == ["EU"]
    short = jsonl(tmp_path, [{"tokens": ["EU", "x"], "ner_tags": ["O"]}], "s.jsonl")
    assert error_of(D.read_conll, short) == f"{short}:1: expected a list of 2 tags, one per token"
    null = jsonl(tmp_path, [{"tokens": ["EU", "x"], "ner_tags": ["B-ORG", None]}], "n.jsonl")
    assert error_of(D.read_conll, null).startswith(f"{null}:1: tag None is not IOB")  # (a TypeError)
    text = jsonl(tmp_path, [{"text": "EU rejects", "label": 1}], "t.jsonl")
    assert error_of(D.read_conll, text).startswith(
        f"{text}:1: expected CoNLL columns, or JSON Lines with a 'tokens' list and a ner_tags list")


def test_an_sts_benchmark_file_is_not_read_as_classes(tmp_path):
    """The STS release layout (no header, score in the fifth field) read as a labelled
    classification file (t-SNE, --task classify) said 'no text column' and listed the
    first row's sentences as column names."""
    rows = "".join(f"main-captions\tMSRvid\t2012test\t{i:04d}\t{i % 5}.000\ta man {i}\ta woman {i}\n"
                   for i in range(6))
    for name in ("sts-dev.csv", "pairs.tsv"):
        p = write(tmp_path, name, rows)
        msg = error_of(D.read_classification, p)
        assert msg.startswith(f"{p}:1: STS Benchmark rows") and "--task regress" in msg, msg


def test_json_records_without_tokens_are_skipped_with_a_note(tmp_path, capsys):
    """A tagger's JSON Lines with {"tokens": []} in the middle: the record was dropped
    without a word, and every later prediction sat one row up from its input."""
    f = tmp_path / "words.jsonl"
    f.write_text('{"tokens": ["Alice"]}\n{"tokens": []}\n{"tokens": ["Bob"]}\n')
    sentences = D.read_conll(f, require_tags=False)
    assert [(s.words, s.line) for s in sentences] == [(["Alice"], 1), (["Bob"], 3)]
    assert capsys.readouterr().err == (f"nanobert: note: {f}: 1 record with no tokens skipped "
                                       "(line 2): row i of the output is the i-th sentence, "
                                       "not line i\n")


def test_unusual_text_in_the_less_common_readers(tmp_path):
    """A bare JSON string with a lone surrogate escape was a traceback (the other JSON
    readers name it); JSON strings piped in (--input -, a file without a suffix) were
    read as plain text, quotes and escapes included; a UTF-16 file with a second
    byte-order mark (iconv of a UTF-8 file that had one) kept it in its header."""
    bad = write(tmp_path, "s.jsonl", '"a man eats"\n"\\ud800"\n')
    assert error_of(D.read_inputs, bad) == f"{bad}:2: the JSON string is not valid Unicode " \
        "(a lone surrogate escape)"
    piped = write(tmp_path, "stdin", '"a man eats"\n\n"caf\\u00e9"\n')
    assert [(e.text_a, e.line) for e in D.read_inputs(piped)] == [("a man eats", 1), ("caf\u00e9", 3)]
    plain = write(tmp_path, "stdin2", '"Hello," she said\n"ok"\n')   # not all JSON: text
    assert [e.text_a for e in D.read_inputs(plain)] == ['"Hello," she said', '"ok"']
    two_marks = write(tmp_path, "b.tsv", "\ufeffsentence\tlabel\ngood\t1\nbad\t0\n", "utf-16")
    assert [e.label for e in D.read_classification(two_marks)] == ["1", "0"]
    # UTF-32 with its mark (ff fe 00 00) was read as UTF-16 and refused as binary data
    for enc in ("utf-32", "utf-32-be"):
        data = "sentence\tlabel\nbon\u00e9\t1\nbad\t0\n".encode(enc)
        u32 = write(tmp_path, "u.tsv", data if enc == "utf-32" else b"\x00\x00\xfe\xff" + data)
        assert [e.text_a for e in D.read_classification(u32)] == ["bon\u00e9", "bad"]


@pytest.mark.parametrize("twin", ["pos\u200b", "pos\u00ad", "\ufeffpos"])
def test_labels_that_differ_only_in_what_cannot_be_seen_are_refused(tmp_path, twin):
    """'pos' and 'pos' + a zero-width space became two classes in silence ('Pos' was
    refused as ambiguous); so did an é written composed and decomposed."""
    p = write(tmp_path, "t.tsv", f"text\tlabel\na\tpos\nb\tneg\nc\t{twin}\n")
    assert error_of(D.label_set, D.read_classification(p), p) == (
        f"{p}:4: labels 'pos' and {twin!r} differ only in invisible characters or in how an "
        "accent is encoded: one class or two? write each class one way")
    p = write(tmp_path, "e.tsv", "text\tlabel\na\tn\u00e9g\nb\tpos\nc\tne\u0301g\n")
    assert "differ only in invisible characters" in error_of(D.label_set,
                                                            D.read_classification(p), p)


def test_a_fasttext_file_is_named_with_a_way_to_convert_it(tmp_path):
    """fastText's `__label__2 I loved this movie, truly.` was refused for a CSV header
    of two made-up columns ('__label__2 I loved this movie', 'truly.')."""
    p = write(tmp_path, "train.txt", "__label__2 I loved this movie, truly.\n"
              "__label__1 Terrible, just terrible.\n")
    msg = error_of(D.read_classification, p)
    assert msg.startswith(f"{p}:1: fastText's format (__label__X then the text) is not read")
    assert msg.endswith(f"' {p} > {p.with_name('train-converted.tsv')}")   # (never onto p)
    label_last = write(tmp_path, "ok.tsv", "text\tlabel\n__label__ is a token\t1\n")
    assert D.read_classification(label_last)[0].text_a == "__label__ is a token"
    table = write(tmp_path, "t.tsv", "__label__1\tI loved it\n__label__0\tawful\n")   # columns
    assert [e.text_a for e in D.read_inputs(table, {"text_column": "1"})] == ["I loved it", "awful"]


def test_an_ontonotes_conll2012_file_is_named_as_such_everywhere(tmp_path):
    """`*_gold_conll` (OntoNotes): predict tagged each of its lines as a text (entities
    on the document ids, exit 0); evaluate said "tag '(12' is not IOB"."""
    p = tmp_path / "a.v4_gold_conll"
    p.write_text("#begin document (bc/cctv/00/cctv_0001); part 000\n"
                 "bc/cctv/00/cctv_0001 0 0 Bill NNP (TOP(S(NP* - - - Speaker#1 (PERSON* (12\n"
                 "bc/cctv/00/cctv_0001 0 1 Clinton NNP *) - - - Speaker#1 *) 12)\n\n"
                 "#end document\n")
    for read in (D.read_text_lines, D.read_conll, lambda q: D.read_conll(q, False)):
        with pytest.raises(NanobertError, match=r"a\.v4_gold_conll:1: an OntoNotes CoNLL-2012 "
                                                r"file .*convert it to those$"):
            read(p)


def test_conll_index_columns_and_language_prefixes(tmp_path, capsys):
    """GermEval's token index was read as the words ('1 2 3 4 5'); PAN-X's 'en:Angela'
    kept its prefix in every word (formats4)."""
    g = write(tmp_path, "g.tsv", "1\tAngela\tB-PER\tO\n2\tMerkel\tI-PER\tO\n3\tvisited\tO\tO\n\n"
                                 "1\tSiemens\tB-ORG\tO\n2\tgrew\tO\tO\n")
    assert error_of(D.read_conll, g).startswith(f"{g}:1: the first column counts 1, 2, 3... "
                                                "(or from 0) in every sentence: a token index")
    zero = write(tmp_path, "z.tsv", "0\tAngela\tB-PER\tO\n1\tMerkel\tI-PER\tO\n\n"
                                    "0\tSiemens\tB-ORG\tO\n")
    assert "a token index" in error_of(D.read_conll, zero)    # (0-based too: regress5)
    p = write(tmp_path, "p.txt", "en:Angela\tB-PER\nen:Merkel\tI-PER\nen:visited\tO\n")
    assert D.read_conll(p)[0].words == ["Angela", "Merkel", "visited"]
    assert capsys.readouterr().err == (f"nanobert: note: {p}: every word starts with 'en:' "
                                       "(WikiANN/PAN-X's language prefix): read without it\n")
    mixed = write(tmp_path, "m.txt", "en:Angela\tB-PER\nMerkel\tI-PER\n")   # (not every word)
    assert D.read_conll(mixed)[0].words == ["en:Angela", "Merkel"]
