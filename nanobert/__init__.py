"""nanobert: BERT-style encoders in readable PyTorch."""
from .files import NanobertError
from .model import PRESETS, Bert, BertConfig, BertModel, preset
from .tokenizer import Tokenizer

__version__ = "0.1.0"


def load(name_or_dir, task="auto", **config_overrides):
    """(model, tokenizer) from a HF directory, the alias 'minilm', or a hub name."""
    from .checkpoint import load_model, resolve
    model = load_model(name_or_dir, task=task, **config_overrides)
    return model, Tokenizer.from_dir(resolve(name_or_dir))


__all__ = ["Bert", "BertConfig", "BertModel", "NanobertError", "PRESETS", "Tokenizer",
           "load", "preset"]
