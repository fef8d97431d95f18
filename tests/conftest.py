"""Shared fixtures: small models and the offline `minilm` checkpoint."""
from __future__ import annotations

import pytest
import torch

import nanobert
from nanobert.checkpoint import resolve


@pytest.fixture
def one_thread():
    """Tiny models gain nothing from a second thread, and on a busy machine idle-spinning
    worker threads make them many times slower. Test modules of tiny models use it."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def minilm_dir():
    return resolve("minilm")


@pytest.fixture(scope="session")
def minilm(minilm_dir):
    """(model, tokenizer) for all-MiniLM-L6-v2, in eval mode."""
    model, tok = nanobert.load(minilm_dir)
    return model.eval(), tok


@pytest.fixture
def tiny_config():
    """A small random BERT config (vocabulary of the minilm tokenizer)."""
    return nanobert.preset("tiny", vocab_size=30522, hidden_dropout_prob=0.0,
                           attention_probs_dropout_prob=0.0, max_position_embeddings=128)


def random_batch(B=4, T=12, vocab=1000, seed=0, min_len=3):
    """ids/mask/types of B sequences with mixed lengths, right-padded to T."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_len, T + 1, (B,), generator=g)
    lengths[0] = T
    ids = torch.randint(5, vocab, (B, T), generator=g)
    mask = (torch.arange(T)[None] < lengths[:, None]).long()
    ids = ids * mask
    types = (torch.arange(T)[None] >= (lengths[:, None] // 2)).long() * mask
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
