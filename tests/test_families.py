"""The BERT family as configuration: random HF checkpoints of each family load into the
one nanobert model with the same outputs, and save back into a directory that
transformers loads with the same outputs."""
from __future__ import annotations

import json

import pytest
import torch
import transformers as hf

from nanobert.checkpoint import load_model
from conftest import random_batch

TOL = 1e-5
SMALL = dict(vocab_size=99, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
             intermediate_size=37, max_position_embeddings=64, pad_token_id=0)


def roberta():
    return hf.RobertaConfig(**dict(SMALL, pad_token_id=1, max_position_embeddings=70),
                            type_vocab_size=1, num_labels=3)


def xlm_roberta():
    return hf.XLMRobertaConfig(**dict(SMALL, pad_token_id=1, max_position_embeddings=70),
                               type_vocab_size=1, num_labels=3)


def camembert():
    return hf.CamembertConfig(**dict(SMALL, pad_token_id=1, max_position_embeddings=70),
                              type_vocab_size=1, num_labels=3)


def electra():
    return hf.ElectraConfig(**SMALL, embedding_size=16, num_labels=3)


def mpnet():
    return hf.MPNetConfig(**dict(SMALL, pad_token_id=1, max_position_embeddings=70),
                          num_labels=3)


def albert():
    return hf.AlbertConfig(**SMALL, embedding_size=16, num_hidden_groups=1, num_labels=3)


def distilbert():
    return hf.DistilBertConfig(vocab_size=99, dim=32, n_layers=3, n_heads=4, hidden_dim=37,
                               max_position_embeddings=64, pad_token_id=0, num_labels=3)


def modernbert():
    return hf.ModernBertConfig(**SMALL, local_attention=4, global_attn_every_n_layers=2,
                               num_labels=3, bos_token_id=2, eos_token_id=3, cls_token_id=2,
                               sep_token_id=3)


def deberta():
    return hf.DebertaV2Config(**SMALL, relative_attention=True, pos_att_type=["p2c", "c2p"],
                              position_buckets=8, max_relative_positions=64, share_att_key=True,
                              norm_rel_ebd="layer_norm", position_biased_input=False,
                              type_vocab_size=0, num_labels=3, layer_norm_eps=1e-7)


ALL_HEADS = (None, "mlm", "classify", "token", "qa")
SUFFIX = {None: "Model", "mlm": "ForMaskedLM", "pretraining": "ForPreTraining",
          "classify": "ForSequenceClassification", "token": "ForTokenClassification",
          "qa": "ForQuestionAnswering"}


def classes(prefix: str, heads=ALL_HEADS) -> dict:
    """head -> the transformers class of that head ("Roberta" -> RobertaModel, ...)."""
    return {h: getattr(hf, prefix + SUFFIX[h]) for h in heads}


FAMILIES = {
    "roberta": (roberta, classes("Roberta")),
    # RoBERTa's layout under other names: multilingual-e5 and bge-m3 are XLM-R
    "xlm-roberta": (xlm_roberta, classes("XLMRoberta")),
    "camembert": (camembert, classes("Camembert", (None, "mlm", "classify"))),
    # BERT's blocks under factorized embeddings; a GELU classification head
    "electra": (electra, classes("Electra")),
    # post-LN blocks with a learnt relative-position bias (all-mpnet-base-v2)
    "mpnet": (mpnet, classes("MPNet")),
    "albert": (albert, classes("Albert", (None, "mlm", "pretraining", "classify", "token"))),
    "distilbert": (distilbert, classes("DistilBert")),
    "deberta-v2": (deberta, classes("DebertaV2")),
    "modernbert": (modernbert, classes("ModernBert")),
}
CASES = [(fam, task) for fam, (_, heads) in FAMILIES.items() for task in heads]


def _make_from(cls, config, seed=0):
    torch.manual_seed(seed)
    model = cls(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    return model


def _make(fam, task, seed=0):
    make_config, heads = FAMILIES[fam]
    config = make_config()
    if task in ("qa", "pretraining"):  # two outputs: start/end, or SOP's two classes
        config.num_labels = 2
    return _make_from(heads[task], config, seed)


PAD_ID_1 = ("roberta", "xlm-roberta", "camembert", "mpnet")   # their padding id: 1


def _batch(fam):
    b = random_batch(B=4, T=20, vocab=99, seed=2, min_len=5)
    if fam in PAD_ID_1:
        b["token_type_ids"].zero_()
        b["input_ids"][b["attention_mask"] == 0] = 1
    if fam in ("distilbert", "modernbert", "deberta-v2", "mpnet"):
        del b["token_type_ids"]
    return b


def _logits(task, out):
    if task is None:
        return {"hidden": out.last_hidden_state if hasattr(out, "last_hidden_state")
                else out.hidden.last_hidden_state}
    if task == "qa":
        return {"start": out.start_logits, "end": out.end_logits}
    if task == "pretraining":
        return {"mlm": getattr(out, "prediction_logits", None) if hasattr(out, "prediction_logits")
                else out.logits,
                "pair": out.sop_logits if hasattr(out, "sop_logits") else out.pair_logits}
    return {"logits": out.logits}


def _compare(ref_out, ours_out, task, mask):
    for name, ref in _logits(task, ref_out).items():
        got = _logits(task, ours_out)[name]
        if ref.dim() >= 2 and ref.shape[:2] == mask.shape:
            ref, got = ref[mask.bool()], got[mask.bool()]
        assert (ref - got).abs().max().item() < TOL, name


@pytest.mark.parametrize("backend", ["sdpa", "unpadded"])
@pytest.mark.parametrize("fam,task", CASES)
def test_family_parity(tmp_path, fam, task, backend):
    ref_model = _make(fam, task)
    ref_model.save_pretrained(tmp_path)
    model = load_model(tmp_path, attn_backend=backend).eval()
    assert model.config.family == fam and model.task == task
    batch = _batch(fam)
    with torch.no_grad():
        _compare(ref_model(**batch), model(**batch), task, batch["attention_mask"])


@pytest.mark.parametrize("backend", ["eager", "unpadded"])
@pytest.mark.parametrize("fam", sorted(FAMILIES))
def test_family_parity_on_left_padded_rows(tmp_path, fam, backend):
    """Padding before the tokens (a decoder tokenizer's, or a collator's): the families
    that count positions from pad_token_id + 1 (RoBERTa's, MPNet) count them from each
    row's first real token, as transformers does; they were counted from the first
    column, every real token's hidden state off by up to 3. Like transformers, they
    count the tokens that are not the padding id."""
    ref_model = _make(fam, None)
    ref_model.save_pretrained(tmp_path)
    model = load_model(tmp_path, attn_backend=backend).eval()
    batch = _batch(fam)
    mask = batch["attention_mask"]
    T = mask.shape[1]
    left = torch.arange(T)[None] >= (T - mask.sum(1))[:, None]          # (B, T)
    assert not left[:, 0].all()
    shifted = {}
    for k, v in batch.items():
        moved = torch.full_like(v, 1 if k == "input_ids" and fam in PAD_ID_1 else 0)
        moved[left] = v[mask.bool()]
        shifted[k] = moved
    shifted["attention_mask"] = left.long()
    with torch.no_grad():
        _compare(ref_model(**shifted), model(**shifted), None, shifted["attention_mask"])
    if fam in PAD_ID_1:   # the padding id inside the real tokens: no position, there too
        first_real = left.long().argmax(1)
        shifted["input_ids"][0, first_real[0] + 1] = 1
        with torch.no_grad():
            _compare(ref_model(**shifted), model(**shifted), None, shifted["attention_mask"])


@pytest.mark.parametrize("fam,task", [(f, t) for f, t in CASES if t in (None, "mlm", "classify")]
                         + [("modernbert", "token"), ("modernbert", "qa")])
def test_family_round_trip(tmp_path, fam, task):
    """nanobert save_pretrained -> transformers from_pretrained -> same outputs."""
    _make(fam, task).save_pretrained(tmp_path / "hf")
    model = load_model(tmp_path / "hf").eval()
    model.save_pretrained(tmp_path / "ours")
    again = FAMILIES[fam][1][task].from_pretrained(tmp_path / "ours").eval()
    batch = _batch(fam)
    with torch.no_grad():
        _compare(again(**batch), model(**batch), task, batch["attention_mask"])


def test_eager_matches_for_modernbert_windows(tmp_path):
    """Local (sliding-window) layers: eager, sdpa and unpadded agree with each other."""
    _make("modernbert", None).save_pretrained(tmp_path)
    outs = []
    for backend in ("eager", "sdpa", "unpadded"):
        model = load_model(tmp_path, attn_backend=backend).eval()
        with torch.no_grad():
            b = _batch("modernbert")
            outs.append(model.bert(**b).last_hidden_state[b["attention_mask"].bool()])
    assert (outs[0] - outs[1]).abs().max() < TOL and (outs[0] - outs[2]).abs().max() < TOL


def test_albert_shares_weights(tmp_path):
    _make("albert", None).save_pretrained(tmp_path)
    model = load_model(tmp_path)
    assert len(model.bert.blocks) == 1 and model.config.num_hidden_layers == 3
    assert model.bert.emb.tok.weight.shape == (99, 16)


def _bpe_files(tmp_path):
    """A small byte-level BPE vocabulary in RoBERTa's vocab.json + merges.txt form."""
    from tokenizers import ByteLevelBPETokenizer
    bpe = ByteLevelBPETokenizer()
    text = ["the quick brown fox jumps over the lazy dog", "hello world, hello there"] * 30
    bpe.train_from_iterator(text, vocab_size=300, min_frequency=1,
                            special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    bpe.save_model(str(tmp_path))
    return tmp_path


@pytest.mark.parametrize("via", ["vocab.json", "tokenizer.json"])
def test_roberta_tokenizer(tmp_path, via):
    from nanobert import Tokenizer
    d = _bpe_files(tmp_path)
    ref = hf.RobertaTokenizerFast.from_pretrained(d)
    if via == "tokenizer.json":
        ref.save_pretrained(d)
    ours = Tokenizer.from_dir(d)
    assert (ours.cls_id, ours.sep_id, ours.pad_id, ours.mask_id) == (0, 2, 1, 4)
    assert set(ours.special_ids) >= {0, 1, 2, 3, 4}
    texts, pairs = ["the quick fox", "hello, world!"], ["over the dog", "there"]
    mine = ours(texts, pairs)
    theirs = ref(texts, pairs, padding=True, return_tensors="pt")
    assert mine["input_ids"].tolist() == theirs["input_ids"].tolist()
    assert mine["attention_mask"].tolist() == theirs["attention_mask"].tolist()
    assert mine["input_ids"][0, 0] == 0                        # <s> first
    ours.save(tmp_path / "saved")
    assert Tokenizer.from_dir(tmp_path / "saved").encode("the fox").ids == ours.encode("the fox").ids


def test_deberta_other_settings(tmp_path):
    """c2p only, no buckets, no relative LayerNorm, absolute positions added too."""
    config = hf.DebertaV2Config(**SMALL, relative_attention=True, pos_att_type=["c2p"],
                                position_buckets=-1, max_relative_positions=16, share_att_key=True,
                                position_biased_input=True, type_vocab_size=2)
    torch.manual_seed(0)
    ref = hf.DebertaV2Model(config).eval()
    ref.save_pretrained(tmp_path)
    model = load_model(tmp_path).eval()
    b = random_batch(B=3, T=24, vocab=99, seed=5)
    with torch.no_grad():
        _compare(ref(**b), model(**b), None, b["attention_mask"])


def test_deberta_mlm_head_of_legacy_false(tmp_path):
    """config.json legacy: false: transformers' other DeBERTa MLM head (lm_predictions.
    lm_head.*, the same layers) loads with its logits, where it was refused as a head
    without weights; saved back in the legacy layout, transformers reads the same logits."""
    config = deberta()
    config.legacy = False
    ref = _make_from(hf.DebertaV2ForMaskedLM, config)
    ref.save_pretrained(tmp_path / "hf")
    model = load_model(tmp_path / "hf").eval()
    assert model.head == "mlm" and not [n for n in model.new_weights if n.startswith("mlm.")]
    b = _batch("deberta-v2")
    with torch.no_grad():
        _compare(ref(**b), model(**b), "mlm", b["attention_mask"])
        model.save_pretrained(tmp_path / "ours")
        back = hf.DebertaV2ForMaskedLM.from_pretrained(tmp_path / "ours").eval()
        _compare(ref(**b), back(**b), "mlm", b["attention_mask"])


@pytest.mark.parametrize("flag", ["false", "left at true"])
@pytest.mark.parametrize("fam", [f for f, (_, heads) in FAMILIES.items() if "mlm" in heads])
def test_untied_decoder_loads_and_saves(tmp_path, fam, flag, capsys):
    """tie_word_embeddings=false: the checkpoint's own decoder matrix is used, and saved
    back (with the flag) so that transformers reads the same logits. So is a decoder
    matrix of its own in a file whose config.json leaves the flag at true (transformers 5
    uses it; nanobert tied it to the embeddings, silently: MLM logits off by 16)."""
    make_config, heads = FAMILIES[fam]
    config = make_config()
    config.tie_word_embeddings = False
    torch.manual_seed(0)
    ref = heads["mlm"](config).eval()
    assert not torch.equal(ref.get_output_embeddings().weight, ref.get_input_embeddings().weight)
    ref.save_pretrained(tmp_path / "hf")
    if flag == "left at true":
        saved = json.loads((tmp_path / "hf" / "config.json").read_text())
        saved["tie_word_embeddings"] = True
        (tmp_path / "hf" / "config.json").write_text(json.dumps(saved))
    model = load_model(tmp_path / "hf").eval()
    assert ("a decoder matrix of its own" in capsys.readouterr().err) == (flag != "false")
    batch = _batch(fam)
    with torch.no_grad():
        _compare(ref(**batch), model(**batch), "mlm", batch["attention_mask"])
    model.save_pretrained(tmp_path / "ours")
    again = heads["mlm"].from_pretrained(tmp_path / "ours").eval()
    with torch.no_grad():
        _compare(again(**batch), model(**batch), "mlm", batch["attention_mask"])
        _compare(again(**batch), load_model(tmp_path / "ours").eval()(**batch), "mlm",
                 batch["attention_mask"])


def test_modernbert_head_bias_without_encoder_biases_is_refused(tmp_path):
    from nanobert.files import NanobertError
    config = modernbert()
    config.classifier_bias = True          # the head's dense has a bias, the encoder none
    hf.ModernBertForSequenceClassification(config).save_pretrained(tmp_path)
    with pytest.raises(NanobertError, match="classifier_bias"):
        load_model(tmp_path)


def test_modernbert_without_decoder_bias(tmp_path):
    """decoder_bias=false: ModernBertForMaskedLM's decoder has no bias (the file none),
    which loads (it was refused as a head without weights) with transformers' logits, and
    saves back into a file transformers reads with the same logits."""
    config = modernbert()
    config.decoder_bias = False
    ref = _make_from(hf.ModernBertForMaskedLM, config)
    ref.save_pretrained(tmp_path / "hf")
    model = load_model(tmp_path / "hf").eval()
    assert not model.config.decoder_bias and "mlm.bias" not in model.new_weights
    assert "mlm.bias" not in dict(model.named_parameters())   # nothing to train
    batch = _batch("modernbert")
    with torch.no_grad():
        _compare(ref(**batch), model(**batch), "mlm", batch["attention_mask"])
    model.save_pretrained(tmp_path / "ours")
    again = hf.ModernBertForMaskedLM.from_pretrained(tmp_path / "ours").eval()
    with torch.no_grad():
        _compare(again(**batch), model(**batch), "mlm", batch["attention_mask"])


def test_mpnet_counts_positions_after_id_1_whatever_pad_token_id_says(tmp_path):
    """transformers' MPNetEmbeddings take id 1 as padding, and positions from 2, with
    any pad_token_id in config.json (a config saying 0 gave other hidden states)."""
    config = hf.MPNetConfig(**dict(SMALL, pad_token_id=0, max_position_embeddings=70))
    theirs = _make_from(hf.MPNetModel, config)
    theirs.save_pretrained(tmp_path)
    ours = load_model(tmp_path).eval()
    ids = torch.randint(2, 99, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got = ours(ids).hidden.last_hidden_state
        assert (theirs(input_ids=ids).last_hidden_state - got).abs().max() < TOL


def test_saved_bos_and_eos_ids_are_the_tokenizers(tmp_path):
    """RoBERTa and MPNet configs were saved with bos 0 and eos 2 whatever the vocabulary:
    with a WordPiece one (pretrain --preset roberta-tiny) those are [PAD] and [CLS]."""
    import json
    from conftest import WORDS
    import nanobert
    tok = nanobert.Tokenizer.train([" ".join(WORDS)] * 3, vocab_size=60, min_frequency=1)
    model = nanobert.Bert(nanobert.preset("roberta-tiny", vocab_size=tok.vocab_size,
                                          pad_token_id=tok.pad_id), "mlm")
    model.save_pretrained(tmp_path / "w", tokenizer=tok)
    conf = json.loads((tmp_path / "w" / "config.json").read_text())
    assert (conf["bos_token_id"], conf["eos_token_id"]) == (tok.cls_id, tok.sep_id) != (0, 2)
    model.save_pretrained(tmp_path / "bare")                   # no tokenizer: RoBERTa's own
    conf = json.loads((tmp_path / "bare" / "config.json").read_text())
    assert (conf["bos_token_id"], conf["eos_token_id"]) == (0, 2)


def test_mpnet_with_other_than_32_buckets_is_refused(tmp_path):
    """transformers' MPNet buckets relative positions into 32 whatever
    relative_attention_num_buckets says (64: outputs 2.6 apart; 16: an IndexError there):
    refused in one line rather than answered otherwise."""
    from nanobert.files import NanobertError
    config = FAMILIES["mpnet"][0]()
    config.relative_attention_num_buckets = 64
    hf.MPNetModel(config).save_pretrained(tmp_path)
    with pytest.raises(NanobertError) as e:
        load_model(tmp_path)
    assert str(e.value) == (f"{tmp_path / 'config.json'}: relative_attention_num_buckets=64 is "
                            "not supported (MPNet buckets relative positions into 32 in "
                            "transformers; only 32 is)")


@pytest.mark.parametrize("pad", [None])   # (strings, floats: the common check of ids)
def test_a_roberta_config_whose_pad_token_id_is_no_integer_is_refused_by_name(tmp_path, pad):
    """RoBERTa counts positions from pad_token_id: null was a TypeError's words
    ("unsupported operand type(s) for +: 'NoneType' and 'int')."""
    from nanobert.files import NanobertError
    hf.RobertaModel(FAMILIES["roberta"][0]()).save_pretrained(tmp_path)
    conf = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**conf, "pad_token_id": pad}))
    with pytest.raises(NanobertError) as e:
        load_model(tmp_path)
    assert str(e.value) == (f"{tmp_path / 'config.json'}: pad_token_id {json.dumps(pad)}: "
                            "roberta counts positions from the padding id, which must be an "
                            "integer")
