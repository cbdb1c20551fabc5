"""The attention modules against the paper's equations, and bad input."""

import argparse

import pytest
import torch
from conftest import attention_args, build_model, left_padded_batch, make_args

from fairseq_memattn.modules.attention import MemoryAttention, build_attention
from fairseq_memattn.modules.memory import MemoryConfig, position_encodings


def random_states(lengths, dim=6, seed=0):
    """Right-padded random states and their padding mask."""
    gen = torch.Generator().manual_seed(seed)
    width = max(lengths)
    states = torch.randn(len(lengths), width, dim, generator=gen)
    mask = torch.arange(width)[None, :] >= torch.tensor(lengths)[:, None]
    return states, mask


def eq4_to_7_by_loops(attn, states, mask, query):
    """Eq. 4-7 written out with Python loops, straight from the paper."""
    W_alpha, W_beta = attn.writer.W_alpha.weight, attn.read.W_beta.weight  # K x E, K x H
    K = W_alpha.size(0)
    score = {"softmax": lambda v: torch.softmax(v, 0), "sigmoid": torch.sigmoid}
    contexts, outputs = [], []
    for b in range(states.size(0)):
        steps = [t for t in range(states.size(1)) if not mask[b, t]]
        raw = {t: W_alpha @ states[b, t] for t in steps}
        if attn.writer.encoder_normalize == "contexts" or attn.writer.encoder_score == "sigmoid":
            alpha = {t: score[attn.writer.encoder_score](raw[t]) for t in steps}  # Eq. 5, over K
        else:  # softmax of each context over time
            over_time = torch.softmax(torch.stack([raw[t] for t in steps]), 0)
            alpha = {t: over_time[i] for i, t in enumerate(steps)}
        C = torch.stack([sum(alpha[t][k] * states[b, t] for t in steps) for k in range(K)])  # Eq. 4
        contexts.append(C)
        row = []
        for h in query[b]:
            beta = score[attn.read.decoder_score](W_beta @ h)  # Eq. 7
            row.append(sum(beta[k] * C[k] for k in range(K)))  # Eq. 6
        outputs.append(torch.stack(row))
    return torch.stack(contexts), torch.stack(outputs)


@pytest.mark.parametrize("normalize", ["contexts", "time"])
@pytest.mark.parametrize("encoder_score", ["softmax", "sigmoid"])
@pytest.mark.parametrize("decoder_score", ["softmax", "sigmoid"])
def test_memory_attention_matches_equations(encoder_score, decoder_score, normalize):
    torch.manual_seed(1)
    attn = MemoryAttention(6, 5, MemoryConfig(k=4, encoder_score=encoder_score, decoder_score=decoder_score,
                                              encoder_normalize=normalize))
    states, mask = random_states([5, 3, 1])
    query = torch.randn(3, 2, 5)
    memory = attn.build_memory(states, mask)
    context, _ = attn.lookup(memory, query)
    expected_C, expected_context = eq4_to_7_by_loops(attn, states, mask, query)
    torch.testing.assert_close(memory["contexts"], expected_C, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(context, expected_context, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("encoder_score", ["softmax", "sigmoid"])
def test_memory_attention_read_matches_equations(encoder_score):
    """--memory-read attention: Eq. 4-5 write C; beta is additive attention over its K rows (Eq. 1-2
    with C_k in place of s_j), c = sum_k beta_k C_k, and the alignment beta alpha^T."""
    torch.manual_seed(5)
    attn = MemoryAttention(6, 5, MemoryConfig(k=4, encoder_score=encoder_score), read="attention", attention_dim=3)
    attn.keep_alignment = True
    states, mask = random_states([5, 3, 1])
    query = torch.randn(3, 2, 5)
    memory = attn.build_memory(states, mask)
    context, weights = attn.lookup(memory, query)
    W_s, W_q, b_q = attn.read.source_proj.weight, attn.read.query_proj.weight, attn.read.query_proj.bias
    v = attn.read.v.weight[0]
    for b in range(3):
        C = memory["values"][b]
        for t, h in enumerate(query[b]):
            scores = torch.stack([v @ torch.tanh(W_q @ h + b_q + W_s @ C[k]) for k in range(4)])  # Eq. 1's f_att
            beta = torch.exp(scores) / torch.exp(scores).sum()  # Eq. 2
            torch.testing.assert_close(context[b, t], sum(beta[k] * C[k] for k in range(4)), atol=1e-5, rtol=1e-5)
            alpha = memory["alpha"][b]  # S x K
            expected = [sum(beta[k] * alpha[s, k] for k in range(4)) for s in range(states.size(1))]
            torch.testing.assert_close(weights[b, t], torch.stack(expected), atol=1e-5, rtol=1e-5)


def test_memory_general_read_matches_equations():
    """--memory-read general: beta is Luong's general attention over the K rows of C, softmax_k(h^T W C_k)
    (Eq. 1-2 with C_k in place of s_j), and c = sum_k beta_k C_k."""
    torch.manual_seed(6)
    attn = MemoryAttention(6, 5, MemoryConfig(k=4, encoder_score="sigmoid"), read="general")
    states, mask = random_states([5, 3, 1])
    query = torch.randn(3, 2, 5)
    memory = attn.build_memory(states, mask)
    context, _ = attn.lookup(memory, query)
    W = attn.read.source_proj.weight  # H x E
    for b in range(3):
        C = memory["values"][b]
        for t, h in enumerate(query[b]):
            scores = torch.stack([sum(h[i] * (W @ C[k])[i] for i in range(5)) for k in range(4)])
            beta = torch.exp(scores) / torch.exp(scores).sum()
            torch.testing.assert_close(context[b, t], sum(beta[k] * C[k] for k in range(4)), atol=1e-5, rtol=1e-5)


def test_memory_alignment_is_beta_times_alpha_transposed():
    torch.manual_seed(2)
    attn = MemoryAttention(6, 5, MemoryConfig(k=3))
    attn.keep_alignment = True
    states, mask = random_states([4, 2])
    query = torch.randn(2, 3, 5)
    memory = attn.build_memory(states, mask)
    _, weights = attn.lookup(memory, query)
    for b in range(2):
        beta = torch.softmax(query[b] @ attn.read.W_beta.weight.T, -1)  # T x K
        alpha = torch.softmax(states[b] @ attn.writer.W_alpha.weight.T, -1)  # S x K
        alpha = alpha.masked_fill(mask[b, :, None], 0)
        torch.testing.assert_close(weights[b], beta @ alpha.T)


def test_position_encodings_by_hand():
    # K = 2, S = 4, one sentence of 3 tokens after one left pad.
    # k=1: L = 0.5(1-s/4) + 0.5(s/4) = 0.5 everywhere -> 1/3 each after renormalising.
    # k=2: L = s/4 = 0.25, 0.5, 0.75 (sum 1.5) -> 1/6, 1/3, 1/2.
    mask = torch.tensor([[True, False, False, False]])
    expected = torch.tensor([[[0, 0], [1 / 3, 1 / 6], [1 / 3, 1 / 3], [1 / 3, 1 / 2]]])
    torch.testing.assert_close(position_encodings(mask, num_contexts=2, max_len=4), expected)
    # --memory-position-normalize mean: each context's encodings average 1 over the 3 tokens.
    torch.testing.assert_close(position_encodings(mask, num_contexts=2, max_len=4, normalize="mean"),
                               3 * expected)


def test_an_option_a_checkpoint_predates_has_the_behaviour_of_its_time():
    # attention_args has no memory_position_normalize, as the options of a checkpoint saved before it
    assert MemoryConfig.from_options(attention_args()).position_normalize == "sum"
    assert MemoryConfig.from_options(attention_args(memory_position_normalize="mean")).position_normalize == "mean"


def test_position_encodings_multiply_write_weights():
    """Eq. 9: alpha_s = score(W_alpha h_s o l_s)."""
    torch.manual_seed(3)
    attn = MemoryAttention(6, 5, MemoryConfig(k=2, position_encoding=True, position_max_len=4))
    states, mask = random_states([3])
    alpha = attn.writer.write_weights(states, mask)
    pe = position_encodings(mask, 2, 4)
    torch.testing.assert_close(alpha, torch.softmax(attn.writer.W_alpha(states) * pe, -1))


def test_padding_never_contributes_to_memory():
    torch.manual_seed(4)
    attn = MemoryAttention(6, 5, MemoryConfig(k=3, encoder_score="sigmoid"))
    states, mask = random_states([2, 4])
    garbage = states.clone()
    garbage[0, 2:] = 1e3  # padding positions of the first sentence
    torch.testing.assert_close(attn.build_memory(states, mask)["contexts"],
                               attn.build_memory(garbage, mask)["contexts"])


# --- bad input: a clear error naming the value and what is allowed -------------

@pytest.mark.parametrize("overrides, message", [
    ({"memory_k": 0}, r"invalid --memory-k: 0 \(must be an integer >= 1\)"),
    ({"memory_k": -3}, r"invalid --memory-k: -3"),
    ({"attention_type": "luong"}, r"invalid --attention-type: 'luong' \(choose from none, additive"),
    ({"memory_encoder_score": "relu"}, r"invalid --memory-encoder-score: 'relu' \(choose from softmax, sigmoid\)"),
    ({"memory_decoder_score": "tanh"}, r"invalid --memory-decoder-score: 'tanh'"),
    ({"memory_encoder_normalize": "rows"}, r"invalid --memory-encoder-normalize: 'rows' \(choose from contexts, time\)"),
    ({"memory_position_normalize": "max"}, r"invalid --memory-position-normalize: 'max' \(choose from sum, mean\)"),
    ({"memory_read": "content"}, r"invalid --memory-read: 'content' \(choose from mix, attention, general\)"),
    # no silent fallback to --max-source-positions for S of Eq. 10
    ({"memory_position_encoding": True},
     r"--memory-position-encoding needs S of Eq. 10: pass --memory-position-max-len S"),
])
def test_bad_attention_options(overrides, message):
    with pytest.raises(ValueError, match=message):
        build_attention(attention_args(**overrides), encoder_dim=8, decoder_dim=8)


def test_dot_attention_needs_matching_sizes():
    with pytest.raises(ValueError, match=r"encoder output size 16 .* != --decoder-hidden-size 12"):
        build_attention(attention_args(attention_type="dot"), encoder_dim=16, decoder_dim=12)


@pytest.mark.parametrize("name, value", [("encoder_hidden_size", 0), ("decoder_layers", 0), ("decoder_layers", True),
                                         ("encoder_embed_dim", 2.0), ("memory_position_max_len", 0),
                                         ("dropout", 1.5)])
def test_bad_model_sizes(dictionary, name, value):
    with pytest.raises(ValueError, match=f"invalid --{name.replace('_', '-')}: {value}"):
        build_model(dictionary, **{name: value})


def test_source_longer_than_position_encoding_maximum(dictionary):
    model = build_model(dictionary, attention_type="memory", memory_position_encoding=True,
                        memory_position_max_len=4)
    tokens, lengths = left_padded_batch(dictionary, [[3, 4, 5, 6, 7]])  # 6 with EOS
    with pytest.raises(ValueError, match=r"^a source has 6 tokens \(EOS included\), more than the S = 4 that the "
                                         r"model's position encodings cover \(Eq. 10: --memory-position-max-len 4"):
        model.encoder(tokens, lengths)


def test_position_encodings_without_training_data_name_the_option(dictionary):
    """A task whose training data cannot be read (here: not a fairseq task at
    all) gets no silent default S: the error says what to pass."""
    with pytest.raises(ValueError, match=r"--memory-position-encoding needs S of Eq. 10, .* pass "
                                         r"--memory-position-max-len S with the number of tokens of "
                                         r"your longest training source, EOS included"):
        build_model(dictionary, attention_type="memory", memory_position_encoding=True)


@pytest.mark.parametrize("overrides, source_limit", [
    ({"memory_position_encoding": True, "memory_position_max_len": 12}, 12),
    ({"memory_position_encoding": True, "memory_position_max_len": 30}, 20),
    ({"memory_position_encoding": False, "memory_position_max_len": 12}, 20),
])
def test_sources_beyond_position_encodings_are_filtered_by_fairseq(dictionary, overrides,
                                                                   source_limit):
    """fairseq skips or refuses sources longer than the model's max_positions(),
    so a source beyond S never reaches the position encodings."""
    model = build_model(dictionary, attention_type="memory", max_source_positions=20,
                        max_target_positions=20, **overrides)
    assert model.max_positions() == (source_limit, 20)


def test_no_attention_refuses_alignment(dictionary):
    model = build_model(dictionary, attention_type="none")
    with pytest.raises(ValueError, match="--print-alignment needs an attention"):
        model.decoder.make_generation_fast_(need_attn=True)


def test_architecture_defaults():
    from fairseq_memattn.models.lstm_memattn import base_architecture, wmt_architecture
    args = argparse.Namespace()
    base_architecture(args)
    assert (args.encoder_hidden_size, args.encoder_layers, args.memory_k, args.dropout) == (256, 2, 32, 0.2)
    assert args.attention_type == "memory" and not args.memory_position_encoding
    assert (args.memory_encoder_score, args.memory_decoder_score) == ("softmax", "softmax")  # Eq. 5, 7
    args = argparse.Namespace()
    wmt_architecture(args)
    assert (args.encoder_hidden_size, args.decoder_embed_dim, args.memory_k) == (512, 512, 64)
    assert args.memory_position_encoding
    assert (args.memory_encoder_score, args.memory_decoder_score) == ("sigmoid", "softmax")  # Fig. 4
    args = make_args(memory_position_encoding=False, memory_encoder_score="softmax")
    wmt_architecture(args)
    assert not args.memory_position_encoding and args.memory_encoder_score == "softmax"
