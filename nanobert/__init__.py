"""nanobert: BERT-style encoders in readable PyTorch.

The Python API, in the words people already know from sentence-transformers and
transformers' pipelines:

    import nanobert
    enc = nanobert.Encoder("minilm")                     # embeddings and search
    enc.encode("A sentence.")                            # (384,)
    enc.encode(["one", "two"], batch_size=32)            # (2, 384)
    enc.search("a query", ["doc one", "doc two"], k=1)   # [(index, score, text)]
    rr = nanobert.Reranker("runs/reranker")              # a cross-encoder `finetune` wrote
    enc.search("a query", docs, k=5, rerank=rr)          # top 100 by cosine, reranked

    clf = nanobert.Predictor("runs/sst2")                # a directory `finetune` wrote
    clf.predict("a gripping film")                       # {'label', 'probability', 'text'}

    cfg = nanobert.FinetuneConfig(task="classify", model="minilm", train="train.tsv",
                                  dev="dev.tsv").replace(out_dir="runs/sst2", epochs=1)
    nanobert.finetune(cfg)                               # the best dev metrics

    model, tokenizer = nanobert.load("minilm")           # the model itself (nn.Module)
"""
from . import threads  # noqa: F401  (first: sets the OpenMP wait policy before torch loads)

import importlib
import sys
import types

from .files import NanobertError

__version__ = "0.1.0"

# The API's names, each imported from its module when first used (PEP 562): importing
# nanobert, as the command line does before its main() can answer a Ctrl-C, loads no
# torch. name -> the module that defines it
_LAZY = {"Encoder": "embed", "FinetuneConfig": "finetune", "Predictor": "finetune",
        "finetune": "finetune", "PRESETS": "model", "Bert": "model", "BertConfig": "model",
        "BertModel": "model", "preset": "model", "PretrainConfig": "pretrain",
        "run_pretrain": "pretrain", "Reranker": "retrieval", "Tokenizer": "tokenizer",
        "TrainConfig": "train"}


def __getattr__(name: str):
    """A name of the API (imported once, then an attribute like any other), or a
    submodule (`nanobert.model` without importing it first, as before)."""
    if name in _LAZY:
        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    if not name.startswith("__"):
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


class _Package(types.ModuleType):
    """This package. Importing the submodule nanobert.finetune sets the package's
    attribute `finetune` to it; the API's `nanobert.finetune` is the function of that
    name, which the attribute stays (read from the module by __getattr__)."""

    def __setattr__(self, name, value):
        if isinstance(value, types.ModuleType) and name in _LAZY and \
                value.__name__ == f"{__name__}.{name}":
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def load(name_or_dir, head="auto", dtype="float32", **config_overrides):
    """(model, tokenizer) from a HF directory, the alias 'minilm', or a hub name; the
    model in eval mode (dropout off), as transformers' from_pretrained gives it.
    head='auto' takes the checkpoint's head; None gives the bare encoder.
    dtype="int8": int8 Linear layers for CPU inference (`nanobert.quantize`).
    config_overrides: BertConfig fields, e.g. attn_backend="eager"."""
    from .checkpoint import load_model, resolve
    from .quantize import dtype_name, to_dtype
    from .tokenizer import Tokenizer
    _check_load_args(name_or_dir, head, config_overrides)
    dtype = dtype_name(dtype)                    # before the weights are read
    model = load_model(name_or_dir, head=head, **config_overrides)
    tokenizer = Tokenizer.from_dir(resolve(name_or_dir))
    if tokenizer.vocab_size > model.config.vocab_size:  # else an IndexError at some input
        raise NanobertError(f"{resolve(name_or_dir)}: the tokenizer's ids run to "
                            f"{tokenizer.vocab_size - 1}, past the model's vocab_size "
                            f"{model.config.vocab_size} (config.json): a vocabulary from "
                            "another model?")
    positions = model.config.usable_positions
    specials = tokenizer.tk.num_special_tokens_to_add(True)
    if model.config.position_embedding_type == "absolute" and positions <= specials:
        # (no truncation fits a pair's special tokens: a ValueError at every input)
        raise NanobertError(f"{resolve(name_or_dir)}: the model reads at most {positions} "
                            f"tokens (max_position_embeddings, config.json), no more than the "
                            f"{specials} special tokens of a text pair: too few to read text")
    if model.config.position_embedding_type == "absolute" and tokenizer.model_max_length > positions:
        # (tokenizer_config.json says 512 for a model of 128 positions, say: tok(long_text)
        # would be a ValueError in the model's forward, not a truncation)
        tokenizer = tokenizer.with_max_length(positions)
    return to_dtype(model.eval(), dtype, tokenizer), tokenizer


def _check_load_args(name_or_dir, head, overrides) -> None:
    """load()'s arguments, each refused by name before anything is read."""
    import os

    from .model import HEADS, BertConfig
    if not isinstance(name_or_dir, (str, os.PathLike)):
        raise TypeError(f"load(name_or_dir): expected a model name or directory (str or "
                        f"path), got {type(name_or_dir).__name__}")
    if not str(name_or_dir).strip():
        raise NanobertError("load(name_or_dir): empty model name")
    if head != "auto" and head not in HEADS:
        raise NanobertError(f"load(head={head!r}): choose 'auto', None or one of "
                            f"{', '.join(h for h in HEADS if h)}")
    unknown = sorted(set(overrides) - set(BertConfig.__dataclass_fields__))
    if unknown:
        raise TypeError(f"load() got an unexpected keyword argument {unknown[0]!r} (not a "
                        "BertConfig field)")
    backend = overrides.get("attn_backend")
    if backend is not None and backend not in ("eager", "sdpa", "unpadded"):
        raise NanobertError(f"load(attn_backend={backend!r}): choose eager, sdpa or unpadded")


__all__ = ["Bert", "BertConfig", "BertModel", "Encoder", "FinetuneConfig", "NanobertError",
           "PRESETS", "Predictor", "PretrainConfig", "Reranker", "Tokenizer", "TrainConfig", "finetune",
           "load", "preset", "run_pretrain"]
