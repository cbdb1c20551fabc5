import argparse
import os
import sys
from types import SimpleNamespace

import pytest
import torch
from fairseq.data import Dictionary

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLUGIN_DIR = os.path.join(REPO, "fairseq_memattn")
sys.path.insert(0, REPO)

from fairseq_memattn.model import MemAttnLSTMModel  # noqa: E402

ALL_ATTENTION = ["none", "additive", "general", "dot", "scaled_dot", "memory", "linear", "gated_linear"]


def make_dictionary(n_symbols=12):
    d = Dictionary()
    for i in range(n_symbols):
        d.add_symbol(str(i))
    return d


def make_args(**overrides):
    """Tiny sizes; encoder 2x8 so that dot attention fits the 16-unit decoder."""
    args = argparse.Namespace(
        encoder_embed_dim=8, encoder_hidden_size=8, encoder_layers=2,
        decoder_embed_dim=8, decoder_hidden_size=16, decoder_layers=2,
        dropout=0.0, memory_k=3,
    )
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


def build_model(dictionary=None, seed=0, **overrides):
    dictionary = dictionary or make_dictionary()
    task = SimpleNamespace(source_dictionary=dictionary, target_dictionary=dictionary)
    torch.manual_seed(seed)
    model = MemAttnLSTMModel.build_model(make_args(**overrides), task)
    model.eval()
    return model


def left_padded_batch(dictionary, sentences):
    """fairseq's collater layout: left-padded sources ending in EOS."""
    width = max(len(s) for s in sentences) + 1
    tokens = torch.full((len(sentences), width), dictionary.pad(), dtype=torch.long)
    for row, sent in enumerate(sentences):
        ids = [dictionary.index(str(t)) for t in sent] + [dictionary.eos()]
        tokens[row, width - len(ids):] = torch.tensor(ids)
    lengths = tokens.ne(dictionary.pad()).sum(1)
    return tokens, lengths


@pytest.fixture
def dictionary():
    return make_dictionary()
