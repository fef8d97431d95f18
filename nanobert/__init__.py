"""nanobert: BERT-style encoders in readable PyTorch."""
from .files import NanobertError
from .model import PRESETS, Bert, BertConfig, BertModel, preset
from .tokenizer import Tokenizer

__version__ = "0.1.0"


def load(name_or_dir, task="auto", dtype="float32", **config_overrides):
    """(model, tokenizer) from a HF directory, the alias 'minilm', or a hub name.
    dtype="int8": int8 Linear layers for CPU inference (`nanobert.quantize`)."""
    from .checkpoint import load_model, resolve
    from .quantize import to_dtype
    model = load_model(name_or_dir, task=task, **config_overrides)
    tokenizer = Tokenizer.from_dir(resolve(name_or_dir))
    return to_dtype(model, dtype, tokenizer), tokenizer


__all__ = ["Bert", "BertConfig", "BertModel", "NanobertError", "PRESETS", "Tokenizer",
           "load", "preset"]
