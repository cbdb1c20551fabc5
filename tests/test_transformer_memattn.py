"""transformer_memattn: the Transformer whose decoder reads a K-row memory
(models/transformer_memattn/), against the paper's equations, fairseq's own
multi-head attention, incremental decoding, padding, alignments (by default in
eval mode, SequenceGeneratorWithAlignment), half precision, beam search and the
command lines (--fp16 on CPU; why not --bf16)."""

import argparse
import contextlib
import copy
import math
import re
from types import SimpleNamespace

import pytest
import torch
from conftest import (BEAM_SOURCES, PLUGIN_DIR, SOURCES, beam_search, build_model, check_copies,
                      left_padded_batch, make_dictionary)
from conftest import run_fairseq as run
from fairseq.models.transformer import TransformerEncoderBase
from fairseq.modules import MultiheadAttention
from test_numerics import assert_close_to, logits_and_gradients

from fairseq_memattn.checkpoint_fit import loading
from fairseq_memattn.errors import UserError
from fairseq_memattn.hub import attention_returned
from fairseq_memattn.modules import beam_sharing
from fairseq_memattn.models.transformer_memattn import (
    MemAttnTransformerModel,
    base_architecture,
    iwslt_de_en_architecture,
)
from fairseq_memattn.modules.memory import MemoryConfig
from fairseq_memattn.modules.memory_reads import AttentionRead, MixRead

# Decoder inputs without padding (BOS = EOS first), one row per source of SOURCES.
PREV_OUTPUT = torch.tensor([[2, 4, 5, 6], [2, 8, 9, 7], [2, 5, 4, 4]])
READ_AND_SHARING = pytest.mark.parametrize(
    "memory_read, per_layer", [(read, per_layer) for read in ("attention", "mix") for per_layer in (False, True)])


def tiny_args(**overrides):
    """2 layers of 16 units and 2 heads on each side, K = 3, position encodings (S = 10: not the
    architecture's default, but the write's hardest path to keep padding-invariant)."""
    args = argparse.Namespace(
        encoder_embed_dim=16, encoder_ffn_embed_dim=32, encoder_layers=2, encoder_attention_heads=2,
        decoder_embed_dim=16, decoder_ffn_embed_dim=32, decoder_layers=2, decoder_attention_heads=2,
        dropout=0.0, memory_k=3, memory_position_encoding=True, memory_position_max_len=10)
    vars(args).update(overrides)
    return args


def build_transformer(dictionary, seed=0, memory_read="attention", per_layer=False, **overrides):
    task = SimpleNamespace(source_dictionary=dictionary, target_dictionary=dictionary)
    torch.manual_seed(seed)
    model = MemAttnTransformerModel.build_model(
        tiny_args(memory_read=memory_read, memory_per_layer=per_layer, **overrides), task)
    model.eval()
    return model


def with_alignments(model):
    model.make_generation_fast_(need_attn=True)  # what fairseq-generate --print-alignment does
    return model


def right_padded_batch(dictionary, sentences):
    tokens, lengths = left_padded_batch(dictionary, sentences)
    for row, length in enumerate(lengths.tolist()):
        tokens[row] = torch.cat([tokens[row, tokens.size(1) - length:], tokens[row, : tokens.size(1) - length]])
    return tokens, lengths


# --- incremental decoding, padding ------------------------------------------------

@READ_AND_SHARING
def test_incremental_decoding_equals_full_forward(dictionary, memory_read, per_layer):
    model = with_alignments(build_transformer(dictionary, memory_read=memory_read, per_layer=per_layer))
    tokens, lengths = left_padded_batch(dictionary, SOURCES)
    with torch.no_grad():
        full, extra = model(tokens, lengths, PREV_OUTPUT)
        encoder_out, state = model.encoder(tokens, lengths), {}
        steps = [model.decoder(PREV_OUTPUT[:, : t + 1], encoder_out, incremental_state=state)
                 for t in range(PREV_OUTPUT.size(1))]
    torch.testing.assert_close(torch.cat([out for out, _ in steps], 1), full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.cat([e["attn"][0] for _, e in steps], 1), extra["attn"][0],
                               atol=1e-5, rtol=1e-5)
    assert extra["attn"][0].shape == (3, PREV_OUTPUT.size(1), tokens.size(1))


@pytest.mark.parametrize("window", [False, True])
@pytest.mark.parametrize("padding", ["left", "right"])
@READ_AND_SHARING
def test_padding_invariance(dictionary, memory_read, per_layer, padding, window):
    """A sentence decodes alike alone and in a padded batch, and its alignment
    stays on its own tokens, in the layout of src_tokens (with --memory-position-window
    too: its positions are counted within each sentence)."""
    model = with_alignments(build_transformer(dictionary, memory_read=memory_read, per_layer=per_layer,
                                              memory_position_window=window))
    batch = left_padded_batch if padding == "left" else right_padded_batch
    tokens, lengths = batch(dictionary, SOURCES)
    with torch.no_grad():
        batched, extra = model(tokens, lengths, PREV_OUTPUT)
        for row, sentence in enumerate(SOURCES):
            alone, alone_extra = model(*batch(dictionary, [sentence]), PREV_OUTPUT[row : row + 1])
            torch.testing.assert_close(batched[row : row + 1], alone, atol=1e-5, rtol=1e-5)
            own = tokens[row].ne(dictionary.pad())
            torch.testing.assert_close(extra["attn"][0][row][:, own], alone_extra["attn"][0][0],
                                       atol=1e-5, rtol=1e-5)
            assert not extra["attn"][0][row][:, ~own].any()


# --- alignments: when they are kept, and what they are -----------------------------

def test_alignments_by_default_in_eval_mode_never_in_training(dictionary):
    """As the LSTM model: alpha is kept (and the decoder returns alignments) in
    eval mode without asking, never in training; make_generation_fast_ with
    need_attn None (fairseq-generate without --print-alignment) or False turns
    them off, True on."""
    tokens, lengths = left_padded_batch(dictionary, SOURCES)

    def kept():
        with torch.no_grad():
            alpha = len(model.encoder(tokens, lengths)["alpha"]) > 0
            attn = model(tokens, lengths, PREV_OUTPUT)[1]["attn"][0]
        assert alpha == (attn is not None)
        return alpha

    model = build_transformer(dictionary)  # eval mode, no make_generation_fast_
    assert kept()
    model.train()
    assert not kept()
    for request, expected in ((None, False), (False, False), ("hard", True), (True, True)):
        model = build_transformer(dictionary)  # fairseq applies make_generation_fast_ once per model
        model.make_generation_fast_(need_attn=request)
        assert model.encoder.alignment_request is expected and kept() == expected
    model.encoder.train()  # a request holds in both modes, as for the LSTM
    assert kept()


def alignment_by_loops(model, source, hypothesis, eos):
    """T x |x| for one source alone (its tokens, EOS included): the last layer's
    read weights over the K rows, averaged over heads, times alpha^T (Sec. 5),
    summed with loops, from a teacher-forced pass over the hypothesis (EOS first)."""
    layer = model.decoder.layers[-1].encoder_attn
    captured = {}
    read = layer.read
    layer.read = lambda query, cache: captured.setdefault("weights", read(query, cache))
    try:
        tokens, lengths = source[None], torch.tensor([source.numel()])
        prev = torch.cat([hypothesis.new_tensor([eos]), hypothesis[:-1]])[None]
        with torch.no_grad(), attention_returned([model]):  # alpha also for a model loaded without
            alpha = model.encoder(tokens, lengths)["alpha"][0][0, layer.memory_index]  # |x| x K
            model(tokens, lengths, prev)
    finally:
        del layer.read
    weights = captured["weights"][1][0]  # H x T x K
    H, T, K = weights.shape
    return torch.tensor([[sum(sum(weights[h, t, k] for h in range(H)) / H * alpha[s, k] for k in range(K))
                          for s in range(alpha.size(0))] for t in range(T)])


@pytest.mark.parametrize("memory_read", ["attention", "mix"])
def test_sequence_generator_with_alignment_without_make_generation_fast(dictionary, memory_read):
    """fairseq's SequenceGeneratorWithAlignment on a model only put in eval
    mode: every hypothesis has its attention, read weights times alpha^T over
    its own source tokens (zero on padding), and the hard alignment of it."""
    from fairseq import utils
    from fairseq.sequence_generator import SequenceGeneratorWithAlignment

    model = build_transformer(dictionary, memory_read=memory_read, per_layer=True)
    tokens, lengths = left_padded_batch(dictionary, BEAM_SOURCES)
    sample = {"id": torch.arange(len(BEAM_SOURCES)), "net_input": {"src_tokens": tokens, "src_lengths": lengths}}
    generator = SequenceGeneratorWithAlignment([model], dictionary, beam_size=3, max_len_b=8)
    hypos = generator.generate([model], sample)
    for row, (source, beams) in enumerate(zip(BEAM_SOURCES, hypos)):
        own = tokens[row].ne(dictionary.pad())
        for hypo in beams:
            expected = alignment_by_loops(model, tokens[row][own], hypo["tokens"], dictionary.eos())
            attention = hypo["attention"].T  # T x width of the batch
            torch.testing.assert_close(attention[:, own], expected, atol=1e-5, rtol=1e-5)
            assert not attention[:, ~own].any()
            assert hypo["alignment"] == utils.extract_hard_alignment(
                attention, tokens[row], hypo["tokens"], dictionary.pad(), dictionary.eos())
            assert len(hypo["alignment"]) == hypo["tokens"].ne(dictionary.eos()).sum()


# --- the write (Eq. 4-5, 8-10) and the reads (Eq. 6-7; fairseq's attention) ----------

def write_by_loops(writer, states, lengths):
    """Eq. 4-5 with position encodings (Eq. 9-10 and Sec. 3.2's masking and
    renormalisation over time) and --memory-position-window's soft windows, with Python loops, for right-aligned sentences
    (left padding): returns C (B x K x d) and alpha (B x S x K)."""
    W = writer.W_alpha.weight  # K x d
    K, width = W.size(0), states.size(1)
    contexts, alphas = [], []
    for b, length in enumerate(lengths):
        steps = range(width - length, width)
        raw = {t: W @ states[b, t] for t in steps}
        if writer.position_encoding_max_len is not None:
            S = writer.position_encoding_max_len
            L = {(k, s): (1 - k / K) * (1 - s / S) + (k / K) * (s / S)
                 for k in range(1, K + 1) for s in range(1, length + 1)}
            l = {(k, s): L[k, s] / sum(L[k, r] for r in range(1, length + 1)) for (k, s) in L}
            raw = {t: raw[t] * torch.tensor([l[k, t - (width - length) + 1] for k in range(1, K + 1)])
                   for t in steps}
        if writer.window_log_width is not None:  # token s of |x| at (s - 1/2)/|x|, context k at (k - 1/2)/K
            w = writer.window_log_width.exp()
            raw = {t: raw[t] - torch.stack([((t - (width - length) + 0.5) / length - (k + 0.5) / K) ** 2
                                            / (2 * w[k] ** 2) for k in range(K)]) for t in steps}
        if writer.encoder_score == "sigmoid":
            alpha = {t: torch.sigmoid(raw[t]) for t in steps}
        elif writer.encoder_normalize == "contexts":
            alpha = {t: torch.softmax(raw[t], 0) for t in steps}  # Eq. 5: over the K contexts
        else:  # each context over time
            totals = [sum(torch.exp(raw[t][k]) for t in steps) for k in range(K)]
            alpha = {t: torch.stack([torch.exp(raw[t][k]) / totals[k] for k in range(K)]) for t in steps}
        C = torch.stack([sum(alpha[t][k] * states[b, t] for t in steps) for k in range(K)])  # Eq. 4
        contexts.append(C)
        alphas.append(torch.stack([alpha[t] if t in alpha else torch.zeros(K) for t in range(width)]))
    return torch.stack(contexts), torch.stack(alphas)


@pytest.mark.parametrize("position_encoding, window", [(True, False), (False, False), (False, True),
                                                      (True, True)])
@pytest.mark.parametrize("encoder_score, normalize",
                         [("softmax", "contexts"), ("softmax", "time"), ("sigmoid", "contexts")])
def test_memory_is_eq_4_5_of_the_final_encoder_states(dictionary, encoder_score, normalize,
                                                      position_encoding, window):
    model = with_alignments(build_transformer(
        dictionary, per_layer=True, memory_encoder_score=encoder_score,
        memory_encoder_normalize=normalize, memory_position_encoding=position_encoding,
        memory_position_window=window))
    tokens, lengths = left_padded_batch(dictionary, SOURCES)
    with torch.no_grad():
        for writer in model.encoder.writers:  # random, distinct write weights per layer
            writer.W_alpha.weight.normal_()
            if window:
                writer.window_log_width.normal_()
        encoder_out = model.encoder(tokens, lengths)
        # fairseq's own encoder, before the write: the final states
        states = TransformerEncoderBase.forward(model.encoder, tokens, lengths)["encoder_out"][0].transpose(0, 1)
    assert encoder_out["memory"][0].shape == (3, 2, 3, 16)  # B x layers x K x d, no |S| x d states
    assert set(encoder_out) == {"memory", "alpha", "group"}
    for index, writer in enumerate(model.encoder.writers):
        # write_by_loops follows the writer's settings: they must be the ones this case asked for
        assert (writer.encoder_score, writer.encoder_normalize, writer.position_encoding_max_len is not None,
                writer.window_log_width is not None) == (encoder_score, normalize, position_encoding, window)
        C, alpha = write_by_loops(writer, states, lengths.tolist())
        torch.testing.assert_close(encoder_out["memory"][0][:, index], C, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(encoder_out["alpha"][0][:, index], alpha, atol=1e-5, rtol=1e-5)


def random_memory(rows=2, K=3, dim=16, width=5, seed=0):
    gen = torch.Generator().manual_seed(seed)
    alpha = torch.rand(rows, 2, width, K, generator=gen)
    return {"memory": torch.randn(rows, 2, K, dim, generator=gen), "alpha": alpha}


@pytest.mark.parametrize("group", [1, 3])
@pytest.mark.parametrize("decoder_score", ["softmax", "sigmoid"])
def test_mix_read_is_eq_6_7(decoder_score, group):
    """beta = score(W_beta h), c = sum_k beta_k C_k, output W_o c + b_o; the
    alignment is beta alpha^T; hypotheses sharing a row read that row."""
    torch.manual_seed(0)
    read = MixRead(16, 16, MemoryConfig(k=3, decoder_score=decoder_score), memory_index=1)
    torch.nn.init.normal_(read.out_proj.bias)
    encoder_out = random_memory()
    query = torch.randn(4, 2 * group, 16)  # T x hypotheses x D: `group` per memory row
    out, align = read(query, encoder_out["memory"], encoder_out["memory"], encoder_out["alpha"],
                      need_head_weights=True)
    score = {"softmax": lambda v: torch.softmax(v, 0), "sigmoid": torch.sigmoid}[decoder_score]
    for t in range(4):
        for n in range(2 * group):
            C, alpha = encoder_out["memory"][n // group, 1], encoder_out["alpha"][n // group, 1]
            beta = score(read.W_beta.weight @ query[t, n])  # Eq. 7
            c = sum(beta[k] * C[k] for k in range(3))  # Eq. 6
            torch.testing.assert_close(out[t, n], read.out_proj.weight @ c + read.out_proj.bias,
                                       atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(align[0, n, t], alpha @ beta, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("group", [1, 3])
def test_attention_read_is_fairseq_multihead_attention_over_the_memory(group):
    """--memory-read attention gives what fairseq's own MultiheadAttention gives
    with the K memory rows as keys and values, a copy per hypothesis; the
    alignment is its head-averaged weights times alpha^T."""
    torch.manual_seed(0)
    read = AttentionRead(16, 2, memory_dim=12, dropout=0.0, memory_index=1)
    reference = MultiheadAttention(16, 2, kdim=12, vdim=12, encoder_decoder_attention=True)
    reference.load_state_dict(read.state_dict())
    encoder_out = random_memory(dim=12)
    query = torch.randn(4, 2 * group, 16)
    out, align = read(query, encoder_out["memory"], encoder_out["memory"], encoder_out["alpha"],
                      need_weights=True)
    rows = torch.arange(2).repeat_interleave(group)
    C = encoder_out["memory"][rows, 1].transpose(0, 1)  # K x hypotheses x d
    expected, weights = reference(query, C, C, static_kv=True, need_weights=True)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    alpha = encoder_out["alpha"][rows, 1]  # hypotheses x S x K
    torch.testing.assert_close(align, torch.bmm(weights, alpha.transpose(1, 2)), atol=1e-5, rtol=1e-5)


def test_reads_project_the_memory_once_per_source(dictionary, monkeypatch):
    """Incremental decoding computes each layer's keys/values once, at the
    first step, from one row per source."""
    model = build_transformer(dictionary, memory_read="attention", per_layer=True)
    calls = []
    project = AttentionRead.project_memory
    monkeypatch.setattr(AttentionRead, "project_memory",
                        lambda self, contexts: calls.append(contexts.size(0)) or project(self, contexts))
    tokens, lengths = left_padded_batch(dictionary, SOURCES)
    with torch.no_grad():
        encoder_out, state = model.encoder(tokens, lengths), {}
        for t in range(PREV_OUTPUT.size(1)):
            model.decoder(PREV_OUTPUT[:, : t + 1], encoder_out, incremental_state=state)
    assert calls == [len(SOURCES)] * 2  # two layers, once each


# --- half precision (--fp16, --bf16, --amp) ----------------------------------------

# Largest errors measured over seeds 0-2, both reads, shared and per-layer memories, against the
# float64 model (relative to the largest logit, resp. the largest gradient entry of any parameter):
#                  logits    gradients  incremental vs full  alignments (absolute)
# bfloat16 model   1.27e-2   8.81e-2    1.12e-2              1.95e-3
# float16 model    1.55e-3   2.38e-2    1.61e-3              2.44e-4
# bfloat16 autocast 8.29e-3  6.13e-2    9.57e-3              1.95e-3
# (float32: 3.1e-7, 2.5e-7, 3.3e-7, 9e-8). The bounds leave a margin of about 2x or more.
HALF = {  # way, dtype: tolerances for logits (and incremental decoding), gradients, alignments
    ("half model", torch.bfloat16): (0.04, 0.2, 0.008),
    ("half model", torch.float16): (0.005, 0.06, 0.001),
    ("autocast", torch.bfloat16): (0.04, 0.2, 0.008),
}


@pytest.mark.parametrize("way, dtype", list(HALF), ids=[f"{w}-{str(d)[6:]}" for w, d in HALF])
@READ_AND_SHARING
def test_half_precision_forward_backward_and_incremental_decoding(dictionary, memory_read, per_layer,
                                                                  way, dtype):
    """fairseq's --bf16 / --fp16 (the model converted) and --amp (autocast) on
    CPU: logits and every gradient finite and close to the float64 model's; the
    memory stays float32; step-by-step decoding equals the full pass, alignments too."""
    model = build_transformer(dictionary, memory_read=memory_read, per_layer=per_layer)
    model.train()  # dropout is 0: train mode only switches on what training uses
    tokens, lengths = left_padded_batch(dictionary, SOURCES)
    expected_logits, expected_grads = logits_and_gradients(copy.deepcopy(model).double(), tokens, lengths,
                                                           PREV_OUTPUT)
    precision = torch.autocast("cpu", dtype=dtype) if way == "autocast" else contextlib.nullcontext()
    if way == "half model":
        model = model.to(dtype)
    with precision:
        logits, grads = logits_and_gradients(model, tokens, lengths, PREV_OUTPUT)
    logit_tolerance, grad_tolerance, align_tolerance = HALF[way, dtype]
    assert logits.dtype == dtype
    assert_close_to(logits, expected_logits, logit_tolerance, "logits")
    scale = max(g.abs().max().item() for g in expected_grads)
    for (name, _), grad, expected in zip(model.named_parameters(), grads, expected_grads):
        assert_close_to(grad, expected, grad_tolerance, f"gradient of {name}", scale)

    model.eval()
    with torch.no_grad(), precision:
        assert model.encoder(tokens, lengths)["memory"][0].dtype == torch.float32  # sum_of_products
        full, extra = model(tokens, lengths, PREV_OUTPUT)
        encoder_out, state = model.encoder(tokens, lengths), {}
        steps = [model.decoder(PREV_OUTPUT[:, : t + 1], encoder_out, incremental_state=state)
                 for t in range(PREV_OUTPUT.size(1))]
    assert_close_to(torch.cat([out for out, _ in steps], 1), full, logit_tolerance, "incremental logits")
    assert_close_to(torch.cat([e["attn"][0] for _, e in steps], 1), extra["attn"][0], align_tolerance,
                    "incremental alignments", scale=1.0)


# --- beam search -----------------------------------------------------------------

def beam_search_with_varied_lengths(model, dictionary):
    """Beam search, after making the untrained model end sentences at different
    steps (sharper outputs, a bias towards EOS), so that finished sentences
    leave the batch while others go on."""
    bias = torch.zeros(len(dictionary))
    output_layer, reorder = model.decoder.output_layer, model.encoder.reorder_encoder_out
    model.decoder.output_layer = lambda features: 10 * output_layer(features) + bias
    live = []
    model.encoder.reorder_encoder_out = lambda encoder_out, new_order: (
        live.append(new_order.numel()) or reorder(encoder_out, new_order))
    try:
        for eos_bias in range(-10, 30):
            bias[dictionary.eos()] = eos_bias
            live.clear()
            hypos = beam_search(model, dictionary)
            if len(set(live)) > 2:  # some sentences finished, and later others
                return hypos
    finally:
        model.encoder.reorder_encoder_out = reorder
    pytest.fail("no EOS bias made sentences end at different steps")


@READ_AND_SHARING
def test_shared_memory_decodes_like_a_copy_per_hypothesis(dictionary, memory_read, per_layer,
                                                          monkeypatch):
    model = with_alignments(build_transformer(dictionary, memory_read=memory_read, per_layer=per_layer))
    shared = beam_search_with_varied_lengths(model, dictionary)
    # The reference: every reorder selects one row per hypothesis, as fairseq's own models do.
    monkeypatch.setattr(beam_sharing, "share_rows",
                        lambda new_order, group: (new_order // group, 1))
    copied = beam_search(model, dictionary)
    for shared_hypos, copied_hypos in zip(shared, copied):
        for a, b in zip(shared_hypos, copied_hypos):
            assert a["tokens"].tolist() == b["tokens"].tolist()
            torch.testing.assert_close(a["positional_scores"], b["positional_scores"])
            torch.testing.assert_close(a["attention"], b["attention"])


def test_beam_search_keeps_memory_and_cache_at_one_row_per_source(dictionary, monkeypatch):
    """The memory and each layer's cached keys/values hold one row per live
    source, read by its beam hypotheses; the cache is computed once and copied
    only when a finished source leaves the batch."""
    model = build_transformer(dictionary, memory_read="attention")
    seen_encoder, seen_reads = [], []
    reorder = model.encoder.reorder_encoder_out

    def spy_reorder(encoder_out, new_order):
        out = reorder(encoder_out, new_order)
        seen_encoder.append((out["memory"][0].size(0), int(out["group"][0]), new_order.numel()))
        return out

    read = AttentionRead.read

    def spy_read(self, query, cache):
        seen_reads.append((id(self), query.size(0), query.size(1), cache["key"].size(0),
                           cache["key"].data_ptr()))
        return read(self, query, cache)

    monkeypatch.setattr(model.encoder, "reorder_encoder_out", spy_reorder)
    monkeypatch.setattr(AttentionRead, "read", spy_read)
    beam_search_with_varied_lengths(model, dictionary)
    seen_encoder.clear()
    seen_reads.clear()
    beam_search(model, dictionary)  # with the EOS bias that varies the lengths
    beam = 4
    assert seen_encoder[0] == (len(BEAM_SOURCES), beam, beam * len(BEAM_SOURCES))
    assert all(rows * group == hypotheses and group == beam for rows, group, hypotheses in seen_encoder)
    for layer in {key for key, *_ in seen_reads}:
        reads = [r for r in seen_reads if r[0] == layer]
        assert all(rows == cached and steps == beam for _, rows, steps, cached, _ in reads)
        assert reads[0][1] == len(BEAM_SOURCES) and reads[-1][1] < len(BEAM_SOURCES), [r[1:4] for r in reads]
        # a new cache tensor only when the number of live sources changed
        changes = sum(a[4] != b[4] for a, b in zip(reads, reads[1:]))
        assert changes == len({r[1] for r in reads}) - 1


# --- options ---------------------------------------------------------------------

@pytest.mark.parametrize("overrides, message", [
    ({"memory_k": 0}, r"invalid --memory-k: 0 \(must be an integer >= 1\)"),
    ({"memory_read": "lookup"}, r"invalid --memory-read: 'lookup' \(choose from attention, mix\)"),
    ({"memory_read": "mix", "memory_decoder_score": "tanh"},
     r"invalid --memory-decoder-score: 'tanh' \(choose from softmax, sigmoid\)"),
    ({"memory_encoder_score": "relu"}, r"invalid --memory-encoder-score: 'relu'"),
    ({"memory_encoder_normalize": "rows"}, r"invalid --memory-encoder-normalize: 'rows'"),
    ({"memory_position_max_len": 0}, r"invalid --memory-position-max-len: 0 \(must be an integer >= 1\)"),
    ({"cross_self_attention": True}, r"--cross-self-attention attends to the encoder states"),
    ({"no_cross_attention": True}, r"--no-cross-attention removes the decoder's only access"),
])
def test_bad_options(dictionary, overrides, message):
    with pytest.raises(ValueError, match=message):
        build_transformer(dictionary, **overrides)


def test_architectures_have_fairseqs_sizes():
    args = argparse.Namespace()
    base_architecture(args)
    assert (args.encoder_embed_dim, args.encoder_ffn_embed_dim, args.encoder_layers,
            args.decoder_attention_heads) == (512, 2048, 6, 8)
    assert (args.memory_k, args.memory_read, args.memory_per_layer, args.memory_position_encoding,
            args.memory_encoder_normalize) == (64, "attention", False, False, "time")
    args = argparse.Namespace()
    iwslt_de_en_architecture(args)
    assert (args.encoder_embed_dim, args.encoder_ffn_embed_dim, args.decoder_attention_heads) == (512, 1024, 4)


@pytest.mark.parametrize("name", ["transformer_tiny", "transformer_iwslt_de_en", "transformer_wmt_en_de",
                                  "transformer_vaswani_wmt_en_de_big", "transformer_vaswani_wmt_en_fr_big",
                                  "transformer_wmt_en_de_big", "transformer_wmt_en_de_big_t2t"])
def test_each_fairseq_transformer_size_has_a_memory_architecture(name):
    from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY

    from fairseq_memattn.convert import target_architecture

    ours = name.replace("transformer", "transformer_memattn", 1)
    assert ARCH_MODEL_REGISTRY[ours] is MemAttnTransformerModel
    assert target_architecture(name) == ours
    fairseqs, memory = argparse.Namespace(), argparse.Namespace()
    ARCH_CONFIG_REGISTRY[name](fairseqs)
    ARCH_CONFIG_REGISTRY[ours](memory)
    assert {key: getattr(memory, key) for key in vars(fairseqs)} == vars(fairseqs)
    plain = argparse.Namespace()
    base_architecture(plain)
    assert {key: value for key, value in vars(memory).items() if key.startswith("memory_")} == \
        {key: value for key, value in vars(plain).items() if key.startswith("memory_")}


@pytest.mark.parametrize("flags, window", [
    ([], True), (["--memory-read", "mix"], False), (["--no-memory-position-window"], False),
    (["--memory-read", "mix", "--memory-position-window"], True)])
def test_position_window_is_on_by_default_for_the_attention_read_only(flags, window):
    """The attention read addresses the rows by content and learned faster with the window; the mix
    read addresses them by position and learned slower (docs/transformer.md, "Why these defaults")."""
    from fairseq import options

    args = options.parse_args_and_arch(options.get_training_parser(), [
        "data-bin", "--user-dir", PLUGIN_DIR, "--arch", "transformer_memattn", *flags])
    assert args.memory_position_window is window


def test_position_max_len_without_position_encodings_is_reported(dictionary, caplog):
    """An S of Eq. 10 with the encodings off (the default) is ignored, and the log says so."""
    build_transformer(dictionary, memory_position_encoding=False, memory_position_max_len=9)
    assert "--memory-position-max-len 9 is ignored: position encodings are off" in caplog.text
    caplog.clear()
    build_transformer(dictionary)  # encodings on, S given: nothing to report
    assert "ignored" not in caplog.text


def test_training_the_write_alone_refuses_fairseqs_fp16_optimizer(dictionary):
    """fairseq's FP16Optimizer gives a dropped gradient to its fp32 copy as zeros (flattened or not),
    which Adam's moments and weight decay still turn into steps."""
    for precision in ("fp16", "bf16"):
        with pytest.raises(UserError, match=re.escape("use --memory-efficient-fp16 (or --memory-efficient-bf16, "
                                                      "or --amp)")):
            build_transformer(dictionary, memory_train_write_only=True, **{precision: True})
    for fits in (dict(fp16=True, memory_efficient_fp16=True), dict(bf16=True, memory_efficient_bf16=True),
                 dict(amp=True), dict(fp16=True, memory_train_write_only=False)):
        build_transformer(dictionary, **{"memory_train_write_only": True, **fits})


def test_a_read_score_without_the_mix_read_is_reported(dictionary, caplog):
    build_transformer(dictionary, memory_decoder_score="sigmoid")
    assert ("--memory-decoder-score sigmoid ignored: --memory-read attention weighs the rows by a softmax of its "
            "scores" in caplog.text)
    caplog.clear()
    build_transformer(dictionary, memory_read="mix", memory_decoder_score="sigmoid")
    assert "ignored" not in caplog.text


def test_sources_beyond_position_encodings_are_filtered_by_fairseq(dictionary):
    model = build_transformer(dictionary, memory_position_max_len=7, max_source_positions=20)
    assert model.max_positions()[0] == 7
    model = build_transformer(dictionary, memory_position_encoding=False, max_source_positions=20)
    assert model.max_positions()[0] == 20


# --- end to end through the command lines ------------------------------------------

TASK = ["--task", "copy_task", "--copy-max-len", "8", "--copy-vocab-size", "10",
        "--copy-train-size", "4000", "--copy-valid-size", "100", "--copy-test-size", "100"]
MODEL = ["--arch", "transformer_memattn", "--memory-k", "16", "--encoder-embed-dim", "64",
         "--decoder-embed-dim", "64", "--encoder-ffn-embed-dim", "128", "--decoder-ffn-embed-dim", "128",
         "--encoder-layers", "2", "--decoder-layers", "2", "--encoder-attention-heads", "2",
         "--decoder-attention-heads", "2", "--dropout", "0"]
# The architecture's defaults (write normalised over time, no position encodings, the position window
# with the attention read). Seeds 1-5 on 1 thread: BLEU 99.73 / 99.45 / 99.73 / 100 / 100, accuracy
# 99 / 99 / 99 / 100 / 100; on 2 threads: BLEU 100 / 100 / 99.73 / 99.45 / 100, accuracy
# 100 / 100 / 99 / 98 / 100. Over the 10: BLEU min / median / max 99.45 / 99.87 / 100, accuracy
# 98 / 99.5 / 100 (python tests/measure_trained.py transformer --seeds 1 2 3 4 5 --threads 1 2 --out DIR).
# Without the window the minimum was BLEU 98.63, accuracy 96; with Eq. 5 and position encodings (the
# defaults before that) BLEU 88.9, accuracy 88.
MIN_BLEU, MIN_ACCURACY = 95.0, 92.0
TRAIN = ["--optimizer", "adam", "--lr", "5e-3", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "200",
         "--clip-norm", "1", "--batch-size", "32", "--max-epoch", "12", "--seed", "1", "--cpu",
         "--no-progress-bar", "--no-epoch-checkpoints"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    save_dir = tmp_path_factory.mktemp("copy_transformer")
    run("fairseq-train", "--user-dir", PLUGIN_DIR, *TASK, *MODEL, *TRAIN, "--save-dir", str(save_dir))
    return save_dir / "checkpoint_best.pt"


@pytest.mark.slow
def test_trained_model_copies_with_beam_search_and_alignments(checkpoint):
    # --min-len 0: the copy task has empty examples
    out = run("fairseq-generate", "--user-dir", PLUGIN_DIR, *TASK, "--path", str(checkpoint),
              "--gen-subset", "test", "--beam", "5", "--batch-size", "32", "--min-len", "0",
              "--required-batch-size-multiple", "1", "--cpu", "--print-alignment").stdout
    assert re.search(r"^A-", out, re.M)
    check_copies(out, MIN_BLEU, MIN_ACCURACY, "transformer_memattn")


@pytest.mark.slow
def test_interactive_translates_with_the_checkpoint(checkpoint):
    out = run("fairseq-interactive", "--user-dir", PLUGIN_DIR, *TASK, "--path", str(checkpoint),
              "--beam", "5", "--cpu", stdin="3 1 4 1 5\n").stdout
    assert re.search(r"^H-0\t\S+\t3 1 4 1 5$", out, re.M), out


# A few updates at tiny sizes, for the precision options of fairseq-train.
FEW_UPDATES = [*TASK[:2], "--copy-max-len", "8", "--copy-vocab-size", "10", "--copy-train-size", "320",
               "--copy-valid-size", "32", "--copy-test-size", "32", "--arch", "transformer_memattn",
               "--memory-k", "4", "--memory-position-max-len", "9", "--encoder-embed-dim", "16",
               "--decoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32",
               "--encoder-layers", "1", "--decoder-layers", "1", "--encoder-attention-heads", "2",
               "--decoder-attention-heads", "2", "--optimizer", "adam", "--lr", "1e-3", "--batch-size", "32",
               "--max-update", "5", "--log-interval", "1", "--no-progress-bar", "--cpu", "--no-save",
               "--num-workers", "0", "--seed", "1"]


@pytest.mark.slow
@pytest.mark.parametrize("memory_read", ["attention", "mix"])
def test_fp16_training_on_cpu(tmp_path, memory_read):
    """fairseq-train --fp16 --cpu: the model in float16 under fairseq's FP16Optimizer
    (loss scaling); --fp16-no-flatten-grads, because fairseq 0.12.3 puts the
    flattened float32 copy on torch.cuda.current_device() (--memory-efficient-fp16
    works too). Every update's loss is finite."""
    result = run("fairseq-train", "--user-dir", PLUGIN_DIR, *FEW_UPDATES, "--memory-read", memory_read,
                 "--fp16", "--fp16-no-flatten-grads", "--save-dir", str(tmp_path))
    log = result.stdout + result.stderr
    updates = re.findall(r"train_inner \|.* loss=([^,]+),.* loss_scale=([^,]+),", log)
    print("fp16 losses:", [loss for loss, _ in updates])
    assert len(updates) == 5 and all(math.isfinite(float(loss)) for loss, _ in updates), log[-3000:]


@pytest.mark.slow
def test_bf16_training_on_cpu_is_not_possible_in_fairseq_0_12_3(tmp_path):
    """fairseq 0.12.3's --bf16 implies --tpu (fairseq/options.py), so the Trainer
    asks torch_xla for its device; without torch_xla it fails before any model
    code runs. What --bf16 would run, the model in bfloat16, is tested above
    (test_half_precision_forward_backward_and_incremental_decoding)."""
    result = run("fairseq-train", "--user-dir", PLUGIN_DIR, *FEW_UPDATES, "--bf16",
                 "--save-dir", str(tmp_path), check=False)
    assert result.returncode != 0
    assert "get_tpu_device" in result.stderr and "xla_device" in result.stderr, result.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("option, value, message", [
    ("--memory-k", "0", "argument --memory-k: invalid value 0 (must be an integer >= 1)"),
    ("--memory-read", "lookup", "argument --memory-read: invalid choice: 'lookup'"),
])
def test_bad_option_is_reported_before_training(tmp_path, option, value, message):
    result = run("fairseq-train", "--user-dir", PLUGIN_DIR, *TASK, *MODEL[:2], option, value,
                 "--optimizer", "adam", "--lr", "1e-3", "--batch-size", "8", "--max-update", "1",
                 "--cpu", "--save-dir", str(tmp_path), check=False)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr[-2000:]


@pytest.mark.parametrize("option", ["share_decoder_input_output_embed", "share_all_embeddings"])
def test_untied_checkpoint_does_not_load_into_a_tied_transformer(dictionary, option):
    """fairseq's own transformer would keep the second of the two tables and decode with it."""
    untied = build_transformer(dictionary).state_dict()
    tied = build_transformer(dictionary, **{option: True})
    with pytest.raises(UserError, match=re.escape(f"checkpoint has {option}=False but the model was built with "
                                                  f"{option}=True")):
        tied.load_state_dict(untied)
    build_transformer(dictionary).load_state_dict(untied)
    tied.load_state_dict(build_transformer(dictionary, seed=1, **{option: True}).state_dict())


# --- checkpoints that do not fit -----------------------------------------------------

@pytest.mark.parametrize("saved, built, message", [
    ({"encoder_ffn_embed_dim": 24}, {}, "checkpoint has encoder_ffn_embed_dim=24 but the model was built with "
                                        "encoder_ffn_embed_dim=32; build the model with --encoder-ffn-embed-dim 24"),
    ({}, {"layernorm_embedding": True}, "checkpoint has layernorm_embedding=False but the model was built with "
                                        "layernorm_embedding=True; build the model with no --layernorm-embedding"),
])
def test_a_misfit_the_shapes_tell_is_named_by_option(dictionary, saved, built, message):
    checkpoint = build_transformer(dictionary, **saved).state_dict()
    with pytest.raises(UserError, match=f"^the checkpoint does not fit the model: {re.escape(message)}$"):
        build_transformer(dictionary, **built).load_state_dict(checkpoint)


def test_a_misfit_no_option_tells_is_one_line_naming_the_parameters(dictionary):
    checkpoint = build_transformer(dictionary).state_dict()
    with pytest.raises(UserError, match=r'^the checkpoint does not fit the model \(Missing key\(s\) in state_dict: '
                                        r'"encoder\.layer_norm\.weight", "encoder\.layer_norm\.bias"\.\): build the '
                                        r"model with the options the checkpoint was trained with$"):
        build_transformer(dictionary, encoder_normalize_before=True).load_state_dict(checkpoint)


def test_a_checkpoint_of_another_kind_of_model_is_said_to_be_one(dictionary):
    """Not compared option by option (a transformer's checkpoint has no LSTM layers, not 0 of them):
    fairseq's transformer is to be converted first; the LSTM's needs its own --arch."""
    memory = build_transformer(dictionary)
    transformer = {name: value for name, value in memory.state_dict().items() if ".writers." not in name}
    with loading("train", "checkpoint_last.pt"):
        with pytest.raises(UserError, match=re.escape(
                "checkpoint_last.pt is a checkpoint of fairseq's transformer, not of transformer_memattn: convert it "
                "first (fairseq-memattn-convert CHECKPOINT OUT --memory-k K), then train from OUT "
                "(--finetune-from-model OUT); to train a new model use another --save-dir")):
            memory.load_state_dict(transformer)
        with pytest.raises(UserError, match=re.escape(
                "checkpoint_last.pt is a checkpoint of lstm_memattn, not of transformer_memattn: give the --arch it "
                "was trained with; to train a new model use another --save-dir")):
            memory.load_state_dict(build_model(dictionary).state_dict())
    with pytest.raises(UserError, match=re.escape(
            "the checkpoint is a checkpoint of transformer_memattn, not of lstm_memattn: give the --arch")):
        build_model(dictionary).load_state_dict(memory.state_dict())


@pytest.mark.parametrize("target_symbols, decoder_dim, message", [
    (20, 16, "--share-all-embeddings needs one dictionary for both languages, but this data has 16 source and "
             "24 target symbols in different dictionaries: preprocess with fairseq-preprocess --joined-dictionary, "
             "or share only --share-decoder-input-output-embed"),
    (12, 8, "--share-all-embeddings needs --encoder-embed-dim (16) equal to --decoder-embed-dim (8)"),
])
def test_share_all_embeddings_without_what_it_needs_is_one_line(dictionary, target_symbols, decoder_dim, message):
    """fairseq's transformer raised these deep inside build_model."""
    target = dictionary if target_symbols == 12 else make_dictionary(target_symbols)
    task = SimpleNamespace(source_dictionary=dictionary, target_dictionary=target)
    args = tiny_args(share_all_embeddings=True, decoder_embed_dim=decoder_dim)
    with pytest.raises(UserError, match=f"^{re.escape(message)}$"):
        MemAttnTransformerModel.build_model(args, task)
