"""MLM masking: rates, the 80/10/10 split, special tokens, whole words, determinism."""
import pytest
import torch

from nanobert.masking import IGNORE, Masker, fixed_masks, parse_split, row_seed, split_name

# a toy vocabulary: 0..4 special ([PAD] [UNK] [CLS] [SEP] [MASK]), 5..49 words, 50..99 '##' pieces
V, PAD, CLS, SEP, MASK = 100, 0, 2, 3, 4
CONT = torch.zeros(V, dtype=torch.bool)
CONT[50:] = True


def masker(**kw):
    kw.setdefault("continuation", CONT)
    return Masker(mask_id=MASK, vocab_size=V, special_ids=[0, 1, 2, 3, 4], **kw)


def batch(B=64, T=48, seed=0):
    """[CLS] tokens [SEP] [PAD]... rows of mixed lengths, some [UNK]s inside."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, V, (B, T), generator=g)
    lengths = torch.randint(8, T + 1, (B,), generator=g)
    pos = torch.arange(T)[None]
    mask = (pos < lengths[:, None]).long()
    ids[:, 0] = CLS
    ids[torch.arange(B), lengths - 1] = SEP
    ids[(torch.rand(B, T, generator=g) < 0.03)] = 1     # [UNK] is special too
    ids[:, 0] = CLS
    ids[mask == 0] = PAD
    return ids, mask


def test_parse_split():
    assert parse_split("80/10/10") == pytest.approx((0.8, 0.1, 0.1))
    assert parse_split("0/0/100") == pytest.approx((0, 0, 1))
    assert split_name((0.5, 0.5, 0.0)) == "50/50/0"
    for bad in ["80/10", "80/10/20", "a/b/c", "-10/100/10"]:
        with pytest.raises(ValueError):
            parse_split(bad)



def test_split_names_keep_their_decimals():
    """split_name rounded to whole percents: 80.5/9.5/10 was named (and, through its name,
    trained as) 80/10/10. A name now parses back to its split."""
    assert split_name(parse_split("80.5/9.5/10")) == "80.5/9.5/10"
    assert split_name(parse_split("80.0/10.00/10")) == "80/10/10"
    assert split_name(parse_split("0.0001/0/99.9999")) == "0.0001/0/99.9999"
    for text in ("80.4/9.6/10", "33.3333333333/33.3333333333/33.3333333334", "7/3/90"):
        assert parse_split(split_name(parse_split(text))) == parse_split(text)

def test_rate_and_split_statistics_over_many_draws():
    m = masker()
    ids, mask = batch()
    maskable = m.maskable(ids, mask)
    n_ok = sel = n_mask = n_rand = n_keep = 0
    for draw in range(40):
        out, labels = m.mask(ids, mask, rows=range(draw * 64, draw * 64 + 64))
        s = labels != IGNORE
        n_ok += int(maskable.sum())
        sel += int(s.sum())
        assert torch.equal(labels[s], ids[s])                    # labels are the originals
        assert (labels[~s] == IGNORE).all()
        assert not (s & ~maskable).any()                        # never special, never padding
        assert torch.equal(out[~s], ids[~s])                    # only selected tokens change
        n_mask += int((out[s] == MASK).sum())
        changed = s & (out != ids) & (out != MASK)
        n_rand += int(changed.sum())
        assert not m.special[out[changed]].any()                # random tokens never special
        n_keep += int((s & (out == ids)).sum())
    assert sel / n_ok == pytest.approx(0.15, abs=0.01)
    assert n_mask / sel == pytest.approx(0.8, abs=0.02)
    # a random draw can hit the original token (1 / 95): it then counts as kept
    assert n_rand / sel == pytest.approx(0.1 * 94 / 95, abs=0.015)
    assert n_keep / sel == pytest.approx(0.1 + 0.1 / 95, abs=0.015)


@pytest.mark.parametrize("split", ["100/0/0", "0/0/100", "50/50/0"])
def test_other_splits(split):
    m = masker(split=parse_split(split))
    ids, mask = batch()
    out, labels = m.mask(ids, mask)
    s = labels != IGNORE
    frac_mask = (out[s] == MASK).float().mean().item()
    frac_same = (out[s] == ids[s]).float().mean().item()
    want_mask, _, want_keep = parse_split(split)
    assert frac_mask == pytest.approx(want_mask, abs=0.06)
    assert frac_same == pytest.approx(want_keep, abs=0.06)


def test_every_row_gets_a_mask_even_when_short():
    m = masker()
    ids = torch.tensor([[CLS, 7, SEP, PAD, PAD]] * 50)
    mask = (ids != PAD).long()
    _, labels = m.mask(ids, mask, rows=range(50))
    assert ((labels != IGNORE).sum(1) == 1).all()
    assert (labels[:, 1] == 7).all()
    only_special = torch.tensor([[CLS, SEP, PAD]])
    _, labels = m.mask(only_special, (only_special != PAD).long())
    assert (labels == IGNORE).all()


def test_dynamic_and_reproducible():
    m = masker()
    ids, mask = batch(B=8)
    a = m.mask(ids, mask, rows=range(8), epoch=0)
    b = m.mask(ids, mask, rows=range(8), epoch=0)
    c = m.mask(ids, mask, rows=range(8), epoch=1)
    assert torch.equal(a[1], b[1]) and torch.equal(a[0], b[0])  # same (seed, epoch, row)
    assert not torch.equal(a[1], c[1])                          # a new mask each epoch
    # a row's mask depends on its key only, not on the rest of the batch
    half = m.mask(ids[4:], mask[4:], rows=range(4, 8), epoch=0)
    assert torch.equal(half[1], a[1][4:])
    assert row_seed(0, 1, 2) != row_seed(0, 2, 1)
    other_seed = masker(seed=1).mask(ids, mask, rows=range(8))
    assert not torch.equal(other_seed[1], a[1])


def words_of(ids_row, mask_row):
    """Group positions into words: a non-'##' maskable token and the '##' pieces after it."""
    words, cur = [], []
    for i, (t, on) in enumerate(zip(ids_row.tolist(), mask_row.tolist())):
        if not on or t < 5:
            if cur:
                words.append(cur)
            cur = []
            continue
        if t >= 50 and cur:
            cur.append(i)
        else:
            if cur:
                words.append(cur)
            cur = [i]
    if cur:
        words.append(cur)
    return words


def test_whole_word_masking_keeps_words_whole():
    m = masker(whole_word=True)
    ids, mask = batch(B=64, T=48, seed=3)
    total_sel = total_ok = 0
    multi_piece_selected = 0
    for draw in range(10):
        _, labels = m.mask(ids, mask, rows=range(draw * 64, draw * 64 + 64))
        s = labels != IGNORE
        for b in range(ids.shape[0]):
            for w in words_of(ids[b], mask[b]):
                flags = {bool(s[b, i]) for i in w}
                assert len(flags) == 1, f"word {w} partly selected"
                if len(w) > 1 and flags == {True}:
                    multi_piece_selected += 1
        total_sel += int(s.sum())
        total_ok += int(m.maskable(ids, mask).sum())
    assert multi_piece_selected > 50
    # words are chosen at 15%, so tokens are too (on average)
    assert total_sel / total_ok == pytest.approx(0.15, abs=0.03)


def test_for_tokenizer_and_fixed_masks(tmp_path):
    from nanobert.tokenizer import Tokenizer
    texts = ["the unbelievable cat sat on the mat", "dogs are running quickly"] * 50
    tok = Tokenizer.train(texts, vocab_size=60)
    m = Masker.for_tokenizer(tok, split=(0.0, 0.0, 1.0), whole_word=True, seed=5)
    assert m.mask_id == tok.mask_id
    pieces = [i for t, i in tok.tk.get_vocab().items() if t.startswith("##")]
    assert pieces and m.continuation[pieces].all() and m.continuation.sum() == len(pieces)
    enc = tok(texts[:8])
    a = fixed_masks(m, enc["input_ids"], enc["attention_mask"], seed=9)
    assert (a[0] == tok.mask_id).any()                           # standard 80/10/10, not 0/0/100
    again = fixed_masks(m, enc["input_ids"], enc["attention_mask"], seed=9)
    assert torch.equal(a[1], again[1]) and torch.equal(a[0], again[0])


def test_validation_masks_are_the_same_whatever_the_training_masks():
    """fixed_masks took --mask-prob and --whole-word-mask from the training masker: runs
    at 15% and 30%, or by tokens and by whole words, were scored on different tasks."""
    ids, mask = batch()
    plain = fixed_masks(masker(), ids, mask, seed=3)
    for kw in ({"mask_prob": 0.3}, {"whole_word": True}, {"split": (0.0, 0.0, 1.0)}):
        other = fixed_masks(masker(**kw), ids, mask, seed=3)
        assert torch.equal(other[0], plain[0]) and torch.equal(other[1], plain[1]), kw
    rate = (plain[1] != IGNORE).sum() / ((mask == 1) & (ids > 4)).sum()
    assert 0.12 < rate < 0.18


def bpe_tokenizer(tmp_path, byte_level: bool):
    """A small BPE tokenizer.json (RoBERTa's byte-level one, or one whose pieces carry no
    word marks) loaded as nanobert reads it."""
    from tokenizers import Tokenizer as HF, models, pre_tokenizers, trainers
    from nanobert.tokenizer import Tokenizer
    tk = HF(models.BPE(unk_token="<unk>"))
    tk.pre_tokenizer = (pre_tokenizers.ByteLevel(add_prefix_space=False) if byte_level
                        else pre_tokenizers.Whitespace())
    words = ["extraordinary", "unbelievable", "cat", "mat", "photosynthesis", "sat", "on"]
    text = [" ".join(words[(i * 3 + j) % len(words)] for j in range(6)) for i in range(40)]
    tk.train_from_iterator(text, trainers.BpeTrainer(
        vocab_size=60, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"]))
    tk.save(str(tmp_path / "tokenizer.json"))
    return Tokenizer.from_dir(tmp_path / "tokenizer.json"), text


def test_whole_word_mask_keeps_byte_level_bpe_words_whole(tmp_path):
    """A byte-level BPE tokenizer has no '##' pieces: whole-word masking masked single
    pieces, silently the same as without the flag. A piece without 'Ġ' continues a word."""
    tok, text = bpe_tokenizer(tmp_path, byte_level=True)
    m = Masker.for_tokenizer(tok, whole_word=True, mask_prob=0.3)
    enc = tok(text[:32])
    ids, att = enc["input_ids"], enc["attention_mask"]
    _, labels = m.mask(ids, att)
    starts = m.word_starts(ids, m.maskable(ids, att))
    selected = labels != IGNORE
    multi = 0
    for r in range(len(ids)):
        for w in starts[r][selected[r]].unique().tolist():
            word = (starts[r] == w) & att[r].bool()
            assert selected[r][word].all()          # a word is masked whole
            multi += int(word.sum() > 1)
    assert multi > 0                                # and words of several pieces occur


def test_whole_word_mask_refuses_a_tokenizer_without_word_marks(tmp_path):
    from nanobert.files import NanobertError
    tok, _ = bpe_tokenizer(tmp_path, byte_level=False)
    assert Masker.for_tokenizer(tok).continuation is None      # fine without the flag
    with pytest.raises(NanobertError, match="--whole-word-mask: the tokenizer's pieces"):
        Masker.for_tokenizer(tok, whole_word=True)
