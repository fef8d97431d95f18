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
