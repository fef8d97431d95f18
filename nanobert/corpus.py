"""Pretraining data: plain-text corpora in, packed token sequences and sentence pairs out.

    files / directories ──► documents (one paragraph a line; a blank line ends one)
        ──► sentences (split after . ! ?) ──► WordPiece ids, cached on disk
        ──► hold out a fraction of the documents for validation
        ──► MLM:     pack whole sentences of one document into [CLS] ... [SEP] rows
            NSP/SOP: cut each packed chunk into segments A and B:
                     NSP: half the time B is replaced by text from another document
                     SOP: half the time A and B swap places

The tokenized corpus is three flat arrays (token ids, sentence starts, document starts)
held in memory and cached as .npz keyed by a hash of the corpus files and the
tokenizer, so the second run (or the masking ablation's next model) starts at once.
`StreamingCorpus` is the path for corpora larger than memory: it reads the files lazily
and packs as it goes, trading the global shuffle (it shuffles within a buffer), the
cache and a known epoch length (the stream cycles) for constant memory.
"""
from __future__ import annotations

import hashlib
import itertools
import os
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional, Sequence

import numpy as np
import torch

from .data import opens_json
from .files import (NanobertError, atomic_path, data_error, no_such_file, note, open_input,
                    path_kind, read_lines)

CACHE_VERSION = 1
SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
NSP, SOP = "nsp", "sop"


# ----------------------------------------------------------------------------------
# Reading text


def corpus_files(paths: Sequence) -> list:
    """The text files named by `paths` (directories are walked recursively, sorted;
    hidden files skipped). A file named twice (or named and inside a named directory) is
    refused: its documents would count twice, and could be held out and trained on."""
    files, given = [], {}
    for p in paths:
        if str(p) == "":   # (Path("") is the current directory)
            raise NanobertError("--corpus: an empty path was given")
        p = Path(p)
        kind = path_kind(p)   # (a path that cannot be looked up is an error saying why)
        if kind == "dir":
            found = directory_files(p)
            if not found:
                raise NanobertError(f"{p}: directory holds no files")
            files.extend(found)
        elif kind == "file":
            files.append(p)
        elif kind == "other":  # a pipe would be read up by the corpus hash, then be empty
            raise NanobertError(f"{p}: not a regular file (a pipe or a device); save the "
                                "text to a file and pass its path")
        else:
            raise no_such_file(p, "file or directory")
    for f in files:
        key = f.resolve()
        if key in given:
            also = f" (also as {given[key]})" if str(given[key]) != str(f) else ""
            raise NanobertError(f"{f}: given twice in the corpus{also}; name each file once")
        given[key] = f
    return files


def directory_files(top: Path) -> list:
    """The files under `top`, sorted: hidden ones skipped, linked directories followed (a
    corpus folder of links to shard folders: rglob passed them by, unread and unsaid),
    each directory once (a link back up would loop), and search's embedding caches
    (`x.txt.nanobert-KEY.npy`, made beside the corpus file it searched) skipped with a
    note: binary, they ended a pretraining on the same folder as bad UTF-8."""
    from .embed import is_embedding_cache
    found, seen, caches, above = [], set(), [], []
    home = os.path.realpath(top)
    for root, dirs, names in os.walk(top, followlinks=True):
        real = os.path.realpath(root)
        if real in seen or (real != home and _holds(real, home)):   # (a link up: a loop)
            if real not in seen:
                above.append(root)
            dirs[:] = []
            continue
        seen.add(real)
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in names:
            f = Path(root) / name
            if name.startswith(".") or path_kind(f) != "file":
                continue
            (caches if is_embedding_cache(f) else found).append(f)
    said = (str(top), len(caches), len(above))
    if (caches or above) and said not in _SAID:   # (once: the run's fingerprint reads it too)
        _SAID.add(said)
        if caches:
            note(f"{top}: {len(caches)} embedding cache file(s) of nanobert search skipped "
                 f"({caches[0].name}...)")
        if above:
            note(f"{top}: {above[0]} links to a folder that holds the corpus folder; not "
                 "followed (it would read the corpus again, and what is beside it)")
    return sorted(found)


_SAID: set = set()


def _holds(folder: str, inner: str) -> bool:
    return os.path.commonpath([folder, inner]) == folder


def document_lines(files: Sequence) -> Iterator[tuple]:
    """(document index, line) for each non-blank line of `files`, in order. A blank line
    (or a file's end) ends a document. Bad UTF-8, JSON (a JSON Lines dataset, a BEIR
    folder's corpus.jsonl: their keys and brackets would be learnt as text) and text-less
    files raise an error naming the file and line."""
    d = 0
    for f in files:
        any_text, open_doc, n = False, False, 0
        for n, line in read_lines(f):  # (a NUL byte is refused there: binary data)
            line = line.strip()
            if line and not any_text and opens_json(line):
                raise data_error(f, n, "JSON, not plain text (a pretraining corpus is text: "
                                 "one paragraph a line, a blank line between documents)")
            if line:
                yield d, line
                any_text = open_doc = True
            elif open_doc:
                d, open_doc = d + 1, False
        d += open_doc
        if not any_text:   # (n: the lines read, all blank)
            raise NanobertError(f"{f}: no text to pretrain on (only blank lines)" if n else
                                f"{f}: empty file (no text to pretrain on)")


def iter_documents(files: Sequence) -> Iterator[list]:
    """Documents as lists of non-blank lines (`document_lines`), a line over LINE_CHARS
    characters in pieces (`line_pieces`): a 200 MB line (no sentence end in it) was one
    string for the vocabulary trainer and the tokenizer, 15 GB and growing, and the
    trainer never came back to Python to see a Ctrl-C."""
    for _, group in itertools.groupby(document_lines(files), key=lambda dl: dl[0]):
        yield [piece for _, line in group for piece in line_pieces(line, LINE_CHARS)]


PART_CHARS = 200_000     # the most characters of a document `StreamingCorpus` holds at once
LINE_CHARS = 20_000      # a line over this is read in pieces by `document_parts`


def document_parts(files: Sequence, part_chars: Optional[int] = None,
                   line_chars: Optional[int] = None) -> Iterator[tuple]:
    """(document index, lines) for the documents of `files`, each a part of about
    `part_chars` characters at most (a document of no blank lines can be a whole file),
    a line over `line_chars` characters cut into pieces (`line_pieces`). What
    `--streaming` reads: its memory no longer grows with a document or a line (a 4.9 MB
    line took 1.07 GB)."""
    part_chars, line_chars = part_chars or PART_CHARS, line_chars or LINE_CHARS
    part, size, at = [], 0, None
    for d, line in document_lines(files):
        for piece in line_pieces(line, line_chars):
            if part and (d != at or size + len(piece) > part_chars):
                yield at, part
                part, size = [], 0
            part.append(piece)
            size += len(piece)
            at = d
    if part:
        yield at, part


def line_pieces(line: str, most: int) -> list:
    """`line` in pieces of at most `most` characters, each cut after its last white
    space (in its second half), else at `most`."""
    pieces = []
    while len(line) > most:
        cut = max(line.rfind(" ", most // 2, most), line.rfind("\t", most // 2, most)) + 1
        cut = cut or most
        pieces.append(line[:cut])
        line = line[cut:]
    return pieces + [line] if line else pieces


def sentences(line: str) -> list:
    return [s for s in SENTENCE_END.split(line) if s]


def files_hash(files: Sequence) -> str:
    h = hashlib.sha256(f"nanobert-corpus-v{CACHE_VERSION}".encode())
    for f in files:
        h.update(str(Path(f).resolve()).encode() + b"\0")
        with open_input(f) as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
        h.update(b"\0\0")
    return h.hexdigest()[:16]


# ----------------------------------------------------------------------------------
# The tokenized corpus


@dataclass
class TokenizedCorpus:
    ids: np.ndarray    # (n_tokens,) int32: every sentence's ids end to end, no specials
    sents: np.ndarray  # (n_sentences + 1,) int64: where each sentence starts in `ids`
    docs: np.ndarray   # (n_documents + 1,) int64: where each document starts in `sents`

    @property
    def n_docs(self) -> int:
        return len(self.docs) - 1

    @property
    def n_tokens(self) -> int:
        return len(self.ids)

    def doc_span(self, d: int) -> tuple:
        """(first token, end token) of document d."""
        return int(self.sents[self.docs[d]]), int(self.sents[self.docs[d + 1]])

    def subset(self, doc_indices) -> "TokenizedCorpus":
        """A corpus of the given documents (in the given order)."""
        ids, sents, docs = [], [0], [0]
        for d in doc_indices:
            s0, s1 = self.docs[d], self.docs[d + 1]
            t0 = self.sents[s0]
            ids.append(self.ids[t0:self.sents[s1]])
            sents.extend((self.sents[s0 + 1:s1 + 1] - t0 + sents[-1]).tolist())
            docs.append(len(sents) - 1)
        ids = np.concatenate(ids) if ids else np.zeros(0, np.int32)
        return TokenizedCorpus(ids.astype(np.int32), np.asarray(sents, np.int64),
                               np.asarray(docs, np.int64))

    def save(self, path):
        with atomic_path(path) as tmp:
            with open(tmp, "wb") as f:
                np.savez(f, ids=self.ids, sents=self.sents, docs=self.docs)

    @classmethod
    def load(cls, path) -> "TokenizedCorpus":
        """The corpus `save` wrote; a ValueError for a file that is not one whole."""
        try:
            with np.load(path) as z:      # (never pickle: allow_pickle is off)
                ids, sents, docs = (np.asarray(z[k]) for k in ("ids", "sents", "docs"))
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
            raise ValueError(f"{type(e).__name__}: {e}") from None
        whole = (ids.ndim == sents.ndim == docs.ndim == 1 and len(sents) and len(docs)
                 and sents[0] == 0 and sents[-1] == len(ids) and docs[0] == 0
                 and docs[-1] == len(sents) - 1 and (np.diff(sents) >= 0).all()
                 and (np.diff(docs) >= 0).all())
        if not whole:
            raise ValueError("its arrays do not fit together")
        return cls(ids.astype(np.int32), sents.astype(np.int64), docs.astype(np.int64))


def tokenize_documents(docs: Sequence, tok, chunk: int = 2048) -> TokenizedCorpus:
    """Split each document's lines into sentences and encode them (no special tokens),
    `chunk` sentences (or CHUNK_CHARS characters) at a time."""
    flat_sents, doc_starts = [], [0]
    for doc in docs:
        for line in doc:
            flat_sents.extend(sentences(line))
        doc_starts.append(len(flat_sents))
    from .batching import size_runs
    from .tokenizer import CHUNK_CHARS
    ids, lengths = [], []     # (ids a chunk at a time as arrays: a list of ints took 36
    for run in size_runs([len(t) for t in flat_sents], CHUNK_CHARS, chunk):   # bytes a token)
        encs = tok.plain([flat_sents[i] for i in run], add_special_tokens=False)
        ids.append(np.fromiter((t for e in encs for t in e.ids), np.int32))
        lengths.extend(len(e.ids) for e in encs)
    sents = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=sents[1:])
    ids = np.concatenate(ids) if ids else np.zeros(0, np.int32)
    return TokenizedCorpus(ids, sents, np.asarray(doc_starts, np.int64))


HOLDOUT_SEED = 0   # what a run is scored on never depends on its --seed


def holdout(n_docs: int, fraction: float) -> tuple:
    """(train document indices, validation document indices): a random `fraction` of the
    documents (at least one) is held out, the same one whatever the run's --seed (a seed
    sweep had scored each seed on other documents, and trained each on another
    vocabulary)."""
    if fraction <= 0:
        return np.arange(n_docs), np.zeros(0, np.int64)
    if n_docs < 2:
        raise NanobertError("the corpus has a single document, so none can be held out for "
                            "validation; separate documents with blank lines (or train "
                            "without validation: --val-fraction 0, not for ablate-masking)")
    n_val = min(n_docs - 1, max(1, round(fraction * n_docs)))
    perm = np.random.default_rng(HOLDOUT_SEED).permutation(n_docs)
    return np.sort(perm[n_val:]), np.sort(perm[:n_val])


def note_vocabulary_size(tok, asked: int):
    """A trained vocabulary of another size than --vocab-size, which is worth a note:
    smaller, the corpus has too few distinct pieces (the trainer merges pairs that occur at
    least twice); larger, its characters alone are more."""
    if tok.vocab_size < asked:
        note(f"--vocab-size {asked}: the vocabulary has {tok.vocab_size} tokens, all the "
             "training text gives (no other pair of pieces occurs twice); a larger corpus "
             "gives more")
    elif tok.vocab_size > asked:   # the special tokens and every character come first
        note(f"--vocab-size {asked}: the vocabulary has {tok.vocab_size} tokens, the special "
             "tokens and every character of the training text (each alone and as a "
             "continuation), which it cannot do without")


def _from_cache(load, path):
    """`load(path)` of a cache entry, or None (with a note) when it cannot be read: a
    cache is rebuilt, never trusted when damaged (a partial copy, a full disk)."""
    try:
        return load(path)
    except (ValueError, NanobertError, OSError) as e:
        note(f"cache {path} cannot be read ({str(e).splitlines()[0][:200]}): rebuilt")
        return None


def _to_cache(save, path):
    """save() of a cache entry at `path`; where something else is in the way (a folder
    where the file goes, a file where the folder goes: a traceback), a note, and the run
    goes on uncached. A full disk is still the run's error."""
    from .files import write_failure
    try:
        save()
    except (OSError, NanobertError) as e:   # (NanobertError: a pipe or a device in the way)
        if write_failure(e):
            raise
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        note(f"cache {path} cannot be written ({why}): not cached")


def load_corpus(paths, tokenizer=None, vocab_size: int = 8000, val_fraction: float = 0.1,
                cache_dir=None, log=print):
    """Read, (train a tokenizer,) tokenize and split a corpus.
    Returns (tokenizer, train TokenizedCorpus, validation TokenizedCorpus)."""
    from .tokenizer import Tokenizer
    files = corpus_files(paths)
    docs = list(iter_documents(files))
    key = f"{files_hash(files)}-l{LINE_CHARS}"   # (how lines are cut shapes the cache)
    try:
        train_idx, val_idx = holdout(len(docs), val_fraction)
    except NanobertError as e:  # say which corpus
        raise NanobertError(f"{', '.join(map(str, files))}: {e}") from None
    cache_dir = Path(cache_dir) if cache_dir else None
    if tokenizer is None:
        tok_dir = cache_dir / f"tokenizer-{key}-v{vocab_size}-f{val_fraction}" if cache_dir else None
        if tok_dir is not None and (tok_dir / "tokenizer.json").is_file():
            tokenizer = _from_cache(Tokenizer.from_dir, tok_dir)
        if tokenizer is None:
            log(f"training a WordPiece vocabulary of {vocab_size} on {len(train_idx)} documents")
            tokenizer = Tokenizer.train((line for i in train_idx for line in docs[i]), vocab_size)
            note_vocabulary_size(tokenizer, vocab_size)
            if tok_dir is not None:
                def save():
                    with atomic_path(tok_dir) as tmp:
                        tokenizer.save(tmp)
                _to_cache(save, tok_dir)
    tok_key = hashlib.sha256(tokenizer.tk.to_str().encode()).hexdigest()[:16]
    cache = cache_dir / f"tokens-{key}-{tok_key}.npz" if cache_dir else None
    corpus = _from_cache(TokenizedCorpus.load, cache) if cache is not None and cache.is_file() \
        else None
    if corpus is not None and corpus.n_docs != len(docs):
        note(f"cache {cache} holds {corpus.n_docs} documents, not the corpus's {len(docs)}: "
             "rebuilt")
        corpus = None
    if corpus is not None:
        log(f"tokenized corpus from cache {cache}")
    else:
        corpus = tokenize_documents(docs, tokenizer)
        if cache is not None:
            _to_cache(lambda: corpus.save(cache), cache)
    log(f"corpus: {len(files)} file(s), {corpus.n_docs} documents, "
        f"{len(corpus.sents) - 1} sentences, {corpus.n_tokens:,} tokens; "
        f"{len(val_idx)} documents held out for validation")
    return tokenizer, corpus.subset(train_idx), corpus.subset(val_idx)


# ----------------------------------------------------------------------------------
# Packing and pairs


def pack(corpus: TokenizedCorpus, budget: int) -> np.ndarray:
    """Spans (n, 2) [start, end) of `corpus.ids`, each at most `budget` tokens: whole
    sentences of one document, greedily; a sentence longer than `budget` is cut."""
    spans = []
    sents = corpus.sents
    for d in range(corpus.n_docs):
        s0, s1 = int(corpus.docs[d]), int(corpus.docs[d + 1])
        start = int(sents[s0])
        for s in range(s0, s1):
            end = int(sents[s + 1])
            while end - start > budget:
                cut = int(sents[s]) if int(sents[s]) > start else start + budget
                spans.append((start, cut))
                start = cut
        end = int(sents[s1])
        if end > start:
            spans.append((start, end))
    return np.asarray(spans, np.int64).reshape(-1, 2)


def after(ids: np.ndarray, corpus: TokenizedCorpus) -> TokenizedCorpus:
    """A one-document `corpus` with `ids` (a row left open, under a row's budget) as its
    first sentence: `pack` then goes on with that row as it would have."""
    if not len(ids):
        return corpus
    return TokenizedCorpus(np.concatenate([ids, corpus.ids]),
                           np.concatenate([[0], corpus.sents + len(ids)]),
                           np.asarray([0, len(corpus.sents)], np.int64))


def make_pairs(corpus: TokenizedCorpus, chunks: np.ndarray, kind: str, rng,
               split: Optional[tuple] = None) -> np.ndarray:
    """One (a0, a1, b0, b1, label) row per chunk of 2+ tokens (spans of `corpus.ids`).
    The chunk is cut at a sentence boundary (or mid-sentence when it holds one sentence).
    NSP: label 1 = B is text of another document (same length), 0 = B follows A.
    SOP: label 1 = A and B swapped, 0 = in order. `split`: (the corpus's name, advice)
    for the error when NSP has fewer than two documents."""
    split = split or ("the training corpus", "separate documents with blank lines")
    if kind == NSP and corpus.n_docs < 2:
        raise NanobertError(f"next-sentence prediction needs at least two documents in "
                            f"{split[0]}, which has {corpus.n_docs}: {split[1]}")
    doc_of_token = np.searchsorted(corpus.sents[corpus.docs[1:]], chunks[:, 0], side="right")
    out = []
    for (c0, c1), d in zip(chunks.tolist(), doc_of_token.tolist()):
        if c1 - c0 < 2:
            continue
        lo, hi = np.searchsorted(corpus.sents, [c0 + 1, c1], side="left")
        bounds = corpus.sents[lo:hi]                    # sentence starts strictly inside
        m = int(rng.choice(bounds)) if len(bounds) else int(rng.integers(c0 + 1, c1))
        a, b = (c0, m), (m, c1)
        label = int(rng.random() < 0.5)
        if label and kind == NSP:
            b = random_sentences(corpus, d, b[1] - b[0], rng, whole=len(bounds) > 0)
        elif label:                                     # SOP: swap
            a, b = b, a
        out.append((*a, *b, label))
    return np.asarray(out, np.int64).reshape(-1, 5)


def random_sentences(corpus: TokenizedCorpus, d: int, n: int, rng, whole: bool = True,
                     tries: int = 10) -> tuple:
    """NSP's NotNext segment B for an IsNext one of n tokens, shaped as that one is (it
    runs from A's end to the end of a chunk: whole sentences, or, `whole` False, from
    inside a sentence): n tokens of another document than d. A run of whole sentences
    within 2 tokens of n, from a random one of up to `tries` documents; else (or not
    `whole`) n tokens that end at a sentence end. Text from a random token had begun and
    ended mid-sentence: 2% ended with a full stop, against 78%, and 'does B end with a
    full stop' alone scored 88% on NSP."""
    for _ in range(tries):
        other = int(rng.integers(corpus.n_docs - 1))
        other += other >= d                             # any document but this one
        bounds = corpus.sents[corpus.docs[other]:corpus.docs[other + 1] + 1]  # starts, end
        starts = bounds[:-1]
        ends = bounds[np.searchsorted(bounds, starts + n, side="right") - 1]  # last <= s + n
        near = np.flatnonzero(ends - starts >= max(1, n - 2)) if whole else []   # (never empty)
        if len(near):
            i = int(rng.choice(near))
            return int(starts[i]), int(ends[i])
        late = bounds[1:][bounds[1:] >= bounds[0] + n]  # sentence ends n tokens in or more
        if not whole and len(late):
            e = int(rng.choice(late))
            return e - n, e
    e = int(rng.choice(late)) if len(late) else int(bounds[-1])
    return max(int(bounds[0]), e - n), e


class PretrainData:
    """Rows for pretraining from an in-memory corpus: packed sequences (MLM) or sentence
    pairs (NSP/SOP, drawn anew each epoch from (seed, epoch)). `rows(epoch, idx)`
    builds the (len(idx), seq_len) batch of the given row indices, padded to seq_len."""

    def __init__(self, corpus: TokenizedCorpus, tok, seq_len: int, pairs: Optional[str] = None,
                 seed: int = 0, split: Optional[tuple] = None):
        if seq_len < 8:
            raise NanobertError(f"--seq-len {seq_len} is too short (at least 8)")
        self.corpus, self.tok, self.seq_len, self.pairs, self.seed = corpus, tok, seq_len, pairs, seed
        self.split = split   # (make_pairs' errors)
        self.chunks = pack(corpus, seq_len - (3 if pairs else 2))
        self._pairs_epoch, self._pairs = None, None
        if pairs:
            self.pair_rows(0)

    def __len__(self) -> int:
        return len(self._pairs) if self.pairs else len(self.chunks)

    def pair_rows(self, epoch: int) -> np.ndarray:
        if self._pairs_epoch != epoch:
            rng = np.random.default_rng([self.seed, epoch, 7])
            self._pairs, self._pairs_epoch = make_pairs(self.corpus, self.chunks, self.pairs, rng,
                                                       self.split), epoch
        return self._pairs

    def order(self, epoch: int) -> np.ndarray:
        """The shuffled order of the rows in an epoch."""
        return np.random.default_rng([self.seed, epoch]).permutation(len(self))

    def rows(self, epoch: int, idx: Sequence[int]) -> dict:
        T, ids = self.seq_len, self.corpus.ids
        B = len(idx)
        input_ids = torch.full((B, T), self.tok.pad_id, dtype=torch.long)
        types = torch.zeros((B, T), dtype=torch.long)
        mask = torch.zeros((B, T), dtype=torch.long)
        cls, sep = self.tok.cls_id, self.tok.sep_id
        labels = []
        table = self.pair_rows(epoch) if self.pairs else self.chunks
        for i, r in enumerate(idx):
            if self.pairs:
                a0, a1, b0, b1, label = table[r].tolist()
                a, b = ids[a0:a1], ids[b0:b1]
                row = np.concatenate([[cls], a, [sep], b, [sep]])
                types[i, len(a) + 2:len(row)] = 1
                labels.append(label)
            else:
                s0, s1 = table[r].tolist()
                row = np.concatenate([[cls], ids[s0:s1], [sep]])
            input_ids[i, :len(row)] = torch.from_numpy(row.astype(np.int64))
            mask[i, :len(row)] = 1
        batch = {"input_ids": input_ids, "attention_mask": mask, "token_type_ids": types}
        if self.pairs:
            batch["pair_labels"] = torch.tensor(labels, dtype=torch.long)
        return batch


# ----------------------------------------------------------------------------------
# Streaming: corpora larger than memory


class StreamingCorpus:
    """Packed MLM rows read lazily from the files, pass after pass, shuffled within a
    buffer of `buffer` rows. Every `round(1 / val_fraction)`-th document is held out.
    With `world_size` > 1, rank r keeps every world_size-th training document (from the
    r-th on)."""

    def __init__(self, files, tok, seq_len: int, val_fraction: float = 0.1, seed: int = 0,
                 buffer: int = 10000, rank: int = 0, world_size: int = 1):
        self.files, self.tok, self.seq_len, self.seed = list(files), tok, seq_len, seed
        self.every = self._every(val_fraction)
        self.buffer, self.rank, self.world_size = buffer, rank, world_size
        self.read_as = self._as_they_are()

    def _as_they_are(self) -> list:
        """(size, modification time) of each file, or the error of one gone."""
        out = []
        for f in self.files:
            try:
                st = os.stat(f)
            except OSError as e:
                raise NanobertError(f"{f}: {e.strerror or e} (--streaming reads the corpus "
                                    "pass after pass: restore it, then continue with "
                                    "--resume)") from None
            out.append((st.st_size, st.st_mtime_ns))
        return out

    def _unchanged(self):
        """A file whose size changed since the last pass is an error: each pass reads the
        files again, and a corpus cut short mid-run was trained on for its last passes,
        while the run's record named what it held at the start. One only touched (its
        size the same) is noted and read on."""
        now = self._as_they_are()
        for f, was, is_ in zip(self.files, self.read_as, now):
            if was[0] == is_[0] and was != is_:     # (touched: a copy, a backup tool)
                note(f"{f}: modified during the run, its size unchanged; read on as it is")
            elif was != is_:
                how = f"{was[0]:,} -> {is_[0]:,} bytes"
                raise NanobertError(f"{f}: changed while --streaming read it ({how}): each "
                                    "pass reads the corpus again; "
                                    "restore it, then continue with --resume, or start over "
                                    "with --overwrite")
        self.read_as = now

    @staticmethod
    def _every(val_fraction: float) -> int:
        """Every how many documents one is held out (0: none)."""
        return round(1 / val_fraction) if val_fraction > 0 else 0

    @staticmethod
    def _held_out(d: int, every: int) -> bool:
        return bool(every) and d % every == 0

    @staticmethod
    def training_documents(files, val_fraction: float) -> Iterator:
        """The documents of `files` that are not held out, in parts of lines
        (`document_parts`): what a new vocabulary is trained on, as in memory
        (validation text must not shape it)."""
        every = StreamingCorpus._every(val_fraction)
        return (lines for d, lines in document_parts(files)
                if not StreamingCorpus._held_out(d, every))

    def _sequences(self, validation: bool) -> Iterator[np.ndarray]:
        """Packed id rows (no specials) of the training or validation documents, once.
        A document is read a part at a time (`document_parts`); the row a part leaves
        open goes on into the next part, so rows are those of the whole document."""
        keep, at, mine, carry = 0, None, False, np.zeros(0, np.int32)
        for d, lines in document_parts(self.files):
            if d != at:                      # a new document: the last one's open row
                if len(carry):
                    yield carry
                    carry = carry[:0]
                at = d
                mine = self._held_out(d, self.every) == validation
                if mine and not validation:
                    keep += 1
                    mine = (keep - 1) % self.world_size == self.rank
            if not mine:
                continue
            corpus = after(carry, tokenize_documents([lines], self.tok))
            rows = pack(corpus, self.seq_len - 2).tolist()
            for s0, s1 in rows[:-1]:
                yield corpus.ids[s0:s1]
            carry = corpus.ids[rows[-1][0]:rows[-1][1]] if rows else carry[:0]
        if len(carry):
            yield carry

    def validation(self, max_rows: int) -> list:
        out = []
        for seq in self._sequences(validation=True):
            out.append(seq)
            if len(out) >= max_rows:
                break
        return out

    def stream(self) -> Iterator[np.ndarray]:
        """Training rows forever: pass p shuffles with a buffer seeded from (seed, p)."""
        for p in range(1 << 30):
            self._unchanged()
            rng = np.random.default_rng([self.seed, p, 11])
            buf, n = [], 0
            for seq in self._sequences(validation=False):
                n += 1
                if len(buf) < self.buffer:
                    buf.append(seq)
                    continue
                j = int(rng.integers(len(buf)))
                yield buf[j]
                buf[j] = seq
            rng.shuffle(buf)
            yield from buf
            if n == 0:
                raise NanobertError(self._no_training_text())

    def _no_training_text(self) -> str:
        names = ", ".join(map(str, self.files[:3])) + (", ..." if len(self.files) > 3 else "")
        held = (f"--val-fraction holds out every {self.every}th document, the first included, "
                "for validation; separate documents with blank lines, or give "
                "--val-fraction 0" if self.every else "it has no text")
        return f"{names}: no training documents for --streaming ({held})"

    def rows_to_batch(self, seqs: Sequence[np.ndarray]) -> dict:
        B, T = len(seqs), self.seq_len
        input_ids = torch.full((B, T), self.tok.pad_id, dtype=torch.long)
        mask = torch.zeros((B, T), dtype=torch.long)
        for i, s in enumerate(seqs):
            row = np.concatenate([[self.tok.cls_id], s, [self.tok.sep_id]]).astype(np.int64)
            input_ids[i, :len(row)] = torch.from_numpy(row)
            mask[i, :len(row)] = 1
        return {"input_ids": input_ids, "attention_mask": mask,
                "token_type_ids": torch.zeros_like(input_ids)}
