"""Extractive QA over long contexts: sliding windows in, best answer span out.

    question + context ──► windows: [CLS] question [SEP] context[i : i+room] [SEP],
                           consecutive windows overlapping by `doc_stride` tokens
    training: the answer's characters → (start token, end token) in each window that
              holds the whole answer; windows without it point at [CLS] (position 0)
    decoding: in every window, the n-best start and end tokens inside the context,
              end >= start, at most `max_answer_length` tokens; score = start + end
              logit; the best span over all windows of a question wins; its text is
              cut from the context through the token offsets (a token's end moved past
              the characters attached to it, as an NER entity's: `attached_end`),
              widened to whole words (`word_offsets`): no answer "ajalein" of
              "Kwajaleinington".
"""
from __future__ import annotations

import bisect
import unicodedata
from dataclasses import dataclass
from typing import Optional

import torch

from .files import NanobertError


@dataclass
class Window:
    example: int            # index of the QAExample this window belongs to
    ids: list
    type_ids: list
    offsets: list           # (char start, char end) in the context, None outside it
    start: int = 0          # answer token positions (0 = [CLS]: no answer here)
    end: int = 0
    question_cut: bool = False   # its question was cut to `question_limit` tokens
    # where an answer that starts or ends at each token starts or ends: its offsets
    # widened to the word they cut into (`word_offsets`); None: the offsets as they are
    spans: Optional[list] = None

    def __post_init__(self):
        if self.spans is None:
            self.spans = self.offsets


def check_room(tk, max_length: int, doc_stride: int, train: bool = False):
    """NanobertError for a doc stride over three quarters of what a window holds past its
    special tokens. With the question cut to `question_limit`, every window then has more
    room for the context than the stride, and moves on by an eighth of the window or more:
    a stride near the window's room moved them on a token at a time (20 questions, 1,836
    windows), and one past it made the tokenizers library panic (a BaseException, with
    a Rust backtrace on stderr). `train`: while fine-tuning, where --max-length and
    --doc-stride set the windows; else the model's windows (nanobert.json) are given."""
    room = max_length - tk.num_special_tokens_to_add(True)
    most = room * 3 // 4
    if doc_stride > most:
        flags = "--doc-stride" if train else "doc stride"
        raise NanobertError(f"{flags} {doc_stride} is more than three quarters of the {room} "
                            f"tokens a window of {max_length} has for the question and context "
                            f"(at most {most}: each window must move on by a part of itself)"
                            + ("; use a smaller --doc-stride or a larger --max-length"
                               if train else ""))


def question_limit(tk, max_length: int, doc_stride: int) -> int:
    """The most tokens a question keeps: half of what a window holds past the specials
    and the doc stride. The context then has more than the stride in every window, and
    each window moves on by at least that half: a question that left one token past the
    stride moved the windows on one token at a time (a 400 kB context, tens of GB)."""
    return max(1, (max_length - tk.num_special_tokens_to_add(True) - doc_stride) // 2)


def cut_questions(tk, questions: list, limit: int) -> list:
    """(question, cut) of each: a question of more than `limit` tokens is cut after its
    `limit`-th token (BERT's max_query_length, in characters so the windows are cut
    from text)."""
    out = []
    for q, e in zip(questions, tk.encode_batch(questions, add_special_tokens=False)):
        if len(e.ids) <= limit:
            out.append((q, False))
            continue
        k = limit
        short = q[:e.offsets[k - 1][1]].rstrip()
        # a word cut inside may come back as more pieces: cut a token earlier
        while k > 1 and len(tk.encode(short, add_special_tokens=False).ids) > limit:
            k -= 1
            short = q[:e.offsets[k - 1][1]].rstrip()
        out.append((short, True))
    return out


def make_windows(tokenizer, examples, max_length: int, doc_stride: int, train: bool = False):
    """All windows of all examples (list of `Window`). `train`: windows to fine-tune on
    (the answers are labelled, and an error names the flags that set the windows). A
    question longer than `question_limit` is cut to it (the window's `question_cut`)."""
    check_room(tokenizer.tk, max_length, doc_stride, train)
    limit = question_limit(tokenizer.tk, max_length, doc_stride)
    # one token past the limit is all a question needs (1.9 MB took 4.7 s and 1.1 GB whole)
    cut = cut_questions(tokenizer.tk, [tokenizer.clip(e.question.strip(), limit + 1)
                                       for e in examples], limit)
    questions = [q for q, _ in cut]
    contexts = [e.context for e in examples]
    try:
        encs = tokenizer.encode_batch(questions, contexts, max_length=max_length,
                                      stride=doc_stride, strategy="only_second")
    except Exception as e:  # the question alone does not fit, or the stride is too big
        advice = ("; use a larger --max-length or a smaller --doc-stride" if train else "")
        raise NanobertError(f"cannot cut QA windows with max length {max_length} and doc stride "
                            f"{doc_stride} ({str(e)[:120]}){advice}")
    windows = []
    for i, (ex, enc) in enumerate(zip(examples, encs)):
        pieces = [enc] + list(enc.overflowing)
        tokens = context_offsets(ex.context, pieces)
        for w, offsets, spans in zip(pieces, tokens, word_offsets(ex.context, pieces, tokens)):
            win = Window(i, list(w.ids), list(w.type_ids), offsets, question_cut=cut[i][1],
                         spans=spans)
            if train and ex.answers:
                char_start, char_end = answer_chars(*ex.answers[0])
                win.start, win.end = answer_tokens(offsets, char_start, char_end)
            windows.append(win)
    return windows


def context_offsets(context: str, pieces) -> list:
    """The offsets of each window's tokens in the context (None outside it), each token's
    end moved past the characters right after it that attach to it (`attached_end`):
    an uncased tokenizer maps the accent of a decomposed "Andre\u0301" to no token, and
    an answer cut at the token's end dropped it. Never past the start of the context's
    next token, in any window (so a token ends where it ends in every window). A token's
    whitespace is not its (`trimmed`): a token of only whitespace is no answer's edge."""
    offsets = [[trimmed(context, o) if s == 1 else None
                for o, s in zip(w.offsets, w.sequence_ids)] for w in pieces]
    starts = sorted({o[0] for win in offsets for o in win if o is not None})
    for win in offsets:
        for k, o in enumerate(win):
            if o is not None:
                nxt = bisect.bisect_right(starts, o[0])
                limit = starts[nxt] if nxt < len(starts) else len(context)
                win[k] = (o[0], attached_end(context, o[1], limit))
    return offsets


def word_offsets(context: str, pieces, offsets) -> list:
    """`offsets` (per window, of each token: `context_offsets`) widened to the whole word
    that they cut into: an answer of sub-words ("aja" "##lein" of "Kwajaleinington") is
    the word, as SQuAD's answers are and the HF question-answering pipeline aligns them
    (align_to_words). The words are the tokenizer's (`word_spans`), widened over letters,
    digits and marks only (`in_word`): not over the punctuation in a SentencePiece word
    ("Paris,"), nor over wide characters (CJK, kana, Hangul: `in_word`)."""
    tokens = dict.fromkeys((o, x) for w in pieces       # (each once: the windows overlap)
                           for o, x, s in zip(w.offsets, w.word_ids, w.sequence_ids) if s == 1)
    words = sorted(word_spans(context, *zip(*tokens)).values()) if tokens else []
    starts = [a for a, _ in words]
    runs = {}           # word -> [(start, end)] of its runs of in_word characters, when asked

    def run(c):         # the run that holds character c, or None
        i = bisect.bisect_right(starts, c) - 1
        if i < 0 or c >= words[i][1]:
            return None
        if i not in runs:
            runs[i] = in_word_runs(context, *words[i])
        k = bisect.bisect_right(runs[i], (c, len(context))) - 1  # the last run from c or before
        return runs[i][k] if k >= 0 and c < runs[i][k][1] else None

    def widened(a, b):
        i = bisect.bisect_right(starts, a) - 1
        j = bisect.bisect_right(starts, b - 1) - 1
        first = run(a) if i >= 0 and a > words[i][0] else None   # (a word's edge stays)
        last = run(b - 1) if j >= 0 and b < words[j][1] else None
        return (first[0] if first else a), (last[1] if last else b)
    return [[None if o is None else widened(*o) for o in win] for win in offsets]


def in_word_runs(text: str, start: int, end: int) -> list:
    """[(start, end)] of the runs of `in_word` characters in text[start:end]."""
    runs, k = [], start
    while k < end:
        stop = k
        while stop < end and in_word(text[stop]):
            stop += 1
        if stop > k:
            runs.append((k, stop))
        k = max(stop, k + 1)
    return runs


def in_word(ch: str) -> bool:
    """Is `ch` one a whole-word answer never cuts a run of: a letter, a digit, a mark; not
    a wide (CJK, kana, Hangul) character: unspaced text is one pre-token, and a WordPiece
    word of kana or Hangul holds the particle after a noun ('はパリです', '부산에'), which
    answers leave out?"""
    if ch.isalnum():
        return unicodedata.east_asian_width(ch) not in "WF"
    return attaches(ch)


# characters that never start a grapheme cluster of their own (UAX #29: Extend, ZWJ),
# besides the combining marks (M*: accents, variation selectors U+FE0E/FE0F): a word's
# when they follow it, though an uncased tokenizer maps them to no token ("Zoe\u0308")
ATTACHED_RANGES = (("\u200c", "\u200d"),            # zero-width non-joiner, joiner
                   ("\U0001f3fb", "\U0001f3ff"),    # emoji skin-tone modifiers
                   ("\U000e0020", "\U000e007f"))    # emoji tag characters


def trimmed(text: str, offsets):
    """A token's (start, end) without the whitespace it carries, or None for a token of
    whitespace only. Byte-level BPE ("Ġ") and SentencePiece ("▁") tokens hold the space
    before a word, and their offsets cover it: an entity or answer read " Paris", and a
    token of spaces alone made an entity " ". WordPiece offsets hold none."""
    a, b = offsets
    while a < b and text[a].isspace():
        a += 1
    while b > a and text[b - 1].isspace():
        b -= 1
    return (a, b) if a < b else None


def attached_end(text: str, end: int, limit: int) -> int:
    """`end` moved past the characters right after it that attach to the one before
    (combining marks, ATTACHED_RANGES), never past `limit` (where the next word
    starts): a word that ends in "e\u0308" ends after the mark. Whitespace, and a mark
    after whitespace, end it. The one rule of where a span ends: NER entities
    (`word_spans`) and QA answers (context_offsets) use it."""
    while end < limit and attaches(text[end]):
        end += 1
    return end


def attaches(ch: str) -> bool:
    """Does `ch` belong to the character before it (a combining mark, ATTACHED_RANGES)?"""
    return (unicodedata.category(ch).startswith("M")
            or any(a <= ch <= b for a, b in ATTACHED_RANGES))


def word_spans(text: str, offsets, word_ids) -> dict:
    """word index -> (char start, char end) in `text` of the tokenizer's pre-tokenized
    words: its first to last token without whitespace (`trimmed`), and the characters
    after it that attach to its last one (`attached_end`). Characters that attach and open
    a word right after another are that one's: byte-level BPE makes the accent of a
    decomposed "Zoe\u0301" a word of its own, and a word of nothing else is no word."""
    spans = {}
    for o, w in zip(offsets, word_ids):
        o = trimmed(text, o) if w is not None else None
        if o is not None:
            a, b = spans.get(w, o)
            spans[w] = (min(a, o[0]), max(b, o[1]))
    words = sorted(spans, key=lambda w: spans[w])
    before = None                                 # the last word kept
    for w, after in zip(words, words[1:] + [None]):
        (a, b), limit = spans[w], len(text) if after is None else spans[after][0]
        if before is not None and spans[before][1] == a:
            a = attached_end(text, a, b)
            spans[before] = (spans[before][0], a)
            if a == b:
                del spans[w]
                continue
        spans[w], before = (a, attached_end(text, b, limit)), w
    return spans


def answer_chars(text: str, char_start: int) -> tuple:
    """[start, end) of an answer's characters without the whitespace around it: no token
    holds a space, so "Paris " ending the context was in no window and trained as no
    answer."""
    lead = len(text) - len(text.lstrip())
    if not text.strip():
        return char_start, char_start + len(text)
    return char_start + lead, char_start + len(text.rstrip())


def answer_tokens(offsets, char_start: int, char_end: int) -> tuple:
    """(start token, end token) of the characters [char_start, char_end) when the window
    holds all of them, else (0, 0)."""
    ctx = [i for i, o in enumerate(offsets) if o is not None]
    if not ctx or char_start < offsets[ctx[0]][0] or char_end > offsets[ctx[-1]][1]:
        return 0, 0
    start = next((i for i in ctx if offsets[i][1] > char_start), None)
    end = next((i for i in reversed(ctx) if offsets[i][0] < char_end), None)
    if start is None or end is None or end < start:
        return 0, 0
    return start, end


def best_spans(start_logits, end_logits, offsets, n_best: int = 20, max_answer_length: int = 30):
    """Candidate spans of one window: [(score, char_start, char_end)], best first.
    start_logits, end_logits: (T,) for the window's tokens."""
    T = len(offsets)
    s, e = start_logits[:T], end_logits[:T]
    k = min(n_best, T)
    starts = torch.topk(s, k).indices.tolist()
    ends = torch.topk(e, k).indices.tolist()
    out = []
    for i in starts:
        if offsets[i] is None:
            continue
        for j in ends:
            if offsets[j] is None or j < i or j - i + 1 > max_answer_length:
                continue
            out.append((float(s[i] + e[j]), offsets[i][0], offsets[j][1]))
    out.sort(key=lambda c: -c[0])
    return out[:n_best]


def best_span_anywhere(start_logits, end_logits, offsets, max_answer_length: int = 30):
    """(score, char_start, char_end) of the best span of one window over ALL its context
    tokens (end >= start, at most `max_answer_length` tokens), or None when the window
    holds no context token. The fallback of `decode` when the n-best starts and ends of
    every window pair into no valid span (say with --n-best 1, when the best start comes
    after the best end, or lies in the question)."""
    ctx = [i for i, o in enumerate(offsets) if o is not None]
    if not ctx:
        return None
    idx = torch.tensor(ctx)
    s, e = start_logits[idx].float(), end_logits[idx].float()
    scores = s[:, None] + e[None, :]                              # (C, C): start row, end column
    pos = idx.float()
    gap = pos[None, :] - pos[:, None]                             # end token - start token
    valid = (gap >= 0) & (gap + 1 <= max_answer_length)
    scores = scores.masked_fill(~valid, float("-inf"))
    flat = int(scores.argmax())
    i, j = divmod(flat, len(ctx))
    if not torch.isfinite(scores[i, j]):
        return None
    return float(scores[i, j]), offsets[ctx[i]][0], offsets[ctx[j]][1]


def decode(examples, windows, start_logits, end_logits, n_best=20, max_answer_length=30) -> list:
    """The best answer of every example over all its windows: a list of dicts
    {"answer", "start", "end", "score", "probability"} in example order. `start_logits`
    and `end_logits` are per window (lists of 1-D tensors, one per window). Every example
    whose context holds a token gets a span (SQuAD v1.1: every question has an answer):
    when no n-best pair is valid in any window, the best valid span over all context
    tokens. Only a context without tokens (empty) gets "" and score -inf."""
    cands = [[] for _ in examples]
    for w, s, e in zip(windows, start_logits, end_logits):
        cands[w.example].extend(best_spans(s, e, w.spans, n_best, max_answer_length))
    empty = {i for i, cs in enumerate(cands) if not cs}
    for w, s, e in zip(windows, start_logits, end_logits):
        if w.example in empty:
            found = best_span_anywhere(s, e, w.spans, max_answer_length)
            if found is not None:
                cands[w.example].append(found)
    out = []
    for ex, cs in zip(examples, cands):
        if not cs:
            out.append({"answer": "", "start": 0, "end": 0, "score": float("-inf"),
                        "probability": 0.0})
            continue
        # the same span found in two overlapping windows counts once, with its best score
        best = {}
        for score, a, b in cs:
            if (a, b) not in best or score > best[(a, b)]:
                best[(a, b)] = score
        spans = sorted(best.items(), key=lambda kv: -kv[1])[:n_best]
        probs = torch.softmax(torch.tensor([sc for _, sc in spans]), 0)
        (a, b), score = spans[0]
        out.append({"answer": ex.context[a:b], "start": a, "end": b, "score": score,
                    "probability": float(probs[0])})
    return out
