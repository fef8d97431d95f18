"""`nanobert info MODEL`: what a checkpoint is, and where its parameters are."""
from __future__ import annotations

import json


def summary(model, tokenizer=None) -> dict:
    """Config, parameter counts by part, vocabulary size, as a dict. `model`: a
    nanobert.Bert (what nanobert.load gives)."""
    from .model import Bert
    if not isinstance(model, Bert):   # (an AttributeError on 'bert' or 'config')
        raise TypeError(f"summary(model): a nanobert.Bert, as nanobert.load gives it, got "
                        f"{type(model).__name__}")
    c = model.config
    bert = model.bert

    def count(params, outside=()) -> int:
        skip = {id(p) for m in outside for p in m.parameters()}
        return sum(p.numel() for p in params if id(p) not in skip)
    counts = {"embeddings": count(bert.emb.parameters()),
              # the rest of the encoder: its blocks, and what they share (DeBERTa's
              # relative position embeddings, ModernBERT's final LayerNorm)
              "encoder blocks": count(bert.parameters(), (bert.emb, bert.pooler)),
              "pooler": count(bert.pooler.parameters()),
              "head": count(model.parameters(), (bert,))}
    # a pooler this family's model for this task does not have (DistilBERT's and
    # ModernBERT's encoders, any token or QA model) is neither saved nor counted
    pooler_saved = _pooler_saved(model)
    if not pooler_saved:
        counts.pop("pooler")
    return {
        "task": model.head or "encoder", "family": c.family,
        "layers": c.num_hidden_layers, "hidden": c.hidden_size,
        "heads": c.num_attention_heads, "ffn": c.intermediate_size,
        # the longest input in tokens (RoBERTa's table of 514 holds 512 and 2 offsets)
        "max_positions": c.usable_positions, "activation": c.hidden_act,
        "attn_backend": c.attn_backend,
        "vocab_size": c.vocab_size if tokenizer is None else tokenizer.vocab_size,
        "labels": c.id2label if model.head in ("classify", "token") else None,
        "parameters": dict(counts, total=saved_parameters(model)),
        # made on load, not in the checkpoint (a head, a pooler): seeded, untrained
        "new_weights": [n for n in getattr(model, "new_weights", [])
                        if pooler_saved or not n.startswith("bert.pooler.")],
    }


def saved_parameters(model) -> int:
    """The parameters a model's directory holds: all but a pooler its family's
    transformers class for its task does not have (an MLM's), as `info` counts them."""
    unsaved = () if _pooler_saved(model) else model.bert.pooler.parameters()
    return model.num_parameters() - sum(p.numel() for p in unsaved)


def _pooler_saved(model) -> bool:
    from .families import FAMILIES
    fam = FAMILIES[model.config.family]
    return any(fam.hf_name("bert.pooler." + n, model.head)
               for n, _ in model.bert.pooler.named_parameters())


def info_args(p):
    p.add_argument("model", help="model directory, 'minilm', or a hub name")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")


def info_cmd(args):
    """Show a model's configuration, parameter count by part and vocabulary size."""
    from .checkpoint import load_for_reading
    model, tokenizer = load_for_reading(args.model)
    s = summary(model, tokenizer)
    if args.json:
        print(json.dumps(s))
        return 0
    print(f"model        {model.source_dir}")
    print(f"task         {s['task']}   family: {s['family']}")
    print(f"shape        {s['layers']} layers, hidden {s['hidden']}, {s['heads']} heads, "
          f"FFN {s['ffn']}, {s['activation']}")
    runs = "" if model.config.unpadded or s["attn_backend"] != "unpadded" else \
        " (runs padded: relative position terms)"    # (DeBERTa, MPNet: model.unpadded)
    print(f"positions    {s['max_positions']} tokens at most   "
          f"attention backend: {s['attn_backend']}{runs}")
    print(f"vocabulary   {s['vocab_size']} tokens "
          f"({'lower-cased' if tokenizer.lowercase else 'cased'})")
    if s["labels"]:
        print(f"labels       {', '.join(s['labels'].values())}")
    if s["new_weights"]:
        parts = sorted({n.rsplit(".", 2)[0] for n in s["new_weights"]})
        print(f"untrained    {', '.join(parts)} (not in the checkpoint: a seeded start)")
    print("parameters")
    for part, n in s["parameters"].items():
        print(f"  {part:<15}{n:>14,}")
    return 0
