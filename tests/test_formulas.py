"""Every formula of the model against an independent transcription of it.

Each reference below recomputes one piece of the model with explicit Python loops
over sentences, positions, contexts and layers, from the module's own weights
(re-drawn at random, large enough that a dropped tanh or a halved score shows),
never through the module's helpers; results must agree to 1e-5. Equation numbers
are those of Britz, Guan & Luong (EMNLP 2017). Covered:

* content attention, Eq. 1-2: alpha_i = softmax_j f_att(h_i, s_j) over the
  sentence's own positions (padding gets 0), c_i = sum_j alpha_ij s_j, with
  f_att = v^T tanh(W_s s_j + W_h h_i + b) (additive, Bahdanau),
  h_i^T W s_j (general), h_i^T s_j (dot), h_i^T s_j / sqrt(D) (scaled_dot);
* memory attention, Eq. 4-7: alpha_t = score(W_alpha s_t), C_k = sum_t alpha_tk s_t,
  beta = score(W_beta h), c = sum_k beta_k C_k, with softmax or sigmoid on either
  side, an encoder softmax over the K contexts (Eq. 5) or over time, with and
  without the position encodings of Eq. 8-10 (L_ks = (1-k/K)(1-s/S) + (k/K)(s/S),
  s counted within the sentence, each context renormalised over time), with and
  without the soft windows of --memory-position-window (the score of token t of
  n and context k of K plus -((t + 1/2)/n - (k + 1/2)/K)^2 / (2 w_k^2)), and the
  alignment beta alpha^T (Sec. 5);
* cheap linear attention (de Brebisson & Vincent 2016): c = C q, q = W_q h,
  C = (1/|x|) sum_t u_t u_t^T with u_t = s_t (linear) or
  u_t = sigmoid(W_g s_t + b_g) o s_t (gated_linear); our convention divides C by
  the source length (attention.LinearAttention's docstring);
* no attention: no context at all;
* the encoder: a bidirectional multi-layer LSTM run on each sentence alone with
  the LSTM cell equations; its states line up with src_tokens, and its final
  state is the top layer's last h and c in both directions, [h_fw; h_bw; c_fw; c_bw];
* the bridge: the decoder's initial (h_0, c_0) of every layer is
  tanh(W_b final_state + b_b), split as h of layers 1..L, then c of layers 1..L;
* the decoder: LSTM cell steps, input feeding (c_{i-1}, zeros at the first step,
  concatenated to the embedding, only when there is a context), and the output
  layer Eq. 3: logits_i = W_out [h_i; c_i] + b, or with --attention-mix (and a
  context) logits_i = W_out tanh(W_m [h_i; c_i] + b_m) + b.
"""

import math

import pytest
import torch
from conftest import PREV_OUTPUT, SOURCES, build_model, left_padded_batch

from fairseq_memattn.modules.attention import (AdditiveAttention, DotAttention, GeneralAttention,
                                       LinearAttention, MemoryAttention, NoAttention)
from fairseq_memattn.modules.memory import MemoryConfig

TOL = dict(atol=1e-5, rtol=1e-5)
CONTENT = ("additive", "general", "dot", "scaled_dot")


def randomise(module, seed, scale):
    """Redraw every parameter from N(0, scale^2): the default initialisations are
    so small that tanh(x) ~ x and several wrong formulas would agree to 1e-3."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=gen) * scale)
    return module


# --- references: one sentence, one decoder state, plain loops ------------------

def softmax(values):
    top = max(float(v) for v in values)
    exps = [torch.exp(v - top) for v in values]
    total = sum(exps)
    return [e / total for e in exps]


def score(name, values):
    """The paper's scoring function over a list of scalars."""
    return softmax(values) if name == "softmax" else [torch.sigmoid(v) for v in values]


def content_reference(kind, attn, states, h):
    """Eq. 1-2 for one decoder state h over the states of one sentence."""
    def f_att(s):
        if kind == "additive":
            hidden = torch.tanh(attn.source_proj.weight @ s + attn.query_proj.weight @ h
                                + attn.query_proj.bias)
            return attn.v.weight[0] @ hidden
        if kind == "general":
            return h @ (attn.source_proj.weight @ s)
        if kind == "dot":
            return h @ s
        return h @ s / math.sqrt(s.numel())  # scaled_dot

    alpha = softmax([f_att(s) for s in states])
    return sum(a * s for a, s in zip(alpha, states)), alpha


def position_encoding_reference(length, K, S, normalize="sum"):
    """Eq. 10 for positions s = 1..length, then each context k renormalised over time: to sum
    to 1 (the paper), or to mean 1 (--memory-position-normalize mean)."""
    L = [[(1 - k / K) * (1 - s / S) + (k / K) * (s / S) for k in range(1, K + 1)]
         for s in range(1, length + 1)]
    target = 1 if normalize == "sum" else length
    totals = [sum(L[s][k] for s in range(length)) for k in range(K)]
    return [[L[s][k] * target / totals[k] for k in range(K)] for s in range(length)]


def memory_contexts_reference(attn, states, encoder_score, normalize, max_len, position_normalize="sum"):
    """Eq. 4-5 (Eq. 9 with position encodings): alpha (|x| lists of K) and C (K rows)."""
    K = attn.writer.W_alpha.weight.size(0)
    raw = [[attn.writer.W_alpha.weight[k] @ s for k in range(K)] for s in states]
    if max_len is not None:
        l = position_encoding_reference(len(states), K, max_len, position_normalize)
        raw = [[raw[t][k] * l[t][k] for k in range(K)] for t in range(len(states))]
    if attn.writer.window_log_width is not None:  # --memory-position-window
        n = len(states)
        raw = [[raw[t][k] - ((t + 0.5) / n - (k + 0.5) / K) ** 2
                / (2 * math.exp(attn.writer.window_log_width[k]) ** 2) for k in range(K)] for t in range(n)]
    if encoder_score == "softmax" and normalize == "time":
        per_context = [softmax([raw[t][k] for t in range(len(states))]) for k in range(K)]
        alpha = [[per_context[k][t] for k in range(K)] for t in range(len(states))]
    else:
        alpha = [score(encoder_score, raw[t]) for t in range(len(states))]
    C = [sum(alpha[t][k] * states[t] for t in range(len(states))) for k in range(K)]
    return alpha, C


def memory_lookup_reference(attn, alpha, C, h, decoder_score):
    """Eq. 6-7 and the alignment beta alpha^T."""
    K = len(C)
    beta = score(decoder_score, [attn.read.W_beta.weight[k] @ h for k in range(K)])
    context = sum(beta[k] * C[k] for k in range(K))
    alignment = [sum(beta[k] * alpha[t][k] for k in range(K)) for t in range(len(alpha))]
    return context, alignment


def linear_reference(attn, states, h, gated):
    """c = C q with C = (1/|x|) sum_t u_t u_t^T = sum_t (u_t . q / |x|) u_t: the
    weight of source t is u_t . q / |x|."""
    if gated:
        u = [torch.sigmoid(attn.gate.weight @ s + attn.gate.bias) * s for s in states]
    else:
        u = list(states)
    C = sum(torch.outer(v, v) for v in u) / len(states)
    q = attn.query_proj.weight @ h
    return C @ q, [v @ q / len(states) for v in u]


def attention_reference(kind, attn, states, queries, options=None):
    """Contexts and alignments of one sentence (states: list of E-vectors, no
    padding) for a list of decoder states; None for no attention."""
    options = options or {}
    if kind == "none":
        return [None] * len(queries), [None] * len(queries)
    if kind in CONTENT:
        results = [content_reference(kind, attn, states, h) for h in queries]
    elif kind == "memory":
        alpha, C = memory_contexts_reference(attn, states, options.get("encoder_score", "softmax"),
                                             options.get("normalize", "contexts"),
                                             options.get("max_len"),
                                             options.get("position_normalize", "sum"))
        results = [memory_lookup_reference(attn, alpha, C, h, options.get("decoder_score", "softmax"))
                   for h in queries]
    else:
        results = [linear_reference(attn, states, h, gated=kind == "gated_linear") for h in queries]
    return [c for c, _ in results], [torch.stack(w) for _, w in results]


# --- the attention modules ------------------------------------------------------

E = H = 6  # dot attention compares encoder and decoder states directly
# Row 0: no padding; row 1: three tokens after three left pads (fairseq's layout);
# row 2: two tokens then right padding. Padded states are large garbage, so any
# padding that leaks into a context or an alignment shows.
MASK = torch.tensor([[False] * 6, [True] * 3 + [False] * 3, [False] * 2 + [True] * 4])


def random_inputs(seed=0, steps=3):
    gen = torch.Generator().manual_seed(seed)
    states = torch.randn(3, 6, E, generator=gen)
    states = torch.where(MASK.unsqueeze(-1), 50 * torch.randn(3, 6, E, generator=gen), states)
    query = torch.randn(3, steps, H, generator=gen)
    return states, query


def build_module(kind, seed, **memory_options):
    torch.manual_seed(seed)
    modules = {
        "none": lambda: NoAttention(),
        "additive": lambda: AdditiveAttention(E, H, attention_dim=5),
        "general": lambda: GeneralAttention(E, H),
        "dot": lambda: DotAttention(E, H, scaled=False),
        "scaled_dot": lambda: DotAttention(E, H, scaled=True),
        "memory": lambda: MemoryAttention(E, H, MemoryConfig(k=4, **memory_options)),
        "linear": lambda: LinearAttention(E, H, gated=False),
        "gated_linear": lambda: LinearAttention(E, H, gated=True),
    }
    attn = randomise(modules[kind](), seed, scale=1.0)
    attn.keep_alignment = True
    return attn.eval()


@torch.no_grad()
def check_against_reference(kind, attn, options=None):
    states, query = random_inputs()
    context, weights = attn.lookup(attn.build_memory(states, MASK), query)
    if kind == "none":
        assert context is None and weights is None
        return
    for b in range(3):
        positions = [t for t in range(6) if not MASK[b, t]]
        expected_contexts, expected_weights = attention_reference(
            kind, attn, [states[b, t] for t in positions], list(query[b]), options)
        torch.testing.assert_close(context[b], torch.stack(expected_contexts), **TOL)
        assert not weights[b][:, MASK[b]].any(), "alignment weight on padding"
        got = weights[b][:, positions]
        expected = torch.stack(expected_weights)
        torch.testing.assert_close(got, expected, **TOL)


@pytest.mark.parametrize("kind", ["none", *CONTENT, "linear", "gated_linear"])
def test_attention_matches_its_formula(kind):
    check_against_reference(kind, build_module(kind, seed=11))


@pytest.mark.parametrize("max_len", [None, 9])
@pytest.mark.parametrize("normalize", ["contexts", "time"])
@pytest.mark.parametrize("encoder_score", ["softmax", "sigmoid"])
@pytest.mark.parametrize("decoder_score", ["softmax", "sigmoid"])
@pytest.mark.parametrize("window", [False, True])
def test_memory_attention_matches_eq_4_to_10(encoder_score, decoder_score, normalize, max_len, window):
    options = dict(encoder_score=encoder_score, decoder_score=decoder_score,
                   encoder_normalize=normalize, position_encoding=max_len is not None,
                   position_max_len=max_len, position_window=window)
    attn = build_module("memory", seed=12, **options)
    check_against_reference("memory", attn, dict(encoder_score=encoder_score,
                                                 decoder_score=decoder_score,
                                                 normalize=normalize, max_len=max_len))


@pytest.mark.parametrize("encoder_score", ["softmax", "sigmoid"])
@pytest.mark.parametrize("window", [False, True])
def test_mean_position_encodings_match_eq_9_scaled_by_the_length(encoder_score, window):
    attn = build_module("memory", seed=13, encoder_score=encoder_score, position_encoding=True,
                        position_max_len=9, position_normalize="mean", position_window=window)
    check_against_reference("memory", attn, dict(encoder_score=encoder_score, max_len=9,
                                                 position_normalize="mean"))


def test_position_encoding_reference_by_hand():
    """The reference itself, on numbers worked out by hand (K = 2, S = 4, 3 tokens):
    k=1: L = 0.5 everywhere -> 1/3 each; k=2: L = s/4 = 1/4, 1/2, 3/4 -> 1/6, 1/3, 1/2."""
    expected = [[1 / 3, 1 / 6], [1 / 3, 1 / 3], [1 / 3, 1 / 2]]
    got = position_encoding_reference(3, K=2, S=4)
    assert all(abs(g - e) < 1e-12 for row, erow in zip(got, expected) for g, e in zip(row, erow))
    got = position_encoding_reference(3, K=2, S=4, normalize="mean")  # three times as much
    assert all(abs(g - 3 * e) < 1e-12 for row, erow in zip(got, expected) for g, e in zip(row, erow))


# --- the model: encoder, bridge, decoder, output layer --------------------------

def lstm_cell(x, h, c, weights, suffix):
    """One step of torch's LSTM cell (gates in the order i, f, g, o)."""
    w_ih, w_hh, b_ih, b_hh = (weights[f"{name}{suffix}"]
                              for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"))
    i, f, g, o = (w_ih @ x + b_ih + w_hh @ h + b_hh).chunk(4)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(c), c


def encoder_reference(encoder, token_ids):
    """The bidirectional LSTM over one sentence alone, step by step.
    Returns its top-layer states (one 2H-vector per token) and its final state."""
    weights = dict(encoder.lstm.named_parameters())
    hidden = encoder.lstm.hidden_size
    x = [encoder.embed_tokens.weight[t] for t in token_ids]
    n = len(x)
    for layer in range(encoder.lstm.num_layers):
        outputs = {}
        for direction, order in (("", range(n)), ("_reverse", reversed(range(n)))):
            h, c = torch.zeros(hidden), torch.zeros(hidden)
            for t in order:
                h, c = lstm_cell(x[t], h, c, weights, f"_l{layer}{direction}")
                outputs[t, direction] = h
            outputs[direction] = (h, c)  # after the last step of this direction
        x = [torch.cat([outputs[t, ""], outputs[t, "_reverse"]]) for t in range(n)]
    (h_fw, c_fw), (h_bw, c_bw) = outputs[""], outputs["_reverse"]
    return x, torch.cat([h_fw, h_bw, c_fw, c_bw])


def decoder_reference(decoder, attention_kind, states, final_state, prev_tokens, options):
    """Bridge, LSTM cell steps, input feeding and Eq. 3 for one sentence."""
    weights = dict(decoder.lstm.named_parameters())
    layers, hidden = decoder.lstm.num_layers, decoder.lstm.hidden_size
    init = torch.tanh(decoder.bridge.weight @ final_state + decoder.bridge.bias)  # the bridge
    h = [init[l * hidden:(l + 1) * hidden] for l in range(layers)]
    c = [init[(layers + l) * hidden:(layers + l + 1) * hidden] for l in range(layers)]
    attn = decoder.attention
    input_feeding = decoder.input_feeding
    assert input_feeding == (options["input_feeding"] and attention_kind != "none")
    previous_context = torch.zeros(attn.context_dim)
    logits = []
    for token in prev_tokens:
        x = decoder.embed_tokens.weight[token]
        if input_feeding:
            x = torch.cat([x, previous_context])
        for layer in range(layers):
            h[layer], c[layer] = lstm_cell(x, h[layer], c[layer], weights, f"_l{layer}")
            x = h[layer]
        (context,), _ = attention_reference(attention_kind, attn, states, [h[-1]], options)
        features = h[-1] if context is None else torch.cat([h[-1], context])
        if options["attention_mix"] and context is not None:  # Luong et al.'s attentional hidden state
            features = torch.tanh(decoder.attention_mix.weight @ features + decoder.attention_mix.bias)
        logits.append(decoder.output_projection.weight @ features
                      + decoder.output_projection.bias)  # Eq. 3
        previous_context = context
    return torch.stack(logits)


MODEL_MEMORY_OPTIONS = dict(memory_position_encoding=True, memory_position_max_len=8,
                            memory_encoder_score="sigmoid")


def build_random_model(dictionary, attention_type, input_feeding=False, **overrides):
    extra = MODEL_MEMORY_OPTIONS if attention_type == "memory" else {}
    model = build_model(dictionary, attention_type=attention_type, input_feeding=input_feeding,
                        **extra, **overrides)
    return randomise(model, seed=5, scale=0.5).eval()


def padded_batch(dictionary, left):
    """fairseq's collater layout: sources ending in EOS, padded on the left or right."""
    tokens, lengths = left_padded_batch(dictionary, SOURCES)
    if not left:
        for row, n in enumerate(lengths.tolist()):
            tokens[row] = torch.cat([tokens[row, -n:], tokens[row, :-n]])
    return tokens, lengths


def sentence(tokens, pad):
    return [t for t in tokens.tolist() if t != pad]


@pytest.mark.parametrize("left_pad", [True, False])
def test_encoder_states_and_final_state(dictionary, left_pad):
    """The top layer's last h and c in both directions; padding is not read."""
    model = build_random_model(dictionary, "dot", left_pad_source=left_pad)
    tokens, lengths = padded_batch(dictionary, left_pad)
    seen = {}
    build_memory = model.encoder.attention.build_memory

    def recording_build_memory(states, padding_mask):
        seen.update(states=states, padding_mask=padding_mask)
        return build_memory(states, padding_mask)

    model.encoder.attention.build_memory = recording_build_memory
    with torch.no_grad():
        encoder_out = model.encoder(tokens, lengths)
    pad = dictionary.pad()
    assert torch.equal(seen["padding_mask"], tokens.eq(pad))
    for row in range(len(SOURCES)):
        states, final_state = encoder_reference(model.encoder, sentence(tokens[row], pad))
        torch.testing.assert_close(encoder_out["final_state"][row], final_state, **TOL)
        torch.testing.assert_close(seen["states"][row][tokens[row].ne(pad)], torch.stack(states),
                                   **TOL)


@pytest.mark.parametrize("input_feeding, attention_mix", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("attention_type", ["none", *CONTENT, "memory", "linear", "gated_linear"])
def test_decoder_logits_match_eq_3(dictionary, attention_type, input_feeding, attention_mix):
    """The whole model against loops: encoder per sentence, bridge, decoder LSTM
    with input feeding, the attention's formula, and logits = W_out [h_i; c_i] + b
    (or through the attention mix)."""
    model = build_random_model(dictionary, attention_type, input_feeding, attention_mix=attention_mix)
    tokens, lengths = left_padded_batch(dictionary, SOURCES)
    options = dict(input_feeding=input_feeding, attention_mix=attention_mix, encoder_score="sigmoid", max_len=8)
    with torch.no_grad():
        logits, _ = model(tokens, lengths, PREV_OUTPUT)
        for row in range(len(SOURCES)):
            states, final_state = encoder_reference(model.encoder,
                                                    sentence(tokens[row], dictionary.pad()))
            expected = decoder_reference(model.decoder, attention_type, states, final_state,
                                         PREV_OUTPUT[row].tolist(), options)
            torch.testing.assert_close(logits[row], expected, **TOL)
