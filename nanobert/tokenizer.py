"""WordPiece tokenization on the `tokenizers` library.

    text ──► normalise (clean, lower-case, split CJK, strip accents when uncased)
         ──► pre-tokenise (whitespace and punctuation)
         ──► WordPiece (longest-match sub-words, '##' continuation)
         ──► [CLS] A [SEP] (B [SEP]) with token type ids 0 for A, 1 for B

`Tokenizer` loads a tokenizer.json or a vocab.txt, trains a new vocabulary, encodes
single texts and pairs with offsets, and pads batches to their longest member. Other
families' tokenizers (RoBERTa's byte-level BPE, ALBERT's SentencePiece saved as
tokenizer.json) load too; their special tokens are found by role (cls, sep, pad, mask,
unk) from tokenizer_config.json / special_tokens_map.json. A tokenizer built from
vocabulary files (vocab.txt, vocab.json + merges.txt) registers the special and added
tokens those files name, with their settings, as transformers does: "<mask>" in a text
is RoBERTa's mask token (and the space before it), not "<", "mask", ">".
"""
from __future__ import annotations

import contextlib
import heapq
import json
import numbers
import os
import re
import threading
import weakref
from collections import Counter
from pathlib import Path
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from typing import Iterable, Optional, Sequence

import torch
from tokenizers import AddedToken
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors

from .files import NanobertError, atomic_path, minilm_dir, read_json, read_lines, read_text

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
ROLES = ("pad", "unk", "cls", "sep", "mask")
BERT_TOKENS = dict(zip(ROLES, SPECIALS))
MAX_WORD_CHARS = 100     # a longer word is one [UNK] (WordPiece's max_input_chars_per_word)
ROBERTA_TOKENS = {"pad": "<pad>", "unk": "<unk>", "cls": "<s>", "sep": "</s>", "mask": "<mask>"}


def _special_tokens(path: Path, conf: dict, vocab: dict) -> dict:
    """role -> token string, from the tokenizer's config files, else by convention."""
    found = {}
    for source in (conf, _read_json(path / "special_tokens_map.json")):
        for role in ROLES:
            t = source.get(f"{role}_token")
            if isinstance(t, dict):
                t = t.get("content")
            if isinstance(t, str) and role not in found:
                found[role] = t
    default = BERT_TOKENS if "[CLS]" in vocab or "<s>" not in vocab else ROBERTA_TOKENS
    return {role: found.get(role, default[role]) for role in ROLES}


# transformers' special-token attributes of a tokenizer, in tokenizer_config.json and
# special_tokens_map.json; and the lists of further special tokens
SPECIAL_KEYS = tuple(f"{k}_token" for k in ("bos", "eos", "unk", "sep", "pad", "cls", "mask"))
EXTRA_SPECIAL_KEYS = ("additional_special_tokens", "extra_special_tokens")
ADDED_TOKEN_FIELDS = ("content", "single_word", "lstrip", "rstrip", "normalized", "special")


def _added_token(value, special: bool, where: Path) -> Optional[AddedToken]:
    """An AddedToken from a config value: a string (special ones are matched as written),
    or a dict of AddedToken's fields (transformers writes lstrip, rstrip, normalized...)."""
    if isinstance(value, str):
        return AddedToken(value, special=special) if value else None
    if not isinstance(value, dict):
        return None
    if not isinstance(value.get("content"), str) or not value["content"]:
        raise NanobertError(f"{where}: a token without its text ('content'): {value!r}"[:200])
    fields = {k: value[k] for k in ADDED_TOKEN_FIELDS if k in value}
    if any(not isinstance(v, bool) for k, v in fields.items() if k != "content"):
        raise NanobertError(f"{where}: the settings of token {value['content']!r} must be "
                            f"true or false: {value!r}"[:200])
    token = AddedToken(**fields)
    token.special = token.special or special   # a named special token is special
    return token


def _config_tokens(path: Path, conf: dict) -> dict:
    """content -> AddedToken of the special tokens named in tokenizer_config.json and
    special_tokens_map.json (the latter wins, key by key, unless tokenizer_config.json has
    an added_tokens_decoder: transformers' rules), the lists of further special tokens
    included."""
    values = dict(conf)
    if "added_tokens_decoder" not in conf:
        values.update(_read_json(path / "special_tokens_map.json"))
    where = path / "tokenizer_config.json"
    found = {}
    for key in SPECIAL_KEYS + EXTRA_SPECIAL_KEYS:
        v = values.get(key)
        items = v if key in EXTRA_SPECIAL_KEYS and isinstance(v, list) else \
            list(v.values()) if key in EXTRA_SPECIAL_KEYS and isinstance(v, dict) else [v]
        for item in items:
            token = _added_token(item, True, where)
            if token is not None and token.content not in found:
                found[token.content] = token
    return found


def _declared_tokens(path: Path, conf: dict, named: dict) -> list:
    """[(id, AddedToken)] that the tokenizer's files add with their ids: tokenizer_config.json's
    added_tokens_decoder, else the older added_tokens.json (special when it names a
    special token, one of `named` (`_config_tokens`), and then not normalised)."""
    where = path / "tokenizer_config.json"
    decoder = conf.get("added_tokens_decoder")
    if isinstance(decoder, dict):
        pairs = [(k, _added_token(v, False, where)) for k, v in decoder.items()]
    else:
        where = path / "added_tokens.json"
        pairs = [(i, AddedToken(t, special=t in named, normalized=t not in named))
                 for t, i in _read_json(where).items()]
    out = []
    for i, token in pairs:
        try:
            i = int(i)
        except (TypeError, ValueError):
            raise NanobertError(f"{where}: token id {i!r} is not a whole number")
        if token is not None:
            out.append((i, token))
    return sorted(out, key=lambda it: it[0])


def _register_tokens(tk: HFTokenizer, path: Path, conf: dict, specials: dict) -> HFTokenizer:
    """Add to a tokenizer built from vocabulary files (vocab.txt, vocab.json + merges.txt)
    the added and special tokens of its configuration, as transformers does, so that they
    are matched whole in a text ("<mask>" is one token, not "<", "mask", ">"), with their
    settings (RoBERTa's <mask> takes the spaces before it: lstrip). First the tokens the
    files give with their ids, then the special tokens (by role, `specials`, when the files
    name none) that the vocabulary has."""
    where = path / "tokenizer_config.json"
    named = _config_tokens(path, conf)
    declared = _declared_tokens(path, conf, named)
    for i, token in declared:
        token.special = token.special or token.content in named
        tk.add_tokens([token])
        if tk.token_to_id(token.content) != i:
            raise NanobertError(f"{where}: added token {token.content!r} has id {i}, but the "
                                f"vocabulary gives it {tk.token_to_id(token.content)}")
    for t in specials.values():
        named.setdefault(t, AddedToken(t, special=True))
    vocab, done = tk.get_vocab(), {t.content for _, t in declared}
    tk.add_tokens([t for c, t in named.items() if c in vocab and c not in done])
    return tk


def _max_length(v, path) -> int:
    """tokenizer_config.json's model_max_length: a positive whole number (transformers
    writes 1e30 for "no limit", which becomes 2^20 here)."""
    if v is None:
        return 512
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v < 1 \
            or (isinstance(v, float) and not v.is_integer() and v < 1e18):
        raise NanobertError(f"{path}: model_max_length must be a whole number >= 1, got {v!r}")
    return int(min(v, 1 << 20))


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    d = read_json(path)
    return d if isinstance(d, dict) else {}


def _byte_level_bpe(path: Path) -> HFTokenizer:
    """RoBERTa's tokenizer from vocab.json + merges.txt: byte-level BPE, <s> A </s></s> B </s>."""
    try:
        tk = HFTokenizer(models.BPE.from_file(str(path / "vocab.json"), str(path / "merges.txt")))
    except Exception as e:
        raise NanobertError(f"{path / 'vocab.json'}: cannot be read with merges.txt ({e})")
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    vocab = tk.get_vocab()
    if "<s>" not in vocab or "</s>" not in vocab:
        raise NanobertError(f"{path / 'vocab.json'}: no <s> or </s> token")
    tk.post_processor = processors.RobertaProcessing(("</s>", vocab["</s>"]), ("<s>", vocab["<s>"]),
                                                     trim_offsets=True, add_prefix_space=False)
    return tk


# transformers' tokenizer classes that build BERT's WordPiece pipeline themselves: they
# take casing, accents and CJK splitting from tokenizer_config.json (lower-case, strip
# accents when lower-casing, split CJK by default), whatever tokenizer.json's normaliser
# says. AutoTokenizer picks one when tokenizer_config.json names it, or, naming none,
# when config.json's model_type is one of BERT_MODEL_TYPES.
BERT_TOKENIZER_CLASSES = ("BertTokenizer", "BertTokenizerFast", "DistilBertTokenizer",
                          "DistilBertTokenizerFast", "ElectraTokenizer", "ElectraTokenizerFast")
BERT_MODEL_TYPES = ("bert", "distilbert", "electra")


def _loads_as_bert(path: Path, conf: dict) -> bool:
    """Whether transformers loads the directory with a BERT tokenizer class."""
    named = conf.get("tokenizer_class")
    if named is None:
        return _read_json(path / "config.json").get("model_type") in BERT_MODEL_TYPES
    return named in BERT_TOKENIZER_CLASSES


def _bert_settings(conf: dict, lowercase: Optional[bool]) -> dict:
    """BertNormalizer settings from tokenizer_config.json, with transformers' defaults;
    `lowercase`, when given, overrides the file's do_lower_case."""
    accents = conf.get("strip_accents")
    return {"lowercase": bool(conf.get("do_lower_case", True) if lowercase is None else lowercase),
            "strip_accents": accents if isinstance(accents, bool) else None,
            "handle_chinese_chars": bool(conf.get("tokenize_chinese_chars", True))}


def _bert_normalizer(tk: HFTokenizer) -> Optional[dict]:
    """The settings of a BertNormalizer (lowercase, strip_accents, handle_chinese_chars),
    or None when the tokenizer normalises some other way."""
    n = tk.normalizer
    if not isinstance(n, normalizers.BertNormalizer):
        return None
    return {k: getattr(n, k) for k in ("lowercase", "strip_accents", "handle_chinese_chars")}


def _lowercases(tk: HFTokenizer) -> bool:
    """Does the tokenizer's normaliser lower-case (a Lowercase step, or a BertNormalizer
    that lower-cases), whatever a config file says of it?"""
    if tk.normalizer is None:
        return False
    def walk(n: dict) -> bool:
        return (n.get("type") == "Lowercase" or (n.get("type") == "BertNormalizer"
                                                 and bool(n.get("lowercase")))
                or any(walk(c) for c in n.get("normalizers") or []))
    try:
        return walk(json.loads(tk.normalizer.__getstate__()))
    except (ValueError, TypeError, AttributeError):
        return False


def _bert_pipeline(tk: HFTokenizer, lowercase: bool, where="the vocabulary",
                   strip_accents: Optional[bool] = None,
                   handle_chinese_chars: bool = True) -> HFTokenizer:
    tk.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=handle_chinese_chars, strip_accents=strip_accents,
        lowercase=lowercase)
    tk.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tk.decoder = decoders.WordPiece(prefix="##")
    cls, sep = tk.token_to_id("[CLS]"), tk.token_to_id("[SEP]")
    if cls is None or sep is None:
        raise NanobertError(f"{where}: no [CLS] or [SEP] token")
    # "[MASK]" typed in a text is the mask token, not the pieces [ mask ]
    vocab = tk.get_vocab()
    tk.add_special_tokens([t for t in SPECIALS if t in vocab])
    tk.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    return tk


# the JSON files of a model directory that are not a tokenizer.json
NOT_TOKENIZER_JSON = ("tokenizer_config.json", "special_tokens_map.json", "config.json",
                      "vocab.json", "added_tokens.json")


def _tokenizer_source(path: Path) -> tuple:
    """(directory, kind, file) of a tokenizer: a directory's tokenizer.json ("json"), else
    its vocab.txt ("vocab"), else its vocab.json + merges.txt ("bpe"); or a file given
    itself, a tokenizer.json (any name ending .json) or a vocab.txt (any .txt), read with
    the configuration files beside it."""
    if path.is_file():
        if path.suffix == ".json" and path.name not in NOT_TOKENIZER_JSON:
            return path.parent, "json", path
        if path.suffix == ".txt" and path.name != "merges.txt":
            return path.parent, "vocab", path
        raise NanobertError(f"{path}: not a tokenizer file; give a tokenizer.json or a "
                            "vocab.txt, or the directory that holds the tokenizer")
    if not path.is_dir():
        raise NanobertError(f"{path}: no such directory (a tokenizer is a directory with "
                            "tokenizer.json or vocab.txt, or one of those files)")
    for kind, name in (("json", "tokenizer.json"), ("vocab", "vocab.txt")):
        if (path / name).is_file():
            return path, kind, path / name
    if (path / "vocab.json").is_file() and (path / "merges.txt").is_file():
        return path, "bpe", path / "vocab.json"
    raise NanobertError(f"{path}: no tokenizer.json, vocab.txt or vocab.json + merges.txt")


def check_text(text, name: str) -> str:
    """`text` when it is a string the tokenizer can read; else a TypeError, or a ValueError
    for a lone surrogate (not valid Unicode: the tokenizers library's own TypeError names
    neither the argument nor the item), naming `name`. Cheap: only a text that is not
    ASCII is encoded, to find out."""
    if not isinstance(text, str):
        raise TypeError(f"{name} must be a string, got {type(text).__name__} {text!r}"[:200])
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"{name} is not valid Unicode: a lone surrogate "
                             f"{text[e.start]!r} at character {e.start}") from None
    return text


def check_texts(texts, name: str = "texts") -> list:
    """A list of strings from any ordered iterable of them (a list, a tuple, a numpy array
    of str, a generator); a TypeError naming `name` and the first item that is not one (the
    tokenizers library's own messages name neither), a ValueError for an item that is not
    valid Unicode. A dict (its keys) or a set (no order: rows could not be matched to the
    texts) is refused."""
    if isinstance(texts, (str, bytes)):
        raise TypeError(f"{name} must be a list of strings, not one {type(texts).__name__} "
                        "(pass [text])")
    if not hasattr(texts, "__iter__"):
        raise TypeError(f"{name} must be a list of strings, got {type(texts).__name__}")
    if isinstance(texts, (Mapping, AbstractSet)):
        why = "its keys would be read as the texts" if isinstance(texts, Mapping) else \
            "it has no order, so the results could not be matched to the texts"
        raise TypeError(f"{name} must be a list of strings, got a {type(texts).__name__} "
                        f"({why}); pass a list")
    refuse_table(texts, name)
    texts = list(texts)
    for i, t in enumerate(texts):
        check_text(t, f"{name}[{i}]")
        if type(t) is not str:          # (np.str_ of an array: given back as found)
            texts[i] = str(t)
    return texts


def refuse_table(value, name: str) -> None:
    """A TypeError for a pandas DataFrame given as texts or inputs: iterated, it gives its
    column names, which were read as the texts (one vector for "text") without a word."""
    if hasattr(value, "columns") and hasattr(value, "iloc"):
        raise TypeError(f"{name} must be a list of strings, got a {type(value).__name__} (its "
                        "column names would be read as the texts); pass one column, "
                        "df['text'], or df['text'].tolist()")


_LIVE: "weakref.WeakSet" = weakref.WeakSet()      # every Tokenizer (`_hold_for_fork`)


def _hold_for_fork() -> None:
    """Before os.fork: take every Tokenizer's lock (once: copies made by `with_max_length`
    share one), so that no call of a wrapped tokenizer is under way in another thread (a
    forked child would wait for its lock forever, or find the tokenizer's state copied
    half-changed); given back on both sides after. A lock held past 10 s (by the thread
    that forks, say) is left to the child anew."""
    _HELD.clear()
    for lock in {id(tok._lock): tok._lock for tok in list(_LIVE)}.values():
        if lock.acquire(timeout=10):
            _HELD.append(lock)


def _release_after_fork(child: bool = False) -> None:
    for lock in _HELD:
        lock.release()
    if child:   # the tokenizers library's thread pool is not in the child: its next
        # parallel call would wait forever where TOKENIZERS_PARALLELISM says true (as the
        # command line sets it); the library reads the variable at each call
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        held, fresh = set(map(id, _HELD)), {}
        for tok in list(_LIVE):   # (a lock not taken may be held by a thread the child
            if id(tok._lock) not in held:   # does not have; copies keep sharing one)
                tok._lock = fresh.setdefault(id(tok._lock), threading.Lock())
    _HELD.clear()


_HELD: list = []
if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_hold_for_fork, after_in_parent=_release_after_fork,
                        after_in_child=lambda: _release_after_fork(child=True))


class AtLeast(int):
    """A token count that is a lower bound: a text too long to be worth counting whole."""

    def __str__(self):
        return f"at least {int(self)}"


class Tokenizer:
    """A `tokenizers` pipeline with the model's special tokens and length: tok(texts)
    gives a padded batch of tensors for the model, encode/encode_batch give
    `tokenizers.Encoding`s (ids, offsets, word ids). Made by `from_dir` (a model
    directory: tokenizer.json, vocab.txt, merges or SentencePiece), `from_vocab` or
    `train`; `save` writes the HF files."""

    def __init__(self, tk: HFTokenizer, model_max_length: int = 512, lowercase: bool = True,
                 specials: Optional[dict] = None):
        if isinstance(tk, (str, Path)):   # (Tokenizer("minilm"): an AttributeError)
            raise TypeError(f"Tokenizer(tk) wraps a tokenizers.Tokenizer, got "
                            f"{type(tk).__name__}; a model's tokenizer is "
                            f"Tokenizer.from_dir({str(tk)[:60]!r}) or nanobert.load(...)[1]")
        tk.no_truncation()
        tk.no_padding()
        self.tk = tk
        # truncation is a setting of the tokenizer, switched on around each call: threads
        # that share one Tokenizer (a server's batch split over the cores) take turns, and
        # every call of the wrapped tokenizer holds the lock (`plain`), so none sees
        # another thread's truncation
        self._lock = threading.Lock()
        _LIVE.add(self)
        self.model_max_length = model_max_length
        bert = _bert_normalizer(tk)  # what the tokenizer does wins over what it was told
        self.lowercase = bool(bert["lowercase"]) if bert else lowercase and _lowercases(tk)
        self.quiet = False     # True: no truncation notes (a server counts and answers them)
        vocab = tk.get_vocab()
        self.specials = specials or BERT_TOKENS             # role -> token string
        for role, token in self.specials.items():            # pad_id, cls_id, mask_id, ...
            setattr(self, f"{role}_id", vocab.get(token))
        added = {t.content for t in tk.get_added_tokens_decoder().values() if t.special}
        self.special_ids = sorted({vocab[t] for t in set(self.specials.values()) | added
                                   if t in vocab})

    # ---- construction --------------------------------------------------------
    @classmethod
    def from_dir(cls, path, lowercase: Optional[bool] = None) -> "Tokenizer":
        """A tokenizer directory (tokenizer.json when present, else vocab.txt) or one of
        those files; casing, accents and CJK splitting of a BERT WordPiece tokenizer from
        the tokenizer_config.json there, as transformers reads them."""
        if not isinstance(path, (str, os.PathLike)):   # (pathlib's TypeError named no argument)
            raise TypeError(f"Tokenizer.from_dir(path): a directory or file path, got "
                            f"{type(path).__name__}")
        path = Path(path).expanduser()
        if str(path) == "minilm" and not path.exists():   # (as every model argument takes it)
            path = minilm_dir()
        path, kind, file = _tokenizer_source(path)
        conf = _read_json(path / "tokenizer_config.json")
        bert = _bert_settings(conf, lowercase)
        lowercase = bert["lowercase"]
        max_len = _max_length(conf.get("model_max_length"), path / "tokenizer_config.json")
        if kind == "json":
            text = read_text(file)
            try:
                tk = HFTokenizer.from_str(text)
            except Exception as e:
                raise NanobertError(f"{file}: not a usable tokenizer.json ({e})")
            if isinstance(tk.model, models.WordPiece) and _loads_as_bert(path, conf):
                tk.normalizer = normalizers.BertNormalizer(clean_text=True, **bert)
        elif kind == "vocab":
            tk = cls.from_vocab(file, **bert).tk
        else:
            tk = _byte_level_bpe(path)
            lowercase = False
        specials = _special_tokens(path, conf, tk.get_vocab())
        if kind != "json":   # a tokenizer.json has its added tokens in it
            _register_tokens(tk, path, conf, specials)
        return cls(tk, max_len, lowercase, specials)

    @classmethod
    def from_vocab(cls, vocab_file, lowercase: bool = True, strip_accents: Optional[bool] = None,
                   handle_chinese_chars: bool = True, model_max_length: int = 512):
        """BERT's WordPiece tokenizer from a vocab.txt (one token a line, its id the line
        number less one), with BERT's normaliser and pre-tokenizer."""
        vocab = {}
        for n, line in read_lines(vocab_file):  # bad UTF-8 is reported with its line
            vocab[line] = n - 1      # (a line twice: the last one's id, as transformers reads it)
        if not vocab:
            raise NanobertError(f"{vocab_file}: empty vocabulary")
        tk = HFTokenizer(models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=MAX_WORD_CHARS))
        return cls(_bert_pipeline(tk, lowercase, vocab_file, strip_accents, handle_chinese_chars),
                   model_max_length, lowercase)

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int = 8000, lowercase: bool = True,
              min_frequency: int = 2, model_max_length: int = 512) -> "Tokenizer":
        """Train a WordPiece vocabulary on an iterator of texts. The same texts give the
        same vocabulary, ids included, in every process (see `train_wordpiece`)."""
        if isinstance(texts, (str, bytes)) or texts is None:   # (a str: one text a character)
            raise TypeError(f"texts must be an iterable of strings (a list of texts), got "
                            f"{type(texts).__name__}")
        for name, value, least in (("vocab_size", vocab_size, len(SPECIALS) + 1),
                                   ("min_frequency", min_frequency, 1),
                                   ("model_max_length", model_max_length, 4)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
            if value < least:
                raise ValueError(f"{name} must be at least {least}, got {value}")
        tk = HFTokenizer(models.WordPiece({t: i for i, t in enumerate(SPECIALS)},
                                          unk_token="[UNK]", max_input_chars_per_word=MAX_WORD_CHARS))
        tk.normalizer = normalizers.BertNormalizer(lowercase=lowercase, strip_accents=None)
        tk.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        vocab = train_wordpiece(count_words(texts, tk), vocab_size, min_frequency)
        tk.model = models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]",
                                    max_input_chars_per_word=MAX_WORD_CHARS)
        return cls(_bert_pipeline(tk, lowercase), model_max_length, lowercase)

    def save(self, out_dir, token_types: bool = True):
        """Write tokenizer.json, tokenizer_config.json, special_tokens_map.json, and
        vocab.txt for WordPiece vocabularies. `token_types` False: for a model of one
        segment type (RoBERTa, DistilBERT, ModernBERT), transformers' tokenizer is told to
        give no token_type_ids, as their own tokenizers give none (a pair's 1s were an
        IndexError in RobertaModel, and DistilBertModel takes no such argument)."""
        out_dir = Path(out_dir)
        if out_dir.exists() and not out_dir.is_dir():
            raise NanobertError(f"{out_dir}: is a file, not a folder to save a tokenizer in")
        out_dir.mkdir(parents=True, exist_ok=True)
        wordpiece = isinstance(self.tk.model, models.WordPiece)
        specials = {f"{role}_token": t for role, t in self.specials.items()}
        bert = _bert_normalizer(self.tk) if wordpiece else None
        if bert is not None:  # transformers' BertTokenizer rebuilds the normaliser from these
            settings = {"tokenizer_class": "BertTokenizer", "strip_accents": bert["strip_accents"],
                        "tokenize_chinese_chars": bool(bert["handle_chinese_chars"])}
        else:  # tokenizer.json as it is
            settings = {"tokenizer_class": "PreTrainedTokenizerFast"}
        if not token_types:
            settings["model_input_names"] = ["input_ids", "attention_mask"]
        files = {
            "tokenizer.json": self.tk.to_str(),
            "tokenizer_config.json": json.dumps(dict(
                **settings, do_lower_case=self.lowercase, model_max_length=self.model_max_length,
                **specials), indent=2),
            "special_tokens_map.json": json.dumps(specials, indent=2),
        }
        if wordpiece:
            # a line per id, gaps kept (a vocab.txt read with a line twice has one): the
            # ids are the line numbers, and a file written without them shifted the rest
            token_of = {i: t for t, i in self.tk.get_vocab().items()}
            files["vocab.txt"] = "".join(token_of.get(i, f"[unused_gap{i}]") + "\n"
                                         for i in range(self.vocab_size))
        for name, text in files.items():
            with atomic_path(out_dir / name) as tmp:
                tmp.write_text(text, encoding="utf-8")

    def with_max_length(self, max_length: int) -> "Tokenizer":
        """A copy whose model_max_length (the length it truncates to by default, and that
        its saved tokenizer_config.json gives transformers and sentence-transformers) is
        `max_length`; it shares the wrapped tokenizer, which neither changes."""
        import copy
        from .config import check_count       # (0 had turned truncation off)
        least = self.tk.num_special_tokens_to_add(False) + 1
        max_length = check_count(max_length, "max_length", minimum=least)
        other = copy.copy(self)
        other._lock = self._lock    # (one wrapped tokenizer: one lock for its truncation)
        other.model_max_length = max_length
        return other

    # ---- encoding ------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        """The rows an embedding table needs: the largest id + 1. The count of tokens can
        be less (a vocab.txt with a line twice, ids with gaps): a model sized by it met
        ids past its end (an IndexError, or a traceback at the first such input)."""
        count = self.tk.get_vocab_size()
        if self.__dict__.get("_rows_of") != count:      # (again when tokens are added)
            self._rows_of = count
            self._rows = max(count, 1 + max(self.tk.get_vocab().values(), default=-1))
        return self._rows

    @contextlib.contextmanager
    def truncating(self, max_length: int, **kw):
        """The wrapped tokenizer with truncation to max_length on, for this thread only."""
        with self._lock:
            self.tk.enable_truncation(max_length, **kw)
            try:
                yield self.tk
            finally:
                self.tk.no_truncation()

    def __getstate__(self):           # (a lock does not pickle)
        return {k: v for k, v in self.__dict__.items() if k != "_lock"}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.Lock()
        _LIVE.add(self)

    def plain(self, texts, add_special_tokens: bool = True, is_pretokenized: bool = False) -> list:
        """The wrapped tokenizer's encodings of `texts` (str, or (a, b) pairs), whole: never
        truncated by another thread's call under way (which switches truncation on for
        the shared tokenizer: a reranker's long pairs were cut at other tokens, 7.8e-3
        off, when threads shared it)."""
        with self._lock:
            return self.tk.encode_batch(list(texts), add_special_tokens=add_special_tokens,
                                        is_pretokenized=is_pretokenized)

    def encode(self, text: str, pair: Optional[str] = None, max_length: Optional[int] = None):
        """One `tokenizers.Encoding` (ids, type_ids, tokens, offsets, word_ids...)."""
        check_text(text, "text")
        if pair is not None:
            check_text(pair, "pair")
        max_length = self.check_max_length(max_length, pair is not None)
        return self.encode_batch([text], None if pair is None else [pair], max_length)[0]

    def encode_batch(self, texts: Sequence[str], pairs: Optional[Sequence[str]] = None,
                     max_length: Optional[int] = None, stride: int = 0,
                     strategy: str = "longest_first", report: Optional[str] = None):
        """A list of `tokenizers.Encoding`, truncated to max_length (default: the model's).
        With `stride` and strategy 'only_second', overflowing windows are kept on each
        encoding's `.overflowing` (used for QA over long contexts). `report` names the
        inputs ("texts", "training examples") in a note on stderr when some were cut.
        Unlike `__call__` it checks only the shape of its arguments (its callers have
        checked the texts): a str is not a list of texts, and pairs are one per text."""
        for name, given in (("texts", texts), ("pairs", pairs)):
            if isinstance(given, str):   # (each character had been a text)
                raise TypeError(f"encode_batch({name}): a list of texts, got a str (encode "
                                "takes one text)")
        texts = list(texts)
        if pairs is not None and len(pairs := list(pairs)) != len(texts):   # (zip cut)
            raise ValueError(f"encode_batch(pairs): {len(pairs)} for {len(texts)} texts "
                             "(one each)")
        max_length = self.check_max_length(max_length, pairs is not None) or self.model_max_length
        inputs = texts if pairs is None else list(zip(texts, pairs))
        tokenized = inputs
        if pairs is None and not stride:        # (a 5 MB row had taken 4.7 GB)
            tokenized = [self.clip(t, max_length + 1) for t in inputs]
        elif pairs is not None and strategy == "longest_first" and not stride:
            tokenized = self.clip_pairs(texts, pairs, max_length)
        with self.truncating(max_length, stride=stride, strategy=strategy):
            encodings = self.tk.encode_batch(tokenized)
        if report:
            report_truncation(self, encodings, inputs, max_length, report, flag=None)
        return encodings

    # ---- cutting long texts before they are tokenized -------------------------
    def clip(self, text: str, keep: int) -> str:
        """A prefix of `text` whose first `keep` tokens are those of `text` and which still
        has at least `keep` tokens (`text` itself when it has fewer, or is short), at a
        cost in `keep`, not in the length of the text: tokenizing costs time and memory
        in the length (2 MB of punctuation: 4 s, 1 GB), and truncating does not help with
        that. At a plain space when there is one (clip_text), else where `head` finds."""
        if len(text) <= CLIP_MIN_CHARS * keep:
            return text
        cut = clip_text(text, keep)
        return cut if len(cut) < len(text) else self.head(text, keep)[0]

    def head(self, text: str, keep: int) -> tuple:
        """(prefix, n): a prefix of `text` that holds exactly its first n >= `keep` tokens,
        or (text, all its tokens) when it has no more than `keep` or none is found. Found
        by tokenizing ever longer prefixes (2 * keep characters, then 4 times as many) and
        cutting one at the start of a pre-tokenizer word well before its end (whose last
        words the rest of the text may change: a word cut short, spaces before a word);
        checked by tokenizing the cut (token_prefix). A text of one huge word (nowhere to
        cut) is tokenized whole, as before."""
        for start, enc in self._prefix_encodings(text, keep):
            prefix, n = self.token_prefix(start, enc, keep, settled=_settled(enc))
            if len(prefix) < len(start):
                return prefix, n
        return self.token_prefix(text, self.plain([text], add_special_tokens=False)[0], keep)

    def _prefix_encodings(self, text: str, least: int):
        """(prefix, its encoding without special tokens) of ever longer prefixes of `text`
        (2 * least + 64 characters, then 4 times as many), while under half of it."""
        span = 2 * least + 64
        while 2 * span < len(text):
            yield text[:span], self.plain([text[:span]], add_special_tokens=False)[0]
            span *= 4

    def least_tokens(self, text: str, least: int) -> int:
        """The tokens of `text`, or a lower bound of them that is over `least`: those of
        ever longer prefixes that the rest of the text cannot change (`_settled`), so
        that a text far over `least` costs `least`, not its length, and no cut needs
        checking (head's check made a refusal slower than tokenizing the whole text).
        A lower bound is an `AtLeast`; a count of the whole text, a plain int."""
        for _, enc in self._prefix_encodings(text, least):
            settled = _settled(enc)
            if settled > least:
                return AtLeast(settled)
        return len(self.plain([text], add_special_tokens=False)[0].ids)

    def clip_pairs(self, texts: Sequence[str], pairs: Sequence[str], max_length: int,
                   ids_only: bool = False) -> list:
        """[(a, b)] of `clip_pair`, each distinct first text cut once beforehand against
        the longest second one (safe for the same reason): a query repeated in every
        pair of a rerank was scanned once per document (1.8 MB x 1,000: 126 s).
        `ids_only` (the caller reads no offsets): a first text of several pairs that no
        cut shortens, one word of megabytes, is `squeezed` once, where it had been
        tokenized again for each document (1.6 MB: 3.5 s a document); a text of one pair
        is read once anyway."""
        if pairs:
            keep = max_length + 1 + TOKENS_PER_CHAR * max(len(p or "") for p in pairs)
            first = {t: self.clip(t, keep) for t in set(texts)}
            if ids_only:
                times = Counter(texts)
                first = {t: self.squeezed(c) if times[t] > 1 and len(c) > SQUEEZE_CHARS else c
                         for t, c in first.items()}
            texts = [first[t] for t in texts]
        return [self.clip_pair(a, b, max_length) for a, b in zip(texts, pairs)]

    def squeezed(self, text: str) -> str:
        """A text with exactly the tokens (ids) of `text`, shorter where many characters
        make one token or none: a WordPiece word past its max_input_chars_per_word is one
        [UNK] at any length, and spaces or control characters make no token. The middle
        of each such run is cut out, SQUEEZE_CHARS // 2 kept at each end, and the result
        is checked by tokenizing it (`text` itself where that differs). Offsets into it
        are not those of `text`: for inputs whose ids alone are read."""
        enc = self.plain([text], add_special_tokens=False)[0]
        points = sorted({0, len(text), *(i for span in enc.offsets for i in span)})
        half = SQUEEZE_CHARS // 2
        pieces = [text[a:b] if b - a <= 2 * half else text[a:a + half] + text[b - half:b]
                  for a, b in zip(points, points[1:])]
        short = "".join(pieces)
        if len(short) < len(text) and \
                self.plain([short], add_special_tokens=False)[0].ids == enc.ids:
            return short
        return text

    def clip_pair(self, a: str, b: Optional[str], max_length: int) -> tuple:
        """(a, b) cut short, without changing what truncating them together to
        `max_length` tokens, longest first, keeps (or a alone to max_length + 1 tokens,
        when b is None). That cut depends only on the shorter side and on which side is
        longer, so a side is first clipped only to more tokens than the whole other side
        can have (4 per character: byte-level BPE). Two sides still both long are then
        cut to their tokens that count (clip_long_pair): the tokenizers library pairs
        every overflowing piece of one with every piece of the other."""
        if b is None:
            return self.clip(a, max_length + 1), None
        room = max_length + 1
        a, b = (self.clip(a, room + TOKENS_PER_CHAR * len(b)),
                self.clip(b, room + TOKENS_PER_CHAR * len(a)))
        if min(len(a), len(b)) > max_length and max(len(a), len(b)) > 4 * max_length:
            return self.clip_long_pair(a, b, max_length - self.tk.num_special_tokens_to_add(True))
        return a, b

    def clip_long_pair(self, a: str, b: str, budget: int) -> tuple:
        """(a, b) clipped so that truncating them longest-first to `budget` tokens keeps
        the same tokens as truncating the whole texts would. Why: the tokenizers library
        pairs every overflowing piece of one side with every piece of the other, so two
        texts far over the limit cost time in the PRODUCT of their lengths (two 4,000-word
        texts at 32 tokens: 76,000 pieces, 4.4 s; a /rerank of two 300 KB CJK texts took
        over 20 GB). What decides the longest-first cut: whether a has more tokens than b,
        and the shorter side's length up to budget + 1. So the side that is not longer
        keeps budget + 1 tokens, and the other side one token more than that (which keeps
        the order of the two) or than the budget leaves it, whichever is more (a side of
        many characters can have few tokens)."""
        ea, eb = self.plain([a, b], add_special_tokens=False)
        swap = len(ea.ids) > len(eb.ids)          # a ties with b as the shorter side
        (s, es), (l, el) = ((b, eb), (a, ea)) if swap else ((a, ea), (b, eb))
        s, kept = self.token_prefix(s, es, budget + 1)
        l, _ = self.token_prefix(l, el, max(kept + 1, budget + 1 - kept))
        return (l, s) if swap else (s, l)

    def token_prefix(self, text: str, enc, keep: int, tries: int = 8,
                     settled: Optional[int] = None) -> tuple:
        """(prefix, its token count): the shortest prefix of `text` found, ending at a token
        boundary, whose tokens are exactly the first `keep` or more tokens of `text` (`enc`:
        its encoding without special tokens); checked by encoding it, so that it holds for
        every tokenizer, with or without spaces in the text. (text, all its tokens) when
        none is found in `tries` attempts. `settled`: when `text` is itself the start of a
        longer text, the tokens after which the rest may still change it (`_settled`)."""
        n = len(enc.ids)
        if n <= keep:
            return text, n
        offsets, words = enc.offsets, enc.word_ids
        # a cut between two pre-tokenized words is the likeliest to leave the tokens as
        # they are; then any cut between two tokens that do not share a character
        end = min(n if settled is None else settled, keep + 64)
        cuts = [j for j in range(keep, end) if offsets[j - 1][1] <= offsets[j][0]]
        cuts.sort(key=lambda j: (words[j] == words[j - 1], j))
        for j in cuts[:tries]:
            prefix = text[:offsets[j][0]]
            if self.plain([prefix], add_special_tokens=False)[0].ids == enc.ids[:j]:
                return prefix, j
        return text, n

    def pad(self, encodings) -> dict:
        """Pad a list of encodings to the longest: input_ids, token_type_ids,
        attention_mask as (B, T) int64 tensors."""
        if not encodings:
            raise ValueError("pad: no encodings to pad")
        T = max(len(e.ids) for e in encodings)
        B = len(encodings)
        ids = torch.full((B, T), self.pad_id or 0, dtype=torch.long)
        types = torch.zeros((B, T), dtype=torch.long)
        mask = torch.zeros((B, T), dtype=torch.long)
        for i, e in enumerate(encodings):
            n = len(e.ids)
            ids[i, :n] = torch.tensor(e.ids)
            types[i, :n] = torch.tensor(e.type_ids)
            mask[i, :n] = 1
        return {"input_ids": ids, "token_type_ids": types, "attention_mask": mask}

    def __call__(self, texts, pairs=None, max_length: Optional[int] = None,
                 report: Optional[str] = None) -> dict:
        """Encode a batch and pad it to its longest member (dynamic padding)."""
        if isinstance(texts, str):
            texts = [texts]
            pairs = [pairs] if isinstance(pairs, str) else pairs
        texts = check_texts(texts)
        if not texts:
            raise ValueError("texts is empty: nothing to encode")
        if pairs is not None:
            pairs = check_texts(pairs, "pairs")
            if len(pairs) != len(texts):
                raise ValueError(f"pairs: {len(pairs)} for {len(texts)} texts (one each)")
        max_length = self.check_max_length(max_length, pairs is not None)
        if report is not None and not isinstance(report, str):
            raise TypeError(f"report must name the inputs (a string such as 'texts'), got "
                            f"{type(report).__name__}")
        return self.pad(self.encode_batch(texts, pairs, max_length, report=report))

    def check_max_length(self, max_length, pair: bool = False):
        """None, or a whole number of tokens that holds the special tokens and at least one
        token of each text ([CLS] a [SEP] b [SEP]: 5); else an error naming max_length."""
        if max_length is None:
            return None
        least = self.tk.num_special_tokens_to_add(pair) + (2 if pair else 1)
        if isinstance(max_length, bool) or not isinstance(max_length, numbers.Integral):
            raise TypeError(f"max_length must be a whole number >= {least}, got "
                            f"{type(max_length).__name__} {max_length!r}"[:200])
        if max_length < least:
            raise ValueError(f"max_length must be a whole number >= {least} (the special "
                             f"tokens of "
                             f"{'a pair' if pair else 'a text'} and a token of "
                             f"{'each text' if pair else 'the text'}), got {max_length}")
        return int(max_length)

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        """The text of token ids (a list, tensor or array), special tokens left out."""
        if hasattr(ids, "tolist"):          # a tensor or an array of ids
            ids = ids.tolist()
        if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
            raise TypeError(f"decode(ids): expected a list of token ids, got "
                            f"{type(ids).__name__} {ids!r}"[:200])
        ids = [self._token_id(i, f"ids[{n}]") for n, i in enumerate(ids)]
        return self.tk.decode(ids, skip_special_tokens=skip_special_tokens)

    def id_to_token(self, i: int) -> str:
        """The token of id `i` ('[CLS]', '##ing'); an error for an id outside the vocabulary."""
        return self.tk.id_to_token(self._token_id(i, "id"))

    def _token_id(self, i, name: str) -> int:
        """i as a token id of this vocabulary, or an error naming `name` (the tokenizers
        library's: "not iterable", OverflowError "number too small")."""
        if getattr(i, "ndim", None) == 0 and not isinstance(i, numbers.Integral):
            i = i.item()                    # a tensor's one id (argmax)
        if isinstance(i, bool) or not isinstance(i, numbers.Integral):
            raise TypeError(f"{name} must be a token id (an integer), got {type(i).__name__} "
                            f"{i!r}"[:200])
        if not 0 <= i < self.vocab_size:
            raise ValueError(f"{name}: {i} is not a token id of this vocabulary "
                             f"(0 to {self.vocab_size - 1})")
        return int(i)

    def word_marker(self) -> Optional[tuple]:
        """How the vocabulary marks words: ("prefix", "##") when a piece that continues a
        word starts with "##" (WordPiece, or BPE with a continuing prefix), ("start", "Ġ" or
        "▁") when a piece that begins a word starts with the mark (byte-level BPE,
        SentencePiece), None when the pieces do not say (whole-word masking cannot work)."""
        if "_word_marker" not in self.__dict__:
            conf = json.loads(self.tk.to_str())
            prefix = (conf.get("model") or {}).get("continuing_subword_prefix")
            marks = json.dumps([conf.get("pre_tokenizer"), conf.get("decoder")])
            self._word_marker = (("prefix", prefix) if prefix else
                                 ("start", "\u0120") if '"ByteLevel"' in marks else
                                 ("start", "\u2581") if '"Metaspace"' in marks else None)
        return self._word_marker

    def display_token(self, i: int) -> str:
        """Token i as a person reads it: byte-level BPE's 'Ġlove' and SentencePiece's
        '▁love' as 'love' (a piece that is part of a character stays as stored)."""
        token = self.id_to_token(i)
        marker = self.word_marker()
        if marker is None or marker[0] != "start" or int(i) in self.special_ids:
            return token
        # (a tokenizer.json without a decoder joins raw pieces: 'Ġlove' shown as stored)
        decoder = self.tk.decoder or (decoders.ByteLevel() if marker[1] == "\u0120"
                                      else decoders.Metaspace())
        text = decoder.decode([token]).strip()
        return token if not text or "\ufffd" in text else text

    def token_to_id(self, t: str):
        """The id of token `t`, or None when the vocabulary has no such token."""
        return self.tk.token_to_id(check_text(t, "token"))


# ----------------------------------------------------------------------------------
# Training a WordPiece vocabulary, deterministically
#
# `tokenizers`' WordPiece trainer numbers the continuation pieces (##x) in hash-map
# order, and breaks ties between equally frequent pairs by those numbers: the same
# corpus gives other ids, and on small corpora other tokens, in every process
# (huggingface/tokenizers#1794). The algorithm is the same BPE-style one; here ties
# are broken by the pieces' text, so the vocabulary is a function of the corpus alone.


def count_words(texts: Iterable[str], tk: HFTokenizer, chunk: int = 1000,
                chars: int = 100_000) -> Counter:
    """Word counts after the tokenizer's normaliser and pre-tokeniser (lines are joined
    in chunks of `chunk` lines or `chars` characters: the pre-tokeniser splits on the
    newlines anyway, and its words of a long text take a few hundred bytes each)."""
    counts, buf, size = Counter(), [], 0

    def flush():
        text = tk.normalizer.normalize_str("\n".join(buf))
        counts.update(w for w, _ in tk.pre_tokenizer.pre_tokenize_str(text))
        buf.clear()
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise TypeError(f"texts[{i}] must be a string, got {type(t).__name__}")
        buf.append(t)
        size += len(t)
        if len(buf) >= chunk or size >= chars:
            flush()
            size = 0
    flush()
    if not counts:   # (a vocabulary of the special tokens alone: every word [UNK])
        raise ValueError("texts hold no words to train a vocabulary on")
    return counts


def _pairs(word: list):
    return zip(word, word[1:])


def train_wordpiece(word_counts: dict, vocab_size: int, min_frequency: int = 2) -> list:
    """The vocabulary, in id order: special tokens, every character, every character as
    a continuation (##c), then merged pieces, most frequent pair first (ties: the pair
    whose text sorts first), until `vocab_size` or no pair occurs `min_frequency` times.
    A word over MAX_WORD_CHARS characters, which the tokenizer reads as [UNK] whatever
    the vocabulary, gives its characters but no pairs: each merge recounts the words it
    touches, and one 50,000-character word (DNA, base64, Thai) took 105 s to learn pieces
    it can never use."""
    ordered = sorted(word_counts)
    vocab = list(SPECIALS) + [c for c in sorted({c for w in ordered for c in w})
                              if c not in SPECIALS]
    vocab += sorted({"##" + c for w in ordered for c in w[1:]})
    ordered = [w for w in ordered if len(w) <= MAX_WORD_CHARS]
    words = [[w[0]] + ["##" + c for c in w[1:]] for w in ordered]
    freq = [word_counts[w] for w in ordered]
    known = set(vocab)
    count, where = Counter(), {}
    for i, w in enumerate(words):
        for p in _pairs(w):
            count[p] += freq[i]
            where.setdefault(p, set()).add(i)
    heap = [(-n, a, b) for (a, b), n in count.items()]
    heapq.heapify(heap)
    while len(vocab) < vocab_size and heap:
        n, a, b = heapq.heappop(heap)
        now = count.get((a, b), 0)
        if now != -n:   # a stale entry: a count that fell is pushed again only when met
            if 0 < now < -n:
                heapq.heappush(heap, (-now, a, b))
            continue
        if -n < min_frequency:
            break
        merged = a + b[2:]
        if merged not in known:
            vocab.append(merged)
            known.add(merged)
        for i in sorted(where.pop((a, b))):
            _merge_word(words, i, freq[i], (a, b), merged, count, where, heap)
    return vocab


def _merge_word(words, i, f, pair, merged, count, where, heap):
    """Replace every `pair` in word i by `merged`, updating the pair counts. Only the
    pairs beside a merge change, so only those are recounted, and only a count that rose
    is pushed (train_wordpiece pushes a fallen one again when it pops it): pushing every
    pair of the word made the heap grow with the words' lengths (8,000 hex hashes took
    3 minutes, now 10 s)."""
    old, (first, second), sites, j = words[i], pair, [], 0
    while True:    # (list.index: most words listed for a pair no longer hold it)
        try:
            j = old.index(first, j, len(old) - 1)
        except ValueError:
            break
        if old[j + 1] == second:
            sites.append(j)
            j += 2
        else:
            j += 1
    if not sites:
        return
    new, at = [], 0
    for j in sites:
        new += old[at:j]
        new.append(merged)
        at = j + 2
    new += old[at:]
    delta = Counter()
    # the old pairs that touch a merged pair, and the new pairs that touch a merged token
    # (the m-th site, old[j : j + 2], is new[j - m])
    for olds, word in (({j + d for j in sites for d in (-1, 0, 1)}, old),
                       ({j - m + d for m, j in enumerate(sites) for d in (-1, 0)}, new)):
        sign = -1 if word is old else 1
        for k in olds:
            if 0 <= k < len(word) - 1:
                delta[word[k], word[k + 1]] += sign * f
    for p, d in delta.items():
        if not d:
            continue
        count[p] += d
        if d > 0:      # (a count that rose is pushed now; one that fell, when popped)
            where.setdefault(p, set()).add(i)
            heapq.heappush(heap, (-count[p], *p))
        elif count[p] <= 0:
            count.pop(p, None)
    words[i] = new


# ----------------------------------------------------------------------------------
# Clipping very long texts before they are tokenized

WORD_RUN = re.compile(r"[^ ]+")   # what lies between plain spaces
TOKENS_PER_CHAR = 4               # the most tokens any tokenizer here makes of a character
CLIP_MIN_CHARS = 16               # a text under this many characters per kept run is left whole
SQUEEZE_CHARS = 512               # a run of characters over this that makes one token or none
                                  # is cut to it (Tokenizer.squeezed)


def clip_text(text: str, keep: int) -> str:
    """A prefix of `text` whose first `keep` tokens are those of `text`, for any of the
    tokenizers here (WordPiece, byte-level BPE, SentencePiece), and which still has at
    least `keep` tokens. Tokenizing costs time in the length of the text, truncating
    does not help with that, and a server must not spend seconds on one long input.

    Why it is safe: the prefix ends at a plain space after `keep` runs of characters
    that each hold a letter or a digit. No tokenizer here joins a token across a plain
    space, none drops a letter or digit, so each such run gives at least one token, and
    the tokens before the cut are the same with or without what follows it."""
    if len(text) <= CLIP_MIN_CHARS * keep:
        return text
    n = 0
    for run in WORD_RUN.finditer(text):
        if any(c.isalnum() for c in run.group()):
            n += 1
            if n == keep:
                return text[:run.end()]
    return text


def _settled(enc) -> int:
    """How many of the tokens of the start of a longer text (`enc`) the rest of that text
    cannot change: those of its words before the last two (the last may be cut short,
    and where it starts can move: trailing spaces join the next word in byte-level BPE)."""
    words = enc.word_ids
    if not words:
        return 0
    last = words[-1]
    return next((j for j, w in enumerate(words) if w is not None and w >= last - 1), len(words))


# ----------------------------------------------------------------------------------
# Saying what truncation cut


def truncation_note(tok: Tokenizer, encodings, inputs, max_length: int, what: str = "inputs",
                    is_pretokenized: bool = False, flag: str = "--max-length") -> Optional[str]:
    """One line on what `max_length` cut from `encodings` (made from `inputs`: texts,
    (text, pair) tuples, or word lists): how many, by how much, and the longest one; None
    when nothing was cut. Only the cut inputs are encoded again, to measure them."""
    return cut_note(cut_lengths(tok, encodings, inputs, is_pretokenized), len(encodings),
                    inputs, max_length, what, is_pretokenized, flag)


MEASURE_TIMES = 64   # a long text (or pair side) is counted up to this many times max_length


def cut_lengths(tok: Tokenizer, encodings, inputs, is_pretokenized: bool = False) -> dict:
    """{index: its whole token count} of the inputs that truncation cut (`encodings` made
    without a stride). A single text read whole adds up its overflowing pieces. A pair's
    sides, or a text clipped before it was tokenized (`Tokenizer.clip`), are encoded
    again: each distinct side once, a few at a time, and one over 16 characters a kept
    token only up to MEASURE_TIMES the kept tokens (`Tokenizer.least_tokens`: then an
    `AtLeast`). All at once, `search --rerank` of a 130 kB query against 1,000
    documents took 21 GB; measuring whole every cut text made a note cost more than
    reading the texts (16 pairs with a 1 MB side: 26 of 35 s, +2.45 GB)."""
    single = tok.tk.num_special_tokens_to_add(False)
    lengths, again = {}, []
    for i, e in enumerate(encodings):
        over = e.overflowing          # (a copy at each reading)
        if not over:
            continue
        x = inputs[i]
        if is_pretokenized or (isinstance(x, str) and len(x) <= CLIP_MIN_CHARS * (len(e) + 1)):
            lengths[i] = single + sum(len(p) - single for p in [e, *over])
        else:
            again.append(i)

    def sides(x):
        return [x] if isinstance(x, str) else [t for t in x if t is not None]
    sizes = {}
    for i in again:
        kept = len(encodings[i])
        for t in sides(inputs[i]):
            if t not in sizes and len(t) > CLIP_MIN_CHARS * (kept + 1):
                sizes[t] = tok.least_tokens(t, MEASURE_TIMES * kept)
    short = list({t for i in again for t in sides(inputs[i]) if t not in sizes})
    for at in range(0, len(short), 16):
        part = short[at:at + 16]
        encs = tok.plain(part, add_special_tokens=False)
        sizes.update((t, len(e.ids)) for t, e in zip(part, encs))
    for i in again:
        counts = [sizes[t] for t in sides(inputs[i])]
        n = tok.tk.num_special_tokens_to_add(len(counts) > 1) + sum(counts)
        lengths[i] = AtLeast(n) if any(isinstance(c, AtLeast) for c in counts) else n
    return dict(sorted(lengths.items()))


CHUNK_TEXTS = 8192        # inputs tokenized at a time by encode_chunks
CHUNK_CHARS = 500_000     # ... and at most this many characters (as clipped: CLIP_MIN_CHARS)


def encode_chunks(tok: Tokenizer, inputs, encode, max_length: int, what: str = "texts",
                  longest_first: bool = False, key=None, numbers=None):
    """Yield (indices, their encodings) of `inputs` (texts, or (text, pair) tuples) a
    chunk at a time, as `encode(indices)` makes them (None: `encode_inputs` of the
    chunk's inputs, all of one kind): CHUNK_TEXTS inputs and CHUNK_CHARS
    characters at most (longest first where `longest_first`, as sentence-transformers
    reads a corpus); then say in one note what truncation cut from all of them. A cut
    text's encoding holds all its tokens: 25,000 texts of 1,300 characters read at once
    for classification took +1.35 GB, 5,000 of 2,000 characters to embed +3.2 GB.
    `key`: the note's, for note_once (default: what, how many inputs, how many cut);
    `numbers`: what the note calls each input (#i + 1)."""
    from .batching import size_runs
    if encode is None:
        def encode(chunk):
            return encode_inputs(tok, [inputs[i] for i in chunk], max_length)
    cap = CLIP_MIN_CHARS * (max_length + 1)       # (what encode_batch clips a text to)
    sizes = [sum(min(len(t), cap) for t in ((x,) if isinstance(x, str) else x) if t is not None)
             for x in inputs]
    order = list(range(len(inputs)))
    if longest_first and (len(order) > CHUNK_TEXTS or sum(sizes) > CHUNK_CHARS):
        order.sort(key=lambda i: -sizes[i])
    cut = {}
    for run in size_runs([sizes[i] for i in order], CHUNK_CHARS, CHUNK_TEXTS):
        chunk = [order[j] for j in run]
        encodings = encode(chunk)
        if not tok.quiet:
            lengths = cut_lengths(tok, encodings, [inputs[i] for i in chunk])
            cut.update((chunk[j], n) for j, n in lengths.items())
        yield chunk, encodings
    # (by default one note per kind of call: keyed by its text, which quotes the input,
    # a server's Predictor printed and remembered one for each long request)
    key = (what, len(inputs), len(cut)) if key is None else key
    note_once(tok, cut_note(cut, len(inputs), inputs, max_length, what, flag=None,
                            numbers=numbers), key=key)


def encode_inputs(tok: Tokenizer, inputs: list, max_length: int) -> list:
    """The encodings of texts, or of (text, pair) tuples: one kind in a list."""
    if isinstance(inputs[0], str):
        return tok.encode_batch(inputs, max_length=max_length)
    return tok.encode_batch([a for a, _ in inputs], [b for _, b in inputs], max_length=max_length)


def cut_note(lengths: dict, total: int, inputs, max_length: int, what: str = "inputs",
             is_pretokenized: bool = False, flag: Optional[str] = "--max-length",
             numbers=None) -> Optional[str]:
    """truncation_note's line from `cut_lengths` (over `total` inputs): also for inputs
    encoded a part at a time (encoder_vectors). `numbers`: what each input is called
    (#i + 1: its place among `inputs`), as a reranker's candidates by their corpus line."""
    if not lengths:
        return None
    worst = max(lengths, key=lambda i: (lengths[i], -i))
    example = inputs[worst]
    shown = " ".join(example) if is_pretokenized else (
        example if isinstance(example, str) else " | ".join(example))
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    lost = [type(n)(n - max_length) for n in lengths.values()]   # (an AtLeast stays one)
    least, most = min(lost), max(lost)
    by = f"{least}" if least == most and type(least) is type(most) else f"{least} to {most}"
    one = len(lengths) == 1
    number = worst + 1 if numbers is None else numbers[worst]
    which = "it" if total == 1 else f"#{number}" if one else f"the longest, #{number},"
    # ("1 of 1 texts is" read oddly: one input is "the text")
    counted = (f"the {what[:-1]}" if total == 1 and what.endswith("s") else
               f"{len(lengths)} of {total} {what}")
    return (f"{counted} {'is' if one else 'are'} longer than "
            f"{max_length} tokens and {'was' if one else 'were'} cut by {by} token"
            f"{'' if by == '1' else 's'} ({which} has "
            f"{lengths[worst]}: {shown!r})" + (f"; raise {flag} to keep more" if flag else ""))


def report_truncation(tok: Tokenizer, encodings, inputs, max_length: int, what: str = "inputs",
                      is_pretokenized: bool = False, flag: str = "--max-length") -> int:
    """Print `truncation_note` on stderr (when something was cut); returns how many
    inputs were cut. Every command that truncates calls it, so no cut is silent."""
    if not tok.quiet:
        note_once(tok, truncation_note(tok, encodings, inputs, max_length, what,
                                       is_pretokenized, flag))
    return sum(1 for e in encodings if e.overflowing)


def note_once(tok: Tokenizer, text: Optional[str], key=None) -> None:
    """`files.note`, once per tokenizer: the dev set, evaluated every epoch, says it
    once. `key`: what makes two notes one (default: their text); a note of a count that
    names its kind (windows read, questions cut) is said once, not once for each count
    (`Predictor.predict`, called again and again, said it at each new count)."""
    from .files import note
    said = tok.__dict__.setdefault("_notes", set())
    key = text if key is None else key
    if text and key not in said and not tok.quiet:
        said.add(key)
        note(text)
