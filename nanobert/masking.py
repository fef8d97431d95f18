"""Masked-language-model masking: which tokens to hide, and what to put in their place.

    select  `mask_prob` of the maskable tokens (not special, not padding); with
            whole-word masking a word (a token and the `##` pieces after it) is
            selected or left as one unit
    replace each selected token by [MASK] / a random token / itself, in the
            proportions of the split (BERT: 80/10/10); random tokens are never special
    labels  the original token at selected positions, -100 everywhere else, so the
            loss (and the MLM head, see `Bert.forward`) only sees selected positions

Masks are drawn from torch.Generators seeded from (seed, epoch, row): a sequence gets
a new mask every time it is seen (dynamic masking, as RoBERTa), the same mask again
when a run is resumed at the same place, and the same mask whatever the batch size or
the number of processes, because each row has its own generator.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
import torch

from .files import NanobertError

IGNORE = -100  # label of positions that carry no loss


def parse_split(text: str) -> tuple:
    """'80/10/10' -> (0.8, 0.1, 0.1): [MASK] / random token / unchanged."""
    try:
        parts = [float(p) for p in str(text).split("/")]
    except ValueError:
        parts = []
    if len(parts) != 3 or not all(0 <= p <= 100 for p in parts) or abs(sum(parts) - 100) > 1e-6:
        raise ValueError(f"mask split {text!r} must be three percentages that sum to 100, "
                         "e.g. 80/10/10 ([MASK]/random/unchanged)")
    return tuple(p / 100 for p in parts)


SPLIT_DECIMALS = 10  # of each percentage in a split's name


def split_name(split) -> str:
    """(0.805, 0.095, 0.1) -> '80.5/9.5/10': the percentages with their decimals (up to
    SPLIT_DECIMALS), so that parse_split(split_name(s)) == s for the splits people write."""
    return "/".join(np.format_float_positional(round(p * 100, SPLIT_DECIMALS), trim="-")
                    for p in split)


def row_seed(*keys: int) -> int:
    """A well-mixed 63-bit seed from a tuple of non-negative ints (seed, epoch, row, ...)."""
    return int(np.random.SeedSequence([int(k) for k in keys]).generate_state(1, np.uint64)[0]
               >> np.uint64(1))


def word_continuations(tok, needed: bool = True) -> Optional[torch.Tensor]:
    """(V,) bool: the tokens that continue the word before them ('##ing' in WordPiece;
    in byte-level BPE and SentencePiece, a piece without the word-start mark Ġ/▁). A
    tokenizer whose pieces do not say where words begin is refused when `needed`
    (--whole-word-mask would silently mask single tokens), else None."""
    marker = tok.word_marker()
    if marker is None:
        if needed:
            raise NanobertError("--whole-word-mask: the tokenizer's pieces do not mark where "
                                "words begin (no '##' continuation prefix, no byte-level 'Ġ' "
                                "or SentencePiece '▁'), so words cannot be masked whole; "
                                "drop the flag or use a WordPiece tokenizer")
        return None
    kind, mark = marker
    cont = torch.zeros(tok.vocab_size, dtype=torch.bool)
    for t, i in tok.tk.get_vocab().items():
        if i < tok.vocab_size:
            starts = t.startswith(mark) and len(t) > len(mark)
            cont[i] = starts if kind == "prefix" else not t.startswith(mark)
    return cont


@dataclass
class Masker:
    """Masks batches of token ids for MLM. Build it once per tokenizer with
    `Masker.for_tokenizer`; call `mask(input_ids, attention_mask, rows)`."""
    mask_id: int
    vocab_size: int
    special_ids: Sequence[int]
    mask_prob: float = 0.15
    split: tuple = (0.8, 0.1, 0.1)
    whole_word: bool = False
    continuation: Optional[torch.Tensor] = None  # (V,) bool: token is a '##' piece
    seed: int = 0

    def __post_init__(self):
        if not 0.0 < self.mask_prob < 1.0:
            raise ValueError(f"mask_prob must be in (0, 1), got {self.mask_prob}")
        special = torch.zeros(self.vocab_size, dtype=torch.bool)
        special[list(self.special_ids)] = True
        self.special = special                                    # (V,) bool
        self.replacements = (~special).nonzero().squeeze(1)       # ids a random token may take
        if self.whole_word and self.continuation is None:
            raise ValueError("whole-word masking needs the tokenizer's '##' pieces")

    @classmethod
    def for_tokenizer(cls, tok, **kw) -> "Masker":
        cont = word_continuations(tok, needed=kw.get("whole_word", False))
        return cls(mask_id=tok.mask_id, vocab_size=tok.vocab_size,
                   special_ids=tok.special_ids, continuation=cont, **kw)

    # -- the random numbers ---------------------------------------------------
    def draws(self, rows: Sequence[int], epoch: int, T: int):
        """Three uniform draws per position for each row, from the row's own generator:
        select (B, T), replace (B, T), and a random-token index (B, T)."""
        sel, rep, pick = [], [], []
        for r in rows:
            g = torch.Generator().manual_seed(row_seed(self.seed, epoch, r))
            sel.append(torch.rand(T, generator=g))
            rep.append(torch.rand(T, generator=g))
            pick.append(torch.randint(len(self.replacements), (T,), generator=g))
        return torch.stack(sel), torch.stack(rep), torch.stack(pick)

    # -- masking --------------------------------------------------------------
    def maskable(self, input_ids, attention_mask=None):
        """(B, T) bool: tokens that may be selected (real, not special)."""
        ok = ~self.special[input_ids]
        if attention_mask is not None:
            ok &= attention_mask.bool()
        return ok

    def word_starts(self, input_ids, ok):
        """(B, T) index of the first piece of the word each position belongs to. A word is
        a maskable token plus the maskable '##' pieces that directly follow it."""
        B, T = input_ids.shape
        cont = self.continuation[input_ids] & ok
        prev_ok = torch.zeros_like(ok)
        prev_ok[:, 1:] = ok[:, :-1]
        start = ~(cont & prev_ok)                                 # (B, T) a word begins here
        pos = torch.arange(T).expand(B, T)
        return torch.cummax(torch.where(start, pos, 0), dim=1).values

    def mask(self, input_ids, attention_mask=None, rows: Optional[Sequence[int]] = None,
             epoch: int = 0, split: Optional[tuple] = None):
        """input_ids (B, T) -> (masked input_ids (B, T), labels (B, T)). `rows` are the
        global indices of the sequences (they key the random draws); default 0..B-1.
        Every row with a maskable token gets at least one selected token."""
        B, T = input_ids.shape
        rows = range(B) if rows is None else rows
        p_mask, p_rand, _ = split or self.split
        u_sel, u_rep, pick = self.draws(rows, epoch, T)
        ok = self.maskable(input_ids, attention_mask)             # (B, T)
        if self.whole_word:
            u_sel = u_sel.gather(1, self.word_starts(input_ids, ok))  # one draw per word
        selected = ok & (u_sel < self.mask_prob)
        # a row with nothing selected gets its lowest draw (so no batch has an empty loss)
        empty = ~selected.any(1) & ok.any(1)
        if empty.any():
            lowest = torch.where(ok, u_sel, 2.0).argmin(1)        # (B,)
            force = torch.zeros_like(selected)
            force[torch.arange(B), lowest] = True
            if self.whole_word:  # the whole word of that token
                starts = self.word_starts(input_ids, ok)
                force = ok & (starts == starts.gather(1, lowest[:, None]))
            selected |= force & empty[:, None]
        labels = torch.where(selected, input_ids, IGNORE)
        to_mask = selected & (u_rep < p_mask)
        to_rand = selected & (u_rep >= p_mask) & (u_rep < p_mask + p_rand)
        out = input_ids.clone()
        out[to_mask] = self.mask_id
        out[to_rand] = self.replacements[pick[to_rand]]
        return out, labels


STANDARD_MASKS = "15% of the tokens, one at a time, 80/10/10"   # what fixed_masks draws


def fixed_masks(masker: Masker, input_ids, attention_mask=None, seed: int = 1234):
    """Masks for validation, drawn once from a fixed seed as BERT's (STANDARD_MASKS:
    whatever rate, split or whole-word masking the model trains with), so every run is
    scored on the same task: masks that followed --mask-prob and --whole-word-mask made
    "15% against 30%" a comparison of two tasks (790 against 1,608 masked tokens)."""
    std = Masker(mask_id=masker.mask_id, vocab_size=masker.vocab_size,
                 special_ids=masker.special_ids, mask_prob=0.15,
                 split=(0.8, 0.1, 0.1), whole_word=False, seed=seed)
    return std.mask(input_ids, attention_mask, epoch=0)
