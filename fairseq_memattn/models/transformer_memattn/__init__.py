"""Transformer whose decoder reads a fixed-size memory instead of the encoder states.

Built on fairseq's own Transformer (``TransformerEncoderBase``,
``TransformerDecoderBase``, ``TransformerDecoderLayerBase``); only two pieces
change:

* the encoder, after fairseq's layers, writes K attention contexts
  C (B x K x d) from its final states with the write of Sec. 3 (Eq. 4-5, with
  the position encodings of Eq. 8-10: ``modules/memory.MemoryWrite``), one memory
  for all decoder layers or one per layer (``--memory-per-layer``, a separate
  W_alpha each), and returns only that memory: never the |S| x d states;
* every decoder layer's encoder-attention is replaced by a *read* of the
  memory: ``--memory-read attention`` (fairseq's multi-head attention over the
  K rows) or ``--memory-read mix`` (the paper's Eq. 6-7, per layer); both in
  ``modules/memory_reads.py``.

Beam search. As in the LSTM model (``modules/beam_sharing.py``), ``encoder_out`` holds
one row per source, shared by the ``group`` consecutive hypotheses of that
source, and reordering moves whole rows only when a source finishes. What a
read derives from the memory (keys and values) is computed at the first
decoder step, once per source, kept in the incremental state and reordered
the same way: per step, neither recomputed nor copied. A source's hypotheses
are read as extra query steps of its one row. A step's cost is then O(K d)
per layer and hypothesis, whatever |S| is.
"""

from .decoder import MemAttnTransformerDecoder, MemoryReadDecoderLayer  # noqa: F401
from .encoder import MemAttnTransformerEncoder  # noqa: F401
from .model import (  # noqa: F401
    MemAttnTransformerModel,
    base_architecture,
    check_memory_options,
    iwslt_de_en_architecture,
    keep_layers,
)
