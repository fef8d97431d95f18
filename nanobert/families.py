"""The BERT family's checkpoint formats, mapped onto nanobert's one model.

Each Hugging Face family names its tensors and config keys its own way. A `Family`
holds, for one of them: how to read its config.json into a `BertConfig` (and write it
back), and a table of name rules `(our name, HF name, heads)` where `{i}` is a layer
index. Q, K and V are separate tensors in most families and one fused tensor in ours;
`qkv` names the three (or one) HF tensors they come from.

Facts of a family that the names do not say are fields of its `Family`: the activation
its transformers MLM head applies (`mlm_act`), and the tensors transformers saves but
never reads for some configs (`unused`).
"""
from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from typing import Callable, Optional

from .model import BertConfig

ALL = None  # a rule that holds for every head
# the heads whose transformers class has BERT's pooler (dense + tanh on [CLS]); the
# masked-LM, token and QA classes are built without it, and a file that carried it
# makes transformers warn of unused weights
POOLED = (None, "pretraining", "classify", "regression")


@dataclass
class Family:
    name: str
    model_type: str
    arch_prefix: str                          # "Bert" -> BertModel, BertForMaskedLM, ...
    prefix: str                               # of the encoder's names in models with heads
    decoder: str                              # the MLM decoder (tied to the word embeddings)
    rules: list                               # (ours regex, HF template, heads or ALL)
    qkv: tuple                                # HF templates of Q, K, V (or one fused)
    from_hf: Callable[[dict], dict]           # config.json -> BertConfig keyword arguments
    to_hf: Callable[[BertConfig], dict]       # BertConfig -> config.json
    heads: tuple = ("mlm", "pretraining", "classify", "regression", "token", "qa")
    # transformers' sequence classifier reads classifier_pooling from config.json
    # (ModernBERT); the others always read [CLS]
    reads_pooling: bool = False
    # the activation of transformers' MLM head (dense, act, LayerNorm), from the config's
    # keyword arguments: None where it is the FFN's (hidden_act), as in BERT, ALBERT,
    # DistilBERT (its `activation`) and DeBERTa-v2
    mlm_act: Callable[[dict], Optional[str]] = lambda kw: None
    # HF tensors transformers creates and saves for this BertConfig but never reads (none
    # of our parameters): skipped on load
    unused: Callable[[BertConfig], tuple] = lambda c: ()
    # (HF regex, the HF name `rules` use): a tensor some files save under another name,
    # renamed on load
    other_names: tuple = ()
    # transformers' embeddings index a token-type table (type_vocab_size 0 is a model it
    # builds but cannot run); the others have none, or none when it is 0 (DeBERTa)
    segment_table: bool = True

    def config_kwargs(self, hf_config: dict) -> dict:
        """config.json -> BertConfig keyword arguments, the MLM head's activation included."""
        kw = self.from_hf(hf_config)
        kw["mlm_act"] = self.mlm_act(kw)
        return kw

    def hf_name(self, ours: str, head) -> Optional[str]:
        for pat, template, heads in self.rules:
            m = re.fullmatch(pat, ours)
            if m and (heads is ALL or head in heads):
                return template.format(*m.groups())
        return None

    def architecture(self, head) -> str:
        suffix = {None: "Model", "mlm": "ForMaskedLM", "pretraining": "ForPreTraining",
                  "classify": "ForSequenceClassification",
                  "regression": "ForSequenceClassification",
                  "token": "ForTokenClassification", "qa": "ForQuestionAnswering"}[head]
        return self.arch_prefix + suffix

    def head_of(self, architecture: str):
        for head in (None,) + self.heads:
            if self.architecture(head) == architecture:
                return head
        return "missing"


def _encoder_rules(layer: str, names: dict, emb: str, extra=()):
    """Rules for embeddings and blocks. `layer` is the HF prefix of block {0};
    `names` maps our block parts to HF names within it."""
    rules = [(rf"bert\.emb\.{ours}\.(\w+)", emb + hf + ".{}", ALL)
             for ours, hf in (("tok", "word_embeddings"), ("pos", "position_embeddings"),
                              ("seg", "token_type_embeddings"), ("norm", "LayerNorm"))]
    rules += [(rf"bert\.blocks\.(\d+)\.{re.escape(ours)}\.(\w+)", layer + "." + hf + ".{}", ALL)
              for ours, hf in names.items()]
    return rules + list(extra)


def _mlm_rules(dense: str, norm: str, bias: str) -> list:
    """The MLM head's transform (dense, LayerNorm) and bias under a family's HF names."""
    return [(r"mlm\.dense\.(\w+)", dense + ".{}", ALL), (r"mlm\.norm\.(\w+)", norm + ".{}", ALL),
            (r"mlm\.bias", bias, ALL)]


# the token classifier and the QA layer, named alike in most families (after any rule
# that names a sequence classifier otherwise)
OUTPUT_RULES = [(r"classifier\.(\w+)", "classifier.{}", ALL), (r"qa\.(\w+)", "qa_outputs.{}", ALL)]


def _common_config(d: dict, **renames) -> dict:
    """BERT-named keys (or their renamed equivalents) that BertConfig takes directly."""
    out = {}
    for k in BertConfig._HF_KEYS:
        src = renames.get(k, k)
        if src in d and d[src] is not None:
            out[k] = d[src]
    missing = [renames.get(k, k) for k in BertConfig._REQUIRED if k not in out]
    if missing:
        raise KeyError(", ".join(missing))
    return out


def _labels(d: dict, kw: dict) -> dict:
    return {**kw, **BertConfig.labels_from_hf(d)}


def _labels_out(c: BertConfig, d: dict) -> dict:
    d.update(c.labels_to_hf())
    return d


# ---- BERT --------------------------------------------------------------------------

BERT_BLOCK = {"attn.proj": "attention.output.dense", "norm1": "attention.output.LayerNorm",
              "up": "intermediate.dense", "down": "output.dense", "norm2": "output.LayerNorm"}
_BERT_HEADS = [
    (r"bert\.pooler\.dense\.(\w+)", "bert.pooler.dense.{}", POOLED),
    *_mlm_rules("cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm",
                "cls.predictions.bias"),
    (r"pair\.(\w+)", "cls.seq_relationship.{}", ALL),
    *OUTPUT_RULES,
]


def _bert_from_hf(d):
    return BertConfig.from_hf_dict(d).__dict__


BERT = Family(
    "bert", "bert", "Bert", "bert.", "cls.predictions.decoder",
    _encoder_rules("bert.encoder.layer.{}", BERT_BLOCK, "bert.embeddings.", _BERT_HEADS),
    ("bert.encoder.layer.{}.attention.self.query", "bert.encoder.layer.{}.attention.self.key",
     "bert.encoder.layer.{}.attention.self.value"),
    _bert_from_hf, lambda c: c.to_hf_dict(),
)

# ---- RoBERTa: BERT's layout; positions offset by the padding index; its own heads ----


def _roberta_from_hf(d):
    kw = _labels(d, _common_config(d))
    # (XLM-RoBERTa and CamemBERT: RoBERTa's layout under their own model_type)
    pad = d.get("pad_token_id", 1)
    if not isinstance(pad, int) or isinstance(pad, bool):   # (null: no position to count from)
        raise ValueError(f"pad_token_id {json.dumps(pad)}: {d.get('model_type', 'roberta')} "
                         "counts positions from the padding id, which must be an integer")
    kw.update(family=d.get("model_type", "roberta"), position_offset=pad + 1)
    return kw


def _roberta_to_hf(c):
    d = {k: v for k, v in c.to_hf_dict().items() if not k.startswith("nanobert_")}
    d.update(model_type=c.family, bos_token_id=0, eos_token_id=2)
    return d


ROBERTA = Family(
    "roberta", "roberta", "Roberta", "roberta.", "lm_head.decoder",
    _encoder_rules("roberta.encoder.layer.{}", BERT_BLOCK, "roberta.embeddings.", [
        # the classification head is its own dense + tanh on <s>: our pooler, then out_proj
        (r"bert\.pooler\.dense\.(\w+)", "classifier.dense.{}", ("classify", "regression")),
        (r"classifier\.(\w+)", "classifier.out_proj.{}", ("classify", "regression")),
        (r"bert\.pooler\.dense\.(\w+)", "roberta.pooler.dense.{}", (None,)),
        *_mlm_rules("lm_head.dense", "lm_head.layer_norm", "lm_head.bias"),
        *OUTPUT_RULES,
    ]),
    tuple(f"roberta.encoder.layer.{{}}.attention.self.{x}" for x in ("query", "key", "value")),
    _roberta_from_hf, _roberta_to_hf,
    heads=("mlm", "classify", "regression", "token", "qa"),
    mlm_act=lambda kw: "gelu",   # RobertaLMHead applies the exact GELU, whatever hidden_act says
)

# ---- ALBERT: factorized embeddings, shared layer groups, SOP ---------------------------

_ALBERT_LAYER = "albert.encoder.albert_layer_groups.{}.albert_layers.0"


def _albert_from_hf(d):
    kw = _labels(d, _common_config(d))
    if d.get("inner_group_num", 1) != 1:
        raise ValueError("inner_group_num other than 1 is not supported")
    kw.update(family="albert", embedding_size=d.get("embedding_size", 128),
              num_layer_groups=d.get("num_hidden_groups", 1),
              hidden_act=d.get("hidden_act", "gelu_new"))
    if d.get("classifier_dropout_prob") is not None:
        kw["classifier_dropout"] = d["classifier_dropout_prob"]
    return kw


def _albert_to_hf(c):
    d = {k: v for k, v in c.to_hf_dict().items() if not k.startswith("nanobert_")}
    d.update(model_type="albert", embedding_size=c.embedding_size or c.hidden_size,
             num_hidden_groups=c.num_layer_groups or c.num_hidden_layers, inner_group_num=1,
             classifier_dropout_prob=c.classifier_dropout or 0.1)
    return d


ALBERT = Family(
    "albert", "albert", "Albert", "albert.", "predictions.decoder",
    _encoder_rules(_ALBERT_LAYER, {"attn.proj": "attention.dense", "norm1": "attention.LayerNorm",
                                   "up": "ffn", "down": "ffn_output",
                                   "norm2": "full_layer_layer_norm"}, "albert.embeddings.", [
        (r"bert\.emb\.proj\.(\w+)", "albert.encoder.embedding_hidden_mapping_in.{}", ALL),
        (r"bert\.pooler\.dense\.(\w+)", "albert.pooler.{}", POOLED),
        *_mlm_rules("predictions.dense", "predictions.LayerNorm", "predictions.bias"),
        (r"pair\.(\w+)", "sop_classifier.classifier.{}", ALL),
        *OUTPUT_RULES,
    ]),
    tuple(f"{_ALBERT_LAYER}.attention.{x}" for x in ("query", "key", "value")),
    _albert_from_hf, _albert_to_hf,
)

# ---- ELECTRA: BERT's blocks, ALBERT's factorized embeddings (not shared), RoBERTa's
# classification head with a GELU; the generator's MLM head -------------------------------


def _electra_from_hf(d):
    kw = _labels(d, _common_config(d))
    E = d.get("embedding_size", kw["hidden_size"])
    kw.update(family="electra", pooler_act="gelu", mlm_act="gelu",
              embedding_size=E if E != kw["hidden_size"] else None)   # (projected when E < H)
    return kw


def _electra_to_hf(c):
    d = {k: v for k, v in c.to_hf_dict().items() if not k.startswith("nanobert_")}
    d.update(model_type="electra", embedding_size=c.embedding_size or c.hidden_size,
             summary_type="first", summary_use_proj=True, summary_activation="gelu",
             summary_last_dropout=0.1)
    return d


ELECTRA = Family(
    "electra", "electra", "Electra", "electra.", "generator_lm_head",
    _encoder_rules("electra.encoder.layer.{}", BERT_BLOCK, "electra.embeddings.", [
        (r"bert\.emb\.proj\.(\w+)", "electra.embeddings_project.{}", ALL),
        # the classification head: dense + GELU on [CLS] (our pooler), then out_proj
        (r"bert\.pooler\.dense\.(\w+)", "classifier.dense.{}", ("classify", "regression")),
        (r"classifier\.(\w+)", "classifier.out_proj.{}", ("classify", "regression")),
        *_mlm_rules("generator_predictions.dense", "generator_predictions.LayerNorm",
                    "generator_lm_head.bias"),
        *OUTPUT_RULES,
    ]),
    tuple(f"electra.encoder.layer.{{}}.attention.self.{x}" for x in ("query", "key", "value")),
    _electra_from_hf, _electra_to_hf,
    heads=("mlm", "classify", "regression", "token", "qa"),
    mlm_act=lambda kw: "gelu",   # ElectraGeneratorPredictions applies GELU, whatever hidden_act
)

# ---- MPNet: BERT's post-LN blocks, RoBERTa's positions and heads, no segments, and a
# learnt relative-position bias per head (T5 buckets) -----------------------------------


MPNET_PAD = 1   # the padding id transformers' MPNet assumes (its embeddings' padding_idx)


def _mpnet_from_hf(d):
    kw = _labels(d, _common_config(d))
    if d.get("relative_attention_num_buckets", 32) != 32:
        # (transformers' MPNet buckets offsets into 32 whatever it says: more rows are
        # never read, fewer fail)
        raise ValueError(f"relative_attention_num_buckets="
                         f"{d['relative_attention_num_buckets']!r} is not supported (MPNet "
                         "buckets relative positions into 32 in transformers; only 32 is)")
    # transformers' MPNetEmbeddings count positions after id 1 whatever pad_token_id says
    kw.update(family="mpnet", type_vocab_size=0, position_offset=MPNET_PAD + 1,
              position_buckets=32, mlm_act="gelu")
    return kw


def _mpnet_to_hf(c):
    d = {k: v for k, v in c.to_hf_dict().items()
         if not k.startswith("nanobert_") and k != "type_vocab_size"}
    d.update(model_type="mpnet", relative_attention_num_buckets=c.position_buckets,
             bos_token_id=0, eos_token_id=2)
    return d


MPNET = Family(
    "mpnet", "mpnet", "MPNet", "mpnet.", "lm_head.decoder",
    _encoder_rules("mpnet.encoder.layer.{}", {
        "attn.proj": "attention.attn.o", "norm1": "attention.LayerNorm",
        "up": "intermediate.dense", "down": "output.dense", "norm2": "output.LayerNorm"},
        "mpnet.embeddings.", [
        (r"bert\.pos_bias\.(\w+)", "mpnet.encoder.relative_attention_bias.{}", ALL),
        # the classification head: dense + tanh on <s> (our pooler), then out_proj
        (r"bert\.pooler\.dense\.(\w+)", "classifier.dense.{}", ("classify", "regression")),
        (r"classifier\.(\w+)", "classifier.out_proj.{}", ("classify", "regression")),
        (r"bert\.pooler\.dense\.(\w+)", "mpnet.pooler.dense.{}", (None,)),
        *_mlm_rules("lm_head.dense", "lm_head.layer_norm", "lm_head.bias"),
        *OUTPUT_RULES,
    ]),
    tuple(f"mpnet.encoder.layer.{{}}.attention.attn.{x}" for x in "qkv"),
    _mpnet_from_hf, _mpnet_to_hf,
    heads=("mlm", "classify", "regression", "token", "qa"),
    mlm_act=lambda kw: "gelu",   # MPNetLMHead applies GELU, whatever hidden_act says
    segment_table=False,
)

# ---- DistilBERT: no segments, no pooler; a ReLU pre-classifier --------------------------

_DISTIL = dict(vocab_size="vocab_size", hidden_size="dim", num_hidden_layers="n_layers",
               num_attention_heads="n_heads", intermediate_size="hidden_dim",
               hidden_act="activation", hidden_dropout_prob="dropout",
               attention_probs_dropout_prob="attention_dropout",
               initializer_range="initializer_range")


def _distil_from_hf(d):
    if d.get("sinusoidal_pos_embds"):
        pass  # the sinusoids are stored in the position table like learned ones
    kw = _labels(d, _common_config(d, **_DISTIL))
    kw.update(family="distilbert", type_vocab_size=0, pooler_act="relu",
              classifier_dropout=d.get("seq_classif_dropout", 0.2))
    return kw


def _distil_to_hf(c):
    d = {hf: getattr(c, ours) for ours, hf in _DISTIL.items()}
    d.update(model_type="distilbert", max_position_embeddings=c.max_position_embeddings,
             pad_token_id=c.pad_token_id, sinusoidal_pos_embds=False,
             seq_classif_dropout=c.classifier_dropout if c.classifier_dropout is not None else 0.2,
             qa_dropout=c.hidden_dropout_prob)
    return _labels_out(c, d)


DISTILBERT = Family(
    "distilbert", "distilbert", "DistilBert", "distilbert.", "vocab_projector",
    _encoder_rules("distilbert.transformer.layer.{}",
                   {"attn.proj": "attention.out_lin", "norm1": "sa_layer_norm", "up": "ffn.lin1",
                    "down": "ffn.lin2", "norm2": "output_layer_norm"}, "distilbert.embeddings.", [
        (r"bert\.pooler\.dense\.(\w+)", "pre_classifier.{}", ("classify", "regression")),
        *_mlm_rules("vocab_transform", "vocab_layer_norm", "vocab_projector.bias"),
        *OUTPUT_RULES,
    ]),
    tuple(f"distilbert.transformer.layer.{{}}.attention.{x}" for x in ("q_lin", "k_lin", "v_lin")),
    _distil_from_hf, _distil_to_hf,
    heads=("mlm", "classify", "regression", "token", "qa"), segment_table=False,
)

# ---- ModernBERT: pre-LN, RoPE, GeGLU, no biases, local/global attention ---------------

_MODERN = dict(vocab_size="vocab_size", hidden_size="hidden_size",
               num_hidden_layers="num_hidden_layers", num_attention_heads="num_attention_heads",
               intermediate_size="intermediate_size", hidden_act="hidden_activation",
               max_position_embeddings="max_position_embeddings", layer_norm_eps="norm_eps",
               pad_token_id="pad_token_id", initializer_range="initializer_range",
               hidden_dropout_prob="mlp_dropout", attention_probs_dropout_prob="attention_dropout")


def _modern_from_hf(d):
    kw = _labels(d, _common_config(d, **_MODERN))
    rope = d.get("rope_parameters") or {}
    layer_types = d.get("layer_types")
    every = d.get("global_attn_every_n_layers", 3)
    if layer_types:  # the explicit per-layer list wins; it must be a regular alternation
        globals_ = [i for i, t in enumerate(layer_types) if t == "full_attention"]
        every = globals_[1] - globals_[0] if len(globals_) > 1 else len(layer_types)
        if [i for i in range(len(layer_types)) if i % every == 0] != globals_:
            raise ValueError("layer_types is not a regular global/local alternation")
    kw.update(
        family="modernbert", type_vocab_size=0, position_embedding_type="rope", pre_norm=True,
        glu=True, bias=bool(d.get("attention_bias", False)), norm_bias=bool(d.get("norm_bias", False)),
        local_attention=d.get("local_attention", 128), global_every=every,
        rope_theta=(rope.get("full_attention") or {}).get("rope_theta", d.get("global_rope_theta", 160000.0)),
        local_rope_theta=(rope.get("sliding_attention") or {}).get("rope_theta", d.get("local_rope_theta", 10000.0)),
        pooler_act=d.get("classifier_activation", "gelu"), pooler_norm=True, token_head=True,
        classifier_pooling=d.get("classifier_pooling", "cls"),
        classifier_dropout=d.get("classifier_dropout", 0.0),
        decoder_bias=bool(d.get("decoder_bias", True)))   # ModernBertForMaskedLM's decoder
    if bool(d.get("mlp_bias", False)) != kw["bias"]:
        raise ValueError("attention_bias and mlp_bias must agree")
    if d.get("classifier_bias", False) and not kw["bias"]:  # the head's dense layer
        raise ValueError("classifier_bias=true is not supported without attention_bias=true")
    return kw


def _modern_to_hf(c):
    d = {hf: getattr(c, ours) for ours, hf in _MODERN.items()}
    d.update(model_type="modernbert", norm_bias=c.norm_bias, attention_bias=c.bias,
             # decoder_bias=True whatever c.decoder_bias says: the file holds the MLM
             # bias (zeros where the model has none), which transformers then reads
             mlp_bias=c.bias, classifier_bias=c.bias, decoder_bias=True,
             local_attention=c.local_attention, global_attn_every_n_layers=c.global_every,
             rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": c.rope_theta},
                              "sliding_attention": {"rope_type": "default",
                                                    "rope_theta": c.local_rope_theta}},
             classifier_pooling=c.classifier_pooling, classifier_activation=c.pooler_act,
             classifier_dropout=c.classifier_dropout or 0.0, embedding_dropout=0.0,
             bos_token_id=None, eos_token_id=None, cls_token_id=None, sep_token_id=None)
    return _labels_out(c, d)


_MODERN_HEAD_TASKS = ("classify", "regression", "token", "qa")   # ModernBertPredictionHead
MODERNBERT = Family(
    "modernbert", "modernbert", "ModernBert", "model.", "decoder",
    [(r"bert\.emb\.tok\.(\w+)", "model.embeddings.tok_embeddings.{}", ALL),
     (r"bert\.emb\.norm\.(\w+)", "model.embeddings.norm.{}", ALL)]
    + [(rf"bert\.blocks\.(\d+)\.{re.escape(ours)}\.(\w+)", "model.layers.{}." + hf + ".{}", ALL)
       for ours, hf in (("attn.qkv", "attn.Wqkv"), ("attn.proj", "attn.Wo"), ("norm1", "attn_norm"),
                        ("up", "mlp.Wi"), ("down", "mlp.Wo"), ("norm2", "mlp_norm"))]
    + [(r"bert\.final_norm\.(\w+)", "model.final_norm.{}", ALL),
       (r"bert\.pooler\.dense\.(\w+)", "head.dense.{}", _MODERN_HEAD_TASKS),
       (r"bert\.pooler\.norm\.(\w+)", "head.norm.{}", _MODERN_HEAD_TASKS),
       *_mlm_rules("head.dense", "head.norm", "decoder.bias"),
       (r"classifier\.(\w+)", "classifier.{}", ALL),
       (r"qa\.(\w+)", "classifier.{}", ALL)],          # its QA layer is named classifier too
    ("model.layers.{}.attn.Wqkv",),
    _modern_from_hf, _modern_to_hf,
    heads=("mlm", "classify", "regression", "token", "qa"), reads_pooling=True,
    segment_table=False,
    # one ModernBertPredictionHead serves the classifier and the MLM: classifier_activation
    mlm_act=lambda kw: kw["pooler_act"],
)

# ---- DeBERTa-v2/v3: disentangled attention over relative positions ---------------------


DEBERTA_DEFAULTS = {"share_att_key": False, "conv_kernel_size": 0}   # what transformers reads


def _deberta_from_hf(d):
    kw = _labels(d, _common_config(d))
    terms = d.get("pos_att_type") or []
    if isinstance(terms, str):
        terms = terms.split("|")
    relative = bool(d.get("relative_attention", False))
    unsupported = [
        ("share_att_key", relative and terms and not d.get("share_att_key", False)),
        ("conv_kernel_size", d.get("conv_kernel_size", 0) > 0),
        ("embedding_size", d.get("embedding_size", kw["hidden_size"]) != kw["hidden_size"]),
        ("pooler_hidden_size", d.get("pooler_hidden_size", kw["hidden_size"]) != kw["hidden_size"]),
    ]
    for key, bad in unsupported:
        if bad:   # (a key left out takes transformers' default: say which)
            shown = (f"{key}={d[key]!r}" if key in d else
                     f"{key} missing (transformers then takes {key}={DEBERTA_DEFAULTS[key]!r})")
            raise ValueError(f"{shown} is not supported for deberta-v2")
    if d.get("attention_head_size", kw["hidden_size"] // kw["num_attention_heads"]) \
            != kw["hidden_size"] // kw["num_attention_heads"]:
        raise ValueError(f"attention_head_size={d['attention_head_size']!r} is not supported for "
                         "deberta-v2 (only hidden_size / num_attention_heads, "
                         f"{kw['hidden_size'] // kw['num_attention_heads']})")
    max_rel = d.get("max_relative_positions", -1)
    kw.update(family="deberta-v2", type_vocab_size=d.get("type_vocab_size", 0),
              position_embedding_type="absolute" if d.get("position_biased_input", True) else "none",
              relative_attention=relative,
              relative_terms="|".join(t for t in ("c2p", "p2c") if t in terms),
              relative_buckets=max(d.get("position_buckets", -1), 0),
              max_relative_positions=max_rel if max_rel >= 1 else kw.get("max_position_embeddings", 512),
              relative_norm="layer_norm" in str(d.get("norm_rel_ebd", "none")).lower(),
              terms_scale=True,   # pos_att_type scales attention even without relative_attention
              pooler_act=d.get("pooler_hidden_act", "gelu"))
    return kw


def _deberta_to_hf(c):
    d = {k: v for k, v in c.to_hf_dict().items() if not k.startswith("nanobert_")}
    d.update(model_type="deberta-v2", relative_attention=c.relative_attention,
             pos_att_type=c.relative_terms.split("|") if c.relative_terms else [],
             position_buckets=c.relative_buckets or -1,
             max_relative_positions=c.max_relative_positions,
             # (without relative attention the norm is never applied, and "none" spares
             # transformers a LayerNorm it would build, find no weights for and not use)
             norm_rel_ebd="layer_norm" if c.relative_attention and c.relative_norm else "none",
             share_att_key=True,
             position_biased_input=c.position_embedding_type == "absolute",
             pooler_hidden_act=c.pooler_act, pooler_hidden_size=c.hidden_size, pooler_dropout=0.0,
             legacy=True)
    return d


DEBERTA = Family(
    "deberta-v2", "deberta-v2", "DebertaV2", "deberta.", "cls.predictions.decoder",
    _encoder_rules("deberta.encoder.layer.{}", BERT_BLOCK, "deberta.embeddings.", [
        (r"bert\.rel\.(\w+)", "deberta.encoder.rel_embeddings.{}", ALL),
        (r"bert\.rel_norm\.(\w+)", "deberta.encoder.LayerNorm.{}", ALL),
        (r"bert\.pooler\.dense\.(\w+)", "pooler.dense.{}", ("classify", "regression")),
        *_mlm_rules("cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm",
                "cls.predictions.bias"),
        *OUTPUT_RULES,
    ]),
    tuple(f"deberta.encoder.layer.{{}}.attention.self.{x}_proj" for x in ("query", "key", "value")),
    _deberta_from_hf, _deberta_to_hf,
    heads=("mlm", "classify", "regression", "token", "qa"), segment_table=False,
    # norm_rel_ebd="layer_norm" without relative attention: transformers builds and saves
    # the norm of relative embeddings it has none of (DebertaV2Encoder.get_rel_embedding)
    unused=lambda c: () if c.relative_attention else (
        "deberta.encoder.LayerNorm.weight", "deberta.encoder.LayerNorm.bias"),
    # config.json legacy: false: transformers' other MLM head, the same layers (dense, act,
    # LayerNorm, the tied decoder, a bias) under other names
    other_names=((r"lm_predictions\.lm_head\.(dense|LayerNorm)\.",
                  r"cls.predictions.transform.\1."),
                 (r"lm_predictions\.lm_head\.bias$", "cls.predictions.bias")),
)

# RoBERTa's layout, names and heads under another model_type and class prefix (the
# multilingual XLM-R of multilingual-e5 and bge-m3; CamemBERT)
XLM_ROBERTA = dataclasses.replace(ROBERTA, name="xlm-roberta", model_type="xlm-roberta",
                                  arch_prefix="XLMRoberta")
CAMEMBERT = dataclasses.replace(ROBERTA, name="camembert", model_type="camembert",
                                arch_prefix="Camembert")
FAMILIES = {f.name: f for f in (BERT, ROBERTA, ALBERT, DISTILBERT, MODERNBERT, DEBERTA,
                                XLM_ROBERTA, CAMEMBERT, ELECTRA, MPNET)}
BY_MODEL_TYPE = {f.model_type: f for f in FAMILIES.values()}
