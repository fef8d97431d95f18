"""Extractive QA over long contexts: sliding windows in, best answer span out.

    question + context ──► windows: [CLS] question [SEP] context[i : i+room] [SEP],
                           consecutive windows overlapping by `doc_stride` tokens
    training: the answer's characters → (start token, end token) in each window that
              holds the whole answer; windows without it point at [CLS] (position 0)
    decoding: in every window, the n-best start and end tokens inside the context,
              end >= start, at most `max_answer_length` tokens; score = start + end
              logit; the best span over all windows of a question wins; its text is
              cut from the context through the token offsets (a token's end moved past
              the characters attached to it, as an NER entity's: `attached_end`).
"""
from __future__ import annotations

import bisect
import unicodedata
from dataclasses import dataclass

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
    cut = cut_questions(tokenizer.tk, [e.question.strip() for e in examples],
                        question_limit(tokenizer.tk, max_length, doc_stride))
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
        for w, offsets in zip(pieces, context_offsets(ex.context, pieces)):
            win = Window(i, list(w.ids), list(w.type_ids), offsets, question_cut=cut[i][1])
            if train and ex.answers:
                text, char_start = ex.answers[0]
                win.start, win.end = answer_tokens(offsets, char_start, char_start + len(text))
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
    (finetune.entities) and QA answers (context_offsets) use it."""
    while end < limit and (unicodedata.category(text[end]).startswith("M")
                           or any(a <= text[end] <= b for a, b in ATTACHED_RANGES)):
        end += 1
    return end


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
        cands[w.example].extend(best_spans(s, e, w.offsets, n_best, max_answer_length))
    empty = {i for i, cs in enumerate(cands) if not cs}
    for w, s, e in zip(windows, start_logits, end_logits):
        if w.example in empty:
            found = best_span_anywhere(s, e, w.offsets, max_answer_length)
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
