"""Sentence embeddings and semantic search.

    texts ──► tokenizer ──► encoder ──► pool over tokens ──► L2-normalise ──► (n, H)
                                        mean of the real tokens (default),
                                        or the [CLS] vector

A sentence-transformers checkpoint says how it pools in `1_Pooling/config.json`;
when that file is there its choice is the default (`default_pooling`). Search is cosine similarity
between a query vector and the corpus vectors (a dot product once both are
normalised). The corpus vectors are cached next to the corpus file, keyed by the
corpus contents, the model and the pooling, so a second search is instant.

    from nanobert import Encoder
    enc = Encoder("minilm")
    vec = enc.encode("A man is eating food.")                                # (384,)
    vecs = enc.encode(["A man is eating food.", "A man is eating bread."])   # (2, 384)
    hits = enc.search("a person eats", ["...", "..."], k=5)   # [(index, score, text)]
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import stat
import sys
import weakref
from pathlib import Path
from typing import NamedTuple, Optional, Sequence

import numpy as np
import torch

from .batching import (CudaGraphs, forward_tokens, restore_order, sorted_batches,
                       to_inference_device)
from .checkpoint import (POOLINGS, declared_max_length, sbert_config, st_json, st_prompts,
                         st_top_folder)
from .config import at_least, check_count, checked, max_length_range
from .files import (NanobertError, atomic_path, check_output_file, note, one_line, progress_bar,
                    spooled_stdin)
from .model import first_real_tokens
from .quantize import add_dtype_flag
from .threads import map_on_cores
from .tokenizer import check_texts, encode_chunks

RERANK_K = 100   # search with a reranker: the nearest entries the cross-encoder re-scores


# ----------------------------------------------------------------------------------
# Pooling


def pool(hidden: torch.Tensor, mask: torch.Tensor, pooling: str = "mean") -> torch.Tensor:
    """hidden (B, T, H), mask (B, T) 1 on real tokens -> (B, H)."""
    m = mask.unsqueeze(-1).to(hidden.dtype)                      # (B, T, 1)
    if pooling == "cls":
        return first_real_tokens(hidden, mask)
    if pooling == "max":
        return hidden.masked_fill(m == 0, torch.finfo(hidden.dtype).min).amax(1)
    total = hidden.masked_fill(m == 0, 0).sum(1)                  # (B, H) (NaN padding: unread)
    count = m.sum(1).clamp(min=1)                                 # (B, 1)
    if pooling == "mean":
        return total / count
    if pooling == "mean_sqrt_len":
        return total / count.sqrt()
    raise ValueError(f"unknown pooling {pooling!r}; choose from {', '.join(POOLINGS)}")


def _pooling_dir(model_dir: Path) -> Optional[Path]:
    """Where the Pooling module's config lives: the folder modules.json names (a list of
    {"type", "path"} objects), else 1_Pooling. (`model_dir` may be the Transformer
    subfolder of a sentence-transformers layout of before 2.0: its top folder holds them.)"""
    from .checkpoint import st_top_folder
    model_dir = st_top_folder(model_dir)
    modules = model_dir / "modules.json"
    if not modules.is_file():
        return model_dir / "1_Pooling"
    entries = st_json(modules, list, "a list of modules")
    found = None
    for m in entries:
        if not (isinstance(m, dict) and isinstance(m.get("type"), str)
                and isinstance(m.get("path", ""), str)):
            raise NanobertError(f"{modules}: expected a list of modules with a string type "
                                f"and path, got {str(m)[:80]}")
        path = m.get("path", "")
        kind = m["type"].rsplit(".", 1)[-1]
        if kind not in ST_MODULES:
            raise NanobertError(f"{modules}: module {m['type']!r} ({path or 'the top folder'}) "
                                f"is not supported (nanobert runs a {', '.join(ST_MODULES[:-1])}"
                                f" and {ST_MODULES[-1]}): its embeddings would differ from the "
                                "checkpoint's")
        if kind == "Pooling" and found is None:
            if Path(path).is_absolute() or ".." in Path(path).parts:
                raise NanobertError(f"{modules}: the Pooling module's path {path!r} is not a "
                                    "folder of the model directory")
            found = model_dir / path
            if not (found / "config.json").is_file():
                raise NanobertError(f"{modules}: the Pooling module's "
                                    f"{found / 'config.json'} is missing")
    return found


def declared_normalize(model_dir) -> bool:
    """Does the checkpoint's sentence-transformers layout end in a Normalize module?
    A layout without one gives vectors of their own length (dot-product models), as
    sentence-transformers does; a directory without the layout is normalised (nanobert's
    default: cosine = dot product)."""
    if model_dir is None:
        return True
    from .checkpoint import st_top_folder
    modules = st_top_folder(Path(model_dir)) / "modules.json"
    if not modules.is_file():
        return True
    _pooling_dir(Path(model_dir))          # a modules.json it cannot read is refused there
    entries = st_json(modules, list, "a list of modules")
    return any(m["type"].rsplit(".", 1)[-1] == "Normalize" for m in entries)


def declared_pooling(model_dir) -> Optional[str]:
    """The pooling a sentence-transformers checkpoint declares, or None."""
    if model_dir is None:
        return None
    pool_dir = _pooling_dir(Path(model_dir))
    path = pool_dir / "config.json" if pool_dir is not None else None
    if path is None or not path.is_file():
        return None
    conf = st_json(path, dict, "a JSON object of pooling settings")
    modes = _pooling_modes(conf, path)
    odd = next((m for m in modes if m not in ST_POOLINGS), None)
    if odd is not None:
        raise NanobertError(f"{path}: pooling {odd!r} is not supported (nanobert pools by "
                            f"{', '.join(dict.fromkeys(ST_POOLINGS.values()))}); its embeddings "
                            "would differ from the checkpoint's")
    if len(modes) > 1:   # sentence-transformers joins the vectors of each, end to end
        raise NanobertError(f"{path}: poolings {' and '.join(modes)} are both on (one vector "
                            "of each, joined); nanobert pools one way: keep one")
    return ST_POOLINGS[modes[0]] if modes else None


def _pooling_modes(conf: dict, path: Path) -> list:
    """The pooling modes a Pooling config turns on: sentence-transformers 6 writes
    "pooling_mode": a name or a list of names; earlier versions one pooling_mode_* flag
    each (the names as ST_POOLINGS spells them)."""
    if "pooling_mode" in conf:
        v = conf["pooling_mode"]
        modes = [v] if isinstance(v, str) else v
        if not (isinstance(modes, list) and modes and all(isinstance(m, str) for m in modes)):
            raise NanobertError(f"{path}: pooling_mode must be a name or a list of names, "
                                f"got {str(v)[:80]}")
        return list(dict.fromkeys(modes))
    return [k for k, v in conf.items() if k.startswith("pooling_mode_") and v]


# sentence-transformers' modules nanobert runs (Dropout: nothing at inference, as in its
# encode), and its pooling settings: name -> ours
ST_MODULES = ("Transformer", "Pooling", "Normalize", "Dropout")
ST_POOLINGS = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean",
               "pooling_mode_max_tokens": "max", "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
               # sentence-transformers 6: "pooling_mode": one of these names, or a list
               "cls": "cls", "mean": "mean", "max": "max", "mean_sqrt_len_tokens": "mean_sqrt_len"}


def declared_prompt(model_dir) -> Optional[str]:
    """The prompt sentence-transformers puts before every text it encodes: the one
    `default_prompt_name` names in config_sentence_transformers.json (None: no default)."""
    conf = st_prompts(model_dir)
    name = conf.get("default_prompt_name")
    return (conf["prompts"][name] or None) if name is not None else None


def declared_include_prompt(model_dir) -> bool:
    """include_prompt of a checkpoint's Pooling config: false (instructor-style models)
    leaves the prompt's tokens out of the pooled vector."""
    pool_dir = _pooling_dir(Path(model_dir)) if model_dir is not None else None
    path = pool_dir / "config.json" if pool_dir is not None else None
    if path is None or not path.is_file():
        return True
    v = st_json(path, dict, "a JSON object of pooling settings").get("include_prompt", True)
    if not isinstance(v, bool):
        raise NanobertError(f"{path}: include_prompt must be true or false, got {v!r}")
    return v


def declared_reading(model_dir) -> tuple:
    """(prompt, lowercase): how a sentence-transformers checkpoint reads its texts, after
    its default prompt (None: none), lower-cased or not (`prepared_texts`)."""
    return declared_prompt(model_dir), declared_lowercase(model_dir)


def prepared_texts(texts: Sequence[str], reading: tuple) -> list:
    """`texts` as sentence-transformers hands them to the tokenizer, by `reading`
    (`declared_reading`): after the default prompt (E5-style 'query: '), lower-cased
    where its Transformer module says so. The encoder and the server's token counts both
    read these."""
    prompt, lower = reading
    texts = [prompt + t for t in texts] if prompt else list(texts)
    return [t.lower() for t in texts] if lower else texts


def prompt_positions(model_dir, tokenizer, reading: tuple) -> int:
    """How many leading positions pooling leaves out: with include_prompt false, those of
    the default prompt with the [CLS] before it, counted as sentence-transformers counts
    them (the prompt tokenized alone, less a trailing special token); else 0."""
    prompt, lower = reading
    if declared_include_prompt(model_dir) or not prompt:   # (a bad value refused either way)
        return 0
    ids = tokenizer.plain([prompt.lower() if lower else prompt])[0].ids
    return len(ids) - (bool(ids) and ids[-1] in set(tokenizer.special_ids))


def declared_lowercase(model_dir) -> bool:
    """do_lower_case of a sentence-transformers checkpoint: its Transformer module
    lower-cases every text before the tokenizer sees it."""
    path, conf = sbert_config(model_dir)
    v = conf.get("do_lower_case", False)
    if not isinstance(v, bool):
        raise NanobertError(f"{path}: do_lower_case must be true or false, got {v!r}")
    return v


# ----------------------------------------------------------------------------------
# Encoding


@torch.inference_mode()
def encoder_vectors(model, tokenizer, texts: Sequence[str], vector, pairs=None,
                    batch_size: int = 64, max_length: Optional[int] = None,
                    progress: bool = False) -> np.ndarray:
    """Run the encoder of `model` over `texts` (and `pairs`) in length-sorted batches and
    return `vector(encoder_output, attention_mask)` (B, H) per batch as one float32 array
    (n, H), rows in the order of `texts`. The one inference loop of embed and inspect.
    A `vector` marked `first_only = True` reads only each row's first token (the model
    then skips the rest of its last block: BertModel.forward's first_only).
    Texts are tokenized a chunk at a time, longest first (`encode_chunks`): all the
    encodings of a corpus at once took +690 MB for 200k short lines, and the progress bar
    waited for all of them."""
    base = getattr(model, "bert", model)       # the bare BertModel under any head
    texts = list(texts)
    if not texts:
        return np.zeros((0, base.config.hidden_size), dtype=np.float32)
    was_training = base.training
    if was_training:   # (a walk over every module: not on every call of a server)
        base.eval()
    pairs = None if pairs is None or all(p is None for p in pairs) else list(pairs)
    inputs = texts if pairs is None else list(zip(texts, pairs))
    # (never past the model's positions, whatever the caller or the tokenizer says)
    max_length = min(max_length or tokenizer.model_max_length, base.config.usable_positions)
    bar = progress_bar(progress, len(texts), "encoding", "text")
    out = None    # (each chunk's vectors go in at once: kept apart, then copied, took 2x)
    try:
        for chunk, encodings in encode_chunks(tokenizer, inputs, None, max_length,
                                              longest_first=True):
            vectors = _vectors(base, tokenizer, encodings, vector, batch_size, bar)
            if out is None:
                out = np.empty((len(texts), vectors.shape[1]), dtype=np.float32)
            out[chunk] = vectors
    finally:
        if was_training:
            base.train()
        bar.close()
    return out


def _vectors(base, tokenizer, encodings, vector, batch_size: int, bar) -> np.ndarray:
    """encoder_vectors' vectors of one chunk's encodings, in their order."""
    device = next(base.parameters()).device
    batches = sorted_batches([len(e.ids) for e in encodings], batch_size,
                             max_tokens=forward_tokens(device))
    # a small batch on a GPU: a CUDA graph of the padded forward (a `vector` with a key)
    graphs = CudaGraphs.of(base) if getattr(vector, "key", None) is not None else None

    def graphed(**batch):
        return vector(base(**batch, padded=True), batch["attention_mask"])

    def forward(idx):
        batch = tokenizer.pad([encodings[i] for i in idx])
        if graphs is not None:
            out = graphs.run(vector.key, graphed, batch, base.config.usable_positions)
            if out is not None:
                return out
        batch = {k: v.to(device) for k, v in batch.items()}
        out = base(**batch, first_only=getattr(vector, "first_only", False))
        return vector(out, batch["attention_mask"]).float().cpu()
    outs = []
    for idx, out in zip(batches, map_on_cores(forward, batches, cpu=device.type == "cpu")):
        outs.append(out)
        bar.update(len(idx))
    return restore_order(batches, torch.cat(outs)).numpy().astype(np.float32)


class Declared(NamedTuple):
    """How a checkpoint's files say its texts are read (`declared_settings`)."""
    pooling: str                 # 1_Pooling/config.json, else mean
    max_length: Optional[int]    # sentence_bert_config.json's max_seq_length
    reading: tuple               # (default prompt, lower-case): declared_reading
    skip: int                    # leading positions left out of pooling: prompt_positions


_DECLARED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def declared_settings(model, tokenizer) -> Declared:
    """What `model`'s checkpoint files declare about reading texts, read once per model
    (and tokenizer), as sentence-transformers reads them when it loads a model. Read on
    every `encode` call they cost 0.8 ms of file reads, 5% of a server's one-sentence
    request on a slow CPU."""
    source = getattr(model, "source_dir", None)
    cached = _DECLARED.get(model)
    if cached is not None and cached[0] == source and cached[1] is tokenizer:
        return cached[2]
    reading = declared_reading(source)
    out = Declared(default_pooling(model), declared_max_length(source), reading,
                   prompt_positions(source, tokenizer, reading))
    _DECLARED[model] = (source, tokenizer, out)
    return out


def encode(model, tokenizer, texts: Sequence[str], pooling: Optional[str] = None,
           normalize: bool = True, batch_size: int = 64,
           max_length: Optional[int] = None, progress: bool = False) -> np.ndarray:
    """Embed `texts` -> float32 array (n, H). `model` is a `Bert` (any head; only the
    encoder runs) or a `BertModel`. pooling=None takes the checkpoint's declared pooling
    (1_Pooling/config.json), else mean. Batches are cut from length-sorted texts so they
    carry little padding; the rows come back in the order of `texts`."""
    base = getattr(model, "bert", model)
    texts = check_texts(texts)
    declared = declared_settings(model, tokenizer)
    pooling = check_pooling(pooling if pooling is not None else declared.pooling)
    normalize = check_flag(normalize, "normalize")
    batch_size = check_count(batch_size or 1, "batch_size") if not texts else \
        check_count(batch_size, "batch_size")     # (none to batch: a server's empty call)
    max_length = max_length_arg(max_length) \
        or declared.max_length or tokenizer.model_max_length
    max_length = min(max_length, base.config.usable_positions)
    reading = declared.reading
    if reading[0]:     # (said once a tokenizer)
        from .tokenizer import note_once
        where = st_top_folder(Path(model.source_dir)) / "config_sentence_transformers.json"
        note_once(tokenizer, f"{where}: every text is encoded after the prompt "
                             f"{reading[0]!r} it makes the default, as sentence-transformers "
                             "does")
    texts = prepared_texts(texts, reading)
    skip = declared.skip                      # leading positions not pooled

    def vector(out, mask):
        if skip:                      # include_prompt: false (the mask is the pooling's only)
            mask = mask.clone()
            mask[:, :skip] = 0
        if pooling == "cls" and not skip:   # (first_only: the output holds the first tokens)
            v = out.last_hidden_state[:, 0].float()                   # (B, H)
        else:
            v = pool(out.last_hidden_state.float(), mask, pooling)    # (B, H)
        return torch.nn.functional.normalize(v, dim=-1) if normalize else v
    vector.first_only = pooling == "cls" and not skip
    vector.key = (pooling, normalize, skip)      # what a CUDA graph of it holds

    return encoder_vectors(model, tokenizer, texts, vector, batch_size=batch_size,
                           max_length=max_length, progress=progress)


TASK_HEADS = {"classify": "sequence classifier (or cross-encoder)", "token": "token tagger",
              "qa": "question-answering reader"}


def note_task_head(model_dir) -> None:
    """A note where a model read as an embedding model was fine-tuned for a task (its
    config.json declares a classifier, tagger or reader head): its encoder's pooled
    vector is used, which it was not trained to give (a cross-encoder given as
    `--model` or `--retriever` in place of a bi-encoder, say)."""
    from .checkpoint import family_of, read_config
    hf = read_config(Path(model_dir))
    fam = family_of(hf, Path(model_dir) / "config.json")
    head = next((h for h in map(fam.head_of, hf.get("architectures") or []) if h in TASK_HEADS),
                None)
    if head is not None:
        note(f"{model_dir}: a fine-tuned {TASK_HEADS[head]} (config.json's architectures), "
             "read here as an embedding model: its encoder's pooled vectors, which it was not "
             "trained to give")


def default_pooling(model) -> str:
    """What a checkpoint declares (1_Pooling/config.json), else mean."""
    return declared_pooling(getattr(model, "source_dir", None)) or "mean"


def check_pooling(pooling: str) -> str:
    if not isinstance(pooling, str) or pooling not in POOLINGS:
        raise NanobertError(f"unknown pooling {pooling!r}; choose from {', '.join(POOLINGS)}")
    return pooling


def max_length_arg(value) -> Optional[int]:
    """A `max_length` argument: None, or a whole number of tokens in the range of
    `--max-length`, refused in its words (`max_length: got 2, expected an integer >= 4`):
    a 1 turned truncation off, a 2 read every text as [CLS] [SEP], a 0 meant the default."""
    from .config import check_value, max_length_range
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"max_length must be {max_length_range().describe(int)} or None, "
                        f"got {type(value).__name__} {value!r}"[:200])
    check_value("max_length", int(value), int, max_length_range())
    return int(value)


def check_flag(value, name: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {type(value).__name__} "
                        f"{value!r}"[:200])
    return bool(value)


def _check_tokenizer(tokenizer):
    from .tokenizer import Tokenizer
    if not isinstance(tokenizer, Tokenizer):
        raise TypeError("Encoder(model, tokenizer): tokenizer must be a nanobert Tokenizer "
                        f"(nanobert.load gives one with the model), got "
                        f"{type(tokenizer).__name__} {tokenizer!r}"[:200])


def _loaded_model(model, tokenizer, dtype: str):
    """An in-memory (model, tokenizer) for Encoder, in the dtype asked for (an int8 copy
    for "int8": the caller's model is left as it was; None: as it is)."""
    import copy
    from .model import Bert, BertModel
    if not isinstance(model, (Bert, BertModel)):
        raise TypeError("Encoder(model): expected a model name or directory, a nanobert "
                        f"Bert/BertModel with its tokenizer, or (model, tokenizer); got "
                        f"{type(model).__name__}")
    if tokenizer is None:
        raise TypeError("Encoder(model, tokenizer): a loaded model needs its tokenizer")
    _check_tokenizer(tokenizer)
    own = getattr(model, "dtype_name", "float32")
    if dtype == "float32" and own == "int8":      # (it had silently stayed int8)
        raise ValueError("Encoder(dtype='float32'): the model given is int8 (quantize works "
                         "in place); load the model again to run it in float32")
    if dtype == "int8" and own != "int8":
        from .quantize import quantize
        model = quantize(copy.deepcopy(model), tokenizer)
    return model


def _one_of_0d(x):
    """np.array("a text") as the one text it holds (as np.str_ is one); anything else as
    it is."""
    return x.item() if getattr(x, "ndim", None) == 0 and hasattr(x, "item") else x


class Encoder:
    """A sentence encoder: model + tokenizer + pooling.

        enc = Encoder("minilm")                     # a name, a directory, or (model, tokenizer)
        enc.encode("A man is eating food.")         # (384,) one vector
        enc.encode(["a", "b"], batch_size=32)       # (2, 384)
        enc.search("a person eats", ["...", "..."], k=5)   # [(index, score, text)]

    A model given by name runs on the GPU where there is one; device="cpu" (or
    "cuda:1") says where, as sentence-transformers' device does."""

    def __init__(self, model="minilm", tokenizer=None, pooling: Optional[str] = None,
                 normalize: Optional[bool] = None, batch_size: int = 64,
                 max_length: Optional[int] = None, dtype: Optional[str] = None,
                 device: Optional[str] = None):
        from .quantize import dtype_name
        asked, dtype = dtype, dtype_name(dtype)     # (None: float32, or a given model's own)
        self.pooling = check_pooling(pooling) if pooling is not None else None
        self.normalize = check_flag(normalize, "normalize") if normalize is not None else None
        self.batch_size = check_count(batch_size, "batch_size")
        self.max_length = max_length_arg(max_length)
        if isinstance(model, tuple) and len(model) == 2 and tokenizer is None:
            model, tokenizer = model               # Encoder(nanobert.load(...))
        by_name = isinstance(model, (str, Path))
        if by_name:
            from . import load
            if tokenizer is not None:      # given with a model name: used, not dropped
                _check_tokenizer(tokenizer)
            model, own = load(model, head=None, dtype=dtype)
            note_task_head(model.source_dir)
            tokenizer = tokenizer or own
        else:
            model = _loaded_model(model, tokenizer, dtype if asked is not None else None)
            dtype = getattr(model, "dtype_name", "float32")
        vocab = getattr(model, "bert", model).config.vocab_size
        if tokenizer.vocab_size > vocab:   # (passed in loaded too: ids past it, or wrong ones)
            raise ValueError(f"Encoder(tokenizer): ids run to {tokenizer.vocab_size - 1}, past "
                             f"the model's vocabulary of {vocab}")
        if by_name or device is not None:   # (a model passed in stays where it is, unless asked)
            to_inference_device(model, dtype, device)
        self.model, self.tokenizer = model.eval(), tokenizer
        positions = getattr(model, "bert", model).config.usable_positions
        if self.max_length is not None and self.max_length > positions:
            note(f"max_length (--max-length) {self.max_length}: the model reads at most "
                 f"{positions} tokens, so texts are cut there")
        self.pooling = self.pooling or default_pooling(model)
        if self.normalize is None:   # as the checkpoint's layout says (Normalize or not)
            self.normalize = declared_normalize(getattr(model, "source_dir", None))
        self.name = str(getattr(model, "source_dir", None) or "model")

    @classmethod
    def from_pretrained(cls, name_or_dir="minilm", **kw) -> "Encoder":
        """Encoder(name_or_dir, **kw), spelled as sentence-transformers' and HF's loaders."""
        return cls(name_or_dir, **kw)

    def encode(self, texts, batch_size: Optional[int] = None, normalize: Optional[bool] = None,
               show_progress=False) -> np.ndarray:
        """One text -> a vector (H,); a list of texts -> an array (n, H), float32.
        `show_progress`: a bar on a terminal, a line every 30 s in a log ("log": the
        lines only)."""
        texts = _one_of_0d(texts)
        single = isinstance(texts, str)
        out = encode(self.model, self.tokenizer, [texts] if single else texts, self.pooling,
                     self.normalize if normalize is None else normalize,
                     self.batch_size if batch_size is None else batch_size,
                     self.max_length, show_progress if show_progress == "log"
                     else check_flag(show_progress, "show_progress"))
        return out[0] if single else out

    def identity(self) -> str:
        """A string that changes when the model's weights or the settings change."""
        parts = [f"pooling={self.pooling}", f"normalize={self.normalize}",
                 f"max_length={self.max_length}",
                 f"dtype={getattr(self.model, 'dtype_name', 'float32')}"]
        source = getattr(self.model, "source_dir", None)
        if source is not None:
            source = Path(source).resolve()
            reading = declared_reading(source)
            parts += [str(source), f"prompt={reading[0]!r}", f"lowercase={reading[1]}",
                      f"include_prompt={declared_include_prompt(source)}"]
            # config and tokenizer files, the sentence-transformers modules'
            # (1_Pooling/config.json) and, for a model in 0_Transformer/, its top folder's,
            # by their content: a file's size and time had let weights swapped for others
            # of the same size, with the time kept, reuse the old model's corpus vectors
            top = st_top_folder(source)
            files = {f for d in {source, top} for f in (*d.glob("*"), *d.glob("*/*"))}
            for f in sorted(files):
                if f.is_file() and f.suffix in (".json", ".txt", ".model"):
                    digest = hashlib.sha256(f.read_bytes()).hexdigest()[:16]
                    parts.append(f"{f.relative_to(top)}:{digest}")
        h = hashlib.sha256()       # the weights as loaded (0.1 s for minilm's 90 MB)
        for k, t in self.model.state_dict().items():
            h.update(k.encode())
            h.update(t.detach().cpu().float().numpy().tobytes())
        parts.append(h.hexdigest())
        return "|".join(parts)

    def search(self, query, corpus, k: int = 5, corpus_embeddings=None, rerank=None,
               rerank_k: Optional[int] = None):
        """Top-k corpus entries for one query (str) or several (list of str):
        [(index, score, text)] per query, best first. `corpus` is a list of texts or a
        file path (then the embeddings are cached beside it). `rerank`, a cross-encoder
        (`nanobert.Reranker`, or its directory), re-scores the `rerank_k` nearest entries
        (default RERANK_K) and keeps k."""
        k = check_count(k, "k")
        if rerank_k is not None and rerank is None:    # (it was ignored without a word)
            raise ValueError("rerank_k is the number of hits given to `rerank`: pass rerank "
                             "too, or leave rerank_k out")
        rerank_k = RERANK_K if rerank_k is None else rerank_k
        query = _one_of_0d(query)
        single = isinstance(query, str)
        queries = [query] if single else check_texts(query, "query")
        if rerank is not None:
            rerank = check_reranker(rerank)
            rerank_k = check_count(rerank_k, "rerank_k")
            first = self.search(query, corpus, max(k, rerank_k), corpus_embeddings)
            if rerank_k < k and (single or first):   # (it was raised without a word; a
                n = len(first if single else first[0])       # corpus under k is all read)
                which = f"the {n} nearest entries" if n == k else f"all {n} entries of the corpus"
                note(f"rerank_k (--rerank-k) {rerank_k} is under k (-k) {k}: {which} are reranked")
            return rerank.rerank_hits(query, first, k)
        if isinstance(corpus, (str, Path)):
            if corpus_embeddings is not None:   # (they were dropped without a word)
                raise ValueError("corpus_embeddings is for a corpus given as a list of texts; "
                                 "a corpus file's embeddings are computed and cached beside it")
            texts, corpus_embeddings = corpus_embeddings_cached(self, corpus)
        else:
            texts = check_texts(corpus, "corpus")
            corpus_embeddings = self._corpus_vectors(texts, corpus_embeddings)
        q = self.encode(queries)
        hits = [[(i, s, texts[i]) for i, s in row]
                for row in top_k(q, corpus_embeddings, k, self.normalize)]
        return hits[0] if single else hits

    def _corpus_vectors(self, texts: list, given) -> np.ndarray:
        """The corpus' vectors: `given` (checked: one row per text, this model's width)
        or computed."""
        if given is None:
            return self.encode(texts)
        if isinstance(given, torch.Tensor):
            given = given.detach().float().cpu().numpy()
        given = np.asarray(given)
        width = self.model.config.hidden_size
        if given.ndim != 2 or given.shape != (len(texts), width):
            raise ValueError(f"corpus_embeddings must have shape ({len(texts)}, {width}): one "
                             f"row per corpus text, this model's width; got {given.shape}")
        if given.dtype.kind not in "fiu":     # (None, complex: NaN scores, or a warning)
            raise ValueError(f"corpus_embeddings must be real numbers, got dtype {given.dtype}")
        given = given.astype(np.float32, copy=False)
        if not np.isfinite(given).all():      # (as a cached file's are checked)
            row = int(np.flatnonzero(~np.isfinite(given).all(1))[0])
            raise ValueError(f"corpus_embeddings row {row} holds NaN or infinity")
        if self.normalize:   # top_k takes a dot product for normalised vectors
            given = given / np.linalg.norm(given, axis=-1, keepdims=True).clip(1e-12)
        return given


def check_reranker(rerank):
    """search's `rerank`: a `nanobert.Reranker` (or anything with its `rerank_hits`), or
    a cross-encoder's directory, loaded as one; else a TypeError naming rerank."""
    from .retrieval import Reranker
    if isinstance(rerank, (str, Path)):
        return Reranker(rerank)
    if not callable(getattr(rerank, "rerank_hits", None)):
        raise TypeError("rerank must be a nanobert.Reranker (a cross-encoder) or its "
                        f"directory, got {type(rerank).__name__}")
    return rerank


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine similarity of rows: a (n, H), b (m, H) -> (n, m)."""
    a = a / np.linalg.norm(a, axis=-1, keepdims=True).clip(1e-12)
    b = b / np.linalg.norm(b, axis=-1, keepdims=True).clip(1e-12)
    return a @ b.T


def top_k(queries: np.ndarray, corpus: np.ndarray, k: int = 5, normalized: bool = False):
    """Cosine top-k: queries (q, H), corpus (n, H) -> per query [(index, score)]."""
    sims = queries @ corpus.T if normalized else cosine(queries, corpus)   # (q, n)
    k = min(k, corpus.shape[0])
    out = []
    for row in sims:
        best = np.argsort(-row, kind="stable")[:k]
        out.append([(int(i), float(row[i])) for i in best])
    return out


# ----------------------------------------------------------------------------------
# Reading inputs and caching corpus embeddings


def read_texts(path, text_column: Optional[str] = None) -> list[str]:
    """Texts to embed, read as `predict` reads its inputs (data.read_inputs): a
    classification file, labels optional (TSV/CSV/JSON Lines, MSRP: its text column, or
    `text_column`, pairs joined by a space), else plain text, one sentence a line (blank
    lines skipped). A BEIR corpus.jsonl gives each document's title and text, as BEIR
    evaluation embeds them. JSON or CoNLL columns in a file without their suffix are
    refused, not embedded line by line as if each line were a sentence."""
    # (not finetune: it imports the embed tasks)
    from .data import beir_corpus_texts, read_inputs
    documents = None if text_column else beir_corpus_texts(path)
    if documents is not None:
        return documents
    # (read_inputs refuses a column flag on one text a line, and notes blank lines it
    # skips in plain text: row i is the i-th sentence)
    examples = read_inputs(path, {"text_column": text_column})
    if not examples:
        raise NanobertError(f"{path}: no sentences")
    return [e.text_a if e.text_b is None else f"{e.text_a} {e.text_b}" for e in examples]


def is_embedding_cache(path: Path) -> bool:
    """Is `path` named as a corpus embedding cache of `_cache_paths`?"""
    return CACHE_NAME.fullmatch(path.name) is not None


CACHE_NAME = re.compile(r".+\.nanobert-[0-9a-f]{8}-[0-9a-f]{16}\.npy")   # corpus.nanobert-READER-TEXTS


def _cache_paths(corpus: Path, key: str) -> list[Path]:
    name = f"{corpus.name}.nanobert-{key}.npy"
    xdg = os.environ.get("XDG_CACHE_HOME", "")   # (empty or relative: ignored, as XDG says)
    if os.path.isabs(xdg):
        return [corpus.parent / name, Path(xdg) / "nanobert" / name]
    try:
        home = Path.home()
    except RuntimeError:      # (no home folder can be found)
        return [corpus.parent / name]
    # (a HOME that is not there is not made)
    return [corpus.parent / name] + ([home / ".cache" / "nanobert" / name] if home.is_dir() else [])


def _mode_writable(folder: Path) -> bool:
    """Does the folder's mode let someone write in it? Root may write in a folder of mode
    555 (a shared, read-only dataset's), which os.access does not refuse it either."""
    try:
        return bool(folder.stat().st_mode & 0o222)
    except OSError:
        return False


def _cached_array(path: Path, rows: int, width: int):
    """The cached (rows, width) float array at `path`, or None when there is none or it
    does not fit: unreadable, another shape (another model's width, another corpus),
    holding NaN/inf (a crash mid-write, a diverged model), or a row of zeros, which no
    encoder gives (a file zeroed on disk scored every line 0). A misfit is rebuilt."""
    if not path.is_file() or path.is_symlink():   # (a link is nobody's cache: skipped)
        return None
    try:
        emb = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError):
        return None
    ok = (emb.ndim == 2 and emb.shape == (rows, width) and emb.dtype.kind == "f"
          and bool(np.isfinite(emb).all()) and bool(np.abs(emb).max(1, initial=0).all()))
    return emb if ok else None


def corpus_embeddings_cached(encoder: Encoder, corpus_path, verbose: bool = False,
                             text_column: Optional[str] = None):
    """(texts, embeddings) of a corpus file; embeddings are read from the cache when the
    texts read (not the file's bytes: the same file read another way, another column or
    a BEIR document's title, embeds other texts) and the model/settings are unchanged,
    else computed and cached (beside the corpus, or under ~/.cache/nanobert when that
    folder is not writable)."""
    corpus = Path(corpus_path)
    texts = read_texts(corpus, text_column)
    # READER-TEXTS: who read which corpus file how (its path too: in ~/.cache/nanobert two
    # corpora of one name meet), and what it read
    resolved = corpus.resolve()
    where = str(resolved).encode("utf-8", "surrogateescape")
    reader = hashlib.sha256(f"{encoder.identity()}\0{text_column}\0".encode()
                            + where).hexdigest()[:8]
    h = hashlib.sha256()
    for t in texts:
        h.update(t.encode("utf-8", "surrogatepass") + b"\0")
    key = f"{reader}-{h.hexdigest()[:16]}"
    candidates = _cache_paths(resolved, key)
    width = encoder.model.config.hidden_size
    for c in candidates:
        emb = _cached_array(c, len(texts), width)
        if emb is not None:
            if verbose:
                print(f"using cached embeddings {c}", file=sys.stderr)
            return texts, emb
    emb = encoder.encode(texts, show_progress=verbose)
    for c in candidates:
        if c.is_symlink():   # (planted beside a shared corpus, it was written through)
            continue
        if c.parent == resolved.parent and not _mode_writable(c.parent):
            continue         # (root writes through a read-only mode: a shared dataset's)
        try:
            with atomic_path(c, mode=_cache_mode(corpus)) as tmp:
                with open(tmp, "wb") as f:
                    np.save(f, emb)
            if verbose:
                print(f"cached corpus embeddings in {c}", file=sys.stderr)
            _prune_stale(c, reader, verbose)
            break
        except (OSError, NanobertError):
            continue
    else:   # (every later search encoded the corpus again, unsaid)
        if verbose:
            where = " or ".join(map(str, candidates))
            print(f"no cache of the corpus embeddings could be written ({where}): the next "
                  "search encodes the corpus again", file=sys.stderr)
    return texts, emb


def _prune_stale(cache: Path, reader: str, verbose: bool) -> None:
    """Remove the caches beside `cache` of the same corpus file (its path) read by the same
    model and settings but holding other texts: the corpus was edited since, and they
    cannot be used again (each edit of a big corpus left one more corpus-sized file
    behind). Only regular files of this user's are removed; caches of other models, and
    of other corpora of the same name in ~/.cache/nanobert, are kept."""
    stem = cache.name[:-len(".npy")].rsplit("-", 1)[0]         # corpus.nanobert-READER
    for old in cache.parent.glob(f"{glob.escape(stem)}-{'[0-9a-f]' * 16}.npy"):
        if old == cache:
            continue
        try:
            st = old.lstat()
            if stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid():
                old.unlink()
                if verbose:
                    print(f"removed {old}: a cache of this corpus before it changed",
                          file=sys.stderr)
        except OSError:
            pass


def _cache_mode(corpus: Path) -> int:
    """A cache is readable by whom the corpus is, at most (a private corpus's vectors were
    left for everyone to read)."""
    from .files import file_mode
    try:
        return file_mode() & stat.S_IMODE(corpus.stat().st_mode)
    except OSError:
        return file_mode()


# ----------------------------------------------------------------------------------
# Command line


def _common(p):
    p.add_argument("--model", default="minilm", help="model directory, 'minilm', or a hub name")
    p.add_argument("--pooling", choices=POOLINGS, default=None,
                   help="token pooling (default: what the checkpoint declares, else mean)")
    norm = p.add_mutually_exclusive_group()
    norm.add_argument("--normalize", dest="normalize", action="store_const", const=True,
                      help="L2-normalise the vectors (the default, but for a "
                           "sentence-transformers layout without a Normalize module)")
    norm.add_argument("--no-normalize", dest="normalize", action="store_const", const=False,
                      help="do not L2-normalise the vectors")
    p.add_argument("--batch-size", type=checked(int, at_least(1), "--batch-size"), default=64,
                   help="texts per forward pass")
    p.add_argument("--max-length", type=checked(int, max_length_range(), "--max-length"), default=None,
                   help="truncate texts to this many tokens (default: the model's)")
    add_dtype_flag(p)
    p.add_argument("--text-column", default=None,
                   help="the column (TSV/CSV header name, or 0-based index for a file "
                        "without a header) or field (JSONL) holding the text (default: "
                        "sentence, text, ... as in finetune)")


def _encoder(args) -> Encoder:
    return Encoder(args.model, pooling=args.pooling, normalize=args.normalize,
                   batch_size=args.batch_size, max_length=args.max_length, dtype=args.dtype)


def embed_args(p):
    _common(p)
    p.add_argument("--input", required=True,
                   help="text file, one sentence per line, or a labelled .tsv/.csv/.jsonl "
                        "file; - reads the standard input")
    p.add_argument("--out", required=True, help="output .npy file (n, hidden) float32")


def embed_cmd(args):
    """Sentence embeddings of a file's sentences, saved as a .npy array (n, hidden)."""
    check_output_file(args.out, "--out", (".npy",), inputs=[args.input])
    with spooled_stdin(args.input) as path:
        texts = read_texts(path, args.text_column)
    enc = _encoder(args)
    emb = enc.encode(texts, show_progress=True)   # (a bar on a terminal, lines in a log)
    with atomic_path(args.out) as tmp:
        with open(tmp, "wb") as f:
            np.save(f, emb)
    print(f"{emb.shape[0]} sentence{'s' if emb.shape[0] != 1 else ''} -> {args.out} ({emb.shape[0]} x {emb.shape[1]}, "
          f"{enc.pooling} pooling, {'normalised' if enc.normalize else 'not normalised'})")
    return 0


def search_args(p):
    _common(p)
    p.add_argument("--corpus", required=True,
                   help="documents: a text file (one a line) or a .tsv/.csv/.jsonl table "
                        "(its text column: --text-column)")
    p.add_argument("--query", required=True, action="append",
                   help="query text (repeat for several queries)")
    p.add_argument("-k", "--top-k", dest="k", type=checked(int, at_least(1), "-k"), default=5,
                   help="how many results")
    p.add_argument("--json", action="store_true", help="print results as JSON")
    p.add_argument("--rerank", metavar="MODEL", help="a cross-encoder (`finetune --task "
                   "rerank`) or a pair classifier of two labels that re-scores the nearest "
                   "--rerank-k lines")
    p.add_argument("--rerank-k", type=checked(int, at_least(1), "--rerank-k"), default=None,
                   help=f"with --rerank: how many nearest lines to re-score (default: "
                        f"{RERANK_K})")


def search_cmd(args):
    """Cosine semantic search: the k corpus lines closest to a query (optionally reranked)."""
    from .retrieval import Reranker
    if not all(q.strip() for q in args.query):
        raise NanobertError("--query: empty query text")
    if args.rerank_k is not None and not args.rerank:   # else dropped without a word
        raise NanobertError("--rerank-k needs --rerank MODEL")
    reranker = Reranker(args.rerank, batch_size=args.batch_size,   # (--dtype: both models)
                        dtype=args.dtype) if args.rerank else None
    enc = _encoder(args)
    for q, e in zip(args.query, enc.tokenizer.plain(args.query,
                                                      add_special_tokens=False)):
        if not e.ids:     # (a zero-width space: a vector of [CLS] and [SEP], ranked by)
            raise NanobertError(f"--query: no tokens in {q[:40]!r} (the tokenizer keeps none "
                                "of its characters): nothing to search with")
    texts, emb = corpus_embeddings_cached(enc, args.corpus, verbose=True,
                                          text_column=args.text_column)
    results = enc.search(args.query, texts, k=args.k, corpus_embeddings=emb, rerank=reranker,
                         rerank_k=args.rerank_k)
    if args.json:
        print(json.dumps([{"query": q, "hits": [{"index": i, "score": round(s, 6), "text": t}
                                                for i, s, t in hits]}
                          for q, hits in zip(args.query, results)]))
        return 0
    for q, hits in zip(args.query, results):      # one hit a line: line breaks escaped
        print(f"query: {one_line(q)}")
        for rank, (i, s, t) in enumerate(hits, 1):
            print(f"{rank:>3}. {s:.4f}  {one_line(t)}")
    return 0
