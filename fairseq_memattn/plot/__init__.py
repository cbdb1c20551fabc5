"""Attention figures from trained checkpoints: the paper's Figs. 6-8 (``fairseq-memattn-plot``,
``fairseq_memattn.cli.plot``, draws them from the command line).

Takes fairseq-generate's options (task and data, --path, --beam, ...), decodes one example of
--gen-subset (or a --sentence) with fairseq's SequenceGenerator and draws, with source tokens on
the y axis and hypothesis tokens on the x axis:

* the alignment: for memory attention beta x alpha^T, "we multiply the attention scores alpha
  and beta from the encoder and decoder" (Sec. 5; Figs. 6 and 8 right); for standard attention
  the attention matrix the model returns while decoding (Eq. 2);
* for memory attention, its two factors: the write weights alpha (S x K, Eq. 5) of each memory
  and the read's weights beta (K x T: Eq. 7 for the mix reads; for the attention reads the
  LSTM's additive or general attention over the K rows, or a Transformer head's, or their mean); which context C_k
  carries each cell, one colour per k, intensity the combined weight (Figs. 7 and 8 left); and
  one small panel per k with C_k's share beta_tk * alpha_sk (Eq. 4-7), which sum over k to the
  alignment.

A transformer_memattn decoder reads the memory in every layer: --layer and --head choose the
read plotted; by default the one fairseq's alignments use (the last layer, mean over heads).

Several checkpoints (--path a.pt:b.pt:...) are decoded one by one, not as an ensemble, and set
side by side (Fig. 6's four scoring functions). The file type follows --output's extension.

``capture.py`` gets the weights from a model (torch, fairseq); ``figure.py`` draws them
(numpy, matplotlib).
"""

from .capture import (PlotError, ReadChoice, check_has_attention, check_read_choice,  # noqa: F401
                      check_source_length, check_task, decode, describe, memory_weights)
from .figure import FACTOR_PANEL_INCHES, MAIN_PANEL_INCHES, Alignment, draw, save  # noqa: F401
