"""ONNX graphs of ``transformer_memattn`` (models/transformer_memattn/),
built from its submodules' weights.

* encoder: src_tokens (B x S) -> fairseq's encoder -> the writes of Eq. 4-5
  -> per decoder layer what its read needs from the memory, projected once
  per source (attention read: keys and values, B x H x K x D/H; mix read:
  C W_o^T, B x K x D), and alpha (B x M x S x K) for alignments;
* decoder step: the previous tokens of N hypotheses (N a multiple of B, the
  hypotheses of a source consecutive), the step, each layer's self-attention
  cache and where each hypothesis's past is in it (_cached_self_attention)
  -> each source's best candidates for the next step (export/search.py), the
  last layer's read weights averaged over heads (N x K) and the new
  position's keys and values. The memory stays at one row per source: the
  queries of a source's hypotheses are read together from its row. With
  short_rows, sources shorter than it keep |S| rows (ShortSource): their
  memory and alpha are inputs of their own, their hypotheses come first.
"""


import numpy as np

from ..deploy.config import short_memory_name
from ..modules.memory_reads import ShortSource
from .graph import FLOAT, INT64, Graph, as_array
from .search import beam_candidates


def positions_table(embed_positions, count: int) -> np.ndarray:
    """The rows of fairseq's positional embedding (learned or sinusoidal), at
    least ``count`` of them (indices padding_idx + 1 + position)."""
    if hasattr(embed_positions, "weights"):  # SinusoidalPositionalEmbedding
        weights = embed_positions.weights
        if weights is None or weights.size(0) < count:
            weights = embed_positions.get_embedding(count, embed_positions.embedding_dim,
                                                    embed_positions.padding_idx)
        return as_array(weights)
    return as_array(embed_positions.weight)


def check_supported(model) -> None:
    """One error naming every option of the model that the graphs do not implement."""
    encoder, decoder = model.encoder, model.decoder
    attentions = [layer.self_attn for layer in (*encoder.layers, *decoder.layers)]
    options = [
        ("--adaptive-softmax-cutoff", getattr(decoder, "adaptive_softmax", None) is not None),
        ("--scale-attn/--scale-fc/--scale-heads/--scale-resids (NormFormer)",
         any(getattr(layer, name, None) is not None
             for layer in decoder.layers for name in ("attn_ln", "ffn_layernorm", "c_attn", "w_resid"))),
        # fairseq's --quant-noise-pq adds a Linear after the embeddings, also at inference
        ("--quant-noise-pq", encoder.quant_noise is not None or decoder.quant_noise is not None),
        ("--alibi", getattr(decoder, "alibi", None) is not None),
        ("attention with add_bias_kv/add_zero_attn", any(a.bias_k is not None or a.add_zero_attn for a in attentions)),
    ]
    unsupported = [name for name, used in options if used]
    if unsupported:
        raise ValueError(f"the export does not support {', '.join(unsupported)}: export a model trained "
                         f"without {'it' if len(unsupported) == 1 else 'them'}")


def _embed(g: Graph, tokens: str, module, positions: str):
    """embed_scale * E[tokens] (+ project_in_dim) + positions (+ layernorm_embedding), as fairseq."""
    x = g.embedding(module.embed_tokens.weight, tokens)
    if module.embed_scale != 1.0:
        x = g.op("Mul", x, g.const(module.embed_scale))
    if getattr(module, "project_in_dim", None) is not None:
        x = g.linear(x, module.project_in_dim)
    if module.embed_positions is not None:
        table = positions_table(module.embed_positions, module.max_positions() + module.padding_idx + 2)
        x = g.op("Add", x, g.embedding(table, positions, "positions"))
    if module.layernorm_embedding is not None:
        x = g.layer_norm(x, module.layernorm_embedding)
    return x


def _sublayer(g: Graph, x: str, layer_norm, normalize_before: bool, body):
    """fairseq's residual block: [LN] -> body -> + residual -> [LN]."""
    y = body(g.layer_norm(x, layer_norm) if normalize_before else x)
    x = g.op("Add", x, y)
    return x if normalize_before else g.layer_norm(x, layer_norm)


def _feed_forward(g: Graph, layer, activation: str):
    return lambda x: g.linear(g.activation(g.linear(x, layer.fc1), activation), layer.fc2)


def _self_attention(g: Graph, x: str, attention, valid: str):
    """fairseq's MultiheadAttention over x itself (B x L x D), by ONNX Runtime's fused
    MultiHeadAttention (it never holds the B x H x L x L scores at once); ``valid``: B x L
    int32, 0 at padding."""
    q, k, v = (g.linear(x, proj) for proj in (attention.q_proj, attention.k_proj, attention.v_proj))
    node = g.op("MultiHeadAttention", q, k, v, "", valid, num_heads=attention.num_heads,
                scale=float(attention.scaling), domain="com.microsoft")
    return g.linear(node, attention.out_proj)


def memory_names(model):
    """The encoder outputs the decoder step reads, in order."""
    return [f"memory_{part}_{index}" for index, layer in enumerate(model.decoder.layers)
            for part in layer.encoder_attn.memory_parts]


def encoder_graph(model, activation: str, quantize: str = None, short_rows: int = 0) -> Graph:
    encoder = model.encoder
    g = Graph("memattn_transformer_encoder", quantize)
    tokens = g.input("src_tokens", INT64, ["batch", "src_len"])
    padding = g.op("Equal", tokens, g.const(encoder.padding_idx, np.int64))
    not_pad = g.cast(g.op("Not", padding), np.int64)
    counts = g.op("CumSum", not_pad, g.const(1, np.int64))  # 1-based positions within each sentence
    positions = g.op("Add", g.op("Mul", counts, not_pad), g.const(encoder.padding_idx, np.int64))  # make_positions
    x = _embed(g, tokens, encoder, positions)
    x = g.op("Mul", x, g.op("Unsqueeze", g.cast(not_pad, np.float32), g.const([-1], np.int64)))
    valid = g.cast(not_pad, np.int32)
    for layer in encoder.layers:
        x = _sublayer(g, x, layer.self_attn_layer_norm, layer.normalize_before,
                      lambda y, a=layer.self_attn: _self_attention(g, y, a, valid))
        x = _sublayer(g, x, layer.final_layer_norm, layer.normalize_before, _feed_forward(g, layer, activation))
    if encoder.layer_norm is not None:
        x = g.layer_norm(x, encoder.layer_norm)
    written = [writer.onnx_write(g, x, padding) for writer in encoder.writers]
    alpha = g.op("Concat", *[g.op("Unsqueeze", a, g.const([1], np.int64)) for _, a in written], axis=1)
    g.output(alpha, "alpha", FLOAT, ["batch", len(written), "src_len", encoder.writers[0].num_contexts])
    reads = [layer.encoder_attn for layer in model.decoder.layers]

    def from_contexts(b):
        return [part for read in reads for part in read.onnx_project(b, written[read.memory_index][0]).values()]

    def from_states(b):
        return [part for read in reads for part in read.onnx_project_states(b, x).values()]

    if short_rows:  # a source shorter than short_rows keeps |S| rows (ShortSource), a longer one K
        shorter = g.op("Less", g.dims(tokens, 1, 2), g.const([short_rows], np.int64))
        memory = g.branch(g.op("Squeeze", shorter), from_states, from_contexts)
    else:
        memory = from_contexts(g)
    shapes = [read.memory_shape("batch") for read in reads for _ in read.memory_parts]
    for value, name, shape in zip(memory, memory_names(model), shapes):
        g.output(value, name, FLOAT, shape)
    return g


# --- one decoder step ------------------------------------------------------------

def _cached_self_attention(g: Graph, x: str, attention, index: int, new_positions: list):
    """fairseq's incremental self-attention for one new position (x: N x D).

    The keys and values of earlier positions stay where they were written: the cache of a layer
    is a table of rows of D/H, one per head, position and hypothesis, and ``history`` (H x N x t)
    holds the row of each head's key and value at each of a hypothesis's past positions. Beam
    search reorders those indices, never the cache. The new position's keys and values are
    outputs (N x H x D/H) that the translator binds to the cache's next rows, so ONNX Runtime
    writes them in place. Softmax over [past scores, new score] is fairseq's softmax over the
    concatenated keys."""
    heads, head_dim = attention.num_heads, attention.head_dim
    q, k_new, v_new = (g.op("Reshape", y, g.const([-1, heads, head_dim], np.int64))  # N x H x D/H
                       for y in g.linears(x, (attention.q_proj, attention.k_proj, attention.v_proj)))
    new_positions += [(k_new, f"new_key_{index}", heads, head_dim), (v_new, f"new_value_{index}", heads, head_dim)]
    q, k_new, v_new = (g.op("Unsqueeze", g.op("Transpose", y, perm=[1, 0, 2]), g.const([2], np.int64))
                       for y in (q, k_new, v_new))  # H x N x 1 x D/H
    q = g.op("Mul", q, g.const(attention.scaling))
    k_past, v_past = (g.op("Gather", f"self_{part}_{index}", "history", axis=0)  # H x N x t x D/H
                      for part in ("key", "value"))
    scores = g.op("Concat", g.op("MatMul", q, g.op("Transpose", k_past, perm=[0, 1, 3, 2])),
                  g.op("ReduceSum", g.op("Mul", q, k_new), g.const([-1], np.int64), keepdims=1), axis=-1)
    weights = g.op("Softmax", scores, axis=-1)  # H x N x 1 x (t + 1)
    last = g.const([-1], np.int64)
    w_past = g.op("Slice", weights, g.const([0], np.int64), last, last)
    w_new = g.op("Slice", weights, last, g.const([np.iinfo(np.int64).max], np.int64), last)
    out = g.op("Add", g.op("MatMul", w_past, v_past), g.op("Mul", w_new, v_new))  # H x N x 1 x D/H
    out = g.op("Reshape", g.op("Transpose", out, perm=[1, 0, 2, 3]), g.const([-1, attention.embed_dim], np.int64))
    return g.linear(out, attention.out_proj)


def decoder_graph(model, activation: str, quantize: str = None, short_rows: int = 0) -> Graph:
    decoder = model.decoder
    K = model.encoder.writers[0].num_contexts
    g = Graph("memattn_transformer_decoder_step", quantize)
    tokens = g.input("prev_tokens", INT64, ["hypotheses"])
    step = g.input("step", INT64, [1])
    g.input("history", INT64, [decoder.layers[0].self_attn.num_heads, "hypotheses", "past"])  # _cached_self_attention
    for index, layer in enumerate(decoder.layers):
        for part in ("key", "value"):
            g.input(f"self_{part}_{index}", FLOAT, ["cache_rows", layer.self_attn.head_dim])
    memories = []
    names = iter(memory_names(model))
    for layer in decoder.layers:
        read = layer.encoder_attn
        memories.append({part: g.input(next(names), FLOAT, read.memory_shape("sources"))
                         for part in read.memory_parts})
    shorts = [None] * len(decoder.layers)
    if short_rows:  # short sources' memory: their |S| projected states, read through alpha
        alpha = g.input("alpha", FLOAT, ["short_sources", len(model.encoder.writers), "short_src_len", K])
        layout = ShortSource.layout(g, alpha, tokens, next(iter(memories[0].values())))
        names = iter(memory_names(model))
        for index, layer in enumerate(decoder.layers):
            read = layer.encoder_attn
            memory = {part: g.input(short_memory_name(next(names)), FLOAT,
                                    read.memory_shape("short_sources", "short_src_len"))
                      for part in read.memory_parts}
            shorts[index] = ShortSource(**layout, memory=memory, memory_index=read.memory_index)
    # fairseq's incremental positions: padding_idx + 1 + step for every hypothesis
    x = _embed(g, tokens, decoder, g.op("Add", step, g.const(decoder.padding_idx + 1, np.int64)))
    new_positions, weights = [], None
    for index, layer in enumerate(decoder.layers):
        x = _sublayer(g, x, layer.self_attn_layer_norm, layer.normalize_before,
                      lambda y, a=layer.self_attn, i=index: _cached_self_attention(g, y, a, i, new_positions))

        def read_memory(y, read=layer.encoder_attn, memory=memories[index], short=shorts[index]):
            nonlocal weights
            out, weights = read.onnx_read(g, y, memory, short)
            return out

        x = _sublayer(g, x, layer.encoder_attn_layer_norm, layer.normalize_before, read_memory)
        x = _sublayer(g, x, layer.final_layer_norm, layer.normalize_before, _feed_forward(g, layer, activation))
    if decoder.layer_norm is not None:
        x = g.layer_norm(x, decoder.layer_norm)
    if decoder.project_out_dim is not None:
        x = g.linear(x, decoder.project_out_dim)
    logits = g.product(x, as_array(decoder.output_projection.weight).T, "output_projection")
    if getattr(decoder.output_projection, "bias", None) is not None:
        logits = g.op("Add", logits, g.weight(decoder.output_projection.bias, "output_bias"))
    beam_candidates(g, logits, len(decoder.dictionary))
    # the last layer's read weights over the K rows, mean over heads (fairseq's alignment layer)
    g.output(g.op("Reshape", weights, g.const([-1, K], np.int64)), "read_weights", FLOAT, ["hypotheses", K])
    for value, name, heads, head_dim in new_positions:
        g.output(value, name, FLOAT, ["hypotheses", heads, head_dim])
    return g


def default_short_rows(k: int) -> int:
    """Sources of fewer tokens (EOS included) keep |S| memory rows by default: below K / 2, where
    reading |S| rows through alpha costs less than reading K (results/speed/deploy_small.md)."""
    return k // 2


def build(model, quantize: str = None, short_rows: int = None):
    """The graphs and the config the translator needs. ``short_rows``: sources shorter than this
    keep their memory as |S| rows (``ShortSource``); None: ``default_short_rows``, 0: never."""
    activation = model.cfg.activation_fn if hasattr(model, "cfg") else model.args.activation_fn
    layers = model.decoder.layers
    k = model.encoder.writers[0].num_contexts
    short_rows = default_short_rows(k) if short_rows is None else short_rows
    if not 0 <= short_rows <= k:
        raise ValueError(f"invalid --short-source-rows: {short_rows} (from 0, never, to the model's "
                         f"--memory-k {k})")
    config = {
        "model": "transformer_memattn",
        "memory_read": layers[0].encoder_attn.name,
        "memories": len(model.encoder.writers),
        "memory_k": model.encoder.writers[0].num_contexts,
        "alignment_memory": layers[-1].encoder_attn.memory_index,
        "memory_outputs": memory_names(model),
        "decoder_state": [],
        "self_attention_cache": [{"heads": layer.self_attn.num_heads, "head_dim": layer.self_attn.head_dim}
                                 for layer in layers],
        "source_padding": "left",
    }
    if short_rows:
        config["short_source_rows"] = short_rows
    return {"encoder": encoder_graph(model, activation, quantize, short_rows),
            "decoder": decoder_graph(model, activation, quantize, short_rows)}, config
