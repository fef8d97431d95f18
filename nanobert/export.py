"""`nanobert export`: a model as ONNX, for ONNX Runtime, OpenVINO or a serving stack.

    nanobert export --format onnx runs/sst2 exported/sst2 [--dtype int8]

OUT becomes a model directory: config.json, model.safetensors and the tokenizer files
(so nanobert and transformers still load it), plus `model.onnx` (fp32) and, with
`--dtype int8`, `model_quantized.onnx` (ONNX Runtime's dynamic int8 of the same graph:
int8 weights per output channel, activations quantized per call).

The graph takes input_ids, attention_mask and token_type_ids, each (batch, sequence)
int64 with both axes dynamic (families without segments, DistilBERT and ModernBERT, and
RoBERTa's one segment, which every token reads, take no token_type_ids), and returns the
head's outputs under transformers' names (OUTPUTS; a bare encoder whose checkpoint has
no trained pooler, such as DistilBERT's or ModernBERT's, gives no pooler_output). It is
traced from the padded layout (`attn_backend="sdpa"`): the unpadded layout gathers a
data-dependent number of tokens and loops over length groups in Python, which a static
graph cannot hold. On real (non-padding) positions the outputs
equal nanobert's to 1e-4; what a graph writes on padding positions is unspecified.
"""
from __future__ import annotations

import contextlib
import copy
import io
import re
import shutil
import warnings
from pathlib import Path

import torch
import torch.nn as nn

from .files import NanobertError, atomic_path, check_not_input, check_output_dir
from .quantize import dtype_flag
from .rundir import RUN_FILE, ST_MODULE_DIR

INPUTS = ("input_ids", "attention_mask", "token_type_ids")
BT, B = {0: "batch", 1: "sequence"}, {0: "batch"}
# head -> its outputs, each with its dynamic axes
OUTPUTS = {
    None: {"last_hidden_state": BT, "pooler_output": B},
    "mlm": {"logits": BT},
    "pretraining": {"logits": BT, "pair_logits": B},
    "classify": {"logits": B},
    "regression": {"logits": B},
    "token": {"logits": BT},
    "qa": {"start_logits": BT, "end_logits": BT},
}
# families whose graphs are checked against nanobert (tests/test_export.py). DeBERTa's
# relative-position index is traced with the example's length and fails on others.
FAMILIES = ("bert", "roberta", "xlm-roberta", "camembert", "electra", "albert", "distilbert",
            "modernbert")
OPSET = 17
MIN_OPSET = 14   # scaled_dot_product_attention's operators (Trilu, ...) need 14


def outputs_of(model) -> dict:
    """The graph's outputs for `model`: its head's (OUTPUTS), less a bare encoder's
    pooler_output when the checkpoint has no trained pooler (DistilBERT and ModernBERT
    encoders, a masked-LM file): its values would be a seeded initialisation, not a
    vector anything was trained to give."""
    from .checkpoint import new_pooler
    outputs = dict(OUTPUTS[model.head])
    if new_pooler(model):
        outputs.pop("pooler_output", None)
    return outputs


class _Graph(nn.Module):
    """The model with plain tensor inputs and a tuple of the head's outputs."""

    def __init__(self, model, names):
        super().__init__()
        self.model, self.names = model, tuple(names)

    def forward(self, input_ids, attention_mask, token_type_ids):
        out = self.model(input_ids, attention_mask, token_type_ids)
        named = {"last_hidden_state": out.hidden.last_hidden_state,
                 "pooler_output": out.hidden.pooler_output, "logits": out.logits,
                 "pair_logits": out.pair_logits, "start_logits": out.start_logits,
                 "end_logits": out.end_logits}
        return tuple(named[k] for k in self.names)


def check_exportable(model) -> None:
    """A one-line NanobertError for a model the exporter does not cover."""
    from .model import Bert
    if not isinstance(model, Bert):
        raise TypeError(f"ONNX export takes a nanobert Bert (nanobert.load(...)[0]), got "
                        f"{type(model).__name__}")
    family, head = model.config.family, model.head
    if getattr(model, "dtype_name", "float32") != "float32":
        raise NanobertError("export takes the fp32 model; ask for int8 with --dtype int8 "
                            "(ONNX Runtime quantizes the exported graph)")
    if family not in FAMILIES:
        raise NanobertError(f"ONNX export supports the families {', '.join(FAMILIES)}; "
                            f"this model is {family}")
    if head not in OUTPUTS:
        raise NanobertError(f"ONNX export has no outputs for head {head!r}")


def onnx_bytes(model, opset: int = OPSET) -> bytes:
    """The fp32 ONNX graph of `model` (its weights are not changed)."""
    if not isinstance(opset, int) or isinstance(opset, bool) or opset < MIN_OPSET:
        # (opset 5: torch printed its whole graph to stdout, then failed on arange)
        raise ValueError(f"opset must be an ONNX opset number >= {MIN_OPSET} (the attention "
                         f"graph's operators), got {opset!r}")
    check_exportable(model)
    outputs = outputs_of(model)
    graph = _Graph(copy.deepcopy(model), outputs).eval().cpu()   # (CUDA: traced on CPU)
    graph.model.config.attn_backend = "sdpa"    # the padded layout: a static graph
    example = {"input_ids": torch.tensor([[2, 5, 6, 3], [2, 7, 3, 0]]),
               "attention_mask": torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]]),
               "token_type_ids": torch.zeros(2, 4, dtype=torch.long)}
    names = list(outputs)
    axes = {k: BT for k in INPUTS} | outputs
    f = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        # the TorchScript exporter: the dynamo one needs onnxscript, which we do not ship
        warnings.simplefilter("ignore")
        torch.onnx.export(graph, tuple(example[k] for k in INPUTS), f, dynamo=False,
                          input_names=list(INPUTS), output_names=names, dynamic_axes=axes,
                          opset_version=opset)
    return f.getvalue()


def quantize_onnx(src: Path, dst: Path) -> None:
    """ONNX Runtime's dynamic int8: int8 weights per channel, activations per call. The
    weights get 7 bits (`reduce_range`): on CPUs without VNNI (AVX2) the products of
    8-bit weights and activations saturate (ALBERT's hidden states were 6.9% off)."""
    import logging
    from onnxruntime.quantization import QuantType, quantize_dynamic
    root = logging.getLogger()
    level, root.level = root.level, logging.ERROR  # its advice to pre-process the graph
    try:
        quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8, per_channel=True,
                         reduce_range=True)
    finally:
        root.setLevel(level)


# what a model directory says besides config, weights and tokenizer, copied along so the
# export is used as the model was: nanobert.json (task, max_length), the
# sentence-transformers modules (pooling, max_seq_length)
SIDE_FILES = ("nanobert.json", "modules.json", "sentence_bert_config.json",
              "config_sentence_transformers.json")
ST_MODULE = re.compile(ST_MODULE_DIR)


# what an export writes: the graphs, save_model's files (config, weights, any family's
# tokenizer files) and SIDE_FILES / sentence-transformers module folders
EXPORT_FILES = {"model.onnx", "model_quantized.onnx", "config.json", "model.safetensors",
                "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                "vocab.txt", "vocab.json", "merges.txt", "added_tokens.json", *SIDE_FILES}


def _exported(p: Path) -> bool:
    return (p.name in EXPORT_FILES and p.is_file()) or (ST_MODULE.fullmatch(p.name) is not None
                                                        and p.is_dir())


def check_export_out(out_dir, model_name=None, flag: str = "OUT") -> Path:
    """OUT is a new or empty directory, or an earlier export (replaced as a whole); never
    the model itself, another model or run, a folder of other files, or the current
    directory. `flag` is how messages name it (the CLI's OUT, or export_onnx's
    argument). Returns it as a Path, `~` expanded (as model paths are)."""
    import os
    if not isinstance(out_dir, (str, os.PathLike)) or not str(out_dir).strip():
        raise TypeError(f"{flag}: expected a directory (str or path), got {out_dir!r}")
    out_dir = Path(out_dir).expanduser()
    here = Path.cwd().resolve()
    if out_dir.exists() and out_dir.resolve() in (here, *here.parents):
        raise NanobertError(f"{flag} {out_dir}: is the current directory (or holds it), "
                            "which an export replaces as a whole: your shell would be left "
                            f"in a deleted directory; give another {flag}, or run from "
                            "its parent")
    if out_dir.suffix.lower() == ".onnx" and not out_dir.is_dir():
        raise NanobertError(f"{flag} {out_dir} names a file, but {flag} is a directory (the "
                            f"model files plus model.onnx): try {out_dir.with_suffix('')}")
    check_output_dir(out_dir, flag)
    given = Path(str(model_name)) if model_name else None
    if given is not None and given.exists() and given.resolve() == out_dir.resolve():
        raise NanobertError(f"{flag} {out_dir}: is the model being exported; writing it would "
                            f"destroy it (choose another {flag})")
    # an earlier export: model.onnx, no run's record, and nothing an export does not write
    # (a notes file or a data folder beside a model.onnx was deleted with it)
    entries = sorted(out_dir.iterdir()) if out_dir.is_dir() else []
    other = next((p.name for p in entries if not _exported(p)), None)
    onnx = (out_dir / "model.onnx").is_file()
    if entries and (other is not None or not onnx or (out_dir / RUN_FILE).exists()):
        what = "a model" if (out_dir / "config.json").exists() else "other files"
        why = f" ({other} is not an export's)" if other and onnx else ""
        raise NanobertError(f"{flag} {out_dir} already holds {what} and is not an earlier "
                            f"export{why}; choose a new or empty directory")
    # an earlier export is replaced whole (no stale model_quantized.onnx), but never one
    # that holds the model being exported
    check_not_input(out_dir, [model_name], flag)
    return out_dir


def need_onnx(dtype: str) -> None:
    """The optional packages an ONNX export needs, or one line on installing them (a
    traceback from torch, "Module onnx is not installed!", had said it)."""
    from .files import need
    for name in ("onnx",) + (("onnxruntime",) if dtype == "int8" else ()):
        need(name, "export" + (" --dtype int8" if dtype == "int8" else ""),
             "pip install 'nanobert[onnx]'")


def export_onnx(model, out_dir, tokenizer=None, dtype: str = "float32") -> Path:
    """Write the model directory `out_dir` with model.onnx (and model_quantized.onnx for
    dtype "int8"), with the source directory's nanobert.json and sentence-transformers
    files. The directory is built beside `out_dir` and renamed into place: an earlier
    export there is replaced whole, a failed or interrupted one leaves nothing. Returns
    the path of the graph asked for."""
    from .checkpoint import save_model
    from .quantize import dtype_name
    dtype = dtype_name(dtype)
    need_onnx(dtype)
    # (as the CLI's OUT: replacing a directory whole must not take a model or other files)
    source = getattr(model, "source_dir", None)
    out_dir = check_export_out(out_dir, source, "export_onnx(out_dir)")
    if tokenizer is None and source is not None:   # (else a folder nothing could read)
        from .tokenizer import Tokenizer
        with contextlib.suppress(NanobertError):   # (a source saved without one: none)
            tokenizer = Tokenizer.from_dir(source)
    data = onnx_bytes(model)
    with atomic_path(out_dir) as tmp:
        save_model(model, tmp, tokenizer=tokenizer)
        _copy_side_files(source, tmp)
        (tmp / "model.onnx").write_bytes(data)
        if dtype == "int8":
            quantize_onnx(tmp / "model.onnx", tmp / "model_quantized.onnx")
    return out_dir / ("model.onnx" if dtype == "float32" else "model_quantized.onnx")


def _copy_side_files(source, dest: Path) -> None:
    """The files beside the weights that say how the model is run (nanobert.json, the
    sentence-transformers layout). A layout from before sentence-transformers 2.0 keeps
    the model in a subfolder (0_Transformer/, the one `source` then is): its Pooling and
    Normalize folders are above it, and the export, whose model files are at its top,
    gets a modules.json that points the Transformer there."""
    import json
    from .checkpoint import st_top_folder
    if source is None or not Path(source).is_dir():
        return
    inner = Path(source)
    top = st_top_folder(inner)
    for folder in dict.fromkeys((inner, top)):       # (the model's own files win)
        for p in sorted(folder.iterdir()):
            if p.name in SIDE_FILES and p.is_file() and not (dest / p.name).exists():
                shutil.copyfile(p, dest / p.name)
            elif ST_MODULE.fullmatch(p.name) and p.is_dir() and p != inner \
                    and not (dest / p.name).exists():
                shutil.copytree(p, dest / p.name)
    if top != inner and (dest / "modules.json").is_file():
        modules = json.loads((dest / "modules.json").read_text())
        for m in modules:
            if isinstance(m, dict) and m.get("path") == inner.name:
                m["path"] = ""
        (dest / "modules.json").write_text(json.dumps(modules, indent=2))


# --format values
EXPORTERS = {"onnx": export_onnx}


def export_args(p):
    p.add_argument("model", help="model directory, 'minilm', or a hub name")
    p.add_argument("out", help="directory to write (the model files plus the graph)")
    p.add_argument("--format", choices=sorted(EXPORTERS), default="onnx",
                   help="what to export to")
    p.add_argument("--dtype", default="float32", type=dtype_flag, choices=("float32", "int8"),
                   help="int8: also write model_quantized.onnx (ONNX Runtime dynamic int8)")
    p.add_argument("--int8", action="store_true", help="the same as --dtype int8")


def export_cmd(args):
    """Export a model to ONNX (dynamic batch and sequence axes; optional int8)."""
    from . import load
    if getattr(args, "int8", False):
        if "dtype" in getattr(args, "_given", ()) and args.dtype != "int8":
            raise NanobertError(f"--int8 and --dtype {args.dtype} ask for different "
                                "models: give one of them")
        args.dtype = "int8"
    out = check_export_out(args.out, args.model)    # before loading or tracing anything
    need_onnx(args.dtype)
    model, tokenizer = load(args.model)
    source = getattr(model, "source_dir", None)  # 'minilm' or a hub name: now a directory
    if source is not None:
        check_not_input(out, [source], "OUT")
    path = EXPORTERS[args.format](model, out, tokenizer, args.dtype)
    also = f"{path.with_name('model.onnx')} and " if path.name != "model.onnx" else ""
    print(f"wrote {also}{path} (outputs: {', '.join(outputs_of(model))})")
    return 0
