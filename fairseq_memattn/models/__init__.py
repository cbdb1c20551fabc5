"""The model families: ``lstm_memattn`` (the paper's LSTM, Sec. 4) and
``transformer_memattn`` (the same memory read by a Transformer decoder)."""

from . import lstm_memattn, transformer_memattn  # noqa: F401
