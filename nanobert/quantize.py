"""int8 inference: 8-bit weights, activations quantized on the fly, fp32 everywhere else.

What `quantize(model, calibration)` changes: the four Linear layers of every block
(fused QKV, the attention output, the FFN up and down projections), which hold 95% of
the model's multiply-adds. Each weight matrix is rounded once to int8 with one scale
per output row. At run time each input matrix is quantized to 8 bits with a scale from
its own min and max (dynamic quantization), multiplied in int8 with int32 sums, and
comes back as fp32 with the bias added, inside one fbgemm kernel. Embeddings,
LayerNorm, softmax, GELU, the pooler and the task heads stay fp32, so the unpadded
layout and the attention backends work unchanged.

Outlier channels. One scale per input matrix is what makes the kernel fast, and BERT
is hostile to it: a few hidden channels carry values 10-100x the others on special
tokens ([CLS], [SEP]); in minilm channel 99 reaches 28 where the median token peaks
near 3. That one value sets the scale of the whole batch, and the short sentences lose
their precision (sentence-embedding cosine to fp32 fell to 0.97). So each Linear keeps
the `OUTLIERS` input channels with the largest values on a calibration batch in fp32:
they are zeroed before quantizing and added back as a rank-k fp32 product. The channels
are a property of the weights (they appear on any text), so a few sentences find them.
Only the layers that have them pay for this: a Linear whose largest input channel peaks
under `OUTLIER_RATIO` x its median channel's peak (in minilm five of the six attention
output projections and the FFN down projections of the last two blocks) runs plain int8, which
measured 7% faster over SST-2 dev with the same cosine to fp32 (0.995). The zeroing is
done in place on the input and undone after the product (no copy of the activations).

Why torch's own kernels (`torch.ops.quantized.linear_dynamic`, fbgemm) and not torchao:
on this repository's 2-core AVX-512 VNNI machine a (800 x 384) @ (384 x 1536) product
ran at about 330 G int8-ops/s through fbgemm and 45-100 through torchao 0.18's
`Int8DynamicActivationInt8WeightConfig` in eager mode, which quantizes the activation
in separate passes (docs/deploy.md).

CPUs without VNNI (AVX2 alone, or AVX-512 without it). There fbgemm multiplies the
unsigned 8-bit activations by the signed 8-bit weights two at a time into a saturating
16-bit sum (vpmaddubsw), and 255 x 127 x 2 overflows it: a product of extreme values
came out 30% wrong. torch's answer (`reduce_range`) halves the activations' range to 7
bits, which on SST-2 dev put the sentence-embedding cosine to fp32 at 0.978 (min over
872 sentences). nanobert halves the weights' instead (|q| <= 63 per output row, so
255 x 63 x 2 = 32130 always fits) and keeps all 8 bits of the activations, whose one
scale per matrix is the coarse one: min cosine 0.992, and no sum saturates on any input.

An int8 model is for inference only: its Linear layers have no gradients and it is
not saved; keep the fp32 checkpoint and quantize when loading:
`nanobert.load(name, dtype="int8")`.
"""
from __future__ import annotations

import functools
import warnings
from pathlib import Path
from typing import Optional

import torch
import torch.nn as nn

from .files import NanobertError
from .model import ACTIVATIONS

# the Linear layers of a block that are quantized (names inside nanobert.model.Block)
QUANTIZED = ("attn.qkv", "attn.proj", "up", "down")
OUTLIERS = 4  # input channels per Linear kept in fp32 (cosine to fp32 0.994 vs 0.970 with 0)
OUTLIER_RATIO = 5.0  # ... in the Linear layers whose top input channel peaks above this x median

# A few ordinary sentences: enough text to find the outlier channels (see above).
CALIBRATION = [
    "The film was shown at the festival last spring and nobody left before the end.",
    "Is the train to the airport running late again?",
    "She bought three apples, a loaf of bread and some cheese.",
    "Prices rose by 4.5% in March, the fastest increase since 2019.",
    "what a boring , predictable mess .",
    "The committee will meet on Tuesday to discuss the new budget proposal.",
    "He said he would call back, but he never did.",
    "Quantum computers use qubits, which can be in a superposition of states.",
]


@functools.lru_cache(maxsize=1)
def _has_vnni() -> bool:
    """Does the CPU have 8-bit dot products with 32-bit sums (AVX512-VNNI / AVX-VNNI)?"""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_vnni" in flags or "avx_vnni" in flags


def weight_levels() -> int:
    """The largest |int8 weight|: 127 where the CPU sums 8-bit products in 32 bits
    (VNNI), 63 where fbgemm pairs them in a saturating 16-bit sum (see the docstring)."""
    return 127 if _has_vnni() else 63


class Int8Linear(nn.Module):
    """y = x W^T + b: W int8 per output row (|q| <= `levels`, by default what this CPU's
    kernel sums without saturating: weight_levels()), x quantized to 8 bits per call,
    except the input channels `outliers`, which are multiplied in fp32."""

    def __init__(self, linear: nn.Linear, outliers: torch.Tensor,
                 levels: Optional[int] = None):
        super().__init__()
        levels = weight_levels() if levels is None else levels
        if isinstance(levels, bool) or not isinstance(levels, int) or not 1 <= levels <= 127:
            raise ValueError(f"Int8Linear(levels=): expected a whole number from 1 to 127 "
                             f"(the largest |int8 weight|), got {levels!r}")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        w = linear.weight.detach().float().clone()                       # (out, in)
        self.register_buffer("outliers", outliers)                       # (k,)
        self.register_buffer("w_outliers", w[:, outliers].t().contiguous())  # (k, out)
        w[:, outliers] = 0
        scale = (w.abs().amax(1) / levels).clamp(min=1e-12).double()     # (out,)
        zero = torch.zeros(w.shape[0], dtype=torch.long)
        bias = linear.bias.detach().float() if linear.bias is not None else None
        with warnings.catch_warnings():  # torch marks its quantized tensors deprecated
            warnings.simplefilter("ignore")
            qw = torch.quantize_per_channel(w, scale, zero, 0, torch.qint8)
            self.packed = torch.ops.quantized.linear_prepack(qw, bias)
        self.levels = levels

    def forward(self, x, act=None):  # (..., in) fp32 -> (..., out) fp32, then act
        if not len(self.outliers):
            y = torch.ops.quantized.linear_dynamic(x, self.packed, False)
        else:
            y = self._with_outliers(x)
        if act == "gelu":            # y is ours: the exact GELU in place, no new buffer
            return torch._C._nn.gelu_(y)
        return ACTIVATIONS[act](y) if act else y

    def _with_outliers(self, x):
        big = x.index_select(-1, self.outliers)                          # (..., k)
        if torch.is_grad_enabled() or torch.is_inference_mode_enabled() != x.is_inference():
            zeroed = x.index_fill(-1, self.outliers, 0)                  # a copy
        else:   # the channels zeroed in place and put back below: no copy of x
            zeroed = x.index_fill_(-1, self.outliers, 0)
        try:
            y = torch.ops.quantized.linear_dynamic(zeroed, self.packed, False)
        finally:
            if zeroed is x:
                x.index_copy_(-1, self.outliers, big)
        y.view(-1, self.out_features).addmm_(big.reshape(-1, big.shape[-1]), self.w_outliers)
        return y

    # Pickled as plain tensors (int8 values, scales, bias) and packed again when read:
    # multiprocessing's pickler (spawn workers) shares tensors through torch's reductions,
    # which fail on the packed quantized weight ("cannot call qscheme on UnknownQuantizer":
    # a spawn Pool of int8 Encoders hung, its workers dying one after another)
    def __getstate__(self):
        state = dict(self.__dict__)
        w, bias = torch.ops.quantized.linear_unpack(self.packed)
        state["packed"] = (w.int_repr(), w.q_per_channel_scales(), bias)
        return state

    def __setstate__(self, state):
        q, scale, bias = state["packed"]
        with warnings.catch_warnings():  # torch marks its quantized tensors deprecated
            warnings.simplefilter("ignore")
            qw = torch._make_per_channel_quantized_tensor(
                q, scale.double(), torch.zeros(len(scale), dtype=torch.long), 0)
            state = dict(state, packed=torch.ops.quantized.linear_prepack(qw, bias))
        super().__setstate__(state)

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"int8 (|q| <= {self.levels}), {len(self.outliers)} fp32 channels")


def _input_peaks(encoder: nn.Module, batch: dict) -> dict:
    """(block index, layer name) -> the largest |input| of each channel on `batch`, for
    a nanobert `BertModel`."""
    peaks, hooks = {}, []
    for i, block in enumerate(encoder.blocks):
        for name in QUANTIZED:
            def hook(module, inputs, key=(i, name)):
                peak = inputs[0].detach().abs().flatten(0, -2).amax(0)
                # a block run more than once (ALBERT shares one block across layers):
                # the largest value over every pass
                peaks[key] = peak if key not in peaks else torch.maximum(peaks[key], peak)
            hooks.append(block.get_submodule(name).register_forward_pre_hook(hook))
    try:
        with torch.inference_mode():
            encoder(**batch)
    finally:
        for h in hooks:
            h.remove()
    return peaks


def outlier_channels(peaks: torch.Tensor, k: int) -> torch.Tensor:
    """The k input channels to keep in fp32, by their calibration peaks (in order), or
    none when the largest peak is under OUTLIER_RATIO x the median one."""
    top = peaks.topk(min(k, len(peaks)))
    if not len(top.values) or top.values[0] <= OUTLIER_RATIO * peaks.median():
        return torch.zeros(0, dtype=torch.long)
    return top.indices.sort().values


def _check_quantizable(model) -> nn.Module:
    """The nanobert model's encoder (a `Bert` or a `BertModel`), or a one-line error."""
    from .model import Bert, BertModel
    if not isinstance(model, (Bert, BertModel)):
        raise TypeError(f"quantize(model): expected a nanobert Bert or BertModel, got "
                        f"{type(model).__name__}")
    if not {"fbgemm", "x86"} & set(torch.backends.quantized.supported_engines):
        raise NanobertError("--dtype int8 needs torch's quantized CPU kernels (fbgemm), "
                            "which this torch build lacks; use --dtype float32")
    devices = {p.device.type for p in model.parameters()}
    if devices - {"cpu"}:
        raise NanobertError(f"dtype int8 is a CPU inference path; this model is on "
                            f"{', '.join(sorted(devices - {'cpu'}))} (move it with "
                            "model.cpu() first, or keep float32 on the GPU)")
    other = {str(p.dtype) for p in model.parameters()} - {str(torch.float32)}
    if other:
        raise NanobertError(f"dtype int8 quantizes a float32 model; this one has "
                            f"{', '.join(sorted(other))} weights (model.float() first)")
    return getattr(model, "bert", model)


def quantize(model: nn.Module, tokenizer=None, outliers: int = OUTLIERS) -> nn.Module:
    """Swap the block Linear layers of a nanobert `Bert` (or `BertModel`) for Int8Linear,
    in place, and put it in eval mode. `tokenizer` encodes the calibration sentences
    that find the outlier channels (none are kept without it). Returns the model."""
    encoder = _check_quantizable(model)
    from .config import check_count
    from .tokenizer import Tokenizer
    outliers = check_count(outliers, "outliers", minimum=0)
    if tokenizer is not None and not isinstance(tokenizer, Tokenizer):
        raise TypeError(f"quantize(tokenizer): expected the nanobert Tokenizer that "
                        f"nanobert.load returns (or None), got {type(tokenizer).__name__}")
    if getattr(model, "dtype_name", "float32") == "int8":
        return model
    model.eval()
    calibration = tokenizer(CALIBRATION) if tokenizer is not None and outliers else None
    peaks = _input_peaks(encoder, calibration) if calibration is not None else {}
    levels = weight_levels()
    for i, block in enumerate(encoder.blocks):
        for name in QUANTIZED:
            parent_name, _, attr = name.rpartition(".")
            parent = block.get_submodule(parent_name)
            linear = getattr(parent, attr)
            if isinstance(linear, Int8Linear):   # a block shared by several layers (ALBERT)
                continue
            keep = outlier_channels(peaks[i, name], outliers) if peaks else \
                torch.zeros(0, dtype=torch.long)
            setattr(parent, attr, Int8Linear(linear, keep, levels))
    model.dtype_name = "int8"     # (checkpoint.save_model refuses such a model)
    return model


# --dtype values: what each does to a loaded fp32 model (and its tokenizer)
DTYPES = {
    "float32": lambda model, tokenizer: model,
    "int8": quantize,
}


# other spellings of a --dtype value (torch's, numpy's, the common short ones)
DTYPE_ALIASES = {"fp32": "float32", "float": "float32", "torch.float32": "float32",
                 "torch.float": "float32", "qint8": "int8", "torch.qint8": "int8",
                 "torch.int8": "int8"}


def dtype_name(dtype) -> str:
    """'float32' or 'int8' for a dtype given as a string ('fp32', 'int8', ...), a torch
    dtype or None (float32); a ValueError (TypeError) naming `dtype` for anything else."""
    if dtype is None:
        return "float32"
    if isinstance(dtype, torch.dtype):
        dtype = str(dtype)
    if not isinstance(dtype, str):
        raise TypeError(f"dtype must be a string (one of {', '.join(DTYPES)}), got "
                        f"{type(dtype).__name__}")
    name = DTYPE_ALIASES.get(dtype.strip().lower(), dtype.strip().lower())
    if name not in DTYPES:
        raise NanobertError(f"dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
    return name


def to_dtype(model: nn.Module, dtype: str, tokenizer=None) -> nn.Module:
    return DTYPES[dtype_name(dtype)](model, tokenizer)


def add_dtype_flag(parser) -> None:
    """--dtype for the inference commands (predict, evaluate, embed, search)."""
    parser.add_argument("--dtype", type=dtype_flag, choices=tuple(DTYPES), default="float32",
                        help="int8: int8 Linear layers with activations quantized per call "
                             "(CPU; faster, slightly different numbers; docs/deploy.md)")


def dtype_flag(text: str) -> str:
    """--dtype's type: an alias (fp32) to its name; an unknown value is left for
    argparse's choices to refuse."""
    try:
        return dtype_name(text)
    except (NanobertError, TypeError):
        return text
