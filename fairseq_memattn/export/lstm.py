"""ONNX graphs of ``lstm_memattn`` with ``--attention-type memory``
(models/lstm_memattn.py), built from its submodules' weights.

* encoder: right-padded src_tokens (B x S) -> the bidirectional LSTM (ONNX's
  LSTM with each sentence's length) -> the write of Eq. 4-5: the memory C
  (B x K x E) and alpha (B x 1 x S x K); and the decoder's initial h and c
  (B x layers x H) through the bridge, from the top layer's final states;
* decoder step: previous tokens of N hypotheses (N a multiple of B, the
  hypotheses of a source consecutive), h and c (N x layers x H) and, with
  input feeding, the previous context -> each source's best candidates for
  the next step from the log-probabilities (Eq. 3, or the attention mix;
  export/search.py), beta (N x K: Eq. 7, or with --memory-read attention or general
  Eq. 2 over the K rows, whose keys the encoder writes beside C) and the next state.
  The memory stays at one row per source; c = beta C (Eq. 6) reads a source's
  hypotheses together.
"""

import numpy as np

from .graph import FLOAT, INT64, Graph, as_array
from .search import beam_candidates


def check_supported(model) -> None:
    """Nothing to refuse: ``export.load_checkpoint`` refuses the other --attention-type values before
    it loads the model."""


def _lstm_weights(g: Graph, lstm, layer: int, directions):
    """W, R, B of ONNX's LSTM (gates i, o, f, c) from torch's (i, f, g, o) for one layer."""
    def gates(t):
        i, f, c, o = np.split(as_array(t), 4, axis=0)
        return np.concatenate([i, o, f, c], axis=0)

    suffixes = ["", "_reverse"][:directions]
    W = np.stack([gates(getattr(lstm, f"weight_ih_l{layer}{s}")) for s in suffixes])
    R = np.stack([gates(getattr(lstm, f"weight_hh_l{layer}{s}")) for s in suffixes])
    B = np.stack([np.concatenate([gates(getattr(lstm, f"bias_ih_l{layer}{s}")),
                                  gates(getattr(lstm, f"bias_hh_l{layer}{s}"))]) for s in suffixes])
    return g.weight(W, "lstm_W"), g.weight(R, "lstm_R"), g.weight(B, "lstm_B")


def encoder_graph(model, quantize: str = None) -> Graph:
    encoder, decoder = model.encoder, model.decoder
    H = encoder.lstm.hidden_size
    g = Graph("memattn_lstm_encoder", quantize)
    tokens = g.input("src_tokens", INT64, ["batch", "src_len"])
    padding = g.op("Equal", tokens, g.const(encoder.padding_idx, np.int64))
    lengths = g.op("ReduceSum", g.cast(g.op("Not", padding), np.int32), g.const([1], np.int64), keepdims=0)
    x = g.op("Transpose", g.embedding(encoder.embed_tokens.weight, tokens), perm=[1, 0, 2])
    for layer in range(encoder.lstm.num_layers):
        y, h, c = g.op("LSTM", x, *_lstm_weights(g, encoder.lstm, layer, 2), lengths, outputs=3,
                       direction="bidirectional", hidden_size=H)
        x = g.op("Reshape", g.op("Transpose", y, perm=[0, 2, 1, 3]), g.const([0, 0, -1], np.int64))  # S x B x 2H
    states = g.op("Transpose", x, perm=[1, 0, 2])  # B x S x 2H, zero at padding
    contexts, alpha = encoder.attention.writer.onnx_write(g, states, padding)
    K = encoder.attention.writer.num_contexts
    g.output(g.op("Unsqueeze", alpha, g.const([1], np.int64)), "alpha", FLOAT, ["batch", 1, "src_len", K])
    for name, tensor in encoder.attention.onnx_read_memory(g, contexts).items():
        g.output(tensor, name, FLOAT, ["batch", K, encoder.attention.onnx_memory_widths()[name]])
    # final_state = [h fwd; h bwd; c fwd; c bwd] of the top layer, then the bridge
    flat = [g.op("Reshape", g.op("Transpose", t, perm=[1, 0, 2]), g.const([0, -1], np.int64)) for t in (h, c)]
    init = g.op("Tanh", g.linear(g.op("Concat", *flat, axis=1), decoder.bridge))
    L, Hd = decoder.num_layers, decoder.hidden_size
    init = g.op("Reshape", init, g.const([0, 2, L, Hd], np.int64))
    for index, name in enumerate(("initial_h", "initial_c")):
        part = g.op("Gather", init, g.const(index, np.int64), axis=1)  # B x layers x H
        g.output(part, name, FLOAT, ["batch", L, Hd])
    return g


def decoder_graph(model, quantize: str = None) -> Graph:
    decoder, attention = model.decoder, model.decoder.attention
    L, H, E, K = decoder.num_layers, decoder.hidden_size, attention.context_dim, attention.writer.num_contexts
    g = Graph("memattn_lstm_decoder_step", quantize)
    tokens = g.input("prev_tokens", INT64, ["hypotheses"])
    g.input("step", INT64, [1])
    reorder = g.input("reorder", INT64, ["hypotheses"])  # which row of the state each hypothesis continues
    h_in, c_in = (g.op("Gather", g.input(name, FLOAT, ["rows", L, H]), reorder, axis=0)
                  for name in ("state_h", "state_c"))
    context_in = (g.op("Gather", g.input("state_context", FLOAT, ["rows", E]), reorder, axis=0)
                  if decoder.input_feeding else None)
    memory = {name: g.input(name, FLOAT, ["sources", K, width])
              for name, width in attention.onnx_memory_widths().items()}
    x = g.embedding(decoder.embed_tokens.weight, tokens)
    if context_in is not None:
        x = g.op("Concat", x, context_in, axis=1)
    h_layers, c_layers = (g.op("Transpose", t, perm=[1, 0, 2]) for t in (h_in, c_in))  # layers x N x H
    new_h, new_c = [], []
    for layer in range(L):
        first = [g.op("Slice", t, g.const([layer], np.int64), g.const([layer + 1], np.int64)) for t in (h_layers, c_layers)]
        y, h, c = g.op("LSTM", g.op("Unsqueeze", x, g.const([0], np.int64)), *_lstm_weights(g, decoder.lstm, layer, 1),
                       "", *first, outputs=3, direction="forward", hidden_size=H)
        x = g.op("Squeeze", y, g.const([0, 1], np.int64))  # N x H
        new_h.append(h)
        new_c.append(c)
    context, beta = attention.onnx_read_rows(g, x, memory)  # a source's hypotheses read its one row together
    features = g.op("Concat", x, context, axis=1)
    if decoder.attention_mix is not None:
        features = g.op("Tanh", g.linear(features, decoder.attention_mix))
    logits = g.linear(features, decoder.output_projection)
    beam_candidates(g, logits, len(decoder.dictionary))
    g.output(g.op("Reshape", beta, g.const([-1, K], np.int64)), "read_weights", FLOAT, ["hypotheses", K])
    for name, parts in (("state_h", new_h), ("state_c", new_c)):
        g.output(g.op("Transpose", g.op("Concat", *parts, axis=0), perm=[1, 0, 2]), "new_" + name, FLOAT,
                 ["hypotheses", L, H])
    if context_in is not None:
        g.output(context, "new_state_context", FLOAT, ["hypotheses", E])
    return g


def build(model, quantize: str = None):
    decoder = model.decoder
    state = [{"name": "state_h", "from": "initial_h"}, {"name": "state_c", "from": "initial_c"}]
    if decoder.input_feeding:
        state.append({"name": "state_context", "zeros": [decoder.attention.context_dim]})
    config = {"model": "lstm_memattn", "memory_k": decoder.attention.writer.num_contexts, "alignment_memory": 0,
              "memory_outputs": list(decoder.attention.onnx_memory_widths()), "decoder_state": state,
              "source_padding": "right"}
    return {"encoder": encoder_graph(model, quantize), "decoder": decoder_graph(model, quantize)}, config
