"""`nanobert info`: what a checkpoint is, parameters by part."""
import json

import nanobert
from nanobert.cli import main
from nanobert.info import summary


def test_summary_counts_every_parameter_once(tiny_config):
    model = nanobert.Bert(tiny_config, "classify")
    s = summary(model)
    parts = s["parameters"]
    assert parts["total"] == model.num_parameters()
    assert parts["embeddings"] + parts["encoder blocks"] + parts["pooler"] + parts["head"] \
        == parts["total"]
    assert s["task"] == "classify" and s["labels"] is None     # no label names given
    named = nanobert.Bert(tiny_config.__class__(**{**vars(tiny_config),
                                                   "id2label": {0: "neg", 1: "pos"}}), "classify")
    assert summary(named)["labels"] == {0: "neg", 1: "pos"}
    assert summary(nanobert.Bert(tiny_config))["task"] == "encoder"


def test_info_json_on_minilm(capsys):
    assert main(["info", "minilm", "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert (s["layers"], s["hidden"], s["heads"], s["vocab_size"]) == (6, 384, 12, 30522)
    assert s["max_positions"] == 512


def test_info_positions_are_the_tokens_a_row_may_hold(tiny_config):
    """RoBERTa's table of 514 positions starts at pad + 1: 512 tokens fit, not 514."""
    from nanobert.model import preset
    roberta = preset("tiny", vocab_size=100, max_position_embeddings=514, position_offset=2,
                     pad_token_id=1)
    assert summary(nanobert.Bert(roberta))["max_positions"] == 512


def test_info_names_weights_the_checkpoint_lacks(tmp_path, tiny_config):
    """A masked-LM file has no pooler: loaded as a classifier, info says the pooler and
    the classifier are untrained (seeded on load). As a masked LM it uses no pooler:
    none is named, nor counted."""
    nanobert.Bert(tiny_config, "mlm").save_pretrained(tmp_path / "m")
    from nanobert.checkpoint import load_model
    s = summary(load_model(tmp_path / "m", head="classify"))
    assert s["new_weights"] == ["bert.pooler.dense.weight", "bert.pooler.dense.bias",
                                "classifier.weight", "classifier.bias"]
    s = summary(load_model(tmp_path / "m"))
    assert s["new_weights"] == [] and "pooler" not in s["parameters"]


def test_info_says_a_relative_position_model_runs_padded(tmp_path, capsys):
    """DeBERTa's (and MPNet's) relative terms keep it on the padded layout: info had said
    'attention backend: unpadded', the config's field, not what runs."""
    from nanobert.model import preset
    tok = nanobert.Tokenizer.train(["a few words of text"] * 3, vocab_size=100, min_frequency=1)
    nanobert.Bert(preset("deberta-tiny", vocab_size=tok.vocab_size)).save_pretrained(
        tmp_path / "d", tokenizer=tok)
    assert main(["info", str(tmp_path / "d")]) == 0
    assert "attention backend: unpadded (runs padded: relative position terms)" in \
        capsys.readouterr().out
    assert main(["info", "minilm"]) == 0
    out = capsys.readouterr().out
    assert "attention backend: unpadded" in out and "runs padded" not in out


def test_summary_names_a_model_of_another_kind():
    """summary(model.bert) or summary('minilm') were AttributeErrors (api4)."""
    import pytest
    import nanobert
    from nanobert.info import summary
    body = nanobert.Bert(nanobert.preset("tiny", vocab_size=100)).bert
    for bad, kind in ((body, "BertModel"), ("minilm", "str")):
        with pytest.raises(TypeError, match=f"^summary\\(model\\): a nanobert.Bert, as "
                                            f"nanobert.load gives it, got {kind}$"):
            summary(bad)
