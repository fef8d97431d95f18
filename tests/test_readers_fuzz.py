"""Property-based fuzzing of every reader: random bytes and mutated valid files either
parse or raise `NanobertError`, never another exception (issue 11, class 5). Bounded
examples and no deadline keep each test to a few seconds on a busy machine."""
from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nanobert import data as D
from nanobert.biencoder import read_embed_data, read_rerank_data
from nanobert.corpus import corpus_files, iter_documents
from nanobert.files import NanobertError, read_lines

JSON_SEEDS = [
    [{"text": "good", "label": 1}, {"text": "bad", "label": "0"}],
    [{"text_a": "x", "text_b": "y", "label": 1}, {"text_a": "z", "text_b": "w", "label": 0}],
    [{"id": "a", "question": "Who?", "context": "Ann met Bob.", "answers": ["Bob"]}],
    {"data": [{"title": "t", "paragraphs": [{"context": "Paris is in France.", "qas": [
        {"id": "q1", "question": "Where?", "answers": [{"text": "France", "answer_start": 12}]}]}]}]},
    {"text": {"0": "good", "1": "bad"}, "label": {"0": 1, "1": 0}},   # pandas' to_json default
    [{"tokens": ["EU", "rejects"], "ner_tags": ["B-ORG", "O"]}, {"tokens": [], "ner_tags": []}],
]
FUZZ = settings(max_examples=150, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture])

VALID = {
    "tsv": "sentence\tlabel\nthe best film\t1\n\"quoted\ttab\"\t0\na dull plot\t0\n",
    "pair_tsv": "sentence1\tsentence2\tlabel\nA man eats.\tA person eats.\t1\nHi\tBye\t0\n",
    "csv": 'text,label\n"hello, world",pos\nbad,neg\n',
    "msrp": "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t1\t2\tA b.\tA c.\n0\t3\t4\tX.\tY.\n",
    "jsonl": '{"text": "good", "label": 1}\n{"text": "bad", "label": 0.0}\n'
             '{"text": "x", "label": "1"}\n',
    "conll": "-DOCSTART- O\n\nEU B-ORG\nrejects O\nGerman I-MISC\n\nPeter B-PER\n",
    "bioes": "Ann S-PER\nmet O\nNew B-LOC\nYork E-LOC\n\nBob U-PER\nSmith L-PER\n",
    "trailing_tsv": "sentence\tlabel\t\ngood film\t1\t\nbad\t0\n",
    "squad": json.dumps({"data": [{"title": "t", "paragraphs": [{
        "context": "Paris is the capital of France.",
        "qas": [{"id": "q1", "question": "Capital?", "answers": [
            {"text": "Paris", "answer_start": 0}]}]}]}]}, indent=1),
    "qa_tsv": "question\tcontext\tanswer\nWho?\tAnn met Bob.\tBob\nWhere?\t\"In\tParis\"\tParis\n",
    "squad_jsonl": '{"id": "a", "question": "Who?", "context": "Ann met Bob.", "answers": ["Bob"]}\n',
    "sts": "main-captions\tMSRvid\t2012test\t0001\t5.000\tA plane.\tAn air plane.\n"
           "main-news\tx\t2012\t2\t0.5\tOne \"two\".\tThree\textra\n",
    "triplets": "anchor\tpositive\tnegative\nq\td\tn\n",
    "rerank": "query\tdocument\tlabel\nq\td\t1\nq\te\t0\n",
    "scored_jsonl": '{"sentence1": "a", "sentence2": "b", "score": 0.5}\n',
    "qrels": "query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td9\t0\n",
    "beir_corpus": '{"_id": "d1", "title": "T", "text": "Body."}\n{"_id": 2, "text": "x"}\n',
    "corpus": "First doc. Two sentences!\nSame doc.\n\nSecond doc?\n",
}
NOISE = ['"', "\t", ",", "\n", "{", "}", "[", "]", ":", "\\", "\x00", "\ufeff", "\r", " ",
         "null", "1.5", "-", "é", "\ud7ff", "B-", "I-", "##", "\"answer_start\": -1"]


@st.composite
def mutated(draw, text: str) -> bytes:
    """A valid file with a few edits: cut a span, insert noise, duplicate or drop a line,
    or flip bytes after encoding."""
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["cut", "insert", "dup", "drop"]))
        i = draw(st.integers(0, len(text)))
        if kind == "cut":
            text = text[:i] + text[i + draw(st.integers(1, 12)):]
        elif kind == "insert":
            text = text[:i] + draw(st.sampled_from(NOISE) | st.text(max_size=4)) + text[i:]
        else:
            lines = text.split("\n")
            j = draw(st.integers(0, len(lines) - 1))
            lines[j:j + 1] = [lines[j]] * 2 if kind == "dup" else []
            text = "\n".join(lines)
    raw = bytearray(text.encode("utf-8", "surrogatepass"))
    if raw and draw(st.booleans()):
        raw[draw(st.integers(0, len(raw) - 1))] = draw(st.integers(0, 255))
    return bytes(raw)


KEYS = ["text", "label", "text_a", "text_b", "sentence", "id", "question", "context", "answers",
        "text", "answer_start", "data", "paragraphs", "qas", "title"]
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 10**20) | st.floats() | st.text(max_size=8),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.sampled_from(KEYS), kids, max_size=4),
    max_leaves=12)


def _paths(obj, at=()):
    """Every place in a JSON value, as a tuple of keys/indices."""
    yield at
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for k, v in items:
        yield from _paths(v, at + (k,))


@st.composite
def json_documents(draw) -> bytes:
    """A valid JSON Lines or SQuAD document with one to three values replaced by random
    JSON (a number for a context, a list for a label, null for an id...) or removed."""
    doc = json.loads(json.dumps(draw(st.sampled_from(JSON_SEEDS))))
    for _ in range(draw(st.integers(1, 3))):
        places = list(_paths(doc))[1:]
        if not places:
            break
        at = draw(st.sampled_from(places))
        parent = doc
        for k in at[:-1]:
            parent = parent[k]
        if draw(st.booleans()):
            parent[at[-1]] = draw(JSON_VALUES)
        elif isinstance(parent, dict):
            del parent[at[-1]]
    if isinstance(doc, list):
        return "".join(json.dumps(o) + "\n" for o in doc).encode()
    return json.dumps(doc).encode()


def file_inputs(*names):
    return (st.binary(max_size=300) | st.one_of(*(mutated(VALID[n]) for n in names))
            | json_documents())


READERS = {
    "classification": lambda p: D.read_classification(p),
    "classification_unlabelled": lambda p: D.read_classification(p, require_label=False),
    "label_set": lambda p: D.label_set(D.read_classification(p), p),
    "predict_inputs": lambda p: D.read_inputs(p),
    "conll": lambda p: D.read_conll(p),
    "conll_unlabelled": lambda p: D.read_conll(p, require_tags=False),
    "squad": lambda p: D.read_squad(p),
    "squad_unlabelled": lambda p: D.read_squad(p, require_answers=False),
    "corpus": lambda p: list(iter_documents(corpus_files([p]))),
    "lines": lambda p: list(read_lines(p)),
    "text_rows": lambda p: D.read_text_rows(p),
    "scored_rows": lambda p: D.read_text_rows(p, require_score=True),
    "qrels": lambda p: list(D.read_qrels(p).items()),
    "beir_corpus": lambda p: list(D._read_beir_jsonl(p, ("title", "text")).items()),
    "text_lines": lambda p: D.read_text_lines(p),
    "embed_rows": lambda p: read_embed_data(p),
    "rerank_rows": lambda p: read_rerank_data(p),
}
SOURCES = {"classification": ("tsv", "pair_tsv", "csv", "msrp", "jsonl", "trailing_tsv"),
           "classification_unlabelled": ("tsv", "csv", "jsonl"),
           "label_set": ("tsv", "jsonl"),
           "predict_inputs": ("tsv", "csv", "jsonl", "corpus"),
           "conll": ("conll", "bioes"), "conll_unlabelled": ("conll", "bioes"),
           "squad": ("squad", "squad_jsonl", "qa_tsv"),
           "squad_unlabelled": ("squad", "squad_jsonl", "qa_tsv"),
           "corpus": ("corpus",), "lines": ("corpus", "tsv"),
           "text_rows": ("sts", "triplets", "scored_jsonl", "tsv"),
           "scored_rows": ("sts", "scored_jsonl", "csv"), "qrels": ("qrels",),
           "beir_corpus": ("beir_corpus",), "text_lines": ("corpus", "jsonl", "conll"),
           "embed_rows": ("triplets", "scored_jsonl", "sts"), "rerank_rows": ("rerank", "csv")}


def well_formed(item) -> bool:
    """What a reader returns is usable downstream: strings where text is expected,
    answers that sit where they say, one tag per word."""
    if isinstance(item, D.Example):
        return (isinstance(item.text_a, str) and isinstance(item.text_b, (str, type(None)))
                and (item.label is None or (isinstance(item.label, str) and item.label)))
    if isinstance(item, D.QAExample):
        return (isinstance(item.question, str) and isinstance(item.context, str)
                and all(isinstance(t, str) and item.context[s:s + len(t)] == t
                        for t, s in item.answers))
    if isinstance(item, D.TextRow):
        return all(isinstance(t, str) for t in item.texts) and (
            item.score is None or abs(item.score) < float("inf"))
    if isinstance(item, D.Sentence):
        return all(isinstance(w, str) for w in item.words) and (
            item.tags is None or len(item.tags) == len(item.words))
    return isinstance(item, (str, tuple, list))      # corpus documents, label names, lines


def check(reader, path, raw: bytes):
    path.write_bytes(raw)
    try:
        out = reader(path)
    except NanobertError as e:
        assert "\n" not in str(e) and str(path) in str(e)
        return
    assert all(well_formed(x) for x in out), out


@pytest.mark.parametrize("name", list(READERS))
def test_reader_parses_or_raises_its_own_error(name, tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzz") / "input"

    @FUZZ
    @given(file_inputs(*SOURCES[name]))
    def run(raw):
        check(READERS[name], path, raw)
    run()


@pytest.mark.parametrize("name", sorted(VALID))
def test_the_valid_seeds_parse(name, tmp_path):
    """The fuzzing starts from files that really are valid."""
    p = tmp_path / "f"
    p.write_text(VALID[name], encoding="utf-8")
    reader = {"conll": D.read_conll, "bioes": D.read_conll, "squad": D.read_squad, "squad_jsonl": D.read_squad,
              "qa_tsv": D.read_squad,
              "corpus": lambda q: list(iter_documents([q])), "qrels": D.read_qrels,
              "beir_corpus": lambda q: D._read_beir_jsonl(q, ("title", "text")),
              "rerank": read_rerank_data}.get(
        name, D.read_text_rows if name in ("sts", "triplets", "scored_jsonl") else D.read_classification)
    assert len(reader(p)) >= 1


LINE_TEXT = st.text(st.characters(blacklist_categories=("Cs",),
                                  blacklist_characters="\r\n\x00\ufeff"),
                    max_size=8)   # U+2028, U+0085, form feeds... stay inside their line


@pytest.mark.parametrize("encoding", ["utf-8", "utf-16"])
def test_any_line_endings_give_the_same_lines(encoding, tmp_path_factory):
    """LF, CRLF and a lone CR (old Mac, some exports) all end a line, mixed as they come;
    a lone CR was kept inside the line, so a CR-only file was one line."""
    path = tmp_path_factory.mktemp("eol") / "input"

    @FUZZ
    @given(st.lists(LINE_TEXT, min_size=1, max_size=6),
           st.lists(st.sampled_from(["\n", "\r\n", "\r"]), min_size=6, max_size=6))
    def run(lines, ends):
        path.write_bytes("".join(t + e for t, e in zip(lines, ends)).encode(encoding))
        assert list(read_lines(path)) == list(enumerate(lines, 1))
    run()


INTEGER_SPELLINGS = [str, "{}.0".format, "{}.".format, "{:+d}".format, "{}e0".format,
                     lambda n: f"{n * 10}E-1", "{}.000".format, "{:+.1f}".format]


@FUZZ
@given(st.integers(-10 ** 9, 10 ** 9), st.sampled_from(INTEGER_SPELLINGS))
def test_an_integer_label_is_one_class_however_it_is_written(n, spell):
    """'+1', '1e0', '10E-1', '1.' are the class '1' (they were classes of their own, and
    label_set's int() then merged them into a repeated name: a KeyError)."""
    assert D.integral_label(spell(n)) == str(n)
    assert D._label_str(float(n), "f", 1) == str(n)
