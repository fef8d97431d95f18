"""Readers of STS, pair/triplet/reranking tables and BEIR folders (nanobert.data)."""
from __future__ import annotations

import json

import pytest

from nanobert import data as D
from nanobert.files import NanobertError


def _write(path, text, newline="\n"):
    path.write_bytes(text.replace("\n", newline).encode("utf-8"))
    return path


def test_sts_original_layout(tmp_path):
    f = _write(tmp_path / "sts-dev.csv",
               'main-captions\tMSRvid\t2012test\t0001\t5.000\tA "plane" takes off.\tA plane is taking off.\n'
               "main-news\theadlines\t2016\t0012\t4\tDriver backs off\tDriver drives off\tsrc\tsrc\n"
               "main-news\theadlines\t2016\t0013\t0.5\t\"unbalanced quote\tplain\n")
    rows = D.read_text_rows(f)
    assert [r.score for r in rows] == [5.0, 4.0, 0.5]
    assert rows[0].texts == ('A "plane" takes off.', "A plane is taking off.")   # quotes literal
    assert rows[1].texts == ("Driver backs off", "Driver drives off")   # extra fields ignored
    assert rows[2].texts[0] == '"unbalanced quote' and rows[2].line == 3


def test_sts_original_bad_lines(tmp_path):
    short = _write(tmp_path / "a.csv", "g\tf\t2012\t1\t5.0\tone\ttwo\ng\tf\t2012\t2\t1.0\tonly one\n")
    with pytest.raises(NanobertError, match=r"a.csv:2: expected at least 7"):
        D.read_text_rows(short)
    bad = _write(tmp_path / "b.csv", "g\tf\t2012\t1\t5.0\tone\ttwo\ng\tf\t2012\t2\tn/a\tx\ty\n")
    with pytest.raises(NanobertError, match=r"b.csv:2: score 'n/a'"):
        D.read_text_rows(bad)


def test_glue_stsb_tsv(tmp_path):
    f = _write(tmp_path / "dev.tsv",
               "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
               "0\tmain-captions\tMSRvid\t2012test\t0000\tnone\tnone\tA man \"sings\".\tA man sings.\t5.000\n"
               "1\tmain-captions\tMSRvid\t2012test\t0002\tnone\tnone\tA cat.\tA dog.\t0.800\n", "\r\n")
    rows = D.read_text_rows(f)
    assert rows[0].texts == ('A man "sings".', "A man sings.") and rows[1].score == 0.8
    unlabelled = _write(tmp_path / "test.tsv", "index\tsentence1\tsentence2\n0\ta\tb\n")
    assert D.read_text_rows(unlabelled)[0].score is None
    with pytest.raises(NanobertError, match="no score column"):
        D.read_text_rows(unlabelled, require_score=True)
    # its header line gone, it was read as the STS Benchmark's layout: old_index as the
    # score, the source columns as the sentences (a wrong Spearman, exit 0)
    headless = _write(tmp_path / "h.tsv", f.read_text().split("\n", 1)[1])
    with pytest.raises(NanobertError, match=r"h\.tsv:1: a GLUE STS-B row without the header "
                                            r"line"):
        D.read_text_rows(headless)
    test_split = _write(tmp_path / "t.tsv", "0\tmain-captions\tMSRvid\t2012test\t0024\tnone\t"
                                           "none\tA girl is styling her hair.\tA girl is "
                                           "brushing her hair.\n")     # (no score column)
    with pytest.raises(NanobertError, match=r"without the header line.*--text-pair-column 8\)$"):
        D.read_text_rows(test_split)
    # its columns given by index: read as its user means (it had been, and stays so)
    rows = D.read_text_rows(headless, columns={"text": "7", "pair": "8", "score": "9"})
    assert rows[0].texts == ('A man "sings".', "A man sings.") and rows[1].score == 0.8


def test_triplets_rerank_rows_and_single_texts(tmp_path):
    trip = _write(tmp_path / "t.jsonl", "\n".join(json.dumps(o) for o in [
        {"anchor": "a", "positive": "p", "negative": "n"},
        {"anchor": "b", "positive": "q", "negative": "m"}]) + "\n")
    assert [r.texts for r in D.read_text_rows(trip)] == [("a", "p", "n"), ("b", "q", "m")]
    rerank = _write(tmp_path / "r.csv", "query,document,label\nwho,him,1\nwho,her,0\n")
    rows = D.read_text_rows(rerank)
    assert rows[1].texts == ("who", "her") and rows[1].score == 0.0
    single = _write(tmp_path / "s.tsv", "sentence\tscore\ngood\t0.9\nbad\t-1.5\n")
    assert [(r.texts, r.score) for r in D.read_text_rows(single)] == [(("good",), 0.9), (("bad",), -1.5)]
    named = _write(tmp_path / "n.tsv", "x\ty\tz\nu\tv\t2\n")
    rows = D.read_text_rows(named, columns={"text": "x", "pair": "y", "score": "z"})
    assert rows[0].texts == ("u", "v") and rows[0].score == 2.0
    with pytest.raises(NanobertError, match="no text column"):
        D.read_text_rows(named)
    missing = _write(tmp_path / "m.jsonl", '{"anchor": "a", "positive": "p"}\n{"anchor": "b"}\n')
    with pytest.raises(NanobertError, match="m.jsonl:2:"):
        D.read_text_rows(missing)


def test_classification_pair_layouts_read_both_texts(tmp_path):
    """QNLI's question/sentence, QQP's question1/question2 and SICK's sentence_A/
    sentence_B tables are pairs: the second text is read, not dropped; without their
    scores they are no (query, positive) pairs."""
    qnli = _write(tmp_path / "qnli.tsv", "question\tsentence\tlabel\nwho?\tme.\t1\n")
    assert D.read_text_rows(qnli, require_score=False)[0].texts == ("who?", "me.")
    qqp = _write(tmp_path / "qqp.tsv", "id\tquestion1\tquestion2\tis_duplicate\n1\tq\tr\t1\n")
    assert D.read_text_rows(qqp, require_score=False)[0].texts == ("q", "r")
    sick = _write(tmp_path / "sick.tsv", "sentence_A\tsentence_B\tscore\na\tb\t4.5\n")
    assert D.read_text_rows(sick)[0].texts == ("a", "b")
    with pytest.raises(NanobertError, match="no score column.*related by their scores"):
        D.read_text_rows(qqp, pairs_need_score=True)


@pytest.mark.parametrize("header, role, flag", [
    ("sentence1,sentence2,score,label", "score", "--label-column"),
    ("query,text", "text", "--text-column"),
    ("anchor,positive,document", "pair", "--text-pair-column"),
])
def test_two_candidate_columns_for_one_role_are_refused(tmp_path, header, role, flag):
    """Two columns that could each hold a role: a guess, refused naming both and the
    flag; naming the role's column by flag reads the file."""
    f = _write(tmp_path / "two.csv", header + "\n" + ",".join("1" * len(header.split(","))) + "\n")
    first, second = [c for c in header.split(",")
                     if c in {"score", "label", "query", "text", "positive", "document"}][:2]
    with pytest.raises(NanobertError, match=f"two.csv:1: two {role} columns, '{first}' and "
                                            f"'{second}'.*{flag}"):
        D.read_text_rows(f)
    rows = D.read_text_rows(f, columns={role: second})
    assert rows[0].texts[0] == "1"


def test_one_column_in_two_roles_is_refused_and_sts_rows_follow_the_flags(tmp_path):
    """--text-column 5 --text-pair-column 5 paired each text with itself; on a file of
    the STS Benchmark layout the column flags were not read at all (now they replace the
    layout's own columns, by index)."""
    sts = _write(tmp_path / "sts-x.csv", "main\tx\t2012\t1\t4.5\tA cat.\tA dog.\n"
                                         "main\tx\t2012\t2\t1.0\tA man.\tThe sky.\n")
    with pytest.raises(NanobertError, match=r"sts-x.csv:1: --text-column and --text-pair-column "
                                            r"both take column '5'; each needs a column of its own"):
        D.read_text_rows(sts, columns={"text": "5", "pair": "5"})
    with pytest.raises(NanobertError, match=r"sts-x.csv:1: --text-column and --label-column both "
                                            r"take column '4'"):
        D.read_text_rows(sts, columns={"text": "4", "pair": "6", "score": "4"})
    with pytest.raises(NanobertError, match=r"sts-x.csv:1: --label-column score: the STS "
                                            "Benchmark layout has no header to name a column "
                                            "by; give its 0-based index"):
        D.read_text_rows(sts, columns={"score": "score"})
    rows = D.read_text_rows(sts, columns={"text": "6", "pair": "5"})
    assert [(r.texts, r.score) for r in rows] == [(("A dog.", "A cat."), 4.5),
                                                  (("The sky.", "A man."), 1.0)]
    assert D.read_text_rows(sts, columns={"pair": "1"})[1].texts == ("A man.", "x")
    with pytest.raises(NanobertError, match=r"sts-x.csv:1: expected at least 10 tab-separated"):
        D.read_text_rows(sts, columns={"score": "9"})
    assert D.read_text_rows(sts)[0].texts == ("A cat.", "A dog.")     # no flags: the layout
    t = _write(tmp_path / "t.tsv", "query\tdocument\tscore\nq\td\t1\n")
    with pytest.raises(NanobertError, match=r"t.tsv:1: --text-pair-column and the negative "
                                            r"column both take column 'document'"):
        D.read_text_rows(t, columns={"pair": "document", "negative": "document"})


def _beir(tmp_path, qrels="query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\t2\n"):
    root = tmp_path / "beir"
    (root / "qrels").mkdir(parents=True)
    _write(root / "corpus.jsonl", '{"_id": "d1", "title": "T", "text": "one"}\n'
                                  '{"_id": "d2", "title": null, "text": "two"}\n')
    _write(root / "queries.jsonl", '{"_id": "q1", "text": "first", "metadata": {}}\n'
                                   '{"_id": "q2", "text": "second"}\n')
    _write(root / "qrels" / "train.tsv", qrels, "\r\n")
    return root


def test_beir_folder(tmp_path):
    root = _beir(tmp_path)
    b = D.read_beir(root)
    assert b.split == "train" and b.qrels == {"q1": {"d1": 1}, "q2": {"d2": 2}}
    assert b.doc_text("d1") == "T one" and b.doc_text("d2") == "two"
    _write(root / "qrels" / "test.tsv", "query-id\tcorpus-id\tscore\nq2\td1\t1\n")
    assert D.beir_splits(root) == ["test", "train"] and D.read_beir(root).split == "test"
    assert D.read_beir(root, "train").split == "train"
    other = D.read_beir(root).select("train")
    assert other.split == "train" and len(other) == 2 and other.doc_text("d1") == "T one"
    with pytest.raises(NanobertError, match="no qrels for split 'dev'"):
        D.read_beir(root).select("dev")
    with pytest.raises(NanobertError, match=r"no qrels for split 'dev' \(available: test, train\)"):
        D.read_beir(root, "dev")
    with pytest.raises(NanobertError, match="not a BEIR folder"):
        D.read_beir(tmp_path)


def test_a_beir_corpus_file_gives_the_texts_beir_evaluation_embeds(tmp_path):
    """`search --corpus corpus.jsonl` embedded the text alone (read as any JSON Lines
    table); a BEIR folder's documents are title + " " + text."""
    root = _beir(tmp_path)
    b = D.read_beir(root)
    assert D.beir_corpus_texts(root / "corpus.jsonl") == [b.doc_text("d1"), b.doc_text("d2")] \
        == ["T one", "two"]
    assert D.beir_corpus_texts(root / "queries.jsonl") is None          # no title: a table
    other = _write(tmp_path / "t.jsonl", '{"title": "T", "text": "one"}\n')   # no _id
    assert D.beir_corpus_texts(other) is None
    assert D.beir_corpus_texts(_write(tmp_path / "t.txt", "one line\n")) is None


def test_a_beir_corpus_whose_first_document_has_no_title_key_keeps_the_titles(tmp_path):
    """The title is optional in corpus.jsonl (read_beir reads a missing one as ""); a
    first document without the key had made search and embed read the file as a table of
    texts, and every later title was dropped (evaluation embeds title + " " + text)."""
    path = _write(tmp_path / "corpus.jsonl", '{"_id": "1", "text": "solar output"}\n'
                  '{"_id": 2, "title": "Coffee", "text": "a drink"}\n')
    assert D.beir_corpus_texts(path) == ["solar output", "Coffee a drink"]


def test_anchor_and_query_are_text_columns_of_a_table(tmp_path):
    """as sentence-transformers' datasets and query tables name them; a query's document
    column is a second text to name with --text-pair-column, as BoolQ's passage is."""
    rows = D.read_classification(_write(tmp_path / "q.csv", "query,label\nhi there,greet\n"))
    assert [(e.text_a, e.text_b, e.label) for e in rows] == [("hi there", None, "greet")]
    table = _write(tmp_path / "a.tsv", "anchor\tpositive\na cat\tcats\n")
    assert [e.text_a for e in D.read_inputs(table)] == ["a cat"]
    pairs = _write(tmp_path / "p.tsv", "query\tdocument\tlabel\nq\td\t1\n")
    with pytest.raises(NanobertError, match="column 'document' looks like the second text of "
                                            "pairs; name the pair with --text-pair-column"):
        D.read_classification(pairs)
    two = _write(tmp_path / "two.tsv", "query\ttext\tlabel\nq\tt\t1\n")
    with pytest.raises(NanobertError, match="two text columns, 'text' and 'query'"):
        D.read_classification(two)


def test_beir_bad_qrels(tmp_path):
    root = _beir(tmp_path, "query-id\tcorpus-id\tscore\nq9\td1\t1\n")
    with pytest.raises(NanobertError, match=r"train.tsv:2: query 'q9' is not in queries.jsonl"):
        D.read_beir(root)
    root2 = _beir(tmp_path / "x", "q1\td1\n")
    with pytest.raises(NanobertError, match=r"train.tsv:1: expected 3 fields \(query-id, corpus-id, score\), found 2$"):
        D.read_beir(root2)


def test_beir_ids_and_judged_documents(tmp_path, capsys):
    # qrels of another corpus scored 0 everywhere; a repeated _id replaced the first
    root = _beir(tmp_path, "q1\td9\t1\n")
    with pytest.raises(NanobertError, match=r"train.tsv: none of the 1 judged documents is in "
                                            r"corpus.jsonl \(e.g. 'd9'\)"):
        D.read_beir(root)
    root = _beir(tmp_path / "some", "q1\td9\t1\nq1\td1\t1\n")
    assert D.read_beir(root).qrels == {"q1": {"d9": 1, "d1": 1}}
    assert capsys.readouterr().err == (f"nanobert: note: {root / 'qrels' / 'train.tsv'}: 1 of 2 "
                                       "judged documents are not in corpus.jsonl (e.g. 'd9'); "
                                       "they count as relevant and never retrieved\n")
    _write(root / "corpus.jsonl", '{"_id": "d1", "text": "a"}\n{"_id": "d1", "text": "b"}\n')
    with pytest.raises(NanobertError, match=r"corpus.jsonl:2: _id 'd1' is used twice \(first on "
                                            r"line 1\)"):
        D.read_beir(root)
    (root / "corpus.jsonl").unlink()  # a folder lacking a file was 'is a directory'
    with pytest.raises(NanobertError, match="not a BEIR folder .*; missing corpus.jsonl"):
        D.read_beir(root)
    from nanobert.biencoder import read_pairs_or_beir
    with pytest.raises(NanobertError, match="missing corpus.jsonl"):
        read_pairs_or_beir(root)


def test_beir_judged_documents_are_checked_in_the_split_chosen(tmp_path, capsys):
    """`--split dev` noted the missing documents of test.tsv, a file it never read, and
    did not check dev.tsv: qrels of another corpus there scored 0 without a word."""
    from nanobert.biencoder import beir_split, read_pairs_or_beir
    root = _beir(tmp_path, "q1\td1\t1\n")
    _write(root / "qrels" / "test.tsv", "q1\td9\t1\nq2\td2\t1\n")
    _write(root / "qrels" / "dev.tsv", "q1\td8\t1\n")
    data = read_pairs_or_beir(root)
    assert beir_split(data, {"split": "train"}, training=False).split == "train"
    assert capsys.readouterr().err == ""
    with pytest.raises(NanobertError, match=r"dev.tsv: none of the 1 judged documents"):
        beir_split(data, {"split": "dev"}, training=False)
    assert beir_split(data, {}, training=False).split == "test"
    assert "test.tsv: 1 of 2 judged documents" in capsys.readouterr().err


@pytest.mark.parametrize("query, msg", [
    ('{"_id": "q1", "text": null}', "query 'q1' has no text"),      # was a TypeError traceback
    ('{"_id": "q1", "text": "  "}', "query 'q1' has no text"),      # matched nothing, silently
    ('{"_id": "q1", "text": 5}', "expected an object with a string '_id' and string 'text'"),
    ('{"_id": null, "text": "x"}', "expected an object with a string '_id'")])   # was id 'None'
def test_beir_queries_need_an_id_and_a_text(tmp_path, query, msg):
    root = _beir(tmp_path)
    _write(root / "queries.jsonl", query + '\n{"_id": "q2", "text": "second"}\n')
    with pytest.raises(NanobertError, match=rf"queries.jsonl:1: {msg}"):
        D.read_beir(root)


def test_beir_corpus_fields_are_strings_or_null(tmp_path, capsys):
    root = _beir(tmp_path)
    _write(root / "corpus.jsonl", '{"_id": "d1", "title": null, "text": null}\n'
                                  '{"_id": 2, "text": "two"}\n{"_id": "d3", "text": " "}\n')
    assert D._read_beir_jsonl(root / "corpus.jsonl", ("title", "text")) == \
        {"d1": ("", ""), "2": ("", "two"), "d3": ("", " ")}
    # documents with nothing to embed are said, once
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "corpus.jsonl: 2 document(s) have no title and no text " \
        "(e.g. _id 'd1' on line 1)" in err
    _write(root / "corpus.jsonl", '{"_id": "d1", "title": "T", "text": 0}\n')   # was text ""
    with pytest.raises(NanobertError, match=r"corpus.jsonl:1: expected an object with a string "
                                            r"'_id' and string 'title', 'text'"):
        D.read_beir(root)


@pytest.mark.parametrize("header", ["query_id\tdoc_id\trelevance\n", "qid\tdocid\tscore\n",
                                    "\nquery-id\tcorpus-id\tscore\n"])
def test_qrels_header_of_any_names_is_skipped(tmp_path, header):
    # 'relevance' was "not an integer relevance grade" at line 1 (BEIR skips the first row)
    root = _beir(tmp_path, header + "q1\td1\t1\nq2\td2\t2\n")
    assert D.read_beir(root).qrels == {"q1": {"d1": 1}, "q2": {"d2": 2}}
    headerless = _beir(tmp_path / "h", "q1\td1\t1\nq2\td2\t2\n")   # the first row is a row
    assert D.read_beir(headerless).qrels == {"q1": {"d1": 1}, "q2": {"d2": 2}}


def test_jsonl_rows_take_the_fields_of_every_line(tmp_path):
    # the columns came from line 1 only: line 2's negative was dropped without a word
    late = _write(tmp_path / "t.jsonl", '{"anchor": "a", "positive": "p"}\n'
                                        '{"anchor": "b", "positive": "q", "negative": "n"}\n')
    with pytest.raises(NanobertError, match=r"t.jsonl:1: missing field 'negative', which 1 of "
                                            r"2 records have \(the first, line 2\)"):
        D.read_text_rows(late)
    # one line of many with an extra field: the error named line 1 and "other lines",
    # never the odd line out
    odd = _write(tmp_path / "odd.jsonl", '{"anchor": "a", "positive": "p"}\n' * 300 +
                 '{"anchor": "b", "positive": "q", "negative": "n"}\n' +
                 '{"anchor": "a", "positive": "p"}\n' * 50)
    with pytest.raises(NanobertError, match=r"odd.jsonl:1: missing field 'negative', which 1 "
                                            r"of 351 records have \(the first, line 301\)"):
        D.read_text_rows(odd)


def test_qrels_separated_by_spaces_and_qrels_of_another_suffix(tmp_path):
    # TREC-style `q1 d1 1` lines were 'found 1 field(s)'; qrels/test.csv was only 'no
    # qrels .tsv files'
    root = _beir(tmp_path, "query-id corpus-id score\nq1 d1 1\nq2  d2\t\n")
    with pytest.raises(NanobertError, match=r"train.tsv:3: expected 3 fields \(query-id, corpus-id, score\)"):
        D.read_beir(root)     # (a line with a tab is split at tabs only)
    _write(root / "qrels" / "train.tsv", "query-id corpus-id score\nq1 d1 1\nq2  d2 2\n")
    assert D.read_beir(root).qrels == {"q1": {"d1": 1}, "q2": {"d2": 2}}
    (root / "qrels" / "train.tsv").rename(root / "qrels" / "train.csv")
    with pytest.raises(NanobertError) as e:
        D.read_beir(root)
    assert str(e.value) == (f"{root / 'qrels'}: no qrels .tsv files (found train.csv: BEIR "
                            "qrels are <split>.tsv, tab-separated)")


def test_the_folder_above_a_beir_folder_points_at_it(tmp_path):
    # scifact.zip unpacks to scifact/scifact/...: the outer folder was only 'missing ...'
    root = _beir(tmp_path)
    with pytest.raises(NanobertError) as e:
        D.read_beir(tmp_path)
    assert str(e.value).endswith(f"; {root} is a BEIR folder: pass that one)")
    with pytest.raises(NanobertError, match="cannot be read"):   # (not an OSError traceback)
        D.is_beir_dir(tmp_path / ("x" * 300))


def test_a_missing_score_is_called_missing(tmp_path):
    # an empty cell was "score '' is not a finite number"
    f = _write(tmp_path / "s.tsv", "sentence1\tsentence2\tscore\na\tb\t1\nc\td\t\n")
    with pytest.raises(NanobertError) as e:
        D.read_text_rows(f, require_score=True)
    assert str(e.value) == f"{f}:3: the score is missing (an empty cell or null); every row needs one here"
    j = _write(tmp_path / "s.jsonl", '{"sentence1": "a", "sentence2": "b", "score": null}\n')
    with pytest.raises(NanobertError, match=r"s.jsonl:1: the score is missing"):
        D.read_text_rows(j, require_score=True)


def test_rows_with_an_empty_text_are_kept_with_one_note(tmp_path, capsys):
    """As labelled classification examples are: kept (a row of the file is a row of the
    output), with one note naming the first one's line and the count."""
    f = _write(tmp_path / "e.tsv", "anchor\tpositive\na man eats\t\na cat\ta kitten\nx\t \n")
    rows = D.read_text_rows(f)
    assert [r.texts for r in rows] == [("a man eats", ""), ("a cat", "a kitten"), ("x", " ")]
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{f}:2: 2 row(s) with an empty text (kept" in err
    D.read_text_rows(_write(tmp_path / "ok.tsv", "anchor\tpositive\na\tb\n"))
    assert capsys.readouterr().err == ""
    sts = _write(tmp_path / "sts-dev.csv", "main-news\theadlines\t2016\t0001\t3.0\tA b\tC d\n"
                                         "main-news\theadlines\t2016\t0002\t3.0\t\tC d\n")
    assert [r.texts for r in D.read_text_rows(sts)][1] == ("", "C d")  # (the release's layout)
    assert f"{sts}:2: 1 row(s) with an empty text (kept" in capsys.readouterr().err


MSRP = ("\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
        "1\t1\t2\tA man eats.\tSomeone is eating.\n0\t3\t4\tThe sky is blue.\tCats purr.\n")


def test_an_msrp_file_is_read_as_pairs_and_its_classes_are_not_taken_for_scores(tmp_path):
    """An MSRP file to an embedding model: evaluate said "expected a TSV/CSV file with a
    header" (it has one), predict read its lines (the header too) as single texts."""
    p = tmp_path / "msr_paraphrase_test.txt"
    p.write_text(MSRP, encoding="utf-8")
    with pytest.raises(NanobertError, match=r"msr_paraphrase_test\.txt:1: the MSRP paraphrase "
                                            r"layout: its 'Quality' column holds classes"):
        D.read_text_rows(p, require_score=True)
    rows = D.read_text_rows(p, require_score=False)
    assert [r.texts for r in rows] == [("A man eats.", "Someone is eating."),
                                       ("The sky is blue.", "Cats purr.")]
    assert [r.score for r in D.read_text_rows(p, columns={"score": "Quality"})] == [1.0, 0.0]
    from nanobert.biencoder import text_rows_input      # predict --input: pairs, no note
    assert [r.texts for r in text_rows_input(p)] == [r.texts for r in rows]


def test_a_label_column_of_only_0_and_1_read_as_scores_is_noted(tmp_path, capsys):
    """GLUE RTE given to an embedding model: its classes (0 entailment) were read as
    similarity scores, a negative Spearman with nothing said."""
    p = tmp_path / "rte.tsv"
    p.write_text("index\tsentence1\tsentence2\tlabel\n0\ta b\ta\t0\n1\tc d\te\t1\n")
    assert [r.score for r in D.read_text_rows(p, require_score=True)] == [0.0, 1.0]
    assert "rte.tsv: every 'label' is 0 or 1, read as similarity scores" in capsys.readouterr().err
    D.read_text_rows(p, require_score=True, columns={"score": "label"})
    p.write_text("sentence1\tsentence2\tlabel\na\tb\t0.5\nc\td\t1\n")
    D.read_text_rows(p, require_score=True)
    assert capsys.readouterr().err == ""


def test_a_score_written_as_python_reads_it_is_refused(tmp_path):
    """'1_000' (a damaged cell) was read as a thousand, and full-width digits as digits,
    where '3,5' is refused (badinputs3)."""
    for cell in ("1_000", "\uff14.5"):
        f = _write(tmp_path / "s.tsv", f"sentence1\tsentence2\tscore\na\tb\t{cell}\nc\td\t1\n")
        with pytest.raises(NanobertError) as e:
            D.read_text_rows(f, require_score=True)
        assert str(e.value) == f"{f}:2: score {cell!r} is not a finite number"


TRIPLES = ("how do planes fly\twings make lift as air flows over them\tthe cat sat on the mat\n"
           "who wrote hamlet\thamlet was written by shakespeare\tthe river is wide\n")


def test_a_headerless_triplets_file_is_told_how_to_read(tmp_path, capsys):
    """MS MARCO's triples.tsv has no header: the error gave no hint, and read with column
    indices its negatives were dropped without a word; a reranker given triplets was told
    to name a label column it does not have (formats4)."""
    f = _write(tmp_path / "triples.tsv", TRIPLES)
    with pytest.raises(NanobertError) as e:
        D.read_text_rows(f)
    assert str(e.value).endswith("its first row reads as data, not names: give the file a "
                                 "header (anchor, positive[, negative], or sentence1, "
                                 "sentence2, score), or name 0-based columns (--text-column 0 "
                                 "--text-pair-column 1)")
    rows = D.read_text_rows(f, columns={"text": "0", "pair": "1"})
    assert [len(r.texts) for r in rows] == [2, 2]
    assert capsys.readouterr().err == (f"nanobert: note: {f}: column(s) 2 not read (the columns "
                                       "named by flags are); hard negatives are read from a "
                                       "header's 'negative' column\n")
    h = _write(tmp_path / "h.tsv", "query\tpositive\tnegative\n" + TRIPLES)
    with pytest.raises(NanobertError, match="a reranker reads \\(query, document, label\\) "
                                            "rows: \\(query, positive, negative\\) triplets"):
        D.read_text_rows(h, require_score=True)


def test_a_relevance_grade_is_a_number_as_people_write_it():
    """qrels still read '1_0' as 10 and a full-width '１' as 1 (regress5)."""
    assert D._grade("2") == 2 and D._grade("2.0") == 2 and D._grade("-1") == -1
    assert D._grade("1_0") is None and D._grade("\uff11") is None and D._grade("x") is None
