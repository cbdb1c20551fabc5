"""Numerics of the attention family: long sources, fully padded rows, low
precision (bfloat16 autocast, float16 masking), and property-based checks of
the interface for arbitrary sizes (hypothesis)."""

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import (PREV_OUTPUT, SOURCES, attention_args, build_every_model, for_every_model,
                      left_padded_batch)
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._pytree import tree_map

from fairseq_memattn.modules.attention import build_attention
from fairseq_memattn.modules.memory import score_function
from fairseq_memattn.modules.numerics import masked_fill_min

# Every attention variant, as build_attention options.
VARIANTS = {
    "none": {"attention_type": "none"},
    "additive": {"attention_type": "additive"},
    "general": {"attention_type": "general"},
    "dot": {"attention_type": "dot"},
    "scaled_dot": {"attention_type": "scaled_dot"},
    "memory": {},
    "memory-time": {"memory_encoder_normalize": "time"},
    "memory-sigmoid": {"memory_encoder_score": "sigmoid", "memory_decoder_score": "sigmoid"},
    "memory-position": {"memory_position_encoding": True},
    "memory-attention-read": {"memory_read": "attention"},
    "memory-general-read": {"memory_read": "general"},
    "linear": {"attention_type": "linear"},
    "gated_linear": {"attention_type": "gated_linear"},
}
WITH_WEIGHTS = [name for name in VARIANTS if name != "none"]
LOW_PRECISION = [torch.float16, torch.bfloat16]


def build_variant(name, encoder_dim, decoder_dim, memory_k=4, max_len=2000, seed=0):
    torch.manual_seed(seed)
    if VARIANTS[name].get("attention_type") in ("dot", "scaled_dot"):
        decoder_dim = encoder_dim
    args = attention_args(**VARIANTS[name], memory_k=memory_k, max_source_positions=max_len,
                          memory_position_max_len=max_len)
    attention = build_attention(args, encoder_dim, decoder_dim)
    attention.keep_alignment = True
    if name.startswith("memory"):  # by_formula follows the module's settings: they must be the ones asked for
        built = {"memory_encoder_normalize": attention.writer.encoder_normalize,
                 "memory_encoder_score": attention.writer.encoder_score,
                 "memory_decoder_score": getattr(attention.read, "decoder_score", None),
                 "memory_position_encoding": attention.writer.position_encoding_max_len is not None}
        asked = {option: value for option, value in VARIANTS[name].items() if option in built}
        assert {option: built[option] for option in asked} == asked, name
    return attention.eval(), decoder_dim


def left_padding(lengths, width):
    """fairseq's layout: True = padding, on the left."""
    return torch.arange(width)[None, :] < (width - torch.as_tensor(lengths))[:, None]


def attend(attention, states, mask, query):
    return attention.lookup(attention.build_memory(states, mask), query)


# --- an independent transcription of every variant ---------------------------------

def bahdanau(P, prefix, h, x):
    """Bahdanau's scores v^T tanh(W_q h_i + b_q + W_s x_j) (T x n) with the parameters P[prefix + ...]."""
    hidden = torch.tanh((h @ P[prefix + "query_proj.weight"].T + P[prefix + "query_proj.bias"])[:, None]
                        + (x @ P[prefix + "source_proj.weight"].T)[None])
    return hidden @ P[prefix + "v.weight"][0]


def by_formula(name, attention, states, mask, query):
    """Every variant written out per sentence in float64, from the papers'
    equations (padding removed first, so positions are counted within the
    sentence); differentiable, so gradients can be checked too. Returns the
    context (B x T x E) and the weights over source positions (B x T x S)."""
    P = {key: value.double() for key, value in attention.named_parameters()}
    B, S, _ = states.shape
    contexts, weights = [], []
    for b in range(B):
        keep = ~mask[b]
        x, h = states[b][keep].double(), query[b].double()  # n x E, T x H
        n = x.size(0)
        if name == "additive":
            scores = bahdanau(P, "", h, x)
        elif name == "general":  # Luong: h_i^T W s_j
            scores = h @ (x @ P["source_proj.weight"].T).T
        elif name in ("dot", "scaled_dot"):
            scores = h @ x.T / (x.size(1) ** 0.5 if name == "scaled_dot" else 1.0)
        if name in ("additive", "general", "dot", "scaled_dot"):
            a = torch.softmax(scores, dim=1)  # Eq. 2
            context = a @ x  # Eq. 1
        elif name.startswith("memory"):
            raw = x @ P["writer.W_alpha.weight"].T  # n x K, Eq. 5
            K = raw.size(1)
            if name == "memory-position":  # Eq. 9-10, S = max_len, renormalised over the sentence
                s_ = torch.arange(1, n + 1, dtype=torch.float64)[:, None] / attention.writer.position_encoding_max_len
                k_ = torch.arange(1, K + 1, dtype=torch.float64)[None] / K
                L = (1 - k_) * (1 - s_) + k_ * s_
                raw = raw * L / L.sum(0)
            if attention.writer.encoder_score == "sigmoid":
                alpha = torch.sigmoid(raw)
            else:
                alpha = torch.softmax(raw, dim=1 if attention.writer.encoder_normalize == "contexts" else 0)
            C = alpha.T @ x  # Eq. 4
            if name == "memory-attention-read":  # Eq. 2 over the K rows of C
                beta = torch.softmax(bahdanau(P, "read.", h, C), 1)
            elif name == "memory-general-read":  # Eq. 2 over the K rows, Luong's general score h^T W C_k
                beta = torch.softmax(h @ (C @ P["read.source_proj.weight"].T).T, 1)
            else:
                raw_beta = h @ P["read.W_beta.weight"].T  # Eq. 7
                beta = torch.sigmoid(raw_beta) if attention.read.decoder_score == "sigmoid" else torch.softmax(raw_beta, 1)
            context = beta @ C  # Eq. 6
            a = beta @ alpha.T  # Sec. 5
        else:  # cheap linear attention: c = (1/n) sum_t u_t u_t^T q, weights u_t^T q / n
            u = x if name == "linear" else torch.sigmoid(x @ P["gate.weight"].T + P["gate.bias"]) * x
            q = h @ P["query_proj.weight"].T
            context = sum(torch.outer(q @ u[t], u[t]) for t in range(n)) / n
            a = q @ u.T / n
        full = torch.zeros(h.size(0), S, dtype=torch.float64)
        full[:, keep] = a
        contexts.append(context)
        weights.append(full)
    return torch.stack(contexts), torch.stack(weights)


def attend_and_differentiate(attention, states, mask, query, name=None):
    """Context, weights and the gradients of a fixed random function of them
    (states, query, then every parameter), by the module or, given ``name``,
    by the formula. The function weighs each entry differently, so a wrong
    gradient anywhere shows."""
    states = states.detach().requires_grad_()
    query = query.detach().requires_grad_()
    attention.zero_grad()
    if name is None:
        context, weights = attend(attention, states, mask, query)
    else:
        context, weights = by_formula(name, attention, states, mask, query)
    def fixed_random(t, seed):  # the same numbers for the first rows whatever the batch size
        pool = torch.randn(4, *t.shape[1:], generator=torch.Generator().manual_seed(seed),
                           dtype=torch.float64)
        return pool[: t.size(0)].to(t.device)

    loss = (context.double() * fixed_random(context, 5)).sum() + (weights.double() * fixed_random(weights, 6)).sum()
    inputs = [states, query, *attention.parameters()]
    grads = torch.autograd.grad(loss, inputs, allow_unused=True)
    grads = [torch.zeros_like(x) if g is None else g for x, g in zip(inputs, grads)]
    return context, weights, grads


def assert_close_to(actual, expected, tolerance, what, scale=None):
    """|actual - expected| <= tolerance x scale entry by entry, scale = max|expected| by default."""
    actual, expected = actual.double(), expected.double()
    assert torch.isfinite(actual).all(), f"{what}: not finite"
    error = (actual - expected).abs().max().item()
    scale = expected.abs().max().item() if scale is None else scale
    assert error <= tolerance * scale, f"{what}: max error {error:.3g} > {tolerance} x {scale:.3g}"


def assert_attention_close(result, expected, tolerance):
    """Context and weights each relative to their largest entry; gradients
    relative to the largest gradient entry of any input or parameter (single
    gradients can be near-cancelling sums, e.g. through a softmax over nearly
    equal contexts, and carry the rounding of the larger terms)."""
    (context, weights, grads), (expected_context, expected_weights, expected_grads) = result, expected
    assert_close_to(context, expected_context, tolerance, "context")
    assert_close_to(weights, expected_weights, tolerance, "weights")
    scale = max((grad.abs().max().item() for grad in expected_grads), default=0.0)
    for index, (grad, expected_grad) in enumerate(zip(grads, expected_grads)):
        assert_close_to(grad, expected_grad, tolerance, f"gradient {index}", scale)


# --- long sources ----------------------------------------------------------------

LONG = 2000
MEMORY_SCORES = ["memory", "memory-sigmoid-softmax", "memory-softmax-sigmoid", "memory-sigmoid"]
VARIANTS["memory-sigmoid-softmax"] = {"memory_encoder_score": "sigmoid"}
VARIANTS["memory-softmax-sigmoid"] = {"memory_decoder_score": "sigmoid"}
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                 reason="no CUDA device"))]
# Largest errors measured on CPU (|S| = 2000, every variant, relative as in assert_attention_close):
# float16 5.6e-3, bfloat16 3.1e-2 (the rounding of weights and states; the sums are float32).
HALF_TOLERANCE = {torch.float16: 1e-2, torch.bfloat16: 6e-2}


def long_problem(name, saturated, seed, E=64, H=12, K=32, dropout=0.2):
    """A variant and a training batch at |S| = 2000 (rows of 2000 and 1000
    tokens), the states after dropout p: with ``saturated`` every state is
    +1 / (1 - p) or 0 and every memory score is large, so Eq. 4-6 reach their
    bound K |S| / (1 - p) = 80,000 for sigmoid on both sides."""
    attention, H = build_variant(name, E, H, memory_k=K, max_len=LONG, seed=seed)
    attention.train()
    gen = torch.Generator().manual_seed(seed)
    if saturated:
        states = torch.ones(2, LONG, E)
        with torch.no_grad():
            attention.writer.W_alpha.weight.fill_(1.0)
            attention.read.W_beta.weight.fill_(1.0)
        query = torch.ones(2, 3, H)
    else:
        states = torch.rand(2, LONG, E, generator=gen) * 2 - 1
        query = torch.randn(2, 3, H, generator=gen)
    torch.manual_seed(seed)
    states = F.dropout(states, dropout, training=True)  # what the encoder hands over in training
    return attention, states, left_padding([LONG, LONG // 2], LONG), query


@pytest.mark.parametrize("name", WITH_WEIGHTS)
def test_float32_over_2000_positions_matches_the_formulas(name):
    attention, states, mask, query = long_problem(name, saturated=False, seed=1, E=16, K=32)
    assert_attention_close(attend_and_differentiate(attention, states, mask, query),
                           attend_and_differentiate(attention, states, mask, query, name=name), 1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("way", ["half model", "autocast"])
@pytest.mark.parametrize("dtype", LOW_PRECISION)
@pytest.mark.parametrize("name, saturated", [(name, True) for name in MEMORY_SCORES] + [
    (name, False) for name in WITH_WEIGHTS if name not in MEMORY_SCORES])
def test_half_precision_over_2000_positions_matches_float64(name, saturated, dtype, way, device):
    """fairseq's --fp16 / --bf16 (a half-precision model) and --amp (autocast)
    at |S| = 2000 with dropout: forward and backward finite and within the
    precision's rounding of the float64 formula. Sigmoid on both sides reaches
    contexts beyond float16's 65,504, where float16 sums gave inf."""
    attention, states, mask, query = long_problem(name, saturated, seed=3)
    attention, states, mask, query = (t.to(device) for t in (attention, states, mask, query))
    if way == "half model":
        attention, states, query = attention.to(dtype), states.to(dtype), query.to(dtype)
        result = attend_and_differentiate(attention, states, mask, query)
    else:
        with torch.autocast(device, dtype=dtype):
            result = attend_and_differentiate(attention, states, mask, query)
    result = tree_map(lambda t: t.cpu(), result)
    expected = attend_and_differentiate(attention.cpu(), states.cpu(), mask.cpu(), query.cpu(), name=name)
    if name == "memory-sigmoid":  # K |S| / (1 - p) = 80,000 up to dropout's sampling
        assert expected[0].max() > torch.finfo(torch.float16).max
    assert_attention_close(result, expected, HALF_TOLERANCE[dtype])


# --- fully padded rows -----------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, *LOW_PRECISION])
def test_softmax_over_fully_padded_rows_is_zero_not_nan(dtype):
    scores = torch.randn(2, 3, 5, dtype=dtype, requires_grad=True)
    mask = torch.zeros(2, 3, 5, dtype=torch.bool)
    mask[1] = True  # every position of the second sentence is padding
    probs = score_function("softmax", scores, dim=-1, mask=mask)
    assert not probs.isnan().any()
    assert probs[1].eq(0).all()
    torch.testing.assert_close(probs[0].float().sum(-1), torch.ones(3), rtol=1e-2, atol=1e-2)
    probs.float().pow(2).sum().backward()
    reference = scores.detach().double()[0].requires_grad_()
    torch.softmax(reference, dim=-1).pow(2).sum().backward()
    tolerance = 1e-6 if dtype == torch.float32 else 2e-2
    assert scores.grad[1].eq(0).all()  # padding gets no gradient
    torch.testing.assert_close(scores.grad[0].double(), reference.grad, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("dtype", [torch.float32, *LOW_PRECISION])
@pytest.mark.parametrize("name", WITH_WEIGHTS)
def test_fully_padded_sentence_does_not_change_the_others(name, dtype):
    """A sentence that is all padding (fairseq always appends EOS, so only a
    direct caller can make one) must not poison the batch with NaN: the other
    sentence's outputs and all parameter gradients are those of the other
    sentence alone, and the padded one gets zero (memory, linear) or uniform
    (content attention) weights."""
    attention, H = build_variant(name, 8, 6)
    attention = attention.to(dtype)
    gen = torch.Generator().manual_seed(4)
    states = torch.randn(2, 5, 8, generator=gen).to(dtype)
    query = torch.randn(2, 3, H, generator=gen).to(dtype)
    mask = left_padding([5, 0], 5)
    context, weights, grads = attend_and_differentiate(attention, states, mask, query)
    alone = attend_and_differentiate(attention, states[:1], mask[:1], query[:1])
    tolerance = 1e-6 if dtype == torch.float32 else HALF_TOLERANCE[dtype]
    assert_attention_close((context[:1], weights[:1], [grads[0][:1], grads[1][:1], *grads[2:]]),
                           alone, tolerance)
    uniform = name in ("additive", "general", "dot", "scaled_dot")
    assert weights[1].eq(1 / 5 if uniform else 0).all()
    if not uniform:
        assert context[1].eq(0).all() and grads[0][1].eq(0).all() and grads[1][1].eq(0).all()


# --- low precision ---------------------------------------------------------------

def test_masking_constant_is_finite_in_every_precision():
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        filled = masked_fill_min(torch.zeros(3, dtype=dtype), torch.tensor([True, False, True]))
        assert torch.isfinite(filled).all()
        assert filled[0] == torch.finfo(dtype).min and filled[1] == 0


@pytest.mark.parametrize("dtype", LOW_PRECISION)
@pytest.mark.parametrize("name", WITH_WEIGHTS)
def test_masking_in_low_precision_matches_float32(name, dtype):
    """The --fp16 path (a half-precision model) on CPU: padding gets exactly
    zero weight and the result is float32's up to the precision's rounding."""
    attention, H = build_variant(name, 8, 6, max_len=16)
    gen = torch.Generator().manual_seed(2)
    states = torch.rand(3, 6, 8, generator=gen) * 2 - 1
    query = torch.rand(3, 4, H, generator=gen) * 2 - 1
    mask = left_padding([6, 3, 1], 6)
    expected_context, expected_weights = attend(attention, states, mask, query)
    low = attention.to(dtype)
    context, weights = attend(low, states.to(dtype), mask, query.to(dtype))
    assert context.dtype == torch.float32  # the decoder rounds it to its own precision
    assert weights.masked_select(mask.unsqueeze(1).expand_as(weights)).eq(0).all()
    tolerance = 2e-2 if dtype == torch.bfloat16 else 4e-3
    torch.testing.assert_close(context.float(), expected_context, rtol=tolerance, atol=tolerance)
    torch.testing.assert_close(weights.float(), expected_weights, rtol=tolerance, atol=tolerance)


def logits_and_gradients(model, tokens, lengths, prev_output=PREV_OUTPUT):
    model.zero_grad()
    logits, _ = model(tokens, lengths, prev_output)
    F.cross_entropy(logits.float().flatten(0, 1), prev_output.flatten()).backward()
    return logits, [p.grad.detach().clone() for p in model.parameters()]  # .to(dtype) would round them in place


@pytest.mark.parametrize("way", ["half model", "autocast"])
@pytest.mark.parametrize("dtype", LOW_PRECISION)
@for_every_model
def test_half_precision_model_forward_and_backward(dictionary, attention_type, input_feeding,
                                                   dtype, way):
    """fairseq's --fp16 / --bf16 (model.half(), model.to(bfloat16)) and --amp
    (autocast) on CPU: logits and every gradient close to float32's."""
    model = build_every_model(dictionary, attention_type, input_feeding)
    model.train()  # dropout is 0: train mode only switches on what training uses
    tokens, lengths = left_padded_batch(dictionary, SOURCES)
    expected_logits, expected_grads = logits_and_gradients(model, tokens, lengths)
    if way == "half model":
        logits, grads = logits_and_gradients(model.to(dtype), tokens, lengths)
    else:
        with torch.autocast("cpu", dtype=dtype):
            logits, grads = logits_and_gradients(model, tokens, lengths)
    assert logits.dtype == dtype
    # Measured over every model and both ways: logits within 0.0019 (bfloat16) and
    # 0.00024 (float16) of float32's; gradients within 0.0057 and 0.00057 of the largest one.
    tolerance = {torch.bfloat16: 0.02, torch.float16: 0.004}[dtype]
    torch.testing.assert_close(logits.float(), expected_logits, rtol=tolerance, atol=tolerance)
    scale = max(g.abs().max().item() for g in expected_grads)
    for grad, expected in zip(grads, expected_grads):
        assert_close_to(grad, expected, tolerance, "gradient", scale)


# --- properties for arbitrary sizes (hypothesis) ----------------------------------

PROPERTIES = settings(max_examples=40, deadline=None, derandomize=True, database=None)


@st.composite
def attention_problems(draw):
    """A variant and a random left- or right-padded batch for it."""
    name = draw(st.sampled_from(sorted(VARIANTS)))
    B, S, T = draw(st.integers(1, 4)), draw(st.integers(1, 7)), draw(st.integers(1, 4))
    K, E, H = draw(st.integers(1, 5)), draw(st.integers(1, 6)), draw(st.integers(1, 6))
    lengths = draw(st.lists(st.integers(1, S), min_size=B, max_size=B))
    mask = left_padding(lengths, S)
    if draw(st.booleans()):
        mask = mask.flip(1)  # right padding
    seed = draw(st.integers(0, 2**16))
    attention, H = build_variant(name, E, H, memory_k=K, max_len=S, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    states = torch.randn(B, S, E, generator=gen)
    query = torch.randn(B, T, H, generator=gen)
    return name, attention, states, mask, query, K


@PROPERTIES
@given(attention_problems())
def test_any_sizes_match_the_formulas(problem):
    name, attention, states, mask, query, K = problem
    B, E = states.size(0), states.size(2)
    memory = attention.build_memory(states, mask)
    context, weights = attention.lookup(memory, query)
    assert all(tensor.size(0) == B for tensor in memory.values())
    if name == "none":
        assert context is None and weights is None
        return
    expected_context, expected_weights = by_formula(name, attention, states, mask, query)
    torch.testing.assert_close(context.double(), expected_context.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(weights.double(), expected_weights.detach(), rtol=1e-5, atol=1e-5)
    if name.startswith("memory"):
        contexts = memory["values"] if attention.reads_content else memory["contexts"]
        assert contexts.shape == (B, K, E)  # fixed size: no |S| in it
    if name.endswith("linear"):
        assert memory["covariance"].shape == (B, E, E)


@PROPERTIES
@given(attention_problems(), st.floats(-1e3, 1e3))
def test_padding_values_never_matter(problem, garbage):
    name, attention, states, mask, query, _ = problem
    context, weights = attend(attention, states, mask, query)
    scrambled = states.masked_fill(mask.unsqueeze(-1), garbage)
    scrambled_context, scrambled_weights = attend(attention, scrambled, mask, query)
    if name == "none":
        return
    torch.testing.assert_close(scrambled_context, context, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(scrambled_weights, weights, rtol=1e-5, atol=1e-5)
    assert weights.masked_select(mask.unsqueeze(1).expand_as(weights)).eq(0).all()


@PROPERTIES
@given(attention_problems(), st.randoms(use_true_random=False))
def test_permuting_the_batch_permutes_the_results(problem, random):
    name, attention, states, mask, query, _ = problem
    order = list(range(states.size(0)))
    random.shuffle(order)
    order = torch.tensor(order)
    context, weights = attend(attention, states, mask, query)
    permuted_context, permuted_weights = attend(attention, states[order], mask[order], query[order])
    if name == "none":
        return
    torch.testing.assert_close(permuted_context, context[order], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(permuted_weights, weights[order], rtol=1e-5, atol=1e-6)


# --- additive attention's memory bound -------------------------------------------

def additive_problem(budget, B=3, T=11, S=7, A=5, seed=0):
    attention, H = build_variant("additive", 8, 6, seed=seed)
    attention.score_budget_bytes = budget
    gen = torch.Generator().manual_seed(seed)
    states = torch.randn(B, S, 8, generator=gen)
    query = torch.randn(B, T, H, generator=gen)
    return attention.train(), states, left_padding([S, 4, 1][:B], S), query


def test_additive_attention_in_chunks_equals_the_whole_target_at_once(monkeypatch):
    """A budget of 3 query steps (B x 3 x S x A float32 numbers) scores the 11
    steps in 4 chunks, recomputed in the backward pass; outputs and gradients
    are those of one B x T x S x A tensor."""
    B, S, A = 3, 7, 6  # A = the decoder size, additive's default attention size
    attention, states, mask, query = additive_problem(budget=3 * B * S * A * 4)
    chunk_sizes = []
    score_pairs = type(attention).score_pairs

    def counting(self, projected_query, keys):
        chunk_sizes.append(projected_query.size(1))
        return score_pairs(self, projected_query, keys)

    monkeypatch.setattr(type(attention), "score_pairs", counting)
    chunked = attend_and_differentiate(attention, states, mask, query)
    # the forward pass, then each chunk again in the backward pass (last chunk first)
    assert chunk_sizes == [3, 3, 3, 2, 2, 3, 3, 3]
    attention.score_budget_bytes = None
    whole = attend_and_differentiate(attention, states, mask, query)
    assert_attention_close(chunked, whole, 1e-6)
    with torch.no_grad():  # decoding: chunks, nothing recomputed
        attention.score_budget_bytes, chunk_sizes[:] = 3 * B * S * A * 4, []
        context, weights = attend(attention, states, mask, query)
    assert chunk_sizes == [3, 3, 3, 2]
    assert_attention_close((context, weights, []), (whole[0], whole[1], []), 1e-6)


def test_additive_score_by_loops():
    """Bahdanau's f_att(h_i, s_j) = v^T tanh(W_q h_i + b_q + W_s s_j), written
    out number by number for a few (sentence, step, position), through the
    chunked path."""
    attention, states, mask, query = additive_problem(budget=1)  # one query step per chunk
    scores = attention.score(query, attention.build_memory(states, mask)["keys"])
    Wq, bq = attention.query_proj.weight.tolist(), attention.query_proj.bias.tolist()
    Ws, v = attention.source_proj.weight.tolist(), attention.v.weight[0].tolist()
    for b, i, j in [(0, 0, 0), (1, 5, 6), (2, 10, 3)]:
        h, s = query[b, i].tolist(), states[b, j].tolist()
        f_att = 0.0
        for a in range(len(v)):
            pre = bq[a] + sum(Wq[a][d] * h[d] for d in range(len(h))) + sum(
                Ws[a][e] * s[e] for e in range(len(s)))
            f_att += v[a] * math.tanh(pre)
        assert abs(scores[b, i, j].item() - f_att) < 1e-5
