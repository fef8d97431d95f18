"""Labelled data readers: classification, NER and QA files, format detected from the file.

Classification (one text or a text pair, and a label):
    GLUE TSV     header `sentence label`, `sentence1 sentence2 label`, `question sentence`,
                 `question1 question2 is_duplicate`...; extra columns ignored; fields
                 CSV-quoted only when the file quotes them (SST-2 has literal quotes,
                 RTE quotes fields that contain `"`), decided by looking at the file
    MSRP         `Quality  #1 ID  #2 ID  #1 String  #2 String` (UTF-8 with BOM)
    CSV          header with `text,label` or `text_a,text_b,label`
    JSON Lines   {"text": ..., "label": ...} or {"text_a", "text_b", "label"}
    Column names can be given instead (--text-column, --text-pair-column, --label-column),
    or 0-based column indices (`--text-column 3 --label-column 1`: a TSV/CSV without a
    header, such as GLUE CoLA; in a file with a header, the index counts its columns).
NER: CoNLL columns, token first and tag last, sentences separated by blank lines,
    `-DOCSTART-` lines skipped; IOB1, BIOES and BILOU tags are rewritten as IOB2.
QA: SQuAD v1.1 JSON (data[].paragraphs[].{context, qas[].{id, question, answers}}),
    or JSON Lines or a TSV/CSV table with `question` and `context` (for prediction).

Every problem is a `NanobertError` naming the file and line.
"""
from __future__ import annotations

import collections
import csv
import functools
import itertools
import json
import random
import re
import shlex
import unicodedata
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Optional

from .files import (NanobertError, data_error, input_path, note, path_kind, plain_number, read_lines,
                    some_of)

csv.field_size_limit(1 << 26)


@dataclass(slots=True)   # (no __dict__ each: a million SST-2 rows read in 46 MB less)
class Example:
    """One classification example: text (and optional pair) with its label (a string)."""
    text_a: str
    text_b: Optional[str] = None
    label: Optional[str] = None
    line: int = 0


@dataclass(slots=True)
class Sentence:
    """One NER sentence: words and their IOB2 tags (None when unlabelled)."""
    words: list
    tags: Optional[list] = None
    line: int = 0
    word_a_line: bool = False   # CoNLL columns: word i on line `line + i` (else all on `line`)

    def line_of(self, i: int) -> int:
        """The line of the file that holds word i."""
        return self.line + i if self.word_a_line else self.line


@dataclass(slots=True)
class QAExample:
    id: str
    question: str
    context: str
    answers: list = field(default_factory=list)   # [(text, char_start)]
    title: str = ""
    line: Optional[int] = None    # of a JSON Lines record or table row
    id_given: bool = True         # False: the file gave none, and `id` is the line number


# ----------------------------------------------------------------------------------
# Classification

TEXT_COLUMNS = ["text", "sentence", "text_a", "sentence1", "question1", "question", "premise",
                "#1 String", "#1 string", "sentence_a",
                # sentence-transformers' (anchor, positive, negative) datasets; query tables
                "anchor", "query"]
PAIR_COLUMNS = {  # first text column -> its pair column
    "text": "text_pair", "text_a": "text_b", "sentence1": "sentence2", "question1": "question2",
    "question": "sentence", "premise": "hypothesis", "#1 String": "#2 String",
    "#1 string": "#2 string", "sentence_a": "sentence_b",
}
LABEL_COLUMNS = ["label", "labels", "gold_label", "Quality", "is_duplicate", "class"]
# second texts of other layouts (BoolQ's question/passage, answer-selection tables, a
# question with its context): read as pairs only when named with --text-pair-column,
# never dropped without a word
SECOND_TEXTS = ["passage", "answer", "document", "context"]
# what SNLI and MultiNLI write where annotators found no consensus: a row with no label
NO_GOLD_LABEL = "-"


@dataclass
class Columns:
    """Which fields hold text, pair and label (names for JSON, names or indices for tables)."""
    text: str
    pair: Optional[str]
    label: Optional[str]


def column_named(names, wanted: Optional[str], loose: bool = True) -> Optional[str]:
    """The column of `names` that is the well-known column `wanted`: the one spelt so, else
    (when `loose`) the one spelt so in other capitals ('Text', 'LABEL': spreadsheets and
    Kaggle files capitalise headers) when just one is."""
    if not wanted:
        return None
    if wanted in names:
        return wanted
    same = [n for n in names if isinstance(n, str) and n.casefold() == wanted.casefold()]
    return same[0] if loose and len(same) == 1 else None


def first_column(names, candidates) -> Optional[str]:
    """The first of `candidates` that `names` has, spelt exactly; else in other capitals
    (an exact 'class' wins over a 'Label')."""
    for loose in (False, True):
        found = next((column_named(names, c, loose) for c in candidates
                      if column_named(names, c, loose)), None)
        if found:
            return found
    return None


def is_column_index(col) -> bool:
    """Is a column given by flag a 0-based index ('3', as pandas and csv count) rather
    than a name?"""
    return isinstance(col, (int, str)) and not isinstance(col, bool) and \
        str(col).isascii() and str(col).isdigit()


def by_index(header: list, col):
    """The name in `header` of a column given as a 0-based index that is not itself a
    name there (the header's column at that place); any other column as given."""
    if col is None or not is_column_index(col):
        return col
    if str(col) in header:      # (3 from Python names the column '3', as '3' does)
        return str(col)
    return header[int(col)] if int(col) < len(header) else str(col)


def _is_header(fields: list, given) -> bool:
    """Is the first row of a table, whose columns were given by index, its header? It is
    when it names a column some reader knows (any capitals), a column given by name, or
    is pandas' header of unnamed columns (`0,1,2`, after an empty name for the index);
    else (GLUE CoLA: `gj04  1    Our friends...`) it is the first row of data."""
    names = _trimmed([_unquoted(f.strip()) for f in fields], 1)
    numbered = names[1:] if names[0] == "" else names
    return any(column_named(names, c) for c in KNOWN_COLUMNS) or \
        any(c in names for c in given if c is not None and not is_column_index(c)) or \
        numbered == [str(i) for i in range(len(numbered))]


def _headerless_hint(names: list) -> str:
    """Advice for a first row that reads as data, not names (a sentence among them): a
    file without a header takes 0-based column indices."""
    lengths = [len(str(n).split()) for n in names]
    if not lengths or max(lengths) <= SENTENCE_WORDS:
        return ""
    text = lengths.index(max(lengths))
    numbers = [i for i, n in enumerate(names) if i != text and _as_float(str(n)) is not None]
    label = f" --label-column {numbers[0]}" if numbers else ""   # (CoLA: source, 1, , text)
    return (f"; its first row reads as data, not names: a file without a header takes "
            f"0-based indices (--text-column {text}{label})")


def choose_columns(names, path, line, text_column=None, pair_column=None, label_column=None,
                   require_label=True) -> Columns:
    names = list(names)
    text_column, pair_column, label_column = (by_index(names, c) for c in
                                              (text_column, pair_column, label_column))
    shown = ", ".join(repr(n) for n in names) or "none"

    def need(col, what):
        if col not in names:
            raise data_error(path, line, f"no {what} column {col!r} (columns: {shown})")
        return col

    if text_column:
        text = need(text_column, "text")
    else:
        text = _text_column(names)
        if text is None:   # (a missing label column said at once: one run, not two)
            no_label = require_label and not label_column and \
                first_column(names, LABEL_COLUMNS) is None
            raise data_error(path, line, f"no text column (expected one of sentence, sentence1, "
                             f"text, text_a, question, question1; columns: {shown}); "
                             "name it with --text-column" + (
                                 " (and the label column with --label-column: none is "
                                 "named 'label' either)" if no_label else "")
                             + _headerless_hint(names))
    if pair_column:
        pair = need(pair_column, "text pair")
    else:
        known = next((c for c in PAIR_COLUMNS if column_named(names, c) == text), text)
        pair = column_named(names, PAIR_COLUMNS.get(known))
    if not text_column:
        _one_candidate(names, TEXT_COLUMNS, (text, pair), "text", path, line, "--text-column")
    if not text_column and not pair_column and pair is None:
        _no_stray_pair(names, text, path, line)
    if label_column:
        label = need(label_column, "label")
    else:
        label = first_column(names, LABEL_COLUMNS)
        if require_label:   # (an input file's labels are not read)
            _one_candidate(names, LABEL_COLUMNS, (label,), "label", path, line, "--label-column")
    if label is None and require_label:
        raise data_error(path, line, f"no label column (expected 'label'; columns: {shown}); "
                         "name it with --label-column, or, for a file without labels (a "
                         "test split), run `nanobert predict --input` on it")
    _distinct_roles([(text, "--text-column"), (pair, "--text-pair-column"),
                     (label if require_label else None, "--label-column")], path, line)
    return Columns(text, pair, label)


def _no_stray_pair(names, text: str, path, line):
    """Refuse a header whose text column has no pair column of its own name but which
    holds another text's pair column (`text` with `text_b`, `sentence` with `sentence2`):
    the second texts were dropped without a word, and a single-text model trained."""
    seconds = {c.casefold() for c in [*PAIR_COLUMNS.values(), *SECOND_TEXTS]}
    stray = next((n for n in names if n != text and isinstance(n, str) and n.casefold() in
                  seconds), None)
    if stray is not None:
        why = ("" if stray.casefold() in {c.casefold() for c in SECOND_TEXTS}
               else f", but {text!r} is not its first text column")
        raise data_error(path, line, f"column {stray!r} looks like the second text of pairs"
                         f"{why}; name the pair with --text-pair-column {stray} (or "
                         f"--text-column {text} for single texts)")


def _one_candidate(names, candidates, chosen, what: str, path, line, flag=None):
    """Refuse a header with two columns that could each be the one chosen (`text` and
    `sentence`; `label` and `class`): which one was meant would be a guess. `chosen`: the
    columns taken, this role's first (a text column and its pair column are both taken);
    `flag`: the one that names the column (None: there is none)."""
    known = {c.casefold() for c in candidates}
    others = [n for n in names if isinstance(n, str) and n.casefold() in known
              and n not in chosen]
    if others:
        how = f"pick one with {flag}" if flag else "rename the one not meant"
        raise data_error(path, line, f"two {what} columns, {chosen[0]!r} and {others[0]!r}: "
                         f"which one holds the {what}s would be a guess; {how}")


def _text_column(names) -> Optional[str]:
    """The text column of a header: the first known one with its pair column there too
    (QNLI's `question sentence`), else the first known one; exact spellings first."""
    for loose in (False, True):
        def find(c):
            return column_named(names, c, loose)
        known = next((c for c in TEXT_COLUMNS if find(c) and find(PAIR_COLUMNS.get(c))), None)
        known = known or next((c for c in TEXT_COLUMNS if find(c)), None)
        if known:
            return find(known)
    return None


def _first_content(path: Path) -> tuple:
    """(line number, text) of the first non-blank line; an empty file, or one of blank
    lines only, is an error."""
    seen = False
    for n, text in read_lines(path):
        if text.strip():
            return n, text
        seen = True
    raise data_error(path, None, no_text(seen))


def no_text(blank_lines: bool) -> str:
    """What a file without text is: empty, or (not empty) of blank lines only."""
    return "no text (only blank lines)" if blank_lines else "empty file"


def _is_json_list(text: str) -> bool:
    """Is this line a whole JSON array of objects?"""
    try:
        v = json.loads(text)
    except (ValueError, RecursionError):
        return False
    return isinstance(v, list) and all(isinstance(x, dict) for x in v)


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list) -> dict:
    """A JSON object's dict; a key given twice is refused (json keeps the last one
    silently, so which text or label the writer meant is a guess)."""
    obj = dict(pairs)
    if len(obj) < len(pairs):
        seen = set()
        key = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise _DuplicateKey(key)
    return obj


def _json_value(text: str, path, line):
    """json.loads, with every way it can fail (bad syntax, a 5000-digit number, nesting
    deeper than Python's stack, a key given twice in one object, a lone surrogate escape)
    reported at the file and line."""
    try:
        value = json.loads(text, object_pairs_hook=_unique_keys)
    except _DuplicateKey as e:
        raise data_error(path, line, f"the key {e.args[0]!r} appears twice in one JSON object "
                         "(which value is meant?)")
    except json.JSONDecodeError as e:
        raise data_error(path, (line or 1) + e.lineno - 1, f"not valid JSON ({_json_msg(e)})")
    except (ValueError, RecursionError) as e:
        raise data_error(path, line, f"not usable JSON ({str(e)[:80] or type(e).__name__})")
    if SURROGATE_ESCAPE.search(text):
        refuse_surrogates(value, path, line)
    return value


SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")   # how JSON writes U+D800-U+DFFF
SURROGATE = re.compile("[\ud800-\udfff]")


def refuse_surrogates(value, path, line):
    """Refuse a parsed JSON value holding a lone surrogate escape ("\\ud800": valid JSON,
    but no text; a pair of escapes is one character, an emoji, once parsed), naming the
    field (`text`, `tokens[1]`, `data[0].paragraphs[1].context`): no tokenizer, JSON
    writer or terminal takes it."""
    where = _surrogate_at(value)
    if where is not None:
        at, key = where
        what = (f"a field name in {at!r}" if at is not None else "a field name") if key else \
            (f"field {at!r}" if at is not None else "the JSON string")
        raise data_error(path, line, f"{what} is not valid Unicode (a lone surrogate escape)")


def _surrogate_at(value):
    """(where, is it a key) of the first string in `value` holding a lone surrogate (json
    leaves one as it is), or None; where is None for `value` itself. Walked with a stack,
    not recursion: json parses values nested almost as deep as Python's stack allows."""
    todo = [(value, None)]
    while todo:
        v, at = todo.pop()
        if isinstance(v, str):
            if SURROGATE.search(v):
                return at, False
        elif isinstance(v, dict):
            bad = next((k for k in v if SURROGATE.search(k)), None)
            if bad is not None:
                return at, True
            todo.extend((x, f"{at}.{k}" if at is not None else k)
                        for k, x in reversed(v.items()))
        elif isinstance(v, list):
            todo.extend((x, f"{at or ''}[{i}]") for i, x in reversed(list(enumerate(v))))
    return None


def _json_msg(e: json.JSONDecodeError) -> str:
    """json's message with its column ('Unterminated string starting at' said nowhere),
    and with what 'Extra data' means in these files."""
    if e.msg == "Extra data":
        return ("more after the first value; JSON Lines hold one object a line, with nothing "
                "after it (no comma)")
    msg = e.msg[:-3] if e.msg.endswith(" at") else e.msg
    return f"{msg} at column {e.colno}"


def opens_json(first: str) -> bool:
    """Does a file whose first non-blank line is `first` surely hold JSON: does the line
    open an object with a key, an array of objects, or is it a lone bracket? (Text that
    merely starts with a bracket, '[Music] hi', does not.)"""
    s = first.strip()
    return s in ("{", "[") or s.startswith('{"') or s.replace(" ", "").startswith("[{")


def _is_json_file(path, first: str) -> bool:
    """Does a file whose first non-blank line is `first` hold JSON (JSON Lines, a JSON
    document, perhaps broken) rather than text or columns that merely start with a
    bracket ('[Music] hi', '( O')? `opens_json`, or a whole file that parses as JSON,
    say it is."""
    if not first.strip().startswith(("{", "[")):
        return False
    if opens_json(first):
        return True
    try:
        json.loads("\n".join(t for _, t in read_lines(path)))
    except (ValueError, RecursionError):
        return False
    return True


def _json_trouble(path) -> tuple:
    """(line, what) of a file that starts like JSON but is no JSON Lines of objects: where
    its JSON breaks and how (a comma after each record, a record cut off...), or what kind
    of JSON document it is."""
    n, first = _first_content(path)
    s = first.strip()
    try:
        if isinstance(json.loads(s), dict):
            return n, "JSON Lines"   # (what a reader of texts or columns does not take)
    except (ValueError, RecursionError):
        pass
    if s.startswith("{") and s.endswith(","):
        try:
            if isinstance(json.loads(s[:-1]), dict):
                return n, ("a comma after the JSON object; JSON Lines hold one object a line, "
                           "with nothing after it")
        except (ValueError, RecursionError):
            pass
    try:
        doc = json.loads("\n".join(t for _, t in read_lines(path)))
    except json.JSONDecodeError as e:
        if s.startswith("{") and s != "{":  # a record a line: line 1 is the broken one
            try:
                json.loads(first)
            except json.JSONDecodeError as e1:
                return n + e1.lineno - 1, f"not valid JSON ({_json_msg(e1)})"
            except (ValueError, RecursionError):
                pass
        return e.lineno, f"not valid JSON ({_json_msg(e)})"
    except (ValueError, RecursionError) as e:
        return n, f"not usable JSON ({str(e)[:80] or type(e).__name__})"
    if isinstance(doc, dict):
        return n, ("SQuAD-style JSON (an object with 'data')" if "data" in doc else
                   "one JSON object over several lines, not JSON Lines")
    if isinstance(doc, list):
        return n, "JSON holding an array of values that are not objects"
    kind = {str: "a string", bool: "a boolean", type(None): "null"}.get(type(doc), "a number")
    return n, f"JSON holding {kind}"


def _jsonl_objects(path: Path):
    """(line number, dict) for each non-blank line of a JSON Lines file, or for each
    record of a file that is one JSON array of objects (pandas' `orient="records"`)."""
    if _first_content(path)[1].lstrip().startswith("["):
        yield from _json_array_objects(path)
        return
    for n, text in read_lines(path):
        if not text.strip():
            continue
        obj = _json_value(text, path, n)
        if not isinstance(obj, dict):
            raise data_error(path, n, "expected a JSON object on each line")
        yield n, obj


JSON_SPACE = re.compile(r"[ \t\n\r]*")


def _json_array_objects(path: Path):
    """(line where it starts, dict) for each element of a file holding one JSON array."""
    text = "\n".join(t for _, t in read_lines(path))   # UTF-8 checked, line-numbered
    decode = json.JSONDecoder(object_pairs_hook=_unique_keys).raw_decode
    pos, line, seen = text.index("[") + 1, 1, 0
    line += text.count("\n", 0, pos)

    def skip(pos):      # past whitespace; the line number follows along
        nonlocal line
        end = JSON_SPACE.match(text, pos).end()
        line += text.count("\n", pos, end)
        return end

    while True:
        pos = skip(pos)
        if text.startswith("]", pos) and seen == 0:
            break
        try:
            obj, end = decode(text, pos)
        except _DuplicateKey as e:
            raise data_error(path, line, f"the key {e.args[0]!r} appears twice in one JSON "
                             "object (which value is meant?)")
        except json.JSONDecodeError as e:
            where = line + text.count("\n", pos, e.pos)
            raise data_error(path, where, "not valid JSON (one JSON array of objects, or JSON "
                             f"Lines, were expected: {_json_msg(e)})")
        except (ValueError, RecursionError) as e:
            raise data_error(path, line, f"not usable JSON ({str(e)[:80] or type(e).__name__})")
        if not isinstance(obj, dict):
            raise data_error(path, line, "expected the array to hold JSON objects (records)")
        if SURROGATE_ESCAPE.search(text, pos, end):
            refuse_surrogates(obj, path, line)
        yield line, obj
        seen += 1
        line += text.count("\n", pos, end)
        pos = skip(end)
        if text.startswith(",", pos):
            pos += 1
        elif text.startswith("]", pos):
            break
        else:
            raise data_error(path, line, "not valid JSON (expected ',' or ']' between records)")
    if text[pos + 1:].strip():
        raise data_error(path, line, "not valid JSON (text after the closing ']')")
    if not seen:
        raise data_error(path, line, "an empty JSON array: no records")


CONLL_SEPARATOR = re.compile(r"[ \t]+")


def conll_columns(text: str) -> list:
    """The columns of a CoNLL line, split at spaces and tabs only: a token may hold other
    Unicode spaces (a no-break space, U+2028), which `str.split` would cut it at."""
    if not text.strip():
        return []
    return CONLL_SEPARATOR.split(text.strip(" \t"))


CONLL_TAB = re.compile(r" *\t[ \t]*")   # a tab, and any spaces around it


def conll_splitter():
    """split(text) -> the columns of each line of one CoNLL file, read in order. In a
    file whose first token line is tab-separated, a line is split at its tabs alone
    where they give the file's columns, so that a token may hold a space (`New York<TAB>
    B-LOC`); other lines, and every line of a space-separated file, are split at spaces
    and tabs (`conll_columns`)."""
    width = None   # the tab-separated columns of the first token line (0: not tab-separated)

    def split(text: str) -> list:
        nonlocal width
        cols = conll_columns(text)
        if not cols or cols[0] == "-DOCSTART-":
            return cols
        tabbed = CONLL_TAB.split(text.strip(" \t"))
        if width is None:
            width = len(tabbed) if len(tabbed) > 1 else 0
        return tabbed if width and len(tabbed) == width else cols
    return split


TAG_PREFIXES = ("B-", "I-", "E-", "S-", "L-", "U-")   # IOB1/IOB2, BIOES, BILOU


def is_iob_tag(tag: str) -> bool:
    """O, or a prefix of IOB (B-, I-), BIOES (E-, S-) or BILOU (L-, U-) and a type."""
    return tag == "O" or (tag[:2] in TAG_PREFIXES and len(tag) > 2)


TO_IOB = {"S-": "B-", "U-": "B-", "E-": "I-", "L-": "I-"}


def to_iob2(tags: list) -> list:
    """IOB2 tags of a sentence tagged in IOB1, IOB2, BIOES or BILOU. The last two mark
    an entity's end (E-, L-) and one-token entities (S-, U-), which IOB2 says with B-
    and I- alone: the entities stay the same, and a model trained on them predicts IOB2
    (scored by entities, as seqeval scores them, nothing is lost)."""
    return iob1_to_iob2([TO_IOB.get(t[:2], t[:2]) + t[2:] if t != "O" else t for t in tags])


def looks_like_conll(path, sample: int = 50) -> bool:
    """Whether a file that could be one text a line is CoNLL columns instead: it starts
    with -DOCSTART-, or its first non-blank lines are each a token followed by columns
    ending in an IOB tag, tagged as an entity tagger's data is (some `O`, or every type
    in capitals: `B-PER`). A sentence's last word can look like a tag ('an E-mail', 'a
    U-turn', 'vitamin B-12'): lines of plain text were read as a token and its columns,
    and their other words dropped. A file that starts so, with most of its first lines
    so, is CoNLL with faults (a line without its tag), for the CoNLL reader to name by
    line: read as plain text, its tags were tagged as words."""
    seen, tags = 0, []
    for _, text in read_lines(path):
        cols = conll_columns(text)
        if not cols:
            continue
        if seen == 0 and cols[0] == "-DOCSTART-":
            return True
        if _conll_comment(cols, tagged=False):      # ('# sent_id = 1' before a sentence)
            continue
        seen += 1
        if len(cols) >= 2 and is_iob_tag(cols[-1]):
            tags.append(cols[-1])
        elif seen == 1:
            return False
        if seen >= sample:
            break
    return (2 * len(tags) > seen
            and ("O" in tags or all(TAGGER_TYPE.fullmatch(t[2:]) for t in tags)))


TAGGER_TYPE = re.compile(r"[A-Z][A-Z0-9_]*")   # an entity type as datasets write them


def token_lines(path) -> bool:
    """Is `path` one token a line, sentences separated by blank lines (CoNLL columns
    without their tag column, as an unlabelled test set is written)? Every line holds one
    token (no space or tab) or nothing, a blank line comes between two tokens somewhere,
    and some sentence has two tokens or more. Read as one text a line, each token was
    tagged alone, out of its sentence; plain text has spaces, or no blank lines between
    one-word lines."""
    if detect_format(path, plain_text=True) not in ("text", "conll"):
        return False
    size = longest = 0
    split = False   # a blank line seen between two tokens
    for _, text in read_lines(path):
        cols = conll_columns(text)
        if len(cols) > 1:
            return False
        if not cols or cols[0] == "-DOCSTART-":
            size = -abs(size)   # (negative: a blank line since the last token)
            continue
        split = split or size < 0
        size = abs(size) + 1 if size > 0 else 1
        longest = max(longest, size)
    return split and longest > 1


def detect_format(path, plain_text: bool = False) -> str:
    """'jsonl' | 'json' | 'tsv' | 'csv' | 'msrp' | 'conll', from the file's content; with
    `plain_text`, a file that is none of these is 'text' (one input a line)."""
    path = input_path(path)
    n, first = _first_content(path)
    s = first.lstrip()
    if s.rstrip() == "[" or s.replace(" ", "").startswith("[{") or _is_json_list(s):
        return "jsonl"   # one array of records: read record by record, as JSON Lines
    if s.startswith("{") or s.startswith("["):
        try:
            obj = json.loads(first)
            return "jsonl" if isinstance(obj, dict) else "json"
        except (ValueError, RecursionError):
            return "json"  # an object spread over lines: a whole-file JSON document
    if first.split("\t")[:2] == ["Quality", "#1 ID"]:
        return "msrp"
    if "\t" in first:
        return "tsv"
    if "," in first:
        # a .tsv file with no tab: a CSV named .tsv when its first line is a row of bare
        # names (`sentence,label`), else one column of texts that hold commas
        bare = all(BARE_NAME.fullmatch(_unquoted(h.strip())) for h in first.split(","))
        return "tsv" if path.suffix.lower() == ".tsv" and not bare else "csv"
    if path.suffix.lower() in (".tsv", ".csv"):  # a one-column file: its header names it
        return path.suffix.lower()[1:]
    if len(first.split()) >= 2 or s.startswith("-DOCSTART-"):
        return "conll"
    if plain_text:
        return "text"
    raise data_error(path, n, "unknown format (expected a TSV/CSV file with a header, JSON Lines, "
                     "CoNLL columns or SQuAD JSON)")


SQUAD_START = re.compile(r'\s*\{\s*("version"\s*:\s*"[^"]*"\s*,\s*)?"data"\s*:\s*\[')
# {"data": [...  or {"version": "v2.0", "data": [...
SQUAD_KEYS = re.compile(r'"(paragraphs|qas)"\s*:')


def _looks_like_squad(path, head: int = 1 << 16) -> bool:
    """Does the file start as SQuAD JSON does: {"data": [ with "paragraphs" or "qas"
    in its first 64 kB (a {"data": [records]} table is not QA data)?"""
    parts, size = [], 0
    try:
        for _, line in read_lines(path):   # (UTF-16 too, as the readers take it)
            parts.append(line)
            size += len(line) + 1
            if size >= head:
                break
    except NanobertError:                  # not text: no SQuAD file
        return False
    text = "\n".join(parts)[:head]
    return bool(SQUAD_START.match(text) and SQUAD_KEYS.search(text))


def task_of_file(path) -> Optional[str]:
    """'ner' for CoNLL columns, 'qa' for SQuAD-style JSON or a table with a context
    column, 'table' for a TSV/CSV whose header names a column some reader knows (any
    other task's), 'beir' for a BEIR folder; None for anything else or a file that
    cannot be read."""
    try:
        if is_beir_dir(path):
            return "beir"
        fmt = detect_format(path, plain_text=True)
        if fmt == "conll" and looks_like_conll(path):
            return "ner"
        if fmt in ("json", "jsonl") and _looks_like_squad(path):
            return "qa"
        fields = _first_content(path)[1].split(_delimiter(path, fmt)) \
            if fmt in ("tsv", "csv") else []
        if fields and column_named([_unquoted(f.strip()) for f in fields], "context"):
            return "qa"        # a question/context table: QA data, as SQuAD JSON is
        if fields and _is_header(fields, ()):
            return "table"
    except (NanobertError, OSError):
        pass
    return None


QUOTED_FIELD = re.compile(r'(?:^|(?<=\t))"(?:[^"]|"")*"(?=\t|$)')
QUOTED_SPAN = re.compile(r'(?:^|(?<=[\t\n]))"(?:[^"]|"")*"(?=[\t\n]|$)')   # may span lines


def tsv_uses_quoting(path) -> bool:
    """Does this TSV quote its fields the CSV way? Quoting is on when some field is wrapped
    in quotes (inner quotes doubled; tabs allowed inside), and no quote appears anywhere
    else. SST-2's literal quotes (`the "best" film`) turn it off. A quoted field may span
    lines (a text with a line break, as csv.writer and pandas' to_csv write it) where
    the file reads no other way (`quoted_across_lines`)."""
    quoted = False
    for _, line in read_lines(path):
        if '"' not in line:
            continue
        rest, n = QUOTED_FIELD.subn("", line)
        if '"' in rest:  # a literal quote, or a quoted field that goes on in the next line
            return quoted_across_lines(path)
        quoted = quoted or n > 0
    return quoted


def quoted_across_lines(path) -> bool:
    """Is this a TSV whose quoted fields span lines? Every quote must belong to a quoted
    field, and read line by line (quotes literal, as for SST-2) some line must not be as
    wide as the header: a file that reads line by line keeps being read so."""
    if _lines_as_wide_as_header(path):   # (streamed: SST-2 is not held in memory)
        return False
    return '"' not in QUOTED_SPAN.sub("", "\n".join(t for _, t in read_lines(path)))


def _lines_as_wide_as_header(path) -> bool:
    """Is every line of this TSV, read without quoting, as wide as its header (empty
    fields past it dropped, as `_table` drops them)?"""
    table = _read_table(Path(path), "\t", quoting=False)
    width = len(_trimmed(next(table, (0, []))[1], 1))
    return all(len(_trimmed(fields, width)) == width for _, fields in table)


def _trimmed(fields: list, width: int) -> list:
    """`fields` without the empty ones at the end past `width` (a tab or comma at the end
    of each line, as some writers leave)."""
    while len(fields) > width and not fields[-1].strip():
        fields = fields[:-1]
    return fields


def _read_table(path: Path, delimiter: str, quoting: bool):
    """Yield (line number, fields) of a delimited file (line number where the row starts).
    Blank lines are skipped, and so are rows of empty fields (`,,`: an empty row of a
    spreadsheet); a lone field written out (`""`, as csv.writer and pandas write an empty
    text in a one-column table) is a row, so that row i of a one-column table's output
    stays row i of the file."""
    lines = read_lines(path, keep_ends=True)   # (a CR inside a quoted field stays a CR)
    state = {"n": 0, "raw": []}

    def feed():
        for n, text in lines:
            state["n"] = n
            state["raw"].append(text)
            yield text
    reader = csv.reader(feed(), delimiter=delimiter,
                        quoting=csv.QUOTE_MINIMAL if quoting else csv.QUOTE_NONE,
                        strict=quoting)
    start = 1
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            kind = ('CSV', 'TSV')[delimiter == chr(9)]
            if "unexpected end of data" in str(e):  # the reader ran to the end of the file
                raise data_error(path, start, f"malformed {kind} row (a quoted field that starts "
                                 "in this row is never closed)")
            raise data_error(path, state["n"], f"malformed {kind} row ({e})")
        raw, state["raw"] = "".join(state["raw"]), []
        if any(x.strip() for x in row) or (len(row) == 1 and raw.strip()):
            yield start, row
        start = state["n"] + 1


NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d{1,3})?")
CODE = re.compile(r"[+-]?0\d+")   # "007", "02139": a code, kept as written


@functools.lru_cache(maxsize=1 << 16)
def integral_label(s: str) -> str:
    """An integral number however a number writer put it ("1.0", "2.", "+1", "1e0",
    "10E-1", "-0") as the plain integer ("1", "2", "1", "1", "1", "0"); any other label,
    a code with leading zeros included, as it is. Cached: a file's labels repeat, and
    each row's own copy of "0" or "1" took 50 bytes and a parse (a million rows: 50 MB)."""
    if len(s) <= 64 and NUMBER.fullmatch(s) and not CODE.fullmatch(s):
        d = Decimal(s)
        if d == d.to_integral_value() and d.adjusted() < 64:   # (not "1e400": 401 digits)
            return str(int(d))
    return s


def _label_str(value, path, line, require: bool = True) -> Optional[str]:
    """A label as a string; integral numbers (1, 1.0, "1.0", "1e0") all become "1", so
    one class is one class whatever the file's writer did with its numbers ("01", with a
    leading zero, is a code and stays as it is: `integral_label`). Without
    `require` (inputs to predict), a null or empty label is an unlabelled row: None."""
    if value is None and require:
        raise data_error(path, line, "the label is null (every example needs a label)")
    if value is None or (not require and isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, bool):  # a boolean column ('is_toxic'), as datasets' to_json writes
        return str(value)        # it; 'True', as pandas' to_csv writes the same column
    if isinstance(value, (list, dict)):
        raise data_error(path, line, f"label {value!r} is not a number or a string"
                         + (" (a multi-label list? each example needs one label)"
                            if isinstance(value, list) else ""))
    if isinstance(value, float) and (value != value or abs(value) == float("inf")):
        raise data_error(path, line, f"label {value!r} is not a finite number (a missing value?)")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    s = str(value).strip()
    if not s:
        raise data_error(path, line, "empty label")
    return integral_label(s)


def missing_field(path, n: int, field: str, records: list) -> NanobertError:
    """The error of line n of a JSON Lines file, which lacks a field that other lines
    (records: [(line, object)]) have: how many have it and the first that does. A field
    on one line of 50,000 was blamed on line 1 as "other lines have it", naming none."""
    having = [m for m, rec in records if field in rec]
    if not having:
        return data_error(path, n, f"missing field {field!r}")
    return data_error(path, n, f"missing field {field!r}, which {len(having)} of "
                      f"{len(records)} records have (the first, line {having[0]}); give every "
                      "record the same fields")


def _read_jsonl_examples(path: Path, cols: dict) -> list:
    """Classification examples of a JSON Lines file. The columns are chosen from the
    fields of ALL lines (a pair field first seen on line 2 is still the pair), and then
    every line must have them."""
    objs = list(_jsonl_objects(path))
    if not objs:
        raise data_error(path, None, "empty file")
    _not_a_frame(objs, path)
    fields = list(dict.fromkeys(k for _, obj in objs for k in obj))
    chosen = choose_columns(fields, path, objs[0][0], **cols)
    out = []
    # (unlabelled reading, predict's: a line without the label field is one without a label)
    needed = (chosen.text, chosen.pair) + ((chosen.label,) if cols["require_label"] else ())
    for n, obj in objs:
        for c in needed:
            if c is not None and c not in obj:
                raise missing_field(path, n, c, objs)
        for c in (chosen.text, chosen.pair):
            if c is not None and not isinstance(obj[c], str):
                raise data_error(path, n, _not_a_text(c, obj[c]))
        a = obj[chosen.text]
        b = obj[chosen.pair] if chosen.pair else None
        label = (_label_str(obj.get(chosen.label), path, n, cols["require_label"])
                 if chosen.label else None)
        out.append(Example(a, b, label, n))
    return out


# what a model learnt from, by the "pairs" setting finetune records in nanobert.json
TEXT_KINDS = {True: "text pairs", False: "single texts"}

JSON_KINDS = {type(None): "null", bool: "a boolean", int: "a number", float: "a number",
              list: "a list", dict: "an object"}


# format characters drawn as signs (Arabic's number sign, end of ayah), and letters and
# marks drawn as nothing (variation selectors, the combining grapheme joiner, Hangul
# fillers, the Braille blank)
DRAWN_FORMAT = {*range(0x600, 0x606), 0x6DD, 0x70F, 0x890, 0x891, 0x8E2, 0x110BD, 0x110CD,
                *range(0x13430, 0x13460)}
BLANK_LETTERS = {*range(0xFE00, 0xFE10), *range(0xE0100, 0xE01F0), 0x34F,
                 *range(0x180B, 0x1810), 0x17B4, 0x17B5, 0x115F, 0x1160, 0x3164, 0xFFA0, 0x2800}


def _invisible(c: str) -> bool:
    """White space, control and format characters (zero-width spaces and joiners, the
    byte-order mark, soft hyphens, direction marks) but DRAWN_FORMAT, and BLANK_LETTERS:
    what a text of nothing else shows: nothing."""
    n = ord(c)
    return n in BLANK_LETTERS or (n not in DRAWN_FORMAT and (
        c.isspace() or unicodedata.category(c) in ("Cc", "Cf")))


@functools.lru_cache(maxsize=None)
def _invisible_chars() -> str:
    """Every `_invisible` character (0.17 s to find: made only for a text that starts
    with one)."""
    import sys
    return "".join(c for c in map(chr, range(sys.maxunicode + 1)) if _invisible(c))


def blank(text: str) -> bool:
    """Is `text` empty to the eye and to the model: nothing but white space and invisible
    characters (`\\u200b\\ufeff` gave `[CLS] [SEP]` and was taken for a text)?"""
    seen = text.strip()
    return not seen or (_invisible(seen[0]) and not seen.strip(_invisible_chars()))


def empty_words(text: str) -> str:
    """How to call a `blank` text in an error: "empty", or what it holds when it has
    characters nobody sees."""
    if not text.strip():
        return "empty"
    seen = next(c for c in text if not c.isspace())
    return f"empty (only invisible characters, such as U+{ord(seen):04X})"


def _note_empty_texts(examples: list, path, what: str = "labelled example(s)") -> None:
    """Examples (or `TextRow`s) with an empty text (a cell lost in an export or a join;
    QQP's train file has a few) are kept, as other tools keep them, with one note saying
    how many and where the first is: the model learns, or is scored on, no input."""
    def texts(e):
        return e.texts if isinstance(e, TextRow) else (e.text_a, e.text_b)
    empty = [e for e in examples if any(t is not None and blank(t) for t in texts(e))]
    if empty:
        note(f"{path}:{empty[0].line}: {len(empty)} {what} with an empty text "
             "(kept; fill the cells or remove the rows if they were lost on the way)")


def _not_a_frame(objs: list, path):
    """A file of one JSON object whose every value is an object or a list is a whole table
    in one object (pandas' to_json orient='columns', 'index' or 'split'), not a record:
    its keys are row numbers or 'columns'/'data', and were taken for field names."""
    if len(objs) == 1 and objs[0][1] and all(isinstance(v, (dict, list))
                                             for v in objs[0][1].values()):
        raise data_error(path, objs[0][0], "one JSON object holding a whole table (pandas' "
                         "to_json layout?), not one record a line; write it with "
                         "orient='records', lines=True")


def _not_a_text(field: str, value) -> str:
    """Why a JSON value cannot be a text, and (for an object of values keyed by row, the
    file pandas' `to_json` writes by default) how to write the file instead."""
    msg = f"field {field!r} holds {JSON_KINDS.get(type(value), 'no string')}, not a text"
    if isinstance(value, dict):
        msg += (" (pandas' to_json writes columns so by default; write the file with "
                "orient='records', lines=True)")
    return msg


def _distinct_roles(roles, path, line):
    """Each role's column is its own: `roles` is [(column or None, the flag or words that
    name the role)]; two roles on one column (--text-column 3 --label-column 3) trained
    on sentences as labels, or on a text paired with itself."""
    seen = {}
    for column, flag in roles:
        if column is not None and column in seen:
            raise data_error(path, line, f"{seen[column]} and {flag} both take column "
                             f"{column!r}; each needs a column of its own")
        seen.setdefault(column, flag)


def _single_columns(header: list, used, path, line):
    """Each column a reader takes is named once in the header: with two, which one holds
    the labels (or texts) is a guess."""
    for c in used:
        if c is not None and header.count(c) > 1:
            raise data_error(path, line, f"column {c!r} appears {header.count(c)} times in the "
                             "header; rename the one not meant")


def _delimiter(path: Path, fmt: str) -> str:
    """The field separator of a table: a tab (TSV, MSRP) or a comma, or for a .csv file
    whose header has semicolons and no comma, a semicolon (what spreadsheets write where
    the comma is the decimal mark, as in most of Europe)."""
    if fmt != "csv":
        return "\t"
    first = _first_content(path)[1]
    return ";" if ";" in first and "," not in first else ","


def _unquoted(name: str) -> str:
    """A header name without the quotes around it: a TSV whose texts hold literal quotes
    is read without CSV quoting, and its writer may still have quoted the header."""
    return name[1:-1] if len(name) >= 2 and name[0] == name[-1] == '"' else name


def _table(path: Path, fmt: str, given=()) -> tuple:
    """(header line, header, rows) of a TSV/CSV/MSRP file: rows yields (line, fields),
    each row as wide as the header. Empty fields past the header's width (a tab or comma
    at the end of each line, as some writers leave) are dropped, and so are empty names
    at the header's end; any other difference in width is an error naming the line.
    When columns are `given` by index and the first row is no header (`_is_header`),
    that row is data and the columns are named '0', '1', ..."""
    delim = _delimiter(path, fmt)
    quoting = fmt == "csv" or (fmt == "tsv" and tsv_uses_quoting(path))
    table = _read_table(path, delim, quoting)
    hline, first = next(((n, f) for n, f in table if any(x.strip() for x in f)), (None, None))
    if first is None:   # (a file of blank lines is refused before: `_first_content`)
        raise data_error(path, None, "no header (only empty fields)")
    header = _trimmed([_unquoted(h.strip()) if not quoting else h.strip() for h in first], 1)
    if any(map(is_column_index, given)):
        ahead = list(itertools.islice(table, HEADER_SAMPLE))
        table = itertools.chain(ahead, table)
        below, known = [f for _, f in ahead], _is_header(first, given)
        why = None if known else _header_by_contrast(header, below)
        if why:
            note(f"{path}:{hline}: read as the header (its {why}); columns given by index "
                 "count from it")
        elif not known or _names_repeat_below(header, below, given):
            first = _trimmed(first, 1)
            header = [str(i) for i in range(len(first))]
            table = itertools.chain([(hline, first)], table)
    sep = {"\t": "tab", ",": "comma", ";": "semicolon"}[delim]
    named = len(header) > 1 and header[0] != "0"      # (a header of indices is no row)

    def rows():
        lines = iter(table)
        for n, fields in lines:
            if len(header) > 1 and not any(x.strip() for x in fields):
                continue   # a lone empty field ("") where rows have several: no row
            fields = _trimmed(fields, len(header))
            if named and _same_names(fields, header):
                raise data_error(path, n, f"repeats the header of line {hline} (files joined "
                                 "with cat? keep one header, or every one is read as a row)")
            if len(fields) != len(header):
                more = (f" (a {sep} inside a text, which must then be quoted?"
                        + (" or columns the header does not name?)" if named else ")")
                        if len(fields) > len(header) else
                        _lone_cr_hint(path, n) or _broken_row_hint(fields, next(lines, None),
                                                                   len(header)))
                like = "the header" if named else f"line {hline}"   # (headerless: its first row)
                raise data_error(path, n, f"expected {len(header)} fields like {like}, "
                                 f"found {len(fields)}{more}")
            yield n, fields
    return hline, header, rows()


def _broken_row_hint(fields: list, after, width: int) -> str:
    """Why a row is short, where the next line holds the rest of it: a line break inside
    a text (GLUE's QQP train.tsv has one, at line 97,931)."""
    if after is None or len(fields) < 2 or \
            len(fields) + len(_trimmed(after[1], width)) - 1 != width:
        return ""   # (a row of one field before a whole one: a lost label, as likely)
    return (f" (a line break inside a text? line {after[0]} holds the rest of the row: join "
            "the two lines, or remove the row)")


def lines_without_inner_cr(path):
    """read_lines(path), refusing a lone CR inside a line of a file whose lines end in LF:
    a line break inside a text (pasted from elsewhere). Read as one, it split the line in
    two, and every output row after it answered the line before (plain text), or a
    sentence in two (CoNLL). Not refused: CRs that end a line (CR CR LF, a stray CR at
    the end) and a file whose lines end in a CR (old Mac), a final LF or not."""
    inner, lf_lines, parts = None, 0, []    # parts: (line, text) of the physical line so far
    for k, t in read_lines(path, keep_ends=True):
        parts.append((k, t.rstrip("\r\n")))
        yield parts[-1]
        if t.endswith("\n"):
            lf_lines += 1
            inner = inner or _inner_cr(parts)
            parts = []
        if inner is not None and lf_lines > 1:
            break
    # (one LF line holding CRs and nothing after it: an old Mac file with a final LF)
    inner = inner or (_inner_cr(parts) if lf_lines else None)
    if inner is not None and (lf_lines > 1 or parts):
        raise data_error(path, inner, "holds a lone CR (a carriage return inside the line?), "
                         "which would break it in two; remove it (tr -d '\\r' removes every CR)")


def _inner_cr(parts: list) -> Optional[int]:
    """The line number where a physical line's texts split at CRs begin, when the CRs
    break it in two (a CR at its start made a blank line: a sentence break in CoNLL), not
    when they only end it (CR CR LF)."""
    texts = [t for _, t in parts]
    while len(texts) > 1 and not texts[-1].strip():
        texts.pop()
    return parts[0][0] if len(texts) > 1 else None


def _lone_cr_hint(path, n: int) -> str:
    """Why a row is short, where it is so: it ends in a lone CR (a line break in that
    text) in a file whose lines end in LF."""
    ends = {k: t[len(t.rstrip("\r\n")):] for k, t in itertools.takewhile(
        lambda line: line[0] <= n + 1, read_lines(path, keep_ends=True))}
    if ends.get(n) == "\r" and any(e.endswith("\n") for e in ends.values()):
        return (" (it ends in a lone CR, which breaks a line: a line break inside the text? "
                "remove it, or quote the field)")
    return ""


HEADER_SAMPLE = 1000    # rows read ahead to tell an unknown header from a first row of data


SENTENCE_WORDS = 5   # a cell of more words is a text, not a column's name


def _header_by_contrast(first: list, rows: list) -> Optional[str]:
    """Why the first row of a table whose columns are given by index, naming no column a
    reader knows (`id, src, sentiment, review`), is still its header: a cell that is no
    number where the rows after it hold numbers, or no value of a column that repeats a few
    values (a label column: `sentiment` over pos/neg); None when nothing tells it apart
    (GLUE CoLA's first row `gj04 1 Our friends...` is data). A value no row repeats is
    no proof where a cell of the row is a sentence (TREC's `ABBR,What is the full form of
    .com ?`, a class seen nowhere else, was read as a header and the example lost); a
    name above numbers still is (a survey's question as a column's name)."""
    sentence = any(len(cell.split()) > SENTENCE_WORDS for cell in first)

    def number(x: str) -> bool:
        try:
            float(x)
            return True
        except ValueError:
            return False
    for j, cell in enumerate(first):
        values = [v for v in (_unquoted(r[j].strip()) for r in rows if j < len(r)) if v]
        if not cell or number(cell) or len(values) < 8:
            continue
        if sum(map(number, values)) >= 0.9 * len(values):
            return f"column {j} {cell!r} is no number, as the rows after it hold"
        seen = set(values)
        if not sentence and len(seen) <= max(2, len(values) // 4) and cell not in seen:
            return f"column {j} {cell!r} is none of the {len(seen)} values the rows after it repeat"
    return None


def _names_repeat_below(first: list, rows: list, given) -> bool:
    """Is a cell of the first row that names a known column (`neg`, `positive`, `text`:
    column names of triplet and pair files) a value of its column in the rows after it?
    Then it is a label or a text of a first row of data, not a name."""
    for j, cell in enumerate(first):
        named = (cell in given and not is_column_index(cell)) or \
            any(column_named([cell], c) for c in KNOWN_COLUMNS)
        if cell and named and any(j < len(r) and _unquoted(r[j].strip()) == cell for r in rows):
            return True
    return False


def _same_names(fields: list, header: list) -> bool:
    """A row that spells the header again (any capitals, a byte-order mark at a join)."""
    def key(x):
        return _unquoted(x.strip().lstrip("\ufeff")).casefold()
    return len(fields) == len(header) and [key(f) for f in fields] == [key(h) for h in header]


def _read_table_examples(path: Path, fmt: str, cols: dict) -> list:
    """Classification examples of a TSV/CSV/MSRP file with a header row."""
    given = (cols.get("text_column"), cols.get("pair_column"), cols.get("label_column"))
    hline, header, rows = _table(path, fmt, given)
    chosen = choose_columns(header, path, hline, **cols)
    _single_columns(header, (chosen.text, chosen.pair, chosen.label), path, hline)
    ia = header.index(chosen.text)
    ib = header.index(chosen.pair) if chosen.pair else None
    il = header.index(chosen.label) if chosen.label else None
    out = []
    for n, row in rows:
        label = _label_str(row[il], path, n, cols["require_label"]) if il is not None else None
        out.append(Example(row[ia], row[ib] if ib is not None else None, label, n))
    return out


def read_classification(path, text_column=None, pair_column=None, label_column=None,
                        require_label=True) -> list:
    """A list of `Example` from any supported classification file."""
    path = input_path(path)
    fmt = detect_format(path)
    cols = dict(text_column=text_column, pair_column=pair_column, label_column=label_column,
                require_label=require_label)
    _not_fasttext(path)
    if fmt == "jsonl":
        out = _read_jsonl_examples(path, cols)
    elif fmt in ("tsv", "csv") and is_sts_original(path, tuple(
            c for c in (text_column, pair_column, label_column) if c)):
        if not (text_column or label_column):
            raise data_error(path, 1, "STS Benchmark rows (a similarity score and two "
                             "sentences a line), not texts with class labels: finetune/"
                             "evaluate --task regress, and finetune --task embed or rerank, "
                             "read them; name a column to read its sentences here "
                             "(--text-column 5)")
        out = _read_sts_examples(path, cols)
    elif fmt in ("tsv", "csv", "msrp"):
        out = _read_table_examples(path, fmt, cols)
    else:
        line, what = _json_trouble(path) if fmt == "json" else (1, "no tab- or comma-separated "
                                                                   "header")
        raise data_error(path, line, f"not a classification file ({what}; expected TSV/CSV "
                         "with a header, or JSON Lines)")
    if require_label:
        out = _without_no_gold(out, path)
    if not out:
        raise data_error(path, None, "no examples (only a header?)")
    _note_empty_texts(out, path, "labelled example(s)" if require_label else "input(s)")
    return out


def _not_fasttext(path):
    """fastText's `__label__pos some text` lines were taken for a CSV header of two
    made-up columns ('__label__2 I loved this movie', 'truly.'). (A table of
    `__label__1<TAB>text` rows is a table: its columns can be named.)"""
    line, text = _first_content(path)
    if re.match(r"__label__\S+ ", text):
        out = shlex.quote(str(path.with_name(path.stem + "-converted.tsv")))
        raise data_error(path, line, "fastText's format (__label__X then the text) is not "
                         "read: write it as a TSV of 'text' and 'label' columns, e.g. awk "
                         "'BEGIN {print \"text\\tlabel\"} {label = substr($1, 10); sub(/^[^ ]+ /, "
                         f"\"\"); print $0 \"\\t\" label}}' {shlex.quote(str(path))} > {out}")


def _without_no_gold(examples: list, path) -> list:
    """The examples less those labelled '-' (SNLI's and MultiNLI's no-consensus mark,
    which tools drop), with a note: as a class of its own it would be learnt."""
    kept = [e for e in examples if e.label != NO_GOLD_LABEL]
    if len(kept) < len(examples):
        first = next(e for e in examples if e.label == NO_GOLD_LABEL)
        note(f"{path}:{first.line}: {len(examples) - len(kept)} row(s) labelled "
             f"{NO_GOLD_LABEL!r} (no gold label, as SNLI marks them) were skipped")
    if examples and not kept:
        raise data_error(path, first.line, f"every row is labelled {NO_GOLD_LABEL!r} (no gold "
                         "label)")
    unlabelled = [e for e in kept if e.label == "-1"]
    if unlabelled and {e.label for e in kept} - {"-1"} <= {str(i) for i in range(len(kept))}:
        note(f"{path}:{unlabelled[0].line}: {len(unlabelled)} row(s) labelled -1, kept as a "
             "class (Hugging Face datasets mark rows without a label so: remove them if these "
             "are such rows)")
    return kept


class ColumnsOnPlainText(NanobertError):
    """Columns named for a file of one text a line (`read_inputs`): refused when the user
    named them; a model's saved columns (finetune._with_columns) fit tables only."""


def read_inputs(path, columns: Optional[dict] = None) -> list:
    """Unlabelled inputs for prediction: a classification file (JSON Lines, MSRP, or a
    TSV/CSV whose header names a known or given text column), else plain text, one input
    a line (`Excellent!`, `很好`, `Hello, world` included). A .tsv/.csv file is a table
    whatever its header: read as text, its header and every column would be inputs."""
    path = input_path(path)
    columns = {k: v for k, v in (columns or {}).items() if v}
    fmt = detect_format(path, plain_text=True)
    if fmt in ("tsv", "csv") and not reads_as_table(path, fmt, TEXT_COLUMNS, columns.values()):
        fmt = "text"
    if fmt == "jsonl" and not columns and _holds_tokens(path):
        return [Example(" ".join(s.words), line=s.line) for s in read_conll(path, False)]
    if fmt in ("jsonl", "msrp", "tsv", "csv"):
        return read_classification(path, require_label=False, **columns)
    refuse_columns(path, columns)
    return tabs_noted(_without_column_name(read_text_lines(path), path), path)


# the reader keywords of the column flags, and the flags (finetune.ColumnsConfig's)
COLUMN_FLAGS = {"text_column": "--text-column", "pair_column": "--text-pair-column",
                "label_column": "--label-column"}


def refuse_columns(path, columns: dict):
    """A column named for a file read as one text a line (ColumnsOnPlainText): such a
    flag had been ignored, whatever its value."""
    key, value = next(((k, v) for k, v in (columns or {}).items() if v), (None, None))
    if key is not None:
        raise ColumnsOnPlainText(f"{COLUMN_FLAGS.get(key, key)} {value}: {path} is plain "
                                 "text, one input a line, with no columns (a table is a "
                                 ".tsv/.csv/.jsonl file, or has a header line naming its "
                                 "columns)")


def tabs_noted(examples: list, path) -> list:
    """Lines read as one text each that all hold the same number of tabs look like a
    table without its header (dataset rows piped in: each label was read as part of its
    text and moved the prediction): said in a note."""
    tabs = {e.text_a.count("\t") for e in examples}
    if len(examples) > 1 and len(tabs) == 1 and min(tabs) > 0:
        note(f"{path}: read as one text a line, but every line holds {min(tabs)} tab(s): a "
             "table without its header? Give it a header line naming its columns (or "
             "--text-column 0 for the first), or the tabs are part of each text")
    return examples


def _without_column_name(examples: list, path) -> list:
    """Texts one a line whose first line is a text column's name alone (`sentence`, as
    `cut -f1` of a GLUE file leaves it): that line is the column's header, not a text
    (each output row had been the one after its input's), with a note."""
    first = examples[0].text_a.strip() if len(examples) > 1 else ""
    if first.lower() not in {c.lower() for c in TEXT_COLUMNS}:
        return examples
    note(f"{path}:{examples[0].line}: {first!r} read as the name of the text column (a "
         "header), not as a text")
    return examples[1:]


BARE_NAME = re.compile(r"[\w#][\w#.-]*")   # a header name as CSV writers write it: text_a, #1


def reads_as_table(path, fmt: str, known, given=()) -> bool:
    """Is an input file (predict, embed) whose first line has a tab or comma (`fmt`
    'tsv' or 'csv') a table, or one text a line? A .tsv/.csv file is a table whatever
    its header. Another is a table when columns are given by 0-based index, or its first
    line is a header: it names a column given by flag, or a known text column (`known`,
    any capitals), and, comma-separated, holds nothing but bare names (no space in or
    around one: `Sentence, paragraph` and `Question, comment or complaint?` are texts).
    A header guessed so gets a note."""
    path = Path(path)
    if fmt == "msrp" or path.suffix.lower() in (".tsv", ".csv") or \
            any(map(is_column_index, given)):   # (MSRP: a header detect_format knows)
        return True
    n, first = _first_content(path)
    header = [_unquoted(h.strip() if fmt == "tsv" else h)
              for h in first.split(_delimiter(path, fmt))]
    named = any(h in given for h in header)
    if not named and ((fmt == "csv" and not all(BARE_NAME.fullmatch(h) for h in header))
                      or not any(column_named(header, c) for c in known)):
        return False
    if not named:
        note(f"{path}: line {n} read as the header of a {'tab' if fmt == 'tsv' else 'comma'}-"
             f"separated table ({', '.join(header)}), not as a text; each later line is a row")
    return True


def holds_token_lists(path, columns: Optional[dict] = None) -> bool:
    """Is `path` JSON Lines of token lists (Hugging Face datasets' NER layout), with no
    text column named in `columns`?"""
    path = input_path(path)
    return (not any((columns or {}).values()) and detect_format(path, plain_text=True) == "jsonl"
            and _holds_tokens(path))


def _holds_tokens(path: Path) -> bool:
    """JSON Lines of token lists ({"tokens": [...]}, a tagger's data) and no text field:
    each record's tokens, joined by spaces, are its input."""
    names = {k for _, obj in _jsonl_objects(path) for k in obj}
    return first_column(names, TOKEN_FIELDS) is not None and _text_column(names) is None


def read_text_lines(path) -> list:
    """`Example`s of a plain text file, one input a line. Blank lines (white space or
    invisible characters only: `blank`) are skipped, with a note when one comes before a
    text: row i of the output is then the i-th text, not line i (tables and JSON Lines
    keep an empty text as a row). A file
    that is JSON (JSON Lines broken on their first line, a JSON document) or CoNLL
    columns is refused: read as text, each of its lines would be taken for an input."""
    path = input_path(path)
    n, first = _first_content(path)
    _refuse_conll2012(path, n, first)
    if first.lstrip().startswith('"'):
        if path.suffix.lower() in JSON_SUFFIXES:
            return _json_string_lines(path)
        strings = None if path.suffix else _json_string_lines(path, strict=False)
        if strings is not None:          # (--input -: no suffix to go by, only the lines)
            return strings
    if _is_json_file(path, first):
        line, what = _json_trouble(path)
        raise data_error(path, line, f"{what} (expected one text a line, or JSON Lines with "
                         "a text field)")
    if looks_like_conll(path):
        raise data_error(path, n, "CoNLL columns (a token and its tag a line), not one text "
                         "a line; a tagger (--task ner) reads these")
    out = [Example(t, line=k) for k, t in lines_without_inner_cr(path) if not blank(t)]
    _refuse_json_after_heading(out, path)
    skipped = out[-1].line - len(out)   # blank lines before the last text (none after it)
    if skipped > 0:   # (a line of invisible characters is blank too: it was read as a text)
        note(f"{path}: {skipped} blank line{'s' * (skipped != 1)} skipped (row i of the output "
             "is the i-th sentence, not line i)")
    return out


JSON_SUFFIXES = (".jsonl", ".ndjson", ".json")


def _refuse_json_after_heading(texts: list, path):
    """JSON Lines under a first line or two that are no JSON (a '// comment', a title):
    the check of the first line read them as text, every record's raw JSON an input."""
    start = next((i for i, e in enumerate(texts) if opens_json(e.text_a)), None)
    if start and all(opens_json(e.text_a) for e in texts[start:]):
        raise data_error(path, texts[0].line, "not valid JSON, but the lines from line "
                         f"{texts[start].line} on are JSON Lines (a comment or title line? JSON "
                         "Lines have none: remove it)")


def _json_string_lines(path, strict: bool = True) -> Optional[list]:
    """`Example`s of a JSON Lines file of bare strings (one JSON string a line, as pandas'
    `Series.to_json(orient="records", lines=True)` writes): the decoded strings, not
    their quotes and escapes. A line that is no JSON string is an error, or without
    `strict` (a file that may be plain text) None."""
    out = []
    for k, t in read_lines(path):
        if not t.strip():
            continue
        try:
            value = json.loads(t)
        except (ValueError, RecursionError):
            value = None
        if not isinstance(value, str):
            if not strict:
                return None
            raise data_error(path, k, "is not a JSON string (the file's first line is one: "
                             "expected one JSON string a line, or JSON Lines objects with a "
                             "text field)")
        out.append(Example(value, line=k))
    for e in out:    # (once every line is known to be one: else, unstrict, plain text)
        refuse_surrogates(e.text_a, path, e.line)
    return out


def _note_stray_labels(examples, where) -> None:
    """A note for a class of one row in a training set of many (a stray '2' in a file of
    0s and 1s trained a 3-class model, said only as '3 labels')."""
    counts = collections.Counter(e.label for e in examples if e.label is not None)
    total = sum(counts.values())
    lone = [label for label, n in counts.items() if n == 1]
    if not lone:
        return
    first = next(e for e in examples if e.label == lone[0])
    if total >= STRAY_AMONG and len(lone) <= len(counts) / 2:
        note(f"{where}: {len(lone)} label{'s' if len(lone) > 1 else ''} of a single row "
             f"(first {lone[0]!r}, line {first.line}) of {total}: a class each, or a typo?")
    elif total >= 4 and len(lone) > len(counts) / 2:
        # (swapped columns, or an id column: a class per row, said only as 'N labels')
        note(f"{where}: {len(lone)} of the {len(counts)} labels are on a single row each "
             f"(first {lone[0]!r}, line {first.line}): is the label column a text or an "
             "id? (choose it with --label-column)")


STRAY_AMONG = 50   # a class of one row among this many rows or more is noted


def label_set(examples, path=None) -> list:
    """The classes of a training set, sorted: numerically when all are integers, else
    alphabetically. A set with one class, or of real-valued scores, is refused: neither
    trains a classifier."""
    where = path or "the training file"
    labels = {e.label for e in examples if e.label is not None}
    numbers = {x: _as_float(x) for x in labels}
    missing = {x for x in labels if numbers[x] is None and _is_non_finite(x)}
    if missing and len(missing) < len(labels) and all(
            numbers[x] is not None for x in labels - missing):
        odd = next(e for e in examples if e.label in missing)
        why = ("is too large a number (beyond float range)" if NUMBER.fullmatch(odd.label)
               else "is not a number like the other labels (a missing value?)")
        raise data_error(where, odd.line, f"label {odd.label!r} {why}")
    nan = next((e for e in examples if e.label in missing and float(e.label) != float(e.label)),
               None)
    if nan is not None and len(labels) > 1:   # (among words: a class 'NaN', unsaid)
        note(f"{where}: label {nan.label!r} (line {nan.line}) is what a table writes for a "
             "missing value; it is a class here (fill it in, or leave the row out, if it is "
             "not one)")
    _one_kind(examples, labels, numbers, missing, where)
    _note_stray_labels(examples, where)
    if labels and all(v is not None for v in numbers.values()):
        frac = next((e for e in examples if e.label is not None
                     and not numbers[e.label].is_integer()), None)
        if frac is not None:
            raise data_error(where, frac.line, f"label {frac.label!r} is a real number: the "
                             "labels look like scores; fine-tune them with --task regress")
    _one_spelling(examples, visible_form, where, "differ only in invisible characters or in "
                  "how an accent is encoded: one class or two? write each class one way")
    _one_spelling(examples, str.casefold, where,
                  "differ only in capitals: one class or two? write each class one way")
    if len(labels) < 2:
        shown = f"only {next(iter(labels))!r}" if labels else "none"
        raise data_error(where, None, f"a classifier needs at least two labels in the training "
                         f"data, found {shown}")
    try:
        values = {x: int(x) for x in labels}
    except ValueError:
        return sorted(labels)
    _one_spelling(examples, values.get, where,
                  "are the same number written two ways; write each class one way")
    return label_order(labels)


def label_order(names) -> list:
    """Class names in a training set's order: numerically when all are integers, else
    alphabetically (with two, the second is the 'positive' one, 1 or positive, unless
    the first names it negated: `positive_label`)."""
    try:
        return sorted(names, key=int)
    except ValueError:
        return sorted(names)


NEGATIONS = ("not", "non", "no", "un", "in", "im", "il", "ir", "dis")   # prefixes


def negates(label: str, other: str) -> bool:
    """Is `label` the negation of `other`: a prefix of NEGATIONS, then `other` (after a
    space, '_' or '-'): not_duplicate, non-hate, unacceptable, incorrect, disagree."""
    label, other = label.casefold(), other.casefold()
    return any(label.startswith(p) and label[len(p):].lstrip(" _-") == other and other
               for p in NEGATIONS)


def positive_label(names) -> str:
    """Of two class names, the one a binary F1 is the F1 of: the one the other negates
    (duplicate beside not_duplicate, equivalent, hate beside non-hate, irony, acceptable
    beside unacceptable, correct beside incorrect, agree beside disagree: the class GLUE
    and TweetEval report), else the second in
    `label_order` (1, positive, pos, True, yes)."""
    first, second = label_order(names)
    for negated, other in ((first, second), (second, first)):
        if negates(negated, other):
            return other
    return second


def _one_kind(examples, labels: set, numbers: dict, missing: set, where):
    """Labels that are numbers and labels that are words in one training file (1, 0 and
    'positive') are refused: they come from two writers or two label schemes, and each
    spelling would silently become a class of its own. The line named is the first of
    the rarer kind."""
    words = {x for x in labels - missing if numbers[x] is None}
    nums = labels - missing - words
    if not words or not nums:
        return
    n_words = sum(e.label in words for e in examples)
    n_nums = sum(e.label in nums for e in examples)
    rare, common, kind, kinds = ((words, nums, "a word", "numbers") if n_words <= n_nums
                                 else (nums, words, "a number", "words"))
    odd = next(e for e in examples if e.label in rare)
    raise data_error(where, odd.line, f"label {odd.label!r} is {kind} but other labels are "
                     f"{kinds} (e.g. {min(common)!r}): mixed label types; write every class "
                     "one way")


def visible_form(s: str) -> str:
    """A label as it reads: composed (NFC: an é typed as e + a combining accent is the
    one é) and without format characters (a zero-width space or joiner, a soft hyphen,
    a byte-order mark: what a copy from a web page leaves)."""
    return "".join(c for c in unicodedata.normalize("NFC", s) if unicodedata.category(c) != "Cf")


def _one_spelling(examples, key, where, how: str):
    """Two labels that are one class by `key` are refused (one class or two?): '01' and
    '1', one number; 'Positive' and 'positive', one word (two annotators, a hand-edited
    row). Each would silently be a class of its own."""
    seen = {}
    for e in examples:
        if e.label is None:
            continue
        other = seen.setdefault(key(e.label), e.label)
        if other != e.label:
            raise data_error(where, e.line, f"labels {other!r} and {e.label!r} {how}")


def _is_non_finite(s: str) -> bool:
    """'nan', 'inf', '-Infinity'...: what a writer prints for a missing number."""
    try:
        v = float(s)
    except ValueError:
        return False
    return v != v or abs(v) == float("inf")


def _as_float(s: str) -> Optional[float]:
    try:
        v = plain_number(s)
    except ValueError:
        return None
    return v if v == v and abs(v) != float("inf") else None


def check_labels(examples, label2id: dict, path, source: str = "the model knows"):
    """Labels must be ones the model knows (raises on the first unknown one, listing
    the known ones after `source`: the model, or the training file they came from)."""
    for e in examples:
        if e.label is not None and e.label not in label2id:
            number = str(int(e.label)) if CODE.fullmatch(e.label) else None
            hint = (f"; with its leading zero {e.label!r} is read as a code, not the number "
                    f"{number}" if number in label2id else "")
            raise data_error(path, e.line, f"unknown label {e.label!r} ({source} "
                             f"{some_of(label2id)}){hint}")


# ----------------------------------------------------------------------------------
# NER


def iob1_to_iob2(tags: list) -> list:
    """I-X that starts an entity (after O or another type) becomes B-X; IOB2 is unchanged."""
    out = []
    prev = "O"
    for t in tags:
        if t.startswith("I-") and (prev == "O" or prev[2:] != t[2:]):
            t = "B-" + t[2:]
        out.append(t)
        prev = t
    return out


def read_conll(path, require_tags=True) -> list:
    """Sentences of a CoNLL file (token first, tag last; blank lines between sentences)."""
    path = input_path(path)
    n, first = _first_content(path)
    _refuse_conll2012(path, n, first)
    if _is_json_file(path, first):
        if detect_format(path) == "jsonl":
            return _read_json_ner(path, require_tags)
        raise data_error(path, n, "JSON, not CoNLL columns (a token and its tag a line, a blank "
                         "line between sentences) nor JSON Lines of tokens and tags")
    out, words, tags, start, comments = [], [], [], 0, []
    width = None  # (columns, line) of the first token line: every token line has as many
    columns = conll_splitter()

    def flush():
        if words:
            out.append(Sentence(list(words), to_iob2(tags) if require_tags else None, start,
                                word_a_line=True))
        words.clear()
        tags.clear()

    for n, text in lines_without_inner_cr(path):   # (a CR broke a sentence in two)
        cols = columns(text)
        if not cols:
            flush()
            continue
        if cols[0] == "-DOCSTART-":
            flush()
            continue
        if _conll_comment(cols, require_tags):
            comments.append(n)
            continue
        if not words:
            start = n
        if require_tags:
            if len(cols) < 2:
                raise data_error(path, n, "expected a token and a tag (CoNLL columns)")
            tag = cols[-1]
            if not is_iob_tag(tag):
                raise data_error(path, n, f"tag {tag!r} is not IOB (O, B-TYPE or I-TYPE; "
                                 "BIOES and BILOU tags are read too)")
            tags.append(tag)
        if width is None:
            width = (len(cols), n)
        elif len(cols) != width[0]:  # a token with a space in it, or a column left out
            raise data_error(path, n, f"expected {width[0]} columns like line {width[1]}, found "
                             f"{len(cols)} (CoNLL columns are separated by spaces or tabs; a "
                             "token holds a space only where tabs separate the columns)")
        words.append(cols[0])
    flush()
    if not out:
        raise data_error(path, None, "no sentences")
    if comments:
        note(f"{path}: {len(comments)} comment line{'s' if len(comments) > 1 else ''} ('# ...', "
             f"first line {comments[0]}) skipped")
    _refuse_index_column(out, path, width)
    return _without_language_prefix(out, path)


def _refuse_index_column(sentences, path, width) -> None:
    """A first column that counts 1, 2, 3... in every sentence is a token index (GermEval,
    CoNLL-U): the model had trained on the words '1 2 3 4 5'."""
    if width[0] > 2 and any(all(s.words == [str(i) for i in range(first, len(s.words) + first)]
                                for s in sentences) for first in (0, 1)):
        raise data_error(path, sentences[0].line, "the first column counts 1, 2, 3... (or from "
                         "0) in every "
                         "sentence: a token index (GermEval, CoNLL-U), but the token is read "
                         "from the first column (and the tag from the last); cut the index "
                         "column away first (e.g. cut -f2- FILE)")


LANGUAGE_PREFIX = re.compile(r"[a-z]{2,3}:")


def _without_language_prefix(sentences, path) -> list:
    """WikiANN/PAN-X as XTREME ships it writes each token 'en:Angela': a prefix every word
    of the file carries is dropped, said in a note (the model had read 'en:' as part of
    every word)."""
    first = LANGUAGE_PREFIX.match(sentences[0].words[0])
    prefix = first.group() if first else None
    if prefix is None or not all(w.startswith(prefix) and len(w) > len(prefix)
                                 for s in sentences for w in s.words):
        return sentences
    note(f"{path}: every word starts with {prefix!r} (WikiANN/PAN-X's language prefix): "
         "read without it")
    for s in sentences:
        s.words = [w[len(prefix):] for w in s.words]
    return sentences


def _refuse_conll2012(path, n, first: str) -> None:
    """An OntoNotes CoNLL-2012 file (`*_gold_conll`): a document id, part and word number
    before each word, entities in brackets. Read as text, each line was tagged as an
    input; as CoNLL-2003, its coreference column was "tag '(12' is not IOB"."""
    if first.startswith("#begin document"):
        raise data_error(path, n, "an OntoNotes CoNLL-2012 file (#begin document; the word in "
                         "the 4th column, entities in brackets): nanobert reads CoNLL-2003 "
                         "columns (the token first, its IOB tag last, a blank line between "
                         "sentences); convert it to those")


def _conll_comment(cols: list, tagged: bool = True) -> bool:
    """A comment line of a CoNLL file ('# sent_id = 1', '# id 3a1 domain=en', as CoNLL-U
    and MultiCoNER write them): its last column is not a tag (it was an error about the
    tag '1'); a token '#' tagged 'O' is a token. In a file read without its tags (predict)
    a comment starts with the word '#' and has more columns ('#hashtag' alone is a token)."""
    if not tagged:
        return cols[0] == "#" and len(cols) > 1 and not is_iob_tag(cols[-1])
    return cols[0].startswith("#") and (len(cols) < 2 or not is_iob_tag(cols[-1]))


TOKEN_FIELDS = ["tokens", "words"]
TAG_FIELDS = ["ner_tags", "tags", "labels", "ner", "label"]


def _read_json_ner(path: Path, require_tags: bool) -> list:
    """Sentences of JSON Lines (or a JSON array) with a list of tokens and a list of
    tags a record, as Hugging Face datasets' to_json writes them ({"tokens": [...],
    "ner_tags": [...]}). Tags must be names: integers are a ClassLabel's indices, whose
    names are not in the file. Records without tokens are skipped (conll2003 has some)."""
    objs = list(_jsonl_objects(path))
    names = list(dict.fromkeys(k for _, obj in objs for k in obj))
    words_at, tags_at = first_column(names, TOKEN_FIELDS), first_column(names, TAG_FIELDS)
    if words_at is None or (require_tags and tags_at is None):
        raise data_error(path, objs[0][0], "expected CoNLL columns, or JSON Lines with a "
                         f"'tokens' list{' and a ner_tags list' if require_tags else ''} "
                         f"(fields: {', '.join(map(repr, names))})")
    out = []
    for n, obj in objs:
        words = obj.get(words_at)
        if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
            raise data_error(path, n, f"{words_at!r} must be a list of strings")
        tags = _json_tags(obj.get(tags_at), len(words), path, n) if require_tags else None
        if words:
            out.append(Sentence(words, tags, n))
    if not out:
        raise data_error(path, None, "no sentences")
    empty = [n for n, obj in objs if not obj.get(words_at)]
    if empty:   # (in the middle of a file, a result a row would then be off by one)
        note(f"{path}: {len(empty)} record{'s' * (len(empty) != 1)} with no tokens skipped "
             f"(line {empty[0]}{', ...' * (len(empty) > 1)}): row i of the output is the i-th "
             "sentence, not line i")
    return out


def _json_tags(tags, n_words: int, path, n) -> list:
    """The IOB2 tags of one JSON record, checked: names, one per token."""
    if not isinstance(tags, list) or len(tags) != n_words:
        raise data_error(path, n, f"expected a list of {n_words} tags, one per token")
    if any(isinstance(t, int) for t in tags):
        raise data_error(path, n, "tags are numbers (a ClassLabel's indices, whose names "
                         "this file lacks); write the tag names ('B-PER', 'O')")
    odd = [t for t in tags if not isinstance(t, str) or not is_iob_tag(t)]
    if odd:   # (a list: the bad tag may be None itself, which next(..., None) hid)
        raise data_error(path, n, f"tag {odd[0]!r} is not IOB (O, B-TYPE or I-TYPE; BIOES "
                         "and BILOU tags are read too)")
    return to_iob2(tags)


# ----------------------------------------------------------------------------------
# QA


def _load_json(path: Path):
    lines = [text for _, text in read_lines(path)]  # UTF-8 checked, line-numbered errors
    if not any(t.strip() for t in lines):
        raise data_error(path, None, no_text(bool(lines)))
    return _json_value("\n".join(lines), path, None)


def read_squad(path, require_answers=True) -> list:
    """QA examples from SQuAD v1.1 JSON, or from JSON Lines with question/context. Every
    answer must occur in its context (at its answer_start, else the nearest occurrence is
    taken, with a note); errors name the question id."""
    path, moved = input_path(path), []
    fmt = detect_format(path)
    if fmt == "jsonl" and '"data"' in _first_content(path)[1][:200]:
        fmt = "json"  # a SQuAD document written on one line
    if fmt == "jsonl":
        out = [_jsonl_question(obj, path, n, require_answers, moved)
               for n, obj in _jsonl_objects(path)]
    elif fmt == "json":
        doc = _load_json(path)
        if not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
            raise data_error(path, 1, "not a SQuAD file (expected an object with a 'data' list)")
        out = [ex for a, article in enumerate(doc["data"])
               for ex in _squad_article(article, f"data[{a}]", path, require_answers, moved)]
        _note_unanswerable(doc, path)
    elif fmt in ("tsv", "csv"):
        out = _table_questions(path, require_answers, moved)
    else:
        raise data_error(path, 1, "expected SQuAD JSON, or JSON Lines or a TSV/CSV table with "
                         "question and context")
    if not out:
        raise data_error(path, None, "no questions")
    _ids_once(out, path)
    if moved:
        note(f"{path}: {len(moved)} answer{'s were' if len(moved) > 1 else ' was'} not at "
             f"{'their' if len(moved) > 1 else 'its'} answer_start, and taken at the nearest "
             f"occurrence of the text, or where answer_start points counted in UTF-16 "
             f"units or UTF-8 bytes when the text is there (first: {moved[0]})")
    return out


def _ids_once(examples: list, path):
    """Predictions and scores are keyed by id: a repeat would hide a question. A
    question without an id takes its line number, which another may give as its own."""
    seen = {}
    for ex in examples:
        first = seen.setdefault(ex.id, ex)
        if first is ex:
            continue
        lines = [x.line for x in (first, ex) if x.line is not None]
        where = f" (lines {lines[0]} and {lines[1]})" if len(lines) == 2 else ""
        lacking = next((x for x in (first, ex) if not x.id_given), None)
        why = (f"; line {lacking.line} has no id and takes its line number as its id: give "
               "it one" if lacking is not None else "")
        raise data_error(path, ex.line, f"question id {ex.id!r} is used twice{where}{why} (ids "
                         "must be unique: answers are matched to questions by id)")


def _table_questions(path: Path, require_answers: bool, moved: list) -> list:
    """QA examples of a TSV/CSV table (a spreadsheet of questions) with `question` and
    `context` columns, and optionally `id` and `answer` (the answer's text, which is
    looked up in the context, as a bare answer in JSON Lines is)."""
    names, rows = read_records(path)
    q, c = column_named(names, "question"), column_named(names, "context")
    if not q or not c:
        shown = ", ".join(map(repr, names))
        raise data_error(path, 1, f"no 'question' and 'context' columns (columns: {shown}); "
                         "expected SQuAD JSON, or JSON Lines or a table with question and context")
    i, a = column_named(names, "id"), column_named(names, "answer")
    start = column_named(names, "answer_start")
    if require_answers and not a and column_named(names, "answers"):
        raise data_error(path, 1, "a table's 'answers' column (a datasets export: the texts "
                         "and answer_starts of a question in one cell) is not read; give one "
                         "'answer' column (and 'answer_start'), or write the data as JSON "
                         "Lines (Dataset.to_json)")
    out = []
    for n, rec in rows:
        # the answer where answer_start puts it (a text found twice had been taken first)
        answer = {"text": rec[a], "answer_start": rec[start]} if a and start and rec[start] \
            else rec[a] if a else None
        obj = {"question": rec[q], "context": rec[c], "id": rec[i] if i else None,
               "answers": [answer] if a and rec[a] else []}
        out.append(_jsonl_question(obj, path, n, require_answers, moved))
    return out


def _jsonl_question(obj: dict, path, n, require_answers, moved: list) -> QAExample:
    if not isinstance(obj.get("question"), str) or not isinstance(obj.get("context"), str):
        raise data_error(path, n, "expected an object with string fields 'question' and "
                         "'context' (JSON Lines of questions), or SQuAD JSON (an object with "
                         "a 'data' list)")
    given = obj.get("id") not in (None, "")
    qid = str(obj["id"] if given else n)
    no_empty_question(obj["question"], obj["context"], f"{path}:{n}: question {qid!r}")
    # (questions to answer: their gold answers are not read, nor refused when wrong); one
    # `answer`, as a table's answer column gives it, was unread: "has no answers"
    given_answers = obj.get("answers")
    if given_answers is None and obj.get("answer") not in (None, ""):
        given_answers = [obj["answer"] if obj.get("answer_start") in (None, "") else
                         {"text": obj["answer"], "answer_start": obj["answer_start"]}]
    answers = (_answers(given_answers or [], obj["context"], f"{path}:{n}: question {qid!r}",
                        moved) if require_answers else [])
    if require_answers and not answers:
        empty = given_answers in ([], {}) or (isinstance(given_answers, dict) and
                                              given_answers.get("text") == [])
        raise data_error(path, n, f"question {qid!r} has no answers" + (
            ": an empty 'answers' is SQuAD v2.0's unanswerable question, and nanobert reads "
            "SQuAD v1.1, where every question has an answer; remove such questions to train "
            "or evaluate on the others" if empty else
            " (expected 'answers': a list of answer texts or of {text, answer_start}, or one "
            "'answer')"))
    return QAExample(qid, obj["question"], obj["context"], answers, line=n, id_given=given)


def no_empty_question(question: str, context: str, where: str):
    """An empty question (or context) is a field lost on the way: the model would pick
    a span of the context with nothing asked (or answer from nothing), and training
    would teach it to."""
    for what, text in ((" is", question), (": its context is", context)):
        if blank(text):
            raise NanobertError(f"{where}{what} {empty_words(text)} (fill it in or remove the "
                                "question)")


def _note_unanswerable(doc: dict, path):
    """SQuAD v2.0's unanswerable questions (`is_impossible`), read for prediction: a model
    of SQuAD v1.1 (nanobert's) answers every question, those too (training and evaluation
    refuse them, as questions without answers)."""
    n = sum(1 for a in doc["data"] if isinstance(a, dict)
            for p in a.get("paragraphs") or [] if isinstance(p, dict)
            for q in p.get("qas") or [] if isinstance(q, dict) and q.get("is_impossible") is True)
    if n:
        note(f"{path}: {n} question(s) are marked is_impossible (SQuAD v2.0: no answer in the "
             "context); a SQuAD v1.1 model answers them too, with the best span it finds")


def _squad_article(article, where, path, require_answers, moved: list) -> list:
    """The QAExamples of one SQuAD article (data[i]), structure checked on the way."""
    def field(obj, key, kind, at):
        if not isinstance(obj, dict) or not isinstance(obj.get(key), kind):
            raise NanobertError(f"{path}: {at}: not SQuAD v1.1 structure (expected "
                                f"{kind.__name__} field {key!r})")
        return obj[key]
    out = []
    title = article.get("title", "") if isinstance(article, dict) else ""
    for p, para in enumerate(field(article, "paragraphs", list, where)):
        at = f"{where}.paragraphs[{p}]"
        context = field(para, "context", str, at)
        for q, qa in enumerate(field(para, "qas", list, at)):
            question = field(qa, "question", str, f"{at}.qas[{q}]")
            qid = qa.get("id", f"{at}.qas[{q}]")
            if not isinstance(qid, (str, int)) or isinstance(qid, bool):
                raise NanobertError(f"{path}: {at}.qas[{q}]: the question id must be a string")
            no_empty_question(question, context, f"{path}: question {str(qid)!r}")
            answers = (_answers(qa.get("answers", []), context, f"{path}: question {str(qid)!r}",
                                moved) if require_answers else [])
            if require_answers and not answers:
                v2 = (" (SQuAD v2.0 'is_impossible': nanobert reads SQuAD v1.1, where every "
                      "question has an answer; remove the questions marked is_impossible to "
                      "train or evaluate on the others)" if qa.get("is_impossible") else "")
                raise NanobertError(f"{path}: question {str(qid)!r} has no answers{v2}")
            out.append(QAExample(str(qid), question, context, answers,
                                 title if isinstance(title, str) else ""))
    return out


def _answers(raw, context: str, where: str, moved: list) -> list:
    """[(text, char_start)], each checked against the context: an answer that is not at
    its answer_start would train the model on the wrong span. Hugging Face datasets'
    layout, {"text": [...], "answer_start": [...]} (SQuAD saved with `to_json`), is read
    as the list it stands for."""
    if isinstance(raw, dict) and set(raw) >= {"text", "answer_start"}:
        texts, starts = raw["text"], raw["answer_start"]
        if not isinstance(texts, list) or not isinstance(starts, list) \
                or len(texts) != len(starts):
            raise NanobertError(f"{where}: 'answers' holds 'text' and 'answer_start' lists of "
                                "different lengths (one start for each answer is needed)")
        raw = [{"text": t, "answer_start": a} for t, a in zip(texts, starts)]
    if not isinstance(raw, list):
        raise NanobertError(f"{where}: 'answers' must be a list")
    out = []
    for a in raw:
        if isinstance(a, str):  # JSON Lines may give bare answer strings: find them
            start = context.find(a)
            if not a or start < 0:
                raise NanobertError(f"{where}: answer {a[:60]!r} does not occur in the context")
            out.append((a, start))
            continue
        text = a.get("text") if isinstance(a, dict) else None
        start = a.get("answer_start") if isinstance(a, dict) else None
        if isinstance(start, str) and _as_float(start.strip()) is not None:
            start = _as_float(start.strip())   # some converters write it as a string
        if isinstance(start, float) and start.is_integer():
            start = int(start)  # or as a float (pandas, a column that once held a NaN: 8.0)
        if not isinstance(text, str) or not text:
            raise NanobertError(f"{where}: each answer needs a non-empty 'text'")
        if isinstance(start, bool) or not isinstance(start, (int, type(None))):
            raise NanobertError(f"{where}: answer_start {start!r} is not a character offset "
                                "(an integer, or none)")
        out.append((text, _answer_start(text, start, context, where, moved)))
    return out


def _recounted(context: str, start) -> list:
    """[(character index, units)] where answer_start `start` points when counted in the
    units of other tools: UTF-16 code units (JavaScript, Java, .NET: an emoji counts 2, and
    the nearest occurrence from there could be another one) or UTF-8 bytes."""
    if not isinstance(start, int) or start <= 0 or context.isascii():
        return []
    out = []
    for codec, width, units in (("utf-16-le", 2, "UTF-16 code units"), ("utf-8", 1, "UTF-8 bytes")):
        raw = context.encode(codec, "surrogatepass")
        if start * width <= len(raw):
            at = len(raw[:start * width].decode(codec, "ignore"))
            if at != start:
                out.append((at, units))
    return out


def _answer_start(text: str, start, context: str, where: str, moved: list) -> int:
    """Where `text` is in the context: at its answer_start, else (no answer_start, or one
    off by a few characters, as converted datasets have them) the occurrence nearest to
    it, added to `moved`; an answer that is nowhere in the context is an error (its context is
    another one). The official EM/F1 reads only the texts, so a held-out file with loose
    offsets scores as it would there."""
    if start is not None and start >= 0 and context[start:start + len(text)] == text:
        return start
    for at, units in _recounted(context, start):
        if context[at:at + len(text)] == text:
            moved.append(f"{where.split(': ', 1)[-1]}: {start} -> {at}, answer_start "
                         f"counted in {units}")
            return at
    found, k = [], context.find(text)
    while k >= 0:
        found.append(k)
        k = context.find(text, k + 1)
    if not found:
        at = "" if start is None else f" (answer_start {start})"
        raise NanobertError(f"{where}: answer {text[:60]!r} does not occur in the context{at}")
    nearest = min(found, key=lambda k: abs(k - (start or 0)))
    if start is not None:
        moved.append(f"{where.split(': ', 1)[-1]}: {start} -> {nearest}")
    return nearest


# ----------------------------------------------------------------------------------
# Similarity, retrieval and reranking data (embedding models and cross-encoders)
#
#   STS original   `genre file year id score sentence1 sentence2 [extra...]`, tab-separated,
#                  no header, quotes literal (the sts-*.csv files of the STS Benchmark)
#   tables         TSV/CSV with a header, or JSON Lines: the columns name the roles,
#                  (anchor, positive[, negative]) or (sentence1, sentence2, score) or
#                  (query, document, label) or (text, score); GLUE STS-B is one of these
#   BEIR folder    corpus.jsonl {"_id", "title", "text"}, queries.jsonl {"_id", "text"},
#                  qrels/<split>.tsv `query-id corpus-id score` (header, any line endings)

ANCHOR_COLUMNS = ["anchor", "query", "sentence1", "text_a", "question", "sentence", "text",
                  "premise", "question1", "sentence_a", "#1 String"]
POSITIVE_COLUMNS = ["positive", "pos", "document", "passage", "sentence2", "text_b", "answer",
                    "hypothesis", "text_pair"]
NEGATIVE_COLUMNS = ["negative", "neg", "hard_negative"]
SCORE_COLUMNS = ["score", "similarity", "similarity_score", "relatedness_score", "label"]
STS_FIELDS = 7  # genre, file, year, id, score, sentence1, sentence2
KNOWN_COLUMNS = list(dict.fromkeys(TEXT_COLUMNS + list(PAIR_COLUMNS.values()) + LABEL_COLUMNS
                                   + ANCHOR_COLUMNS + POSITIVE_COLUMNS + NEGATIVE_COLUMNS
                                   + SCORE_COLUMNS))


@dataclass(slots=True)
class TextRow:
    """One row of a similarity / retrieval file: 1-3 texts and an optional score."""
    texts: tuple               # (text,), (text_a, text_b) or (anchor, positive, negative)
    score: Optional[float] = None
    line: int = 0
    path: Optional[Path] = field(default=None, repr=False, compare=False)   # the file read


def note_regraded(path, n: int, query: str, doc: str, first: int, last: int) -> None:
    """Said of qrels and of reranking tables: a (query, document) pair judged twice."""
    note(f"{path}: {n} (query, document) pair(s) judged twice with different grades (e.g. "
         f"{query!r}, {doc!r} on lines {first} and {last}); the last grade counts")


def last_grades(rows: list, quiet: bool = False) -> list:
    """(query, document, label) rows, one per (query, document): the last one's label, as
    the qrels reader keeps it, said when they differ. A pair listed twice had been two
    documents: labelled 1 and 0, the metric changed with the rows' order (1.0 or 0.63)."""
    last, regraded = {}, []
    for r in rows:
        key = tuple(r.texts)
        if key in last and last[key].score != r.score:
            regraded.append((r.path, *key, last[key].line, r.line))
        last[key] = r
    if regraded and not quiet:
        note_regraded(regraded[0][0], len(regraded), *regraded[0][1:])
    return list(last.values()) if len(last) < len(rows) else rows


MAX_SCORE = 1e15   # squared, summed over a batch of thousands: still finite in float32


def _score(value, path, line, column: Optional[str] = None,
           kind: str = "similarity scores") -> float:
    if value is None or (isinstance(value, str) and not value.strip()):
        raise data_error(path, line, "the score is missing (an empty cell or null); every row "
                         "needs one here")
    try:
        x = plain_number(value)
    except (TypeError, ValueError, OverflowError):   # (a JSON integer of 400 digits)
        x = float("nan")
    if isinstance(value, bool) or x != x or x in (float("inf"), float("-inf")):
        words = isinstance(value, str) and x != x and column in LABEL_COLUMNS
        guess = " (an NLI or classification file?)" if kind == "similarity scores" else ""
        raise data_error(path, line, f"score {value!r} is not a finite number" + (
            f": the {column!r} column holds class labels{guess}, not {kind}" if words else ""))
    if abs(x) > MAX_SCORE:
        raise data_error(path, line, f"score {value!r} is too large (at most {MAX_SCORE:g} in "
                         "magnitude: the squared errors of training overflow float32); "
                         "rescale the scores")
    return x


def is_sts_original(path, given=()) -> bool:
    """The STS Benchmark release layout: no header, >= 7 tab-separated fields, a number
    in the fifth. A first line off that layout (a score that is no number, a field
    left out) is still a row of it, to be refused with its line and fault, not a header
    whose columns are then missing: where it names no column (a reader's, or one
    `given` by name) and the file is named as the release's are (sts-*.csv) or its next
    lines have the layout."""
    path = Path(path)
    n, first = _first_content(path)
    if not given:     # (columns given by index read such a file as its user means)
        _refuse_glue_stsb_without_header(first, path, n)
    if _is_sts_row(first):
        return True
    fields = first.split("\t")
    if len(fields) < 2 or _is_header(fields, given):
        return False
    if re.fullmatch(r"sts-.*\.csv", path.name, re.IGNORECASE):
        return True
    after = (t for _, t in itertools.islice(read_lines(path), 1, 50) if t.strip())
    return any(_is_sts_row(t) for t in itertools.islice(after, 5))


GLUE_STSB = "index genre filename year old_index source1 source2 sentence1 sentence2 score"


def _refuse_glue_stsb_without_header(first: str, path, line) -> None:
    """A GLUE STS-B row with its header line gone has the release layout's number in
    its fifth field: it was read as the STS Benchmark's, its old_index taken for the
    score and its source columns for the sentences (a wrong Spearman, exit 0)."""
    fields, names = first.split("\t"), GLUE_STSB.split()
    if len(fields) in (len(names), len(names) - 1) and fields[0].strip().isdigit() and \
            _as_float(fields[1]) is None and _as_float(fields[4]) is not None:
        header = " ".join(names[:len(fields)])          # (the test split has no score)
        raise data_error(path, line, "a GLUE STS-B row without the header line, which names "
                         f"its columns; put the header back (tab-separated: {header}), or "
                         "give the columns by 0-based index (--text-column 7 "
                         "--text-pair-column 8" + (" --label-column 9)" if len(fields) ==
                                                   len(names) else ")"))


def _is_sts_row(text: str) -> bool:
    fields = text.split("\t")
    if len(fields) < STS_FIELDS:
        return False
    try:
        float(fields[4])
    except ValueError:
        return False
    return True


STS_ROLES = {"text": 5, "pair": 6, "score": 4}   # the layout's columns (0-based)


def _sts_columns(columns: dict, path) -> tuple:
    """(text, pair, score) column indices of the STS Benchmark layout: its own, or those
    the column flags give (0-based: the layout has no header to name them by)."""
    flags = {role: flag for role, _, flag in TEXT_ROLES}
    odd = next((r for r in columns if r not in STS_ROLES), None)
    if odd is not None:
        raise data_error(path, 1, f"the STS Benchmark layout has (text, pair, score) rows: no "
                         f"{odd} column")
    bad = next((r for r, c in columns.items() if not is_column_index(c)), None)
    if bad is not None:
        raise data_error(path, 1, f"{flags[bad]} {columns[bad]}: the STS Benchmark layout has no "
                         "header to name a column by; give its 0-based index")
    idx = {**STS_ROLES, **{r: int(c) for r, c in columns.items()}}
    _distinct_roles([(str(idx[r]), flags[r]) for r in STS_ROLES], path, 1)
    return idx["text"], idx["pair"], idx["score"]


def _read_sts_original(path: Path, require_score: bool, columns: Optional[dict] = None) -> list:
    out, idx = [], _sts_columns(columns or {}, path)
    for n, text in read_lines(path):
        if not text.strip():
            continue
        try:
            out.append(_sts_row(text, path, n, require_score, idx))
        except NanobertError as e:
            if out:
                raise
            raise NanobertError(f"{e} (read as a row of the STS Benchmark layout, which has "
                                "no header; a header names its columns: sentence1, sentence2, "
                                "score)") from None
    return out


def _read_sts_examples(path: Path, cols: dict) -> list:
    """`Example`s of an STS Benchmark release file read by columns given by 0-based index
    (`embed --text-column 5`, `tsne --label-column 4`): each line split on tabs, quoting
    off, the trailing fields some lines carry ignored, as the STS reader reads them (the
    table reader refused those lines as ragged)."""
    roles = ("text_column", "pair_column", "label_column")
    given = {r: cols[r] for r in roles if cols.get(r)}
    flags = {role: flag for role, _, flag in TEXT_ROLES}
    flag_of = dict(zip(roles, (flags["text"], flags["pair"], flags["score"])))
    bad = next((r for r in given if not is_column_index(given[r])), None)
    if bad is not None or "text_column" not in given:
        what = (f"{flag_of[bad]} {given[bad]}: it has no header to name a column by; give "
                "its 0-based index" if bad else "give the text's column by 0-based index "
                "(--text-column 5: sentence1)")
        raise data_error(path, 1, f"the STS Benchmark layout (genre file year id score "
                         f"sentence1 sentence2): {what}")
    ia, ib, il = (int(given[r]) if r in given else None for r in roles)
    if il is None and cols["require_label"]:
        raise data_error(path, 1, "the STS Benchmark layout has no class labels; name the "
                         "column to read as one (--label-column 4: the score)")
    need = max(STS_FIELDS, *(i + 1 for i in (ia, ib, il) if i is not None))
    out = []
    for n, text in read_lines(path):
        if not text.strip():
            continue
        fields = text.split("\t")
        if len(fields) < need:
            raise data_error(path, n, f"expected at least {need} tab-separated fields (genre "
                             f"file year id score sentence1 sentence2), found {len(fields)}")
        label = _label_str(fields[il], path, n, cols["require_label"]) if il is not None else None
        out.append(Example(fields[ia], fields[ib] if ib is not None else None, label, n))
    return out


def _sts_row(text: str, path, n, require_score: bool, idx: tuple) -> TextRow:
    """The row of one line; `idx`: its (text, pair, score) fields (`_sts_columns`)."""
    fields = text.split("\t")  # quoting off: quotes are part of the sentences
    need = max(STS_FIELDS, max(idx) + 1)
    if len(fields) < need:
        raise data_error(path, n, f"expected at least {need} tab-separated fields (genre "
                         f"file year id score sentence1 sentence2), found {len(fields)}")
    a, b, score = (fields[i] for i in idx)
    score = _score(score, path, n) if require_score or score.strip() else None
    return TextRow((a, b), score, n, path)


def read_records(path, given=()) -> tuple:
    """(column names, [(line, {column: value})]) of a JSON Lines file or a TSV/CSV file
    with a header (or, with columns `given` by index, without one: see `_table`)."""
    path = input_path(path)
    fmt = detect_format(path)
    if fmt == "jsonl":  # the fields of all lines: one first seen on line 2 is still a column
        rows = list(_jsonl_objects(path))
        _not_a_frame(rows, path)
        return list(dict.fromkeys(k for _, obj in rows for k in obj)), rows
    if fmt == "json":
        line, what = _json_trouble(path)
        raise data_error(path, line, f"{what}; expected a TSV/CSV file with a header, or "
                         "JSON Lines")
    if fmt not in ("tsv", "csv", "msrp"):
        raise data_error(path, 1, "expected a TSV/CSV file with a header, or JSON Lines")
    _, header, table = _table(path, fmt, given)
    return header, [(n, dict(zip(header, fields))) for n, fields in table]


def _pick(names, candidates, given=None):
    if given:
        given = by_index(names, given)
        return given if given in names else None
    return first_column(names, candidates)


def read_text_rows(path, require_score: Optional[bool] = None, columns: Optional[dict] = None,
                   pairs_need_score: bool = False, min_texts: tuple = (1, ""),
                   score_kind: str = "similarity scores") -> list:
    """`TextRow`s of an STS / pairs / triplets / reranking file. The columns present
    decide the texts (anchor, positive, negative) and the score; `columns` may name them
    ({"text": ..., "pair": ..., "negative": ..., "score": ...}), by name or 0-based index.
    require_score=True makes a missing score column an error, False ignores it, None
    takes it when present; with `pairs_need_score` (where unscored pairs are taken for
    (query, positive) pairs), STS/NLI pair columns without a score are refused too
    (`_scored_pairs`). `min_texts` is (the fewest text columns, the error if fewer):
    checked before any row is read, so a file of another shape is named as such, not by
    its first row's value under a column taken for the score. `score_kind` names what
    the scores are, for the error on a cell that is a word."""
    path, columns = Path(path), columns or {}
    if is_sts_original(path, tuple(columns.values())):
        out = _read_sts_original(path, require_score is not False, columns)
        _note_empty_texts(out, path, "row(s)")
        return out
    names, records = read_records(path, tuple(columns.values()))
    shown = ", ".join(map(repr, names)) or "none"
    roles = [_pick(names, ANCHOR_COLUMNS, columns.get("text")),
             _pick(names, POSITIVE_COLUMNS, columns.get("pair")),
             _pick(names, NEGATIVE_COLUMNS, columns.get("negative"))]
    if roles[0] is not None and roles[1] is None and not columns.get("pair"):
        roles[1] = _pair_of(names, roles[0])   # QNLI's question/sentence, QQP's question1/2
    score = None if require_score is False else _pick(names, SCORE_COLUMNS, columns.get("score"))
    _no_second_candidate(names, roles + [score], columns, path)
    _distinct_roles([(c, flag or f"the {role} column") for c, (role, _, flag) in
                     zip(roles + [score], TEXT_ROLES)], path, 1)
    if roles[0] is None:
        raise data_error(path, 1, f"no text column (expected one of {', '.join(ANCHOR_COLUMNS[:5])}"
                         f"...; columns: {shown})" + _headerless_rows_hint(names))
    unscored = pairs_need_score and _scored_pairs(roles, columns)
    if score is None and (require_score or unscored):
        raise _no_score(path, roles, unscored, shown)
    _note_unread_texts(names, roles + [score], columns, path)
    roles = [r for r in roles if r is not None]
    _single_columns(names, roles + [score], path, 1)
    if len(roles) < min_texts[0]:
        raise data_error(path, records[0][0] if records else 1, min_texts[1])
    out = []
    for n, rec in records:
        absent = next((c for c in roles + [score] if c is not None and c not in rec), None)
        if absent is not None:
            raise missing_field(path, n, absent, records)
        texts = tuple(rec.get(r) for r in roles)
        odd = next((r for r in roles if not isinstance(rec.get(r), str)), None)
        if odd is not None:
            raise data_error(path, n, _not_a_text(odd, rec.get(odd)))
        out.append(TextRow(texts, _score(rec.get(score), path, n, score, score_kind)
                           if score else None,
                           n, path))
    if not out:
        raise data_error(path, None, "no rows (only a header?)")
    if columns.get("score") is None:
        _no_nli_classes(roles, score, out, path)
        _note_class_scores(roles, score, out, path)
    _note_empty_texts(out, path, "row(s)")
    return out


# the pair columns of labelled pair tasks (STS, NLI, QNLI, QQP...): related only by their scores
SCORED_PAIR_COLUMNS = list(dict.fromkeys(c.casefold() for c in PAIR_COLUMNS.values()))
# the roles of read_text_rows: the columns each may be found in, the flag that names it
TEXT_ROLES = (("text", ANCHOR_COLUMNS, "--text-column"),
              ("pair", POSITIVE_COLUMNS, "--text-pair-column"),
              ("negative", NEGATIVE_COLUMNS, None),
              ("score", SCORE_COLUMNS, "--label-column"))


def _no_score(path, roles: list, unscored: bool, shown: str) -> NanobertError:
    """The error of rows that need a score column and have none."""
    if detect_format(path) == "msrp":
        return data_error(path, 1, MSRP_UNSCORED)
    hint = UNSCORED_PAIRS.format(*roles) if unscored else ""
    if roles[2] is not None and not unscored:   # (a reranker given triplets)
        hint = ("; a reranker reads (query, document, label) rows: (query, positive, "
                "negative) triplets train an embedding model (--task embed)")
    return data_error(path, 1, f"no score column (expected one of {', '.join(SCORE_COLUMNS)}; "
                      f"columns: {shown}){hint or '; name it with --label-column'}")


def _headerless_rows_hint(names) -> str:
    """For a first row of sentences taken for names (MS MARCO's triples.tsv has no
    header): how to read such a file."""
    if not _headerless_hint(names):
        return ""
    return ("; its first row reads as data, not names: give the file a header (anchor, "
            "positive[, negative], or sentence1, sentence2, score), or name 0-based columns "
            "(--text-column 0 --text-pair-column 1)")


def _note_unread_texts(names, taken: list, columns: dict, path) -> None:
    """Columns named by index leave the others unread: a third column of a headerless
    triplets file (its negatives) had been dropped without a word; no flag names a
    negatives column, its header name does."""
    if not all(isinstance(n, int) or str(n).isdigit() for n in names):   # (a header's: kept)
        return
    unread = [n for n in names if n not in taken]
    if unread:
        note(f"{path}: column(s) {', '.join(map(str, unread))} not read (the columns named "
             "by flags are); hard negatives are read from a header's 'negative' column")


def _pair_of(names, text: str) -> Optional[str]:
    """The column paired with a first text column in the classification layouts
    (PAIR_COLUMNS, any capitals), when the header has it."""
    first = next((c for c in PAIR_COLUMNS if c.casefold() == text.casefold()), None)
    return column_named(names, PAIR_COLUMNS.get(first)) if first else None


def _no_second_candidate(names, taken: list, columns: dict, path):
    """Refuse a header where a role found by its column name (not named by flag) has a
    second column that could hold it too and is taken by no role ('score' and 'label';
    'query' and 'text'): which one was meant would be a guess."""
    for (role, candidates, flag), chosen in zip(TEXT_ROLES, taken):
        if chosen is not None and columns.get(role) is None:
            _one_candidate(names, candidates, (chosen, *taken), role, path, 1, flag)
UNSCORED_PAIRS = ("; {0!r}/{1!r} pairs (STS, NLI) are related by their scores, not all matches "
                  "(an STS-B test file?); (query, positive) pairs are read from columns named "
                  "so (anchor/positive, query/document, question/answer) or named with "
                  "--text-pair-column")

MSRP_UNSCORED = ("the MSRP paraphrase layout: its 'Quality' column holds classes (1 a "
                 "paraphrase, 0 not), not similarity scores; fine-tune and evaluate a "
                 "classifier on it (--task classify), or read the classes as scores with "
                 "--label-column Quality")


def _no_nli_classes(roles: list, score: Optional[str], rows: list, path):
    """Refuse premise/hypothesis pairs whose score, found in a column named `label`, is
    all 0, 1 and 2: NLI's classes (entailment, neutral, contradiction; SNLI and MNLI as
    Hugging Face exports them), which read as similarity scores would make entailment the
    least similar pair. A column named by --label-column is taken as scores."""
    if (score is None or score.casefold() != "label" or len(roles) != 2
            or roles[1].casefold() != "hypothesis"):
        return
    if {r.score for r in rows} <= {0.0, 1.0, 2.0}:
        raise data_error(path, rows[0].line, f"{score!r} holds NLI classes (0 entailment, "
                         "1 neutral, 2 contradiction), not similarity scores: read as scores, "
                         "entailment would be the least similar pair. Fine-tune a classifier on "
                         "them (--task classify), train embeddings on (anchor, positive, "
                         "negative) triples, or name a score column with --label-column")


def _note_class_scores(roles: list, score: Optional[str], rows: list, path):
    """Say so where the pairs of classification layouts (sentence1/sentence2, text_a/
    text_b: not query/document) have a column named `label` of only 0 and 1: read as
    similarity scores (1 similar), which class labels may not be (GLUE RTE and WNLI: 0 is
    entailment; their Spearman came out negative, unsaid). Named by --label-column: no
    note."""
    if score is not None and score.casefold() == "label" and len(roles) == 2 and \
            roles[1].casefold() in SCORED_PAIR_COLUMNS and {r.score for r in rows} == {0.0, 1.0}:
        note(f"{path}: every {score!r} is 0 or 1, read as similarity scores (1: the pair is "
             "similar); if they are class labels (GLUE RTE, WNLI: 0 is entailment), fine-tune "
             "a classifier on them (--task classify); --label-column label takes them as "
             "scores without this note")


def _scored_pairs(roles: list, columns: dict) -> bool:
    """Are these the pair columns of STS or NLI data (sentence1/sentence2, text_a/text_b,
    premise/hypothesis), whose pairs mean something only with their scores or labels
    (GLUE STS-B's test file pairs unrelated sentences too), rather than (anchor,
    positive) columns? A pair column named by flag, or a negative column, says the rows
    are (anchor, positive[, negative])."""
    pair = roles[1]
    return (pair is not None and roles[2] is None and not columns.get("pair")
            and pair.casefold() in SCORED_PAIR_COLUMNS)


def seeded_subset(items: list, n: Optional[int], seed: int) -> list:
    """At most n of `items`, a seeded random choice kept in their order (all: n None)."""
    if not n or n >= len(items):
        return items
    return [items[i] for i in sorted(random.Random(seed).sample(range(len(items)), n))]


@dataclass
class Beir:
    """A BEIR retrieval set: documents, queries and relevance judgements."""
    corpus: dict   # doc id -> (title, text)
    queries: dict  # query id -> text
    qrels: dict    # query id -> {doc id: relevance (int)}
    split: str = ""
    root: Optional[Path] = None
    checked: bool = False   # its judged documents checked against the corpus (select)
    sample: Optional[tuple] = None  # (n, seed): a run uses a seeded n of its queries

    def sampled(self, query_ids: list) -> list:
        """The queries of `query_ids` a run uses: all, or a seeded choice of `sample`'s n
        (--max-train-examples / --max-dev-examples), kept in their order."""
        return seeded_subset(query_ids, *self.sample) if self.sample else query_ids

    def doc_text(self, doc_id) -> str:
        """What gets embedded for the document `doc_id` (the function `doc_text`)."""
        return doc_text(*self.corpus[doc_id])

    def __len__(self) -> int:
        return len(self.qrels)

    def select(self, split: Optional[str]) -> "Beir":
        """The same corpus and queries with the judgements of another split (None: this
        one), its judged documents checked against the corpus (`_check_judged_docs`)."""
        if not split or split == self.split:
            if not self.checked:
                _check_judged_docs(self, Path(self.root or ".") / "qrels" / f"{self.split}.tsv")
                self.checked = True
            return self
        splits = beir_splits(self.root)
        if split not in splits:
            raise NanobertError(f"{self.root}: no qrels for split {split!r} "
                                f"(available: {', '.join(splits)})")
        qrels = read_qrels(self.root / "qrels" / f"{split}.tsv", self.queries)
        return Beir(self.corpus, self.queries, qrels, split, self.root,
                    sample=self.sample).select(None)


def doc_text(title: str, text: str) -> str:
    """What gets embedded for a BEIR document: title, a space, the text (as BEIR does)."""
    return f"{title} {text}".strip() if title else text.strip()


BEIR_DOC_FIELDS = ("title", "text")   # of corpus.jsonl, beside "_id"


def beir_corpus_texts(path) -> Optional[list]:
    """The documents of a BEIR corpus.jsonl (objects with "_id" and "text", a "title" in
    some), as BEIR evaluation embeds them (`doc_text`), in file order; None for another
    file (its first object lacks "_id" or "text", or no object has a title: then the texts
    are the same). `search` had embedded the text alone; and the titles of every document
    when the first one had no "title" key (`read_beir` reads it as "")."""
    path = input_path(path)
    if detect_format(path, plain_text=True) != "jsonl":
        return None
    first = next(_jsonl_objects(path), (None, {}))[1]
    if not all(f in first for f in ("_id", "text")) \
            or not any("title" in obj for _, obj in _jsonl_objects(path)):
        return None
    return [doc_text(*fields) for fields in _read_beir_jsonl(path, BEIR_DOC_FIELDS).values()]


BEIR_SPLIT_PREFERENCE = ("test", "dev", "validation", "train")


def is_beir_dir(path) -> bool:
    p = Path(path)
    return path_kind(p) == "dir" and path_kind(p / "corpus.jsonl") == "file" \
        and path_kind(p / "qrels") == "dir"


def beir_splits(root) -> list:
    """Names of the qrels files of a BEIR folder, most evaluation-like first."""
    names = sorted(p.stem for p in (Path(root) / "qrels").glob("*.tsv"))
    pref = {s: i for i, s in enumerate(BEIR_SPLIT_PREFERENCE)}
    return sorted(names, key=lambda s: pref.get(s, len(pref)))


def _read_beir_jsonl(path: Path, fields: tuple) -> dict:
    """{_id: the string fields} of corpus.jsonl ((title, text); a null field is "") or
    queries.jsonl (text, which a query must have: an empty one matches nothing)."""
    out, first, blank = {}, {}, []
    for n, obj in _jsonl_objects(path):
        values = [obj.get(f) for f in fields]
        if not isinstance(obj.get("_id"), (str, int)) or isinstance(obj.get("_id"), bool) \
                or not all(v is None or isinstance(v, str) for v in values):
            raise data_error(path, n, "expected an object with a string '_id' and string "
                             f"{', '.join(map(repr, fields))}")
        if "text" not in obj:
            raise data_error(path, n, "missing field 'text'")
        values = tuple(v or "" for v in values)
        if len(fields) == 1 and not values[0].strip():
            raise data_error(path, n, f"query {obj['_id']!r} has no text")
        if not "".join(values).strip():
            blank.append((obj["_id"], n))
        key = str(obj["_id"])
        if key in first:  # the later one silently replaced the earlier
            raise data_error(path, n, f"_id {key!r} is used twice (first on line {first[key]}); "
                             "ids must be unique")
        first[key] = n
        out[key] = values if len(fields) > 1 else values[0]
    if not out:
        raise data_error(path, None, "empty file")
    if blank:   # (null or "" title and text: embedded as an empty string, found by chance)
        note(f"{path}: {len(blank)} document(s) have no title and no text (e.g. _id "
             f"{blank[0][0]!r} on line {blank[0][1]}); they are kept, as empty documents")
    return out


def read_qrels(path, queries: Optional[dict] = None) -> dict:
    """{query id: {doc id: relevance}} of a BEIR qrels TSV (header optional). Grades are
    integers; a file without one relevant (grade > 0) document is refused; a pair judged
    twice with two grades gets a note (the last grade counts, as BEIR's loader has it)."""
    path = input_path(path)
    qrels, first, regraded = {}, {}, []
    rows = ((n, _qrels_fields(text)) for n, text in read_lines(path) if text.strip())
    for k, (n, f) in enumerate(rows):
        if k == 0 and _is_qrels_header(f):
            continue
        if len(f) != 3:   # (a 4th field: TREC's layout, whose doc ids would be read as grades)
            trec = (" (4 columns, as TREC qrels `query-id iteration doc-id grade` have? BEIR "
                    "qrels are query-id, corpus-id, score)"
                    if len(f) == 4 and _grade(f[3]) is not None else "")
            raise data_error(path, n, f"expected 3 fields (query-id, corpus-id, score), found "
                                      f"{len(f)}" + trec)
        rel = _grade(f[2])
        if rel is None:
            raise data_error(path, n, f"score {f[2]!r} is not an integer relevance grade")
        if queries is not None and f[0] not in queries:
            raise data_error(path, n, f"query {f[0]!r} is not in queries.jsonl")
        docs = qrels.setdefault(f[0], {})
        if f[1] in docs and docs[f[1]] != rel:
            regraded.append((f[0], f[1], first[f[0], f[1]], n))
        first.setdefault((f[0], f[1]), n)
        docs[f[1]] = rel
    if not qrels:
        raise data_error(path, None, "no judgements")
    if regraded:
        note_regraded(path, len(regraded), *regraded[0])
    if not any(r > 0 for docs in qrels.values() for r in docs.values()):
        raise data_error(path, None, "no relevant documents: every score is 0 or less (nothing "
                         "to retrieve, every metric would be 0)")
    return qrels


def _qrels_fields(text: str) -> list:
    """The fields of a qrels line: tab-separated as BEIR writes them, or, in a line without
    a tab, separated by spaces (as TREC tools write qrels; ids hold no spaces)."""
    text = text.strip()
    return text.split("\t") if "\t" in text else text.split()


def _is_qrels_header(fields: list) -> bool:
    """Is this first row of a qrels file a header: BEIR's `query-id corpus-id score`, or
    three names whose last is no number (`qid docid relevance`)? BEIR's loader skips the
    first row whatever it holds; here a row of judgements is read."""
    if fields[0] == "query-id":
        return True
    try:
        float(fields[-1])
    except ValueError:
        return len(fields) == 3
    return False


def _grade(text: str) -> Optional[int]:
    """A relevance grade ('1', '2.0', '-1') as an int; None when it is no integer (nor
    '1_0' or full-width digits, which Python's float() reads)."""
    try:
        x = plain_number(text)
    except ValueError:
        return None
    return int(x) if x == x and abs(x) != float("inf") and x.is_integer() else None


def _beir_lacks(root: Path) -> list:
    """What keeps `root` from being a BEIR folder: a part missing (perhaps there compressed),
    or a file where a folder belongs (or the other way round)."""
    out = []
    if path_kind(root) != "dir":
        return ["no such folder" if path_kind(root) is None else "a file, not a folder"]
    for name, folder in (("corpus.jsonl", False), ("queries.jsonl", False), ("qrels", True)):
        p = root / name
        kind = path_kind(p)
        if kind is not None and (kind == "dir") != folder:
            out.append(f"{name} is {'a file, not a folder' if folder else 'a folder, not a file'}")
        elif kind is None:
            packed = sorted(q.name for q in root.glob(f"{name}.*")
                            if q.suffix in (".gz", ".bz2", ".xz", ".zip", ".zst"))
            out.append(f"missing {name}{'/' if folder else ''}" +
                       (f" ({packed[0]} is there: decompress it)" if packed else ""))
    inner = _beir_inside(root) if out else None
    if inner:  # an unpacked archive: scifact.zip holds scifact/
        out.append(f"{inner} is a BEIR folder: pass that one")
    return out


def _beir_inside(root: Path) -> Optional[Path]:
    """A BEIR folder directly inside `root`, if one is (entries that cannot be looked at
    are passed over: this only adds a hint to another error)."""
    try:
        entries = sorted(root.iterdir())
    except OSError:
        return None
    for d in entries:
        try:
            if is_beir_dir(d):
                return d
        except NanobertError:
            continue
    return None


def read_beir(root, split: Optional[str] = None, check: bool = True) -> Beir:
    """A BEIR folder; `split` names qrels/<split>.tsv (default: test, dev, validation,
    then train, whichever exists). `check` False: its judged documents are checked when
    a split is chosen (`Beir.select`), not those of a split that is not used."""
    root = input_path(root)
    if not is_beir_dir(root):
        lacking = "; ".join(_beir_lacks(root))
        raise NanobertError(f"{root}: not a BEIR folder (expected corpus.jsonl, queries.jsonl "
                            f"and qrels/*.tsv{'; ' + lacking if lacking else ''})")
    splits = beir_splits(root)
    if not splits:
        others = sorted(q.name for q in (root / "qrels").iterdir() if not q.name.startswith("."))
        raise NanobertError(f"{root / 'qrels'}: no qrels .tsv files" + (
            f" (found {', '.join(others[:3])}: BEIR qrels are <split>.tsv, tab-separated)"
            if others else ""))
    split = split or splits[0]
    if split not in splits:
        raise NanobertError(f"{root}: no qrels for split {split!r} (available: {', '.join(splits)})")
    corpus = _read_beir_jsonl(root / "corpus.jsonl", BEIR_DOC_FIELDS)
    queries = _read_beir_jsonl(root / "queries.jsonl", ("text",))
    beir = Beir(corpus, queries, read_qrels(root / "qrels" / f"{split}.tsv", queries), split, root)
    return beir.select(None) if check else beir


def _check_judged_docs(beir: Beir, path: Path):
    """Judged documents missing from the corpus can never be retrieved: none there is
    another corpus's qrels (every score 0); some (as in a few BEIR sets) get a note."""
    judged = {d for docs in beir.qrels.values() for d in docs}
    missing = sorted(judged - set(beir.corpus))
    if missing and len(missing) == len(judged):
        raise data_error(path, None, f"none of the {len(judged)} judged documents is in "
                         f"corpus.jsonl (e.g. {missing[0]!r}): qrels of another corpus?")
    if missing:
        note(f"{path}: {len(missing)} of {len(judged)} judged documents are not in corpus.jsonl "
             f"(e.g. {missing[0]!r}); they count as relevant and never retrieved")
