"""Numerics of the attention family: long sources, fully padded rows, low
precision (bfloat16 autocast, float16 masking), and property-based checks of
the interface for arbitrary sizes (hypothesis)."""

import pytest
import torch
import torch.nn.functional as F
from conftest import (PREV_OUTPUT, SOURCES, attention_args, build_every_model, for_every_model,
                      left_padded_batch)
from hypothesis import given, settings
from hypothesis import strategies as st

from fairseq_memattn.attention import build_attention, masked_fill_min, score_function

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
    "linear": {"attention_type": "linear"},
    "gated_linear": {"attention_type": "gated_linear"},
}
WITH_WEIGHTS = [name for name in VARIANTS if name != "none"]
LOW_PRECISION = [torch.float16, torch.bfloat16]


def build_variant(name, encoder_dim, decoder_dim, memory_k=4, max_len=2000, seed=0):
    torch.manual_seed(seed)
    if VARIANTS[name].get("attention_type") in ("dot", "scaled_dot"):
        decoder_dim = encoder_dim
    args = attention_args(**VARIANTS[name], memory_k=memory_k, max_source_positions=max_len)
    attention = build_attention(args, encoder_dim, decoder_dim)
    attention.keep_alignment = True
    return attention.eval(), decoder_dim


def left_padding(lengths, width):
    """fairseq's layout: True = padding, on the left."""
    return torch.arange(width)[None, :] < (width - torch.as_tensor(lengths))[:, None]


def attend(attention, states, mask, query):
    return attention.lookup(attention.build_memory(states, mask), query)


# --- long sources ----------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, *LOW_PRECISION])
@pytest.mark.parametrize("saturated", [False, True])
def test_sigmoid_memory_attention_over_2000_positions_stays_finite(dtype, saturated):
    """With sigmoid on both sides nothing normalises the sums of Eq. 4 and 6:
    |c| <= K |S| max|s_t|. LSTM states are tanh outputs (|s_t| <= 1); the
    saturated case (all states +1, all scores large) reaches the bound,
    K |S| = 32 x 2000 = 64,000, which float16 (max 65,504) still holds."""
    attention, H = build_variant("memory-sigmoid", 16, 12, memory_k=32)
    S = 2000
    gen = torch.Generator().manual_seed(0)
    if saturated:
        states = torch.ones(2, S, 16)
        with torch.no_grad():
            attention.W_alpha.weight.fill_(1.0)
            attention.W_beta.weight.fill_(1.0)
        query = torch.ones(2, 3, H)
    else:
        states = torch.rand(2, S, 16, generator=gen) * 2 - 1
        query = torch.randn(2, 3, H, generator=gen)
    mask = left_padding([S, S // 2], S)
    attention = attention.to(dtype)
    context, weights = attend(attention, states.to(dtype), mask, query.to(dtype))
    assert torch.isfinite(context).all() and torch.isfinite(weights).all()
    assert context.abs().max() <= 32 * S
    if saturated:  # the bound is reached: full row 32 x 2000, half row 32 x 1000
        torch.testing.assert_close(context[:, 0, 0].float(), torch.tensor([64000.0, 32000.0]),
                                   rtol=0.01, atol=0)


@pytest.mark.parametrize("name", ["memory", "memory-time", "memory-position", "additive", "gated_linear"])
def test_other_attentions_over_2000_positions_stay_finite(name):
    attention, H = build_variant(name, 16, 12, memory_k=32)
    gen = torch.Generator().manual_seed(1)
    states = torch.rand(2, 2000, 16, generator=gen) * 2 - 1
    context, weights = attend(attention, states, left_padding([2000, 7], 2000),
                              torch.randn(2, 3, H, generator=gen))
    assert torch.isfinite(context).all() and torch.isfinite(weights).all()


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
    assert torch.isfinite(scores.grad).all()


@pytest.mark.parametrize("dtype", [torch.float32, *LOW_PRECISION])
@pytest.mark.parametrize("name", WITH_WEIGHTS)
def test_fully_padded_sentence_gives_finite_outputs_and_gradients(name, dtype):
    """A sentence that is all padding (fairseq always appends EOS, so only a
    direct caller can make one) must not poison the batch with NaN."""
    attention, H = build_variant(name, 8, 6)
    attention = attention.to(dtype)
    states = torch.randn(2, 5, 8, dtype=dtype, requires_grad=True)
    query = torch.randn(2, 3, H, dtype=dtype, requires_grad=True)
    mask = left_padding([5, 0], 5)
    context, weights = attend(attention, states, mask, query)
    assert torch.isfinite(context).all() and torch.isfinite(weights).all()
    context.float().sum().backward()
    assert torch.isfinite(states.grad).all() and torch.isfinite(query.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in attention.parameters())


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
    assert context.dtype == dtype
    assert weights.masked_select(mask.unsqueeze(1).expand_as(weights)).eq(0).all()
    tolerance = 2e-2 if dtype == torch.bfloat16 else 4e-3
    torch.testing.assert_close(context.float(), expected_context, rtol=tolerance, atol=tolerance)
    torch.testing.assert_close(weights.float(), expected_weights, rtol=tolerance, atol=tolerance)


@for_every_model
def test_bfloat16_autocast_forward_and_backward(dictionary, attention_type, input_feeding):
    model = build_every_model(dictionary, attention_type, input_feeding)
    tokens, lengths = left_padded_batch(dictionary, SOURCES)
    with torch.no_grad():
        expected, _ = model(tokens, lengths, PREV_OUTPUT)
    model.train()  # dropout is 0: train mode only switches on what training uses
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, _ = model(tokens, lengths, PREV_OUTPUT)
    assert logits.dtype == torch.bfloat16
    loss = F.cross_entropy(logits.float().flatten(0, 1), PREV_OUTPUT.flatten())
    loss.backward()
    assert torch.isfinite(logits).all() and torch.isfinite(loss)
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    # bfloat16 keeps 8 bits of mantissa: measured differences are below 0.002.
    torch.testing.assert_close(logits.float(), expected, rtol=0.02, atol=0.01)


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
def test_shapes_for_any_sizes(problem):
    name, attention, states, mask, query, K = problem
    (B, S, E), T = states.shape, query.size(1)
    memory = attention.build_memory(states, mask)
    context, weights = attention.lookup(memory, query)
    assert all(tensor.size(0) == B for tensor in memory.values())
    if name == "none":
        assert context is None and weights is None
        return
    assert context.shape == (B, T, E) and weights.shape == (B, T, S)
    if name.startswith("memory"):
        assert memory["contexts"].shape == (B, K, E)  # fixed size: no |S| in it
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
