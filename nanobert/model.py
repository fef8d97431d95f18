"""The BERT encoder, top to bottom, in one file.

    input ids ──► Embeddings (token + position + segment, LayerNorm, dropout)
              ──► N × Block (bidirectional self-attention, FFN; post-LN as in BERT)
              ──► Pooler (dense + tanh on [CLS])
              ──► a task head (MLM, NSP/SOP, classification, tokens, QA)

Shapes in comments: B batch, T longest sequence in the batch, N real (non-padding)
tokens in the batch, H hidden size, nh heads, hd = H / nh head size, V vocabulary.

Three attention backends, chosen by one config field, `attn_backend`:
  "eager"    softmax(QK^T/sqrt(hd) + mask) V written out; the reference.
  "sdpa"     torch.nn.functional.scaled_dot_product_attention on the padded batch.
  "unpadded" padding is dropped once, right after the embedding lookup: every
             token-wise operation (projections, FFN, LayerNorm, heads) runs on the
             N real tokens only, and attention runs per sequence with no padding
             (CPU: one SDPA call per distinct length; CUDA: flash-attn varlen when
             installed, else one padded SDPA call, as kernel launches cost more there).
The blocks do not know which one runs: they hand q, k, v to a `Layout`, which
knows how the batch is laid out and how to attend over it.

The BERT family is configuration, not copies of this file: RoBERTa (position offset,
no NSP), ALBERT (factorized embeddings, shared layers), DistilBERT (no segments, ReLU
pre-classifier), ModernBERT (pre-LN, RoPE, GeGLU, no biases, alternating local/global
attention), DeBERTa (disentangled attention over relative positions) are a few config
fields each; see the "variants" block of BertConfig.

Checkpoint names follow our own short names; `nanobert.families` maps them to and from
each family's Hugging Face names when loading and saving.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, fields, replace
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.optim.optimizer import register_optimizer_step_post_hook

try:  # optional: varlen attention kernels for CUDA
    from flash_attn import flash_attn_varlen_func
except ImportError:
    flash_attn_varlen_func = None

# ----------------------------------------------------------------------------------
# Configuration


def _id2label(given) -> dict:
    """{int id: str label} of a config's id2label (config.json writes its keys as strings);
    a ValueError naming it for anything else."""
    if not isinstance(given, dict):
        raise ValueError(f"id2label must be a dict {{id: label}}, got {type(given).__name__}")
    try:
        out = {int(k): str(v) for k, v in given.items()}
    except (TypeError, ValueError):
        raise ValueError(f"id2label's keys must be label ids 0, 1, ..., got {list(given)[:5]!r}")
    if sorted(out) != list(range(len(out))):
        raise ValueError(f"id2label's keys must be 0 to {len(out) - 1}, got {sorted(out)[:5]!r}")
    return out


@dataclass
class BertConfig:
    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    pad_token_id: int = 0
    # task heads
    num_labels: int = 2
    id2label: Optional[dict] = None
    problem_type: Optional[str] = None  # "single_label_classification" | "regression" |
                                        #   "multi_label_classification" (sigmoid per label)
    classifier_dropout: Optional[float] = None
    # nanobert only (saved under "nanobert_*" keys; transformers ignores them)
    attn_backend: str = "unpadded"  # "eager" | "sdpa" | "unpadded" (the fastest)
    # ---- variants: the defaults are BERT ----
    family: str = "bert"                    # checkpoint naming: bert roberta albert distilbert modernbert
    embedding_size: Optional[int] = None    # ALBERT: embeddings of size E < H, projected to H
    num_layer_groups: Optional[int] = None  # ALBERT: the layers share this many sets of weights
    position_embedding_type: str = "absolute"  # "rope" (rotary, ModernBERT) or "none"
    position_offset: int = 0                # RoBERTa: positions start at pad_token_id + 1
    pre_norm: bool = False                  # ModernBERT: LN before attention and FFN, final LN
    glu: bool = False                       # ModernBERT: gated FFN, act(x W) * (x V) (GeGLU)
    bias: bool = True                       # biases in the attention and FFN linears
    norm_bias: bool = True                  # biases in the LayerNorms
    local_attention: int = 0                # sliding-window width of local layers (0: all global)
    global_every: int = 1                   # every n-th layer (from the first) is global
    rope_theta: float = 10000.0             # RoPE base of global layers
    local_rope_theta: float = 10000.0       # RoPE base of local layers
    pooler_act: str = "tanh"                # DistilBERT's pre-classifier uses relu
    pooler_norm: bool = False               # ModernBERT's head: dense, act, LayerNorm
    token_head: bool = False                # ModernBERT: that head runs on every token
                                            #   before the token and QA classifiers
    classifier_pooling: str = "cls"         # "cls" or "mean" (ModernBERT option)
    relative_attention: bool = False        # DeBERTa: disentangled attention (content and
    relative_terms: str = "c2p|p2c"         #   relative position; c2p, p2c: cross terms)
    relative_buckets: int = 256             # DeBERTa: relative distances log-bucketed into
    max_relative_positions: int = 512       #   2 × buckets embeddings, up to this distance
    relative_norm: bool = True              # DeBERTa: LayerNorm on the relative embeddings
    terms_scale: bool = False               # DeBERTa: scores scaled by 1/sqrt(hd (1 + terms)),
                                            #   relative attention on or off
    position_buckets: int = 0               # MPNet: a learnt bias per head on each query-key
    position_max_distance: int = 128        #   offset, T5-bucketed (0: none), shared by layers
    mlm_act: Optional[str] = None           # the MLM head's activation (None: hidden_act's;
                                            #   RoBERTa's is gelu, ModernBERT's its pooler_act)
    decoder_bias: bool = True               # the MLM decoder's bias (ModernBERT may have none)

    # keys of config.json that BertConfig reads and writes
    _HF_KEYS = (
        "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
        "intermediate_size", "hidden_act", "hidden_dropout_prob",
        "attention_probs_dropout_prob", "max_position_embeddings", "type_vocab_size",
        "layer_norm_eps", "initializer_range", "pad_token_id",
    )
    _REQUIRED = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                 "intermediate_size")
    _VARIANT_KEYS = ("family", "embedding_size", "num_layer_groups", "position_embedding_type",
                     "position_offset", "pre_norm", "glu", "bias", "norm_bias", "local_attention",
                     "global_every", "rope_theta", "local_rope_theta", "pooler_act", "pooler_norm",
                     "token_head", "classifier_pooling", "relative_attention", "relative_terms",
                     "relative_buckets", "max_relative_positions", "relative_norm", "terms_scale",
                     "position_buckets", "position_max_distance", "mlm_act", "decoder_bias")

    def __post_init__(self):
        for f in fields(self):   # np.int64(100) from a sweep: the Python number it holds
            v = getattr(self, f.name)
            if type(v).__module__ == "numpy" and getattr(v, "ndim", None) == 0:
                setattr(self, f.name, v.item())
        for key in self._REQUIRED:   # (a string here failed later, in the % below)
            v = getattr(self, key)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{key} must be a whole number >= 1, got {v!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not a multiple of "
                             f"num_attention_heads {self.num_attention_heads}")
        if self.attn_backend not in ("eager", "sdpa", "unpadded"):
            raise ValueError(f"unknown attn_backend {self.attn_backend!r}")
        # what would otherwise fail later, deep inside torch (a KeyError, an assertion)
        for key in ("hidden_act", "pooler_act", "mlm_act"):
            if getattr(self, key) is not None and getattr(self, key) not in ACTIVATIONS:
                raise ValueError(f"unknown {key} {getattr(self, key)!r}; choose from "
                                 f"{', '.join(ACTIVATIONS)}")
        for key, lo in (("max_position_embeddings", 1), ("type_vocab_size", 0), ("num_labels", 1)):
            v = getattr(self, key)
            if not isinstance(v, int) or isinstance(v, bool) or v < lo:
                raise ValueError(f"{key} must be a whole number >= {lo}, got {v!r}")
        for key in ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout"):
            v = getattr(self, key)
            if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool)
                                  or not 0 <= v <= 1):
                raise ValueError(f"{key} must be a probability from 0 to 1, got {v!r}")
        if self.pad_token_id is not None and not 0 <= self.pad_token_id < self.vocab_size:
            raise ValueError(f"pad_token_id {self.pad_token_id} is outside the vocabulary "
                             f"(0 to {self.vocab_size - 1})")
        self._check_variants()
        if self.id2label is not None:
            self.id2label = _id2label(self.id2label)
            self.num_labels = len(self.id2label)

    # what each variant field takes: a choice, or (the least value, its kind)
    _CHOICES = {"position_embedding_type": ("absolute", "rope", "none"),
                "classifier_pooling": ("cls", "mean"),
                "problem_type": (None, "single_label_classification",
                                 "multi_label_classification", "regression")}
    _LEAST = {"layer_norm_eps": (0.0, float), "initializer_range": (0.0, float),
              "position_offset": (0, int), "local_attention": (0, int), "global_every": (1, int),
              "num_layer_groups": (1, int), "embedding_size": (1, int),
              "relative_buckets": (0, int), "max_relative_positions": (1, int),
              "position_buckets": (0, int), "position_max_distance": (1, int),
              "rope_theta": (0.0, float), "local_rope_theta": (0.0, float)}

    def _check_variants(self):
        """A ValueError naming the field for a value no variant has: 'relative_key' had
        built a model with no positions at all, a negative layer_norm_eps gave NaN, and
        others failed later inside torch."""
        for key, allowed in self._CHOICES.items():
            if getattr(self, key) not in allowed:
                raise ValueError(f"{key} {getattr(self, key)!r} is not supported; choose from "
                                 f"{', '.join(repr(a) for a in allowed)}")
        for key, (least, kind) in self._LEAST.items():
            v = getattr(self, key)
            if v is None:
                continue
            number = isinstance(v, (int, float) if kind is float else int) and \
                not isinstance(v, bool) and math.isfinite(v)
            strict = kind is float and key != "initializer_range"     # (eps, theta: > 0)
            if not number or v < least or (strict and v <= least):
                what = "a number" if kind is float else "a whole number"
                raise ValueError(f"{key} must be {what} {'>' if strict else '>='} {least}, "
                                 f"got {v!r}")
        flags = [f.name for f in fields(self) if f.type in (bool, "bool")]
        odd = next((k for k in flags if not isinstance(getattr(self, k), bool)), None)
        if odd is not None:   # ('no' had been read as true: relative attention built)
            raise ValueError(f"{odd} must be True or False, got {getattr(self, odd)!r}")
        terms = set(self.relative_terms.split("|")) - {"", "c2p", "p2c"} \
            if isinstance(self.relative_terms, str) else {self.relative_terms}
        if terms:
            raise ValueError(f"relative_terms {self.relative_terms!r}: c2p, p2c or both "
                             "('c2p|p2c')")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def usable_positions(self) -> int:
        """Tokens a row may hold: the position table less the offset at which positions
        start (RoBERTa: pad + 1), so a tokenizer's max_length is capped by this."""
        return self.max_position_embeddings - self.position_offset

    @property
    def unpadded(self) -> bool:
        """Does the model run on real tokens only? DeBERTa's and MPNet's relative biases
        are dense (T, T) terms, so they stay on the padded layout whatever the backend says."""
        return (self.attn_backend == "unpadded" and not self.relative_attention
                and not self.position_buckets)

    def is_local(self, layer: int) -> bool:
        """Does this layer attend within a sliding window? (ModernBERT alternation)"""
        return self.local_attention > 0 and layer % self.global_every != 0

    def layer_weights(self, layer: int) -> int:
        """Which set of block weights layer `layer` uses (ALBERT sharing)."""
        groups = self.num_layer_groups or self.num_hidden_layers
        return layer * groups // self.num_hidden_layers

    @classmethod
    def from_hf_dict(cls, d: dict) -> "BertConfig":
        """Build from a BERT config.json dict (unknown keys are ignored; other families
        are read by `nanobert.families`)."""
        missing = [k for k in cls._REQUIRED if k not in d]
        if missing:
            raise KeyError(", ".join(missing))
        kw = {k: d[k] for k in cls._HF_KEYS if k in d}
        kw.update(cls.labels_from_hf(d))
        if d.get("classifier_dropout") is not None:
            kw["classifier_dropout"] = d["classifier_dropout"]
        for k in ("attn_backend",) + cls._VARIANT_KEYS:
            if f"nanobert_{k}" in d:
                kw[k] = d[f"nanobert_{k}"]
        return cls(**kw)

    @staticmethod
    def labels_from_hf(d: dict) -> dict:
        """The label fields of a config.json of any family: id2label (or num_labels),
        problem_type."""
        kw = {}
        if d.get("id2label") is not None:
            kw["id2label"] = d["id2label"]
        elif "num_labels" in d:
            kw["num_labels"] = d["num_labels"]
        if d.get("problem_type") is not None:
            kw["problem_type"] = d["problem_type"]
        return kw

    def labels_to_hf(self) -> dict:
        """id2label, label2id (and problem_type) as config.json writes them."""
        id2label = self.id2label or {i: f"LABEL_{i}" for i in range(self.num_labels)}
        d = {"id2label": {str(i): lab for i, lab in id2label.items()},
             "label2id": {lab: i for i, lab in id2label.items()}}
        if self.problem_type:
            d["problem_type"] = self.problem_type
        return d

    def to_hf_dict(self) -> dict:
        """This config as a Hugging Face BERT config.json's fields."""
        d = {k: getattr(self, k) for k in self._HF_KEYS}
        d["model_type"] = "bert"
        d["position_embedding_type"] = "absolute"
        d.update(self.labels_to_hf())
        if self.classifier_dropout is not None:
            d["classifier_dropout"] = self.classifier_dropout
        d["nanobert_attn_backend"] = self.attn_backend
        default = BertConfig()
        for k in self._VARIANT_KEYS:  # only what differs from BERT
            if getattr(self, k) != getattr(default, k):
                d[f"nanobert_{k}"] = getattr(self, k)
        return d


# name: (layers, hidden, heads); FFN is 4 × hidden. tiny/mini/small/medium are the
# sizes of Google's "well-read students" BERT miniatures; base and large are BERT's.
PRESETS = {
    "tiny": (2, 128, 2),
    "mini": (4, 256, 4),
    "small": (4, 512, 8),
    "medium": (8, 512, 8),
    "base": (12, 768, 12),
    "large": (24, 1024, 16),
}


# The family as switches on top of a size: "albert-base", "modernbert-tiny", ...
VARIANTS = {
    "bert": {},
    "roberta": dict(family="roberta", type_vocab_size=1, layer_norm_eps=1e-5, mlm_act="gelu"),
    "albert": dict(family="albert", embedding_size=128, num_layer_groups=1,
                   hidden_act="gelu_new"),
    "distilbert": dict(family="distilbert", type_vocab_size=0, pooler_act="relu"),
    "deberta": dict(family="deberta-v2", position_embedding_type="none", type_vocab_size=0,
                    relative_attention=True, relative_buckets=256, terms_scale=True,
                    layer_norm_eps=1e-7, pooler_act="gelu"),
    "modernbert": dict(family="modernbert", type_vocab_size=0, position_embedding_type="rope",
                       pre_norm=True, glu=True, bias=False, norm_bias=False, local_attention=128,
                       global_every=3, rope_theta=160000.0, pooler_act="gelu", pooler_norm=True,
                       token_head=True, mlm_act="gelu", layer_norm_eps=1e-5, max_position_embeddings=8192),
}


def preset(name: str, **overrides) -> BertConfig:
    """A size ("base"), or a variant and a size ("albert-base"), plus any overrides."""
    if not isinstance(name, str):
        raise TypeError(f"preset(name): a preset name such as 'tiny', got {name!r}")
    variant, _, size = name.rpartition("-")
    variant = variant or "bert"
    if size not in PRESETS or variant not in VARIANTS:
        names = list(PRESETS) + [f"{v}-{p}" for v in VARIANTS if v != "bert" for p in ("tiny", "base")]
        raise ValueError(f"unknown preset {name!r}; choose a size ({', '.join(PRESETS)}), "
                         f"optionally after a variant ({', '.join(VARIANTS)}), e.g. {names[-1]}")
    layers, hidden, heads = PRESETS[size]
    kw = dict(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
              intermediate_size=4 * hidden)
    kw.update(VARIANTS[variant])
    if variant == "distilbert":   # half the layers of the teacher size
        kw["num_hidden_layers"] = max(1, layers // 2)
    if variant == "modernbert":   # GeGLU: 2 × 1.5H inputs keep the FFN near BERT's size
        kw["intermediate_size"] = 3 * hidden // 2
    kw.update(overrides)
    if variant == "roberta":      # positions start after the padding index
        kw.setdefault("position_offset", kw.get("pad_token_id", 0) + 1)
        kw["max_position_embeddings"] = kw.get("max_position_embeddings", 512) + kw["position_offset"]
    return BertConfig(**kw)


ACTIVATIONS = {
    "gelu": F.gelu,  # the exact (erf) GELU, as BERT
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
    "tanh": torch.tanh,
}
# The same, writing over their input: the Linear fast path applies them to the product it
# has just made. A new output of (2,048 x 1,536) floats per GELU came from fresh pages
# (glibc handed memory of this size back to the OS as it was freed): 21,000-24,000 page
# faults per batch of 78 SST-2 sentences against 740 in place, 8% of minilm's forward.
ACTIVATIONS_IN_PLACE = {
    "gelu": torch.ops.aten.gelu_,
    "gelu_new": lambda x: torch.ops.aten.gelu_(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: torch.ops.aten.gelu_(x, approximate="tanh"),
    "relu": torch.relu_,
    "silu": lambda x: F.silu(x, inplace=True),
    "swish": lambda x: F.silu(x, inplace=True),
    "tanh": torch.tanh_,
}

# Activations oneDNN applies inside a Linear's output pass: name -> (post-op, algorithm).
# Its GELU post-ops are fast only with AVX-512: on an AVX2-only CPU (Zen 3) the fused exact
# GELU cost an 800 x 384 x 1536 product 3-5 ms, where torch's own GELU after it costs
# 1.3-2 ms, bit for bit the same (3-4% of a whole minilm forward, docs/speed.md).
FUSED_ACTIVATIONS = {"relu": ("relu", "")}
if "AVX512" in torch.backends.cpu.get_cpu_capability():
    FUSED_ACTIVATIONS.update({"gelu": ("gelu", "none"), "gelu_new": ("gelu", "tanh"),
                              "gelu_pytorch_tanh": ("gelu", "tanh")})
ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def onednn_rows(m: int) -> int:
    """The row count a oneDNN product of `m` rows runs at: m rounded up to 5 significant
    bits (at most 1/16 extra rows). oneDNN builds and keeps code per input shape; on the
    unpadded path every batch has a new token count, and a server's memory grew without
    bound (+360 MB in 10 minutes). Rounded, a few hundred shapes cover every batch."""
    step = 1 << max(0, m.bit_length() - 5)
    return -(-m // step) * step


class Linear(nn.Linear):
    """nn.Linear, plus a fast path for CPU inference, with an optional activation `act`
    (a name of ACTIVATIONS) applied to the output.

    Without autograd (torch.no_grad / inference_mode), on fp32 CPU tensors, the product
    runs on a copy of the weight laid out once for the kernel that is fastest at the
    input's row count, so no call repacks the weight:
      rows <= SMALL_ROWS  MKL's sgemm on a (K, N) copy: one sentence or a few (1.16x a
                          whole forward of one SST-2 sentence, docs/speed.md)
      more rows           oneDNN on its own blocked layout, the activation applied in the
                          same pass over the output (1.2-1.3x F.linear on SST-2 batches)
    The copies are rebuilt when the weight changes: an in-place update (load_state_dict)
    moves the tensor's version counter, a new tensor its address; the fused AdamW step
    moves neither, so the Trainer drops the copies after each step. A weight made inside
    torch.inference_mode (an inference tensor) has no version counter and can still be
    changed in place there, so it gets no copies: it runs F.linear, always current.
    (nanobert.load builds its models outside inference mode, wherever it is called.)"""

    SMALL_ROWS = 128

    def forward(self, x, act: Optional[str] = None):
        if not self._inference_on_cpu(x):
            y = F.linear(x, self.weight, self.bias)
            return ACTIVATIONS[act](y) if act else y
        rows = x.numel() // x.shape[-1]
        x2 = x.reshape(rows, x.shape[-1])                                   # (M, K)
        if rows <= self.SMALL_ROWS:
            w = self._weight_copy("kn")                                     # (K, N)
            y = x2 @ w if self.bias is None else torch.addmm(self.bias, x2, w)
            y = y.reshape(*x.shape[:-1], y.shape[-1])
            return ACTIVATIONS_IN_PLACE[act](y) if act else y
        post, algorithm = FUSED_ACTIVATIONS.get(act, ("none", ""))
        extra = onednn_rows(rows) - rows
        if extra:
            x2 = F.pad(x2, (0, 0, 0, extra))                            # (M', K), zero rows
        y = torch.ops.mkldnn._linear_pointwise(x2, self._weight_copy("onednn"), self.bias,
                                               post, [], algorithm)[:rows]   # (M, N)
        y = y.reshape(*x.shape[:-1], y.shape[-1])
        return ACTIVATIONS_IN_PLACE[act](y) if act and act not in FUSED_ACTIVATIONS else y

    def _inference_on_cpu(self, x) -> bool:
        return (x.dtype == self.weight.dtype and self.fast_path(x)
                and not self.weight.is_inference())

    @staticmethod
    def fast_path(x) -> bool:  # (not while tracing: ONNX has no such op)
        return (ONEDNN and not torch.is_grad_enabled() and x.device.type == "cpu"
                and x.dtype == torch.float32 and x.numel() > 0 and not torch.jit.is_tracing())

    def __getstate__(self):  # the weight copies are a cache: deepcopy and pickle skip them
        state = dict(super().__getstate__())
        state.pop("_packed", None)
        return state

    def _weight_copy(self, layout: str):
        """The weight laid out for one kernel: "onednn" (blocked) or "kn" (transposed),
        made again when the weight changed: its storage, its version (in-place ops under
        no_grad), or after `weights_changed` (any optimizer step in the process: the fused
        AdamW kernel moves no version, and inference after a step of one's own loop ran on
        the old weights). An edit through `.data` is not seen: edit under torch.no_grad()
        instead, or call weights_changed()."""
        key = (self.weight.data_ptr(), self.weight._version, WEIGHT_CHANGES[0])
        if getattr(self, "_packed", (None,))[0] != key:
            self._packed = (key, {})
        copies, w = self._packed[1], self.weight.detach()
        if layout not in copies:
            copies[layout] = (w.t().contiguous() if layout == "kn"
                              else torch.ops.mkldnn._reorder_linear_weight(w))
        return copies[layout]


WEIGHT_CHANGES = [0]   # optimizer steps and other changes of weights in this process


def weights_changed(*_):
    """Every Linear's weight copies are made again: an optimizer step took place (a hook
    of every torch optimizer), or weights were swapped through `.data`."""
    WEIGHT_CHANGES[0] += 1


register_optimizer_step_post_hook(weights_changed)


# ----------------------------------------------------------------------------------
# Batch layouts: how the tokens of a batch sit in memory, and how to attend over them


def first_real_tokens(x, mask):  # x (B, T, H), mask (B, T) 1 on real tokens -> (B, H)
    """Each row's first real token: column 0, unless the batch is left-padded (then the pad
    at column 0 would stand in for the sequence, as it does in `transformers`, and the
    unpadded layout, which has no such pad, would disagree)."""
    first = mask.int().argmax(1)                                  # (B,), 0 if all masked
    return x[torch.arange(x.shape[0], device=x.device), first]


def has_holes(mask) -> bool:  # mask (B, T)
    """Does a row of `mask` have padding between real tokens (not one block of them)?"""
    m = mask.bool()
    cols = torch.arange(m.shape[1], device=m.device)
    first = torch.where(m, cols, m.shape[1]).amin(1)                   # (B,)
    last = torch.where(m, cols, -1).amax(1)                            # (B,)
    return bool(((last - first + 1).clamp(min=0) != m.sum(1)).any())


class Layout:
    """Padded layout: activations are (B, T, H); `mask` (B, T) is 1 on real tokens.
    `backend` is "eager" or "sdpa"."""

    def __init__(self, mask: torch.Tensor, backend: str = "sdpa"):
        self.mask = mask.bool()                                   # (B, T)
        self.B, self.T = mask.shape
        self.backend = backend
        self.positions = None                                     # (B, T), set by the model
        self._rotary = {}

    def rotary(self, theta: float, dim: int):
        """cos, sin of the rotary embedding at every position: (..., dim), cached."""
        if (theta, dim) not in self._rotary:
            inv_freq = theta ** -(torch.arange(0, dim, 2, device=self.mask.device).float() / dim)
            angles = self.positions[..., None].float() * inv_freq               # (..., dim/2)
            angles = torch.cat((angles, angles), dim=-1)                         # (..., dim)
            self._rotary[theta, dim] = (angles.cos(), angles.sin())
        return self._rotary[theta, dim]

    def attend(self, q, k, v, dropout_p: float, want_probs: bool, window: int = 0,
               bias=None, scale=None):
        # q, k, v: (B, T, nh, hd) -> out (B, T, nh, hd), probs (B, nh, T, T) or None
        # window > 0: each query sees only keys within window // 2 positions of it
        # bias (B, nh, T, T): added to the scores (DeBERTa); scale: of q·k, default 1/sqrt(hd)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))          # (B, nh, T, hd)
        keep = self.mask[:, None, None, :]                        # (B, 1, 1, T) keys
        if window:   # (each query its own key too: a padding query past the band of the
            # real tokens would see none, a row of NaN on CUDA that V carries onwards)
            keep = (keep & _band(self.T, window, q.device)) | \
                _band(self.T, 0, q.device)                             # (B, 1, T, T)
        if bias is not None:  # one float mask: the bias where allowed, -inf-ish elsewhere
            keep = bias.masked_fill(~keep, torch.finfo(bias.dtype).min)
        probs = None
        if self.backend == "eager" or want_probs:
            probs = _attention_probs(q, k, keep, scale)
        if self.backend == "eager":
            out = F.dropout(probs, dropout_p) @ v
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, dropout_p=dropout_p,
                                                 scale=scale)
        return out.transpose(1, 2), probs

    def pad(self, x):  # already padded
        return x

    def first_tokens(self, x):  # the [CLS] vector of each sequence: (B, H)
        return first_real_tokens(x, self.mask)

    def mean_tokens(self, x):  # the mean over each sequence's real tokens: (B, H)
        m = self.mask.unsqueeze(-1)                               # (a padding NaN: not read)
        return x.masked_fill(~m, 0).sum(1) / m.sum(1).to(x.dtype)


class UnpaddedLayout(Layout):
    """Unpadded layout: activations are (N, H), the N real tokens of the batch end to
    end, with no padding anywhere.

    The sequences are stored longest first (ties keep batch order), so sequences of
    equal length sit side by side and attention is one SDPA call per distinct length
    (on CUDA: one varlen flash-attn kernel when installed, else one padded SDPA call):
      order (B,)         batch row of the i-th stored sequence
      lengths (B,)       length of the i-th stored sequence (non-increasing)
      cu_seqlens (B+1,)  where the i-th stored sequence starts in the (N, ...) tensor
      index (N,)         where each stored token sits in the flattened (B * T) batch
    `unpad`, `pad`, `first_tokens` and `mean_tokens` hide the order: what they take
    and give is in batch order."""

    def __init__(self, mask: torch.Tensor):
        super().__init__(mask, "unpadded")
        lengths = self.mask.sum(1)                                            # (B,)
        self.order = lengths.sort(descending=True, stable=True).indices       # (B,)
        self.lengths = lengths[self.order]                                    # (B,)
        self.cu_seqlens = F.pad(self.lengths.cumsum(0), (1, 0))               # (B + 1,)
        rows, cols = self.mask[self.order].nonzero(as_tuple=True)             # (N,) each
        self.index = self.order[rows] * self.T + cols                         # (N,)
        self.rows_cols = rows, cols
        self._grid = None   # (grid index, key mask) of attend_in_one_call, made on first use
        self._runs_plan = None   # (key, plan) of attend_inference, made on first use
        self.N = N = rows.shape[0]
        self.spare = 0      # zero rows after the N tokens (round_rows); `real` cuts them off
        # where each batch row's first token is stored (B,)
        self.starts = self.cu_seqlens[:-1][self.order.argsort()].clamp(max=max(N - 1, 0))
        # runs of equal length, [(length, count), ...]: the one host sync of a batch
        lens, counts = self.lengths.unique_consecutive(return_counts=True)
        self.groups = list(zip(lens.tolist(), counts.tolist()))
        self.max_seqlen = self.groups[0][0] if self.groups else 0

    def unpad(self, x):  # (B, T, ...) -> (N, ...)
        return x.flatten(0, 1)[self.index]

    def round_rows(self, x):  # (N, H) -> (onednn_rows(N), H): spare zero rows at the end
        """Once per batch, the row count every Linear of the CPU fast path would pad to
        (onednn_rows), so no Linear pads (a zero fill and a copy per product: 7% of the
        forward with 2 threads). The spare rows go through the row-wise layers, attend
        to nothing and are cut off by `real` before anything reads the output."""
        self.spare = onednn_rows(self.N) - self.N
        if self.spare:
            x = F.pad(x, (0, 0, 0, self.spare))
            self.positions = F.pad(self.positions, (0, self.spare))
        return x

    def real(self, x):  # (N + spare, ...) -> (N, ...), a view
        return x[:self.N] if self.spare else x

    def pad(self, x):  # (N, ...) -> (B, T, ...), zeros on padding
        out = x.new_zeros((self.B * self.T,) + x.shape[1:])
        out[self.index] = x
        return out.view((self.B, self.T) + x.shape[1:])

    def first_tokens(self, x):  # (N, H) -> (B, H)
        if self.N == 0:   # every row masked: no token to take (as padded: some finite value)
            return x.new_zeros(self.B, x.shape[-1])
        return x[self.starts]

    def mean_tokens(self, x):  # (N, H) -> (B, H)
        row = torch.repeat_interleave(self.order, self.lengths)               # (N,)
        out = x.new_zeros(self.B, x.shape[-1]).index_add_(0, row, x)
        return out / self.mask.sum(1, keepdim=True).to(x.dtype)

    def attend_first(self, q, k, v, window: int = 0, scale=None):
        # q (B, nh, hd): each batch row's first token; k, v (N + spare, nh, hd) stored
        # -> (B, nh, hd), what `attend` gives those rows (keys padded: one SDPA call)
        k, v = (self.pad(self.real(t)).transpose(1, 2) for t in (k, v))     # (B, nh, T, hd)
        keep = self.mask.clone()                                              # (B, T) keys
        if window:   # keys within window // 2 of the first real column
            cols = torch.arange(self.T, device=q.device)
            keep &= (cols - self.mask.int().argmax(1, keepdim=True)).abs() <= window // 2
        keep[:, 0] |= ~keep.any(1)   # (an empty row attends somewhere finite: nothing reads it)
        o = F.scaled_dot_product_attention(q.unsqueeze(2), k, v, attn_mask=keep[:, None, None],
                                           scale=scale)                       # (B, nh, 1, hd)
        return o.squeeze(2)

    def attend(self, q, k, v, dropout_p: float, want_probs: bool, window: int = 0,
               bias=None, scale=None):
        # q, k, v: (N, nh, hd) in stored order -> out (N, nh, hd), probs (B, nh, T, T) or None
        # Each sequence attends only over its own tokens. (No `bias`: models with a dense
        # relative-position bias run on the padded layout.)
        if (flash_attn_varlen_func is not None and q.is_cuda and not want_probs
                and q.dtype in (torch.float16, torch.bfloat16)):
            cu = self.cu_seqlens.to(torch.int32)
            w = (window // 2, window // 2) if window else (-1, -1)
            out = flash_attn_varlen_func(q, k, v, cu, cu, self.max_seqlen, self.max_seqlen,
                                         dropout_p=dropout_p, softmax_scale=scale, window_size=w)
            return out, None
        if q.is_cuda and not want_probs and len(self.groups) > 1:
            # a GPU pays per kernel launch, not per padded FLOP: one call beats a loop
            return self.attend_in_one_call(q, k, v, dropout_p, window, scale), None
        if not (q.is_cuda or want_probs or torch.is_grad_enabled()):
            return self.attend_inference(q, k, v, dropout_p, window, scale), None
        probs = None
        if want_probs:
            probs = q.new_zeros(self.B, q.shape[1], self.T, self.T)
        if not torch.is_grad_enabled():   # each group's output written in place: one copy
            out = q.new_empty(q.shape)                                        # (N + spare, nh, hd)
            out[self.N:] = 0
        else:                             # (autograd: no in-place writes into one buffer)
            out = []
        start, seq = 0, 0
        for L, g in self.groups:                    # g sequences of length L, side by side
            end = start + g * L
            if L > 0:
                qs, ks, vs = (t[start:end].unflatten(0, (g, L)).transpose(1, 2)
                              for t in (q, k, v))                             # (g, nh, L, hd)
                band = _band(L, window, q.device) if window else None         # (L, L)
                o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=band,
                                                   dropout_p=dropout_p, scale=scale)
                if isinstance(out, list):
                    out.append(o.transpose(1, 2).flatten(0, 1))               # (g * L, nh, hd)
                else:
                    out[start:end].unflatten(0, (g, L)).copy_(o.transpose(1, 2))
                if want_probs:
                    rows = self.order[seq:seq + g]
                    probs[rows, :, :L, :L] = _attention_probs(qs, ks, band, scale)
            start, seq = end, seq + g
        if isinstance(out, list):
            out = torch.cat(out) if len(out) > 1 else out[0] if out else torch.zeros_like(q)
        return out, probs

    def attend_inference(self, q, k, v, dropout_p: float, window: int = 0, scale=None):
        """`attend` on CPU without autograd: one SDPA call per run of equal length, each
        writing into one output (N + spare, nh, hd). What does not change from layer to
        layer (the runs, their key lengths, their masks) is worked out once per batch
        (`_plan`): a batch of 78 SST-2 sentences has 33-40 runs, and the tensor work
        around each call had cost nearly as much as the attention kernels themselves."""
        out = q.new_empty(q.shape)                                        # (N + spare, nh, hd)
        out[self.N:] = 0
        for start, g, L, P, mask in self._plan(q.shape[0], window, q.dtype):
            qs = _runs(q, start, g, L, L)                                 # (g, nh, L, hd)
            ks, vs = _runs(k, start, g, L, P), _runs(v, start, g, L, P)   # (g, nh, P, hd)
            o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask,
                                               dropout_p=dropout_p, scale=scale)
            _runs(out, start, g, L, L).copy_(o)
        return out

    def _plan(self, rows: int, window: int, dtype) -> list:
        """[(start, g, L, P, mask)]: g sequences of L tokens from row `start`, their keys
        read as P rows each (`_key_block`; the rows past L belong to the next sequence, or
        are spare, and `mask` hides them), mask additive (1 or L, P) or None."""
        if self._runs_plan is None or self._runs_plan[0] != (rows, window, dtype):
            plan, start = [], 0
            for L, g in self.groups:
                end = start + g * L
                if L > 0:
                    P = _key_block(L)
                    if window or end + P - L > rows:   # (the last run: no rows to borrow)
                        P = L
                    plan.append((start, g, L, P, _key_mask(L, P, window, dtype, self.mask.device)))
                start = end
            self._runs_plan = ((rows, window, dtype), plan)
        return self._runs_plan[1]

    def attend_in_one_call(self, q, k, v, dropout_p: float, window: int = 0, scale=None):
        """Attention as one SDPA call: q, k, v (N, nh, hd) scattered into a padded
        (B, nh, L, hd) grid (L the longest length), keys past each length masked, and the
        real tokens gathered back (N, nh, hd)."""
        B, L, (nh, hd) = self.B, self.max_seqlen, q.shape[1:]
        if self._grid is None:  # the same for every layer of the batch
            rows, cols = self.rows_cols
            keep = torch.arange(L, device=q.device)[None] < self.lengths[:, None]  # (B, L)
            keep[:, 0] = True  # (an empty sequence attends somewhere finite; nothing reads it)
            self._grid = rows * L + cols, keep[:, None, None, :]          # (N,), (B, 1, 1, L)
        at, mask = self._grid

        def grid(t):  # (N, nh, hd) -> (B, nh, L, hd)
            return t.new_zeros(B * L, nh, hd).index_copy(0, at, t).view(B, L, nh, hd).transpose(1, 2)
        if window:
            mask = mask & _band(L, window, q.device)
        o = F.scaled_dot_product_attention(grid(q), grid(k), grid(v), attn_mask=mask,
                                           dropout_p=dropout_p, scale=scale)  # (B, nh, L, hd)
        return o.transpose(1, 2).reshape(B * L, nh, hd)[at]


def _band(T, window, device):
    # (T, T) bool: key j is within window // 2 of query i
    i = torch.arange(T, device=device)
    return (i[:, None] - i[None, :]).abs() <= window // 2


def _key_block(L: int) -> int:
    """The key length CPU attention runs a sequence of L tokens at. torch's CPU flash
    kernel works in blocks of 16 keys and is slow on a partial block: at L = 31 it took
    2.5x the time of L = 32 (one thread, 12 heads of 32). Keys padded to the next
    multiple of 16 and masked cost less, except when only 1-3 keys spill over."""
    return L + (-L) % 16 if L % 16 >= 4 else L


def _runs(t, start: int, g: int, L: int, P: int):
    # t (N, nh, hd) -> (g, nh, P, hd), a view: g windows of P rows, from row `start`, L rows
    # apart (P > L: each window runs into the next one's rows)
    row, head, dim = t.stride()
    return t.as_strided((g, t.shape[1], P, t.shape[2]), (L * row, head, row, dim),
                        t.storage_offset() + start * row)


def _key_mask(L: int, P: int, window: int, dtype, device):
    """The additive mask (0 or -inf) of a run whose queries are L rows and keys P rows:
    keys past L hidden, and with a window, keys farther than window // 2. None: no mask.
    Kept for the next batches, but a windowed one of over CACHED_MASK elements (L x P
    floats: 256 MB at 8,192 tokens, and a server meets every length)."""
    if window and L * P > CACHED_MASK:
        return _new_key_mask(L, P, window, dtype, device)
    return _cached_key_mask(L, P, window, dtype, device)


def _new_key_mask(L: int, P: int, window: int, dtype, device):
    if P == L and not window:
        return None
    with torch.inference_mode(False):   # (cached: made inside inference mode, usable outside)
        keep = torch.arange(P, device=device)[None] < L                      # (1, P)
        if window:
            keep = keep & F.pad(_band(L, window, device), (0, P - L))        # (L, P)
        return torch.zeros(keep.shape, dtype=dtype, device=device).masked_fill(~keep, -math.inf)


CACHED_MASK = 1 << 20
_cached_key_mask = functools.lru_cache(maxsize=1024)(_new_key_mask)


def _rotate(x, cos, sin):
    # rotary position embedding: rotate pairs (x_i, x_{i + d/2}) by position-dependent angles
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def _attention_probs(q, k, keep, scale=None):
    # q, k: (B, nh, T, hd); keep: bool (or an additive float mask), broadcastable to
    # (B, nh, T, T), or None
    scores = (q @ k.transpose(-1, -2)) * (scale or 1 / math.sqrt(q.shape[-1]))
    if keep is not None:
        scores = scores + (_additive_mask(keep, scores.dtype) if keep.dtype == torch.bool else keep)
    return scores.softmax(-1)


def _position_buckets(T, buckets, max_distance, device):
    """(T, T): the bucket of key j's offset from query i (MPNet, as T5): one half of the
    buckets per direction; offsets under a quarter of the buckets exactly, the rest
    log-spaced up to `max_distance`, beyond it the last bucket."""
    offset = torch.arange(T, device=device)[:, None] - torch.arange(T, device=device)[None, :]
    half = buckets // 2
    out = (offset < 0).long() * half                 # keys after the query: the upper half
    n = offset.abs()
    exact = half // 2
    far = exact + (torch.log(n.float().clamp(min=1) / exact) / math.log(max_distance / exact)
                   * (half - exact)).long()
    return out + torch.where(n < exact, n, far.clamp(max=half - 1))


def _relative_index(T, buckets, max_distance, device):
    """(T, T): which relative-position embedding query i uses for key j (DeBERTa).
    Distances up to buckets/2 are exact, farther ones share log-spaced buckets."""
    rel = torch.arange(T, device=device)[:, None] - torch.arange(T, device=device)[None, :]
    span = buckets if buckets > 0 else max_distance
    if buckets > 0:
        mid = buckets // 2
        far = rel.abs().clamp(min=mid)
        log_pos = torch.ceil(torch.log(far / mid) / math.log((max_distance - 1) / mid)
                             * (mid - 1)) + mid
        rel = torch.where(rel.abs() <= mid, rel, (log_pos * rel.sign()).long())
    return (rel + span).clamp(0, 2 * span - 1)


def _additive_mask(keep, dtype):
    # 0 where a key may be attended to, the most negative number where it is padding
    return torch.zeros(keep.shape, dtype=dtype, device=keep.device).masked_fill(
        ~keep, torch.finfo(dtype).min)


# ----------------------------------------------------------------------------------
# The encoder


def LayerNorm(c: BertConfig, size=None):
    return nn.LayerNorm(size or c.hidden_size, eps=c.layer_norm_eps, bias=c.norm_bias)


class Embeddings(nn.Module):
    """token + position + segment, LayerNorm, dropout. Variants: no position table with
    RoPE, no segments when type_vocab_size is 0, and ALBERT's size E projected to H."""

    def __init__(self, c: BertConfig):
        super().__init__()
        E = c.embedding_size or c.hidden_size
        self.tok = nn.Embedding(c.vocab_size, E, padding_idx=c.pad_token_id)
        absolute = c.position_embedding_type == "absolute"
        self.pos = nn.Embedding(c.max_position_embeddings, E) if absolute else None
        self.seg = nn.Embedding(c.type_vocab_size, E) if c.type_vocab_size else None
        self.norm = LayerNorm(c, E)
        self.drop = nn.Dropout(c.hidden_dropout_prob)
        self.proj = nn.Linear(E, c.hidden_size) if c.embedding_size else None  # ALBERT

    def forward(self, ids, pos, seg):  # any shape (...) -> (..., H)
        x = self.tok(ids)
        if self.pos is not None:
            x = x + self.pos(pos)
        if self.seg is not None:   # one segment (RoBERTa): both texts of a pair read it
            x = x + (self.seg.weight[0] if self.seg.num_embeddings == 1 else self.seg(seg))
        x = self.drop(self.norm(x))
        return self.proj(x) if self.proj is not None else x


class SelfAttention(nn.Module):
    def __init__(self, c: BertConfig, local: bool = False):
        super().__init__()
        self.nh, self.hd = c.num_attention_heads, c.head_dim
        self.qkv = Linear(c.hidden_size, 3 * c.hidden_size, bias=c.bias)  # fused Q, K, V
        self.proj = Linear(c.hidden_size, c.hidden_size, bias=c.bias)
        self.dropout_p = c.attention_probs_dropout_prob
        self.window = c.local_attention if local else 0
        self.rope_theta = None
        if c.position_embedding_type == "rope":
            self.rope_theta = c.local_rope_theta if local else c.rope_theta
        # DeBERTa scales q·k by 1/sqrt(hd (1 + its c2p, p2c terms)), with relative attention
        # on or off; None: 1/sqrt(hd)
        terms = [t for t in c.relative_terms.split("|") if t]
        n = len(terms) if c.relative_attention or c.terms_scale else 0
        self.scale = 1 / math.sqrt(self.hd * (1 + n)) if n else None

    def forward(self, x, layout: Layout, want_probs=False, rel=None, rows=None):
        # x: (..., H) where ... is (B, T) padded or (N,) unpadded
        # rows (B,): only these queries (each sequence's first token, unpadded) -> (B, H)
        q, k, v = self.qkv(x).unflatten(-1, (3, self.nh, self.hd)).unbind(-3)  # (..., nh, hd)
        if self.rope_theta is not None:
            cos, sin = (t.unsqueeze(-2) for t in layout.rotary(self.rope_theta, self.hd))
            q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        if rows is not None:
            out = layout.attend_first(q[rows], k, v, self.window, self.scale)  # (B, nh, hd)
            return self.proj(out.flatten(-2)), None
        bias = None
        if isinstance(rel, torch.Tensor):    # MPNet: (1, nh, T, T), the same in every layer
            bias = rel
        elif rel is not None:                # DeBERTa: from this layer's queries and keys
            bias = self.relative_bias(q, k, *rel)
        p = self.dropout_p if self.training else 0.0
        out, probs = layout.attend(q, k, v, p, want_probs, self.window, bias, self.scale)
        return self.proj(out.flatten(-2)), probs                               # (..., H)

    def relative_bias(self, q, k, rel_emb, index, terms):
        """DeBERTa's disentangled attention: besides content·content, the content of
        query i against the relative position i-j (c2p), and the content of key j
        against the relative position j-i seen from i (p2c). The relative embeddings
        (2S, H) go through the same Q and K projections (shared keys)."""
        # q, k: (B, T, nh, hd); rel_emb: (2S, H); index: (T, T) into the 2S embeddings
        if not {"c2p", "p2c"} & set(terms):   # (pos_att_type []: content·content only)
            return None
        pos_q, pos_k, _ = self.qkv(rel_emb).unflatten(-1, (3, self.nh, self.hd)).unbind(-3)
        B, T = q.shape[:2]
        idx = index.expand(B, self.nh, T, T)
        bias = 0
        if "c2p" in terms:  # [i, j] = q_i · pos_k[index[i, j]]
            bias = bias + torch.einsum("bind,rnd->bnir", q, pos_k).gather(-1, idx)
        if "p2c" in terms:  # [i, j] = k_j · pos_q[index[i, j]]
            bias = bias + torch.einsum("bjnd,rnd->bnjr", k, pos_q).gather(
                -1, idx.transpose(-1, -2)).transpose(-1, -2)
        return bias * self.scale  # every term is scaled alike (relative attention: set)


class Block(nn.Module):
    """Post-LN, as in BERT:      x = LN(x + Attn(x));   x = LN(x + FFN(x))
    pre-LN, as in ModernBERT:  x = x + Attn(LN(x));   x = x + FFN(LN(x))
    FFN(x) = down(act(up(x))), or with glu: down(act(x W) * (x V)) where up = [W V]."""

    def __init__(self, c: BertConfig, layer: int = 0):
        super().__init__()
        self.pre_norm, self.glu = c.pre_norm, c.glu
        self.attn = SelfAttention(c, local=c.is_local(layer))
        # pre-LN: the embeddings end in a LayerNorm already, so the first block skips one
        self.norm1 = nn.Identity() if c.pre_norm and layer == 0 else LayerNorm(c)
        self.up = Linear(c.hidden_size, c.intermediate_size * (2 if c.glu else 1), bias=c.bias)
        self.down = Linear(c.intermediate_size, c.hidden_size, bias=c.bias)
        self.norm2 = LayerNorm(c)
        self.act_name, self.act = c.hidden_act, ACTIVATIONS[c.hidden_act]
        self.drop = nn.Dropout(c.hidden_dropout_prob)

    def warm(self, rows: int):
        """Every product of the block once on `rows` zero token rows, as forward calls them."""
        x = self.up.weight.new_zeros(rows, self.up.in_features)      # (rows, H)
        self.attn.qkv(x), self.attn.proj(x), self.ffn(x)

    def ffn(self, x):
        if self.glu:
            h, gate = self.up(x).chunk(2, dim=-1)
            return self.down(self.act(h) * gate)
        return self.down(self.up(x, act=self.act_name))

    def forward(self, x, layout: Layout, want_probs=False, rel=None, rows=None):
        # rows: the block's output at these rows only (the last block, when only each
        # sequence's first token is read: everything after attention is per row)
        if self.pre_norm:
            a, probs = self.attn(self.norm1(x), layout, want_probs, rel, rows)
            x = (x if rows is None else x[rows]) + self.drop(a)
            return x + self.drop(self.ffn(self.norm2(x))), probs
        a, probs = self.attn(x, layout, want_probs, rel, rows)
        x = self.norm1((x if rows is None else x[rows]) + self.drop(a))
        return self.norm2(x + self.drop(self.ffn(x))), probs


class Pooler(nn.Module):
    """dense + tanh on [CLS] (BERT); relu (DistilBERT); + LayerNorm (ModernBERT's head)."""

    def __init__(self, c: BertConfig):
        super().__init__()
        self.dense = nn.Linear(c.hidden_size, c.hidden_size, bias=c.bias)
        self.act = ACTIVATIONS[c.pooler_act]
        self.norm = LayerNorm(c) if c.pooler_norm else nn.Identity()

    def forward(self, h):  # (B, H) -> (B, H)
        return self.norm(self.act(self.dense(h)))


@dataclass
class EncoderOutput:
    last_hidden_state: torch.Tensor          # (B, T, H), (N, H) kept unpadded, (B, 1, H) first_only
    pooler_output: torch.Tensor              # (B, H)
    attentions: Optional[list] = None        # per layer (B, nh, T, T), when asked for
    layout: Optional[Layout] = None


def check_inputs(c: BertConfig, input_ids, attention_mask, token_type_ids):
    """A ValueError naming the argument for what would otherwise fail deep inside torch
    (an IndexError from an embedding lookup) or, worse, silently: ids that are no (B, T)
    integer tensor, outside the vocabulary or longer than the positions, a mask or token
    types of another shape. The value checks run where they cost no device sync (CPU)."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 \
            or input_ids.dtype.is_floating_point or input_ids.dtype == torch.bool:
        shown = (f"a {input_ids.dim()}-D {input_ids.dtype} tensor"
                 if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__)
        raise ValueError(f"input_ids must be a (batch, length) tensor of token ids, got {shown}")
    B, T = input_ids.shape
    if B == 0 or T == 0:
        raise ValueError(f"input_ids is empty: shape {tuple(input_ids.shape)}")
    absolute = c.position_embedding_type == "absolute"
    if absolute and T + c.position_offset > c.max_position_embeddings:
        raise ValueError(f"input_ids has {T} tokens a row, more than the model's "
                         f"{c.max_position_embeddings - c.position_offset} positions")
    for name, t in (("attention_mask", attention_mask), ("token_type_ids", token_type_ids)):
        if t is not None and (not isinstance(t, torch.Tensor) or t.shape != input_ids.shape):
            shown = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name} must have the shape of input_ids {(B, T)}, got {shown}")
    if input_ids.device.type != "cpu":
        return
    lo, hi = int(input_ids.min()), int(input_ids.max())
    if lo < 0 or hi >= c.vocab_size:
        raise ValueError(f"input_ids holds {lo if lo < 0 else hi}, outside the vocabulary "
                         f"(0 to {c.vocab_size - 1})")
    if token_type_ids is not None and c.type_vocab_size > 1:   # (0: the model reads none; 1:
        # every token reads the one segment, as RoBERTa's tokenizer gives both texts type 0)
        if int(token_type_ids.min()) < 0 or int(token_type_ids.max()) >= c.type_vocab_size:
            raise ValueError(f"token_type_ids must be from 0 to {c.type_vocab_size - 1}")
    if attention_mask is not None and attention_mask.dtype != torch.bool:
        odd = attention_mask[(attention_mask != 0) & (attention_mask != 1)]
        if odd.numel():   # (-1 or 0.5 read as a token here, not in transformers: 5.9 apart)
            raise ValueError(f"attention_mask must hold 0 (padding) and 1 (a token), got "
                             f"{odd[0].item():g}")


class BertModel(nn.Module):
    """Embeddings, blocks and pooler: the `BertModel` of the checkpoint format."""

    def __init__(self, c: BertConfig):
        super().__init__()
        self.config = c
        self.emb = Embeddings(c)
        n_weights = c.num_layer_groups or c.num_hidden_layers  # fewer when ALBERT shares
        self.blocks = nn.ModuleList(Block(c, i) for i in range(n_weights))
        self.final_norm = LayerNorm(c) if c.pre_norm else None
        self.pooler = Pooler(c)
        if c.relative_attention:  # DeBERTa: embeddings of relative distances, shared by layers
            span = c.relative_buckets if c.relative_buckets > 0 else c.max_relative_positions
            self.rel = nn.Embedding(2 * span, c.hidden_size)
            self.rel_norm = LayerNorm(c) if c.relative_norm else nn.Identity()
        if c.position_buckets:    # MPNet: a bias per head for each bucket of offsets
            self.pos_bias = nn.Embedding(c.position_buckets, c.num_attention_heads)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None,
                output_attentions=False, keep_unpadded=False, first_only=False,
                padded=False) -> EncoderOutput:
        """The encoder: last_hidden_state (B, T, H), pooler_output (B, H), and with
        output_attentions each layer's attention probabilities (B, nh, T, T)."""
        # input_ids, attention_mask, token_type_ids: (B, T)
        # padded: the padded layout whatever the backend (fixed shapes, no host sync: a
        # CUDA graph, batching.CudaGraphs)
        # first_only: the caller reads pooler_output and each row's first real token
        # (last_hidden_state (B, 1, H)): unpadded, the last block runs past attention on
        # those rows alone (a sixth of minilm's products, on sentences of 25 tokens)
        check_inputs(self.config, input_ids, attention_mask, token_type_ids)
        if input_ids.dtype not in (torch.int64, torch.int32):   # (uint8, int16: the lookup's)
            input_ids = input_ids.long()
        if token_type_ids is not None and token_type_ids.dtype not in (torch.int64, torch.int32):
            token_type_ids = token_type_ids.long()
        B, T = input_ids.shape
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        positions = self.positions(input_ids)                          # (B, T)
        # (a window over a mask with holes counts columns, as transformers' padded path
        # does; packed, the tokens around a hole would be nearer: the padded layout)
        unpadded = self.config.unpadded and not padded and not (
            self.config.local_attention and has_holes(attention_mask))
        if unpadded:
            layout = UnpaddedLayout(attention_mask)
            ids, pos, seg = (layout.unpad(t) for t in (input_ids, positions, token_type_ids))
        else:
            layout = Layout(attention_mask, self.config.attn_backend)
            ids, pos, seg = input_ids, positions, token_type_ids
        layout.positions = pos - self.config.position_offset
        x = self.emb(ids, pos, seg)                          # (B, T, H) or (N, H)
        if unpadded and Linear.fast_path(x) and isinstance(self.blocks[0].attn.qkv, Linear):
            x = layout.round_rows(x)                         # (N + spare, H)
        attentions = [] if output_attentions else None
        rel = self.relative_terms(T, x.device)
        mean = self.config.classifier_pooling == "mean"
        shortcut = (first_only and unpadded and rel is None and not mean
                    and not output_attentions and layout.N > 0)
        last = self.config.num_hidden_layers - 1
        for layer in range(self.config.num_hidden_layers):
            block = self.blocks[self.config.layer_weights(layer)]
            rows = layout.starts if shortcut and layer == last else None
            x, probs = block(x, layout, output_attentions, rel, rows)
            if output_attentions:
                attentions.append(probs)
        if self.final_norm is not None:
            x = self.final_norm(x)
        if shortcut:                                         # (B, H): the first tokens
            return EncoderOutput(x.unsqueeze(1), self.pooler(x), attentions, layout)
        if unpadded:
            x = layout.real(x)                               # (N, H)
        pooled = self.pooler((layout.mean_tokens if mean else layout.first_tokens)(x))  # (B, H)
        if first_only:
            x = layout.first_tokens(x).unsqueeze(1)          # (B, 1, H)
        elif not keep_unpadded:
            x = layout.pad(x)
        return EncoderOutput(x, pooled, attentions, layout)

    def positions(self, input_ids):
        # input_ids (B, T) -> the position of each token (B, T): 0, 1, 2... from the first
        # column, or, in the families that count from pad_token_id + 1 (RoBERTa, MPNet),
        # as transformers counts them there: the tokens that are not the padding id, from
        # the offset (a left-padded row's first token too); padding at offset - 1
        B, T = input_ids.shape
        offset = self.config.position_offset
        if not offset:
            return torch.arange(T, device=input_ids.device).expand(B, T)
        real = (input_ids != offset - 1).long()
        return real.cumsum(1) * real + (offset - 1)

    def relative_terms(self, T: int, device):
        """What every block's attention adds for relative positions over T tokens:
        DeBERTa's (embeddings, index, terms), MPNet's bias (1, nh, T, T), else None."""
        c = self.config
        if c.relative_attention:
            return (self.rel_norm(self.rel.weight),
                    _relative_index(T, c.relative_buckets, c.max_relative_positions, device),
                    c.relative_terms.split("|"))
        if c.position_buckets:
            buckets = _position_buckets(T, c.position_buckets, c.position_max_distance, device)
            return self.pos_bias(buckets).permute(2, 0, 1).unsqueeze(0)     # (1, nh, T, T)
        return None

    @torch.inference_mode()
    def warm_shapes(self, max_tokens: int) -> list:
        """Build oneDNN's code for every row count a CPU batch of up to `max_tokens` real
        tokens runs its products at (onednn_rows above Linear.SMALL_ROWS: 80 counts up
        to 4,096 tokens, the CPU's forward-pass cap), at once. oneDNN keeps the code of
        each shape it meets (minilm: about 2.4 MB per row count), so a server that meets
        them one by one, as rare batch sizes arrive, grows for many minutes; warmed, its
        memory starts where it stays.
        Blocks share their shapes, so one block runs. Returns the row counts (none off
        the fast path)."""
        block = self.blocks[0]
        if not (isinstance(block.up, Linear) and isinstance(block.attn.qkv, Linear)
                and Linear.fast_path(block.up.weight)):
            return []
        rows = sorted({onednn_rows(m) for m in range(Linear.SMALL_ROWS + 1, max_tokens + 1)})
        block.warm(1)  # the (K, N) copies of the small-row products
        for r in rows:
            block.warm(r)
        return rows


# ----------------------------------------------------------------------------------
# Task heads


class MLMHead(nn.Module):
    """dense + act + LayerNorm, then the decoder, whose weight is the word embedding. The
    activation is the FFN's (hidden_act) unless the family's head fixes its own (mlm_act)."""

    def __init__(self, c: BertConfig, word_embeddings: nn.Embedding):
        super().__init__()
        E = c.embedding_size or c.hidden_size  # ALBERT projects back down to E
        self.dense = nn.Linear(c.hidden_size, E, bias=c.bias)
        self.act = ACTIVATIONS[c.mlm_act or c.hidden_act]
        self.norm = LayerNorm(c, E)
        self.word_embeddings = word_embeddings  # tied: shared, not copied
        if c.decoder_bias:
            self.bias = nn.Parameter(torch.zeros(c.vocab_size))
        else:  # no bias: zeros that are neither trained nor part of the state dict
            self.register_buffer("bias", torch.zeros(c.vocab_size), persistent=False)

    def forward(self, h):  # (..., H) -> (..., V)
        h = self.norm(self.act(self.dense(h)))
        return F.linear(h, self.word_embeddings.weight, self.bias)


# the heads a Bert can carry (HF names the models BertModel, BertForMaskedLM, ...)
HEADS = (None, "mlm", "pretraining", "classify", "regression", "token", "qa")


def pair_loss(pair_logits, pair_labels, reduction: str = "mean") -> torch.Tensor:
    """NSP/SOP: cross-entropy of the two-way sentence-pair classifier, (B, 2) vs (B,)."""
    return F.cross_entropy(pair_logits.float(), pair_labels, reduction=reduction)


def sequence_loss(logits, labels, problem_type: Optional[str]) -> torch.Tensor:
    """A sequence head's loss, as transformers' BertForSequenceClassification computes it:
    regression, the MSE of the one output ((B,) or (B, 1) labels alike: (B, 1) had
    broadcast to (B, B)); multi-label, a sigmoid BCE per label on (B, C) multi-hot
    labels; else cross-entropy over the classes, (B,) class ids."""
    if problem_type == "regression":
        if labels.numel() != logits.shape[0]:
            raise ValueError(f"labels of shape {tuple(labels.shape)}: a regression head takes "
                             f"one number per row ({logits.shape[0]})")
        return F.mse_loss(logits.squeeze(-1), labels.float().reshape(-1))
    if problem_type == "multi_label_classification":
        if labels.shape != logits.shape:
            raise ValueError(f"labels of shape {tuple(labels.shape)}: a multi-label head takes "
                             f"0/1 per row and label, {tuple(logits.shape)}")
        return F.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype))
    if labels.dim() != 1 or labels.shape[0] != logits.shape[0] or labels.is_floating_point():
        raise ValueError(f"labels of shape {tuple(labels.shape)}, {labels.dtype}: a "
                         f"classifier takes one class id per row, ({logits.shape[0]},) integers")
    return F.cross_entropy(logits, labels)


def masked_lm_loss(logits, labels) -> torch.Tensor:
    """Per-token cross-entropy (MLM, NER), (M, V) vs (M,) (-100: not scored), averaged
    over the scored tokens; 0 (with its graph) where there are none (rows of [UNK] and
    special tokens alone: the mean over no token was NaN, and the run stopped as diverged)."""
    scored = (labels != -100).sum().clamp(min=1)       # (no host sync: a tensor)
    return F.cross_entropy(logits, labels, reduction="sum") / scored


@dataclass
class Output:
    loss: Optional[torch.Tensor] = None
    logits: Optional[torch.Tensor] = None        # task logits (MLM: (M, V) or (B, T, V))
    pair_logits: Optional[torch.Tensor] = None   # NSP/SOP (B, 2)
    start_logits: Optional[torch.Tensor] = None  # QA (B, T)
    end_logits: Optional[torch.Tensor] = None    # QA (B, T)
    hidden: Optional[EncoderOutput] = None


class Bert(nn.Module):
    """An encoder plus one head (one of HEADS; None: the bare encoder)."""

    def __init__(self, config: BertConfig, head: Optional[str] = None):
        super().__init__()
        if not isinstance(config, BertConfig):
            raise TypeError(f"Bert(config): expected a BertConfig (nanobert.preset('tiny'), "
                            f"say), got {type(config).__name__}")
        if head not in HEADS:
            raise ValueError(f"unknown head {head!r}; choose from {[h for h in HEADS if h]}")
        # the head decides the output size: a changed copy, the caller's config stays as it is
        if head == "regression":
            config = replace(config, num_labels=1, problem_type="regression", id2label=None)
        elif config.problem_type == "regression":   # (a new head on a regression checkpoint)
            config = replace(config, problem_type=None)
        if head == "qa":  # two outputs, start and end; HF sizes the layer by num_labels
            config = replace(config, num_labels=2, id2label=None)
        self.config, self.head = config, head
        c = config
        self.bert = BertModel(c)
        drop = c.classifier_dropout if c.classifier_dropout is not None else c.hidden_dropout_prob
        self.drop = nn.Dropout(drop)
        if head in ("mlm", "pretraining"):
            self.mlm = MLMHead(c, self.bert.emb.tok)
        if head == "pretraining":
            self.pair = nn.Linear(c.hidden_size, 2)            # NSP / SOP
        if head in ("classify", "regression", "token"):
            self.classifier = nn.Linear(c.hidden_size, c.num_labels)
        if head == "qa":
            self.qa = nn.Linear(c.hidden_size, 2)              # start, end
        self.apply(self._init_weights)

    def _init_weights(self, m):
        std = self.config.initializer_range
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=std)
            if m.padding_idx is not None:
                m.weight.data[m.padding_idx].zero_()
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            if m.bias is not None:
                nn.init.zeros_(m.bias)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None,
                output_attentions=False, mlm_full=False, first_only=False, **targets) -> Output:
        """labels: MLM (B, T) with -100 where no loss; classify (B,); regression (B,) float;
        token (B, T) with -100 where no loss. targets: pair_labels, NSP/SOP (B,);
        start_positions and end_positions, QA (B,) each. first_only: only a sequence
        head's logits are read (BertModel.forward's). For MLM the vocabulary projection
        runs only where labels != -100 (logits (M, V)), unless `mlm_full` or no labels."""
        self._check_targets(input_ids, labels, targets)
        pair_labels = targets.get("pair_labels")
        start_positions, end_positions = targets.get("start_positions"), targets.get("end_positions")
        head = self.head
        enc = self.bert(input_ids, attention_mask, token_type_ids, output_attentions,
                        keep_unpadded=head in ("mlm", "pretraining", "token"),
                        first_only=first_only and head in ("classify", "regression"))
        out = Output(hidden=enc)
        h, layout = enc.last_hidden_state, enc.layout  # h: (B, T, H) or (N, H)
        unpadded = isinstance(layout, UnpaddedLayout)   # (the batch's: holes run padded)
        if head in ("mlm", "pretraining"):
            if labels is not None and not mlm_full:
                flat = layout.unpad(labels) if unpadded else labels.flatten()   # (N,)/(B*T,)
                sel = (flat != -100).nonzero().squeeze(1)                      # (M,)
                if unpadded:  # rows of the logits in batch order, as in the padded path
                    sel = sel[layout.index[sel].argsort()]
                hs = h.flatten(0, -2)[sel] if not unpadded else h[sel]         # (M, H)
                out.logits = self.mlm(hs)                                      # (M, V)
                out.loss = masked_lm_loss(out.logits, flat[sel])
            else:
                out.logits = layout.pad(self.mlm(h)) if unpadded else self.mlm(h)
                if labels is not None:
                    out.loss = masked_lm_loss(out.logits.flatten(0, 1), labels.flatten())
            if head == "pretraining":
                out.pair_logits = self.pair(enc.pooler_output)                 # (B, 2)
                if pair_labels is not None:
                    pl = pair_loss(out.pair_logits, pair_labels)
                    out.loss = pl if out.loss is None else out.loss + pl
        elif head in ("classify", "regression"):
            out.logits = self.classifier(self.drop(enc.pooler_output))         # (B, C)
            if labels is not None:
                out.loss = sequence_loss(out.logits, labels, self.config.problem_type)
        elif head == "token":
            h = self.bert.pooler(h) if self.config.token_head else h          # ModernBERT
            logits = self.classifier(self.drop(h))                             # (..., C)
            out.logits = layout.pad(logits) if unpadded else logits            # (B, T, C)
            if labels is not None:
                out.loss = masked_lm_loss(out.logits.flatten(0, 1), labels.flatten())
        elif head == "qa":
            h = self.drop(self.bert.pooler(h)) if self.config.token_head else h  # ModernBERT
            logits = self.qa(h)
            start, end = logits[..., 0], logits[..., 1]                        # (B, T) each
            out.start_logits, out.end_logits = start, end
            if start_positions is not None:
                # padding is never an answer; masking it makes every backend's loss equal
                pad = ~layout.mask
                start, end = (t.masked_fill(pad, torch.finfo(t.dtype).min) for t in (start, end))
                out.loss = (F.cross_entropy(start, start_positions)
                            + F.cross_entropy(end, end_positions)) / 2
        return out

    def _check_targets(self, input_ids, labels, targets: dict) -> None:
        """A ValueError naming the argument for a target outside its range, which torch's
        loss would report as a bare IndexError (or a device assert on CUDA); checked on
        CPU tensors only (no device sync)."""
        unknown = set(targets) - {"pair_labels", "start_positions", "end_positions"}
        if unknown:
            raise TypeError(f"unexpected argument(s) {', '.join(sorted(unknown))}")
        T = input_ids.shape[-1] if isinstance(input_ids, torch.Tensor) else 0
        self._check_target_shapes(input_ids, labels, targets)
        classes = {"mlm": self.config.vocab_size, "pretraining": self.config.vocab_size,
                   "classify": self.config.num_labels, "token": self.config.num_labels}
        limits = {"labels": classes.get(self.head), "pair_labels": 2,
                  "start_positions": T, "end_positions": T}
        for name, t in (("labels", labels), *targets.items()):
            n = limits[name]
            if n is None or not isinstance(t, torch.Tensor) or t.device.type != "cpu" \
                    or t.numel() == 0 or t.dtype.is_floating_point:
                continue
            bad = t[(t != -100) & ((t < 0) | (t >= n))]   # -100: no loss at that position
            if bad.numel():
                raise ValueError(f"{name} holds {int(bad[0])}, outside 0 to {n - 1} "
                                 f"(or -100 for no loss)")

    def _check_target_shapes(self, input_ids, labels, targets: dict) -> None:
        """Targets of the shape their loss reads (torch said 'Expected input batch_size
        (10) to match target batch_size (2)', or an IndexError deep in the unpadded
        layout): per token (B, T), per row (B,); QA's start and end together."""
        if ("start_positions" in targets) != ("end_positions" in targets) or \
                (targets.get("start_positions") is None) != (targets.get("end_positions") is None):
            raise ValueError("start_positions and end_positions go together (QA's loss reads "
                             "both)")
        if not isinstance(input_ids, torch.Tensor):
            return
        B = input_ids.shape[0] if input_ids.dim() > 1 else 1
        per_token = self.head in ("mlm", "pretraining", "token")
        wanted = {"labels": tuple(input_ids.shape) if per_token else None,
                  "pair_labels": (B,), "start_positions": (B,), "end_positions": (B,)}
        for name, t in (("labels", labels), *targets.items()):
            if t is None:
                continue
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name} must be a tensor, got {type(t).__name__}")
            if wanted[name] is not None and tuple(t.shape) != wanted[name]:
                raise ValueError(f"{name} of shape {tuple(t.shape)}: expected "
                                 f"{wanted[name]}, " + ("one per token of input_ids"
                                                        if name == "labels" else "one per row"))

    @property
    def task(self) -> Optional[str]:
        """The head, under the name transformers-era code (and the parity tests) use."""
        return self.head

    def num_parameters(self) -> int:
        """How many numbers the model holds (tied embeddings counted once)."""
        return sum(p.numel() for p in self.parameters())

    # checkpoint I/O lives in nanobert.checkpoint; these are the convenient doors to it
    @classmethod
    def from_pretrained(cls, name_or_dir, head="auto", **config_overrides) -> "Bert":
        """In eval mode, as transformers' from_pretrained returns it (dropout off)."""
        from .checkpoint import load_model
        return load_model(name_or_dir, head=head, **config_overrides).eval()

    def save_pretrained(self, out_dir, tokenizer=None):
        """config.json + model.safetensors (+ the tokenizer's files) into `out_dir`. Not
        into a directory of a nanobert run or a sentence-transformers model: its settings
        (nanobert.json, modules.json and the pooling's config), run record and checkpoint
        would then describe another model than the weights beside them."""
        from pathlib import Path
        from .checkpoint import SETTINGS_FILE, save_model
        from .files import NanobertError
        from .rundir import RUN_FILE
        if isinstance(out_dir, (str, Path)) and str(out_dir):
            held = [f for f in (SETTINGS_FILE, RUN_FILE, "modules.json",
                                "sentence_bert_config.json") if (Path(out_dir) / f).is_file()]
            if held:
                whose = ("a nanobert run's" if held[0] in (SETTINGS_FILE, RUN_FILE)
                         else "a sentence-transformers model's")
                raise NanobertError(f"save_pretrained({out_dir}): holds {whose} "
                                    f"{' and '.join(held)}, which would describe another "
                                    "model than the one saved; save into a new directory")
        save_model(self, out_dir, tokenizer=tokenizer)
