"""Decoder behaviour for every attention type: incremental decoding, padding,
beam reordering, alignments and shared embeddings."""

import logging
import re
from types import SimpleNamespace

import pytest
import torch
from conftest import (PREV_OUTPUT, SOURCES, build_every_model, build_model, for_every_model,
                      left_padded_batch, make_args, make_dictionary)

from fairseq_memattn.errors import UserError
from fairseq_memattn.models.lstm_memattn import MemAttnLSTMModel


def incremental_outputs(model, tokens, lengths, prev_output, need_attn=False):
    encoder_out = model.encoder(tokens, lengths)
    state = {}
    logits, attns = [], []
    for step in range(prev_output.size(1)):
        out, extra = model.decoder(prev_output[:, : step + 1], encoder_out, incremental_state=state)
        logits.append(out)
        attns.append(extra["attn"][0])
    return torch.cat(logits, 1), (torch.cat(attns, 1) if need_attn else None)


@for_every_model
def test_incremental_equals_full_forward(dictionary, attention_type, input_feeding):
    model = build_every_model(dictionary, attention_type, input_feeding)
    need_attn = attention_type != "none"
    model.decoder.make_generation_fast_(need_attn=need_attn)
    tokens, lengths = left_padded_batch(dictionary, SOURCES)
    with torch.no_grad():
        full, extra = model(tokens, lengths, PREV_OUTPUT)
        step, step_attn = incremental_outputs(model, tokens, lengths, PREV_OUTPUT, need_attn)
    torch.testing.assert_close(step, full, atol=1e-5, rtol=1e-5)
    if need_attn:
        torch.testing.assert_close(step_attn, extra["attn"][0], atol=1e-5, rtol=1e-5)


@for_every_model
def test_padding_invariance(dictionary, attention_type, input_feeding):
    model = build_every_model(dictionary, attention_type, input_feeding)
    tokens, lengths = left_padded_batch(dictionary, SOURCES)
    with torch.no_grad():
        batched, _ = model(tokens, lengths, PREV_OUTPUT)
        for row, sentence in enumerate(SOURCES):
            alone_tokens, alone_lengths = left_padded_batch(dictionary, [sentence])
            alone, _ = model(alone_tokens, alone_lengths, PREV_OUTPUT[row : row + 1])
            torch.testing.assert_close(batched[row : row + 1], alone, atol=1e-5, rtol=1e-5)


@for_every_model
def test_beam_reordering(dictionary, attention_type, input_feeding):
    """Reordering memory and incremental state mid-decoding, as beam search does,
    gives what decoding the reordered batch from scratch gives."""
    model = build_model(dictionary, attention_type=attention_type, input_feeding=input_feeding)
    tokens, lengths = left_padded_batch(dictionary, SOURCES)
    new_order = torch.tensor([2, 0, 0])
    with torch.no_grad():
        encoder_out = model.encoder(tokens, lengths)
        state = {}
        for step in range(2):
            model.decoder(PREV_OUTPUT[:, : step + 1], encoder_out, incremental_state=state)
        encoder_out = model.encoder.reorder_encoder_out(encoder_out, new_order)
        model.decoder.reorder_incremental_state(state, new_order)
        prev = PREV_OUTPUT.index_select(0, new_order)
        reordered, _ = model.decoder(prev[:, :3], encoder_out, incremental_state=state)

        expected, _ = model(tokens.index_select(0, new_order), lengths.index_select(0, new_order),
                            prev[:, :3])
    torch.testing.assert_close(reordered[:, -1], expected[:, -1], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("attention_type", ["memory", "linear"])
def test_fixed_size_memory_carries_no_encoder_states(dictionary, attention_type):
    """What beam search copies every step must not grow with the source length."""
    model = build_model(dictionary, attention_type=attention_type)
    model.decoder.make_generation_fast_(need_attn=False)  # fairseq-generate without --print-alignment
    sizes = []
    for length in (3, 30):
        tokens, lengths = left_padded_batch(dictionary, [[4] * length])
        encoder_out = model.encoder(tokens, lengths)
        tensors = list(encoder_out["memory"].values()) + [encoder_out["final_state"]]
        sizes.append(sum(t.numel() for t in tensors))
    assert sizes[0] == sizes[1]


@pytest.mark.parametrize("attention_type", ["additive", "dot", "memory", "gated_linear"])
def test_alignment_lines_up_with_left_padded_source(dictionary, attention_type):
    """Alignments are B x T x S in src_tokens' own (left-padded) layout: no
    weight on padding, and a sentence's weights do not depend on its padding."""
    model = build_model(dictionary, attention_type=attention_type)
    model.decoder.make_generation_fast_(need_attn=True)
    tokens, lengths = left_padded_batch(dictionary, SOURCES)
    with torch.no_grad():
        _, extra = model(tokens, lengths, PREV_OUTPUT)
        attn = extra["attn"][0]
        assert attn.shape == (3, PREV_OUTPUT.size(1), tokens.size(1))
        pad = tokens.eq(dictionary.pad())
        assert attn.masked_select(pad.unsqueeze(1).expand_as(attn)).abs().max() == 0
        alone_tokens, alone_lengths = left_padded_batch(dictionary, [SOURCES[1]])
        _, alone_extra = model(alone_tokens, alone_lengths, PREV_OUTPUT[1:2])
    width = alone_tokens.size(1)
    torch.testing.assert_close(attn[1, :, -width:], alone_extra["attn"][0][0], atol=1e-5, rtol=1e-5)


def test_alignments_in_eval_mode_unless_switched_off(dictionary):
    """As fairseq's LSTM: alignments by default in eval mode; none in training
    (no criterion reads them) nor after make_generation_fast_(need_attn=False),
    and then the memory keeps no alpha either."""
    model = build_model(dictionary, attention_type="memory")
    tokens, lengths = left_padded_batch(dictionary, SOURCES)
    with torch.no_grad():
        _, extra = model(tokens, lengths, PREV_OUTPUT)
    assert extra["attn"][0].shape == (3, PREV_OUTPUT.size(1), tokens.size(1))
    model.train()
    _, extra = model(tokens, lengths, PREV_OUTPUT)
    assert extra["attn"][0] is None and "alpha" not in model.encoder(tokens, lengths)["memory"]
    model.eval()
    model.decoder.make_generation_fast_(need_attn=False)
    _, extra = model(tokens, lengths, PREV_OUTPUT)
    assert extra["attn"][0] is None and "alpha" not in model.encoder(tokens, lengths)["memory"]


@pytest.mark.parametrize("modules, changed", [(None, {"encoder", "decoder"}), (["MemAttnDecoder"], {"decoder"})])
def test_retain_dropout_keeps_the_models_dropout_at_inference(dictionary, modules, changed):
    """fairseq-generate --retain-dropout (and --retain-dropout-modules) keeps dropout on in eval
    mode, as for fairseq's own LSTM; without it two passes are equal."""
    model = build_model(dictionary, attention_type="memory", dropout=0.5)
    tokens, lengths = left_padded_batch(dictionary, SOURCES)

    def twice(run):
        torch.manual_seed(1)
        first = run()
        return first, run()

    with torch.no_grad():
        for run in (lambda: model.encoder(tokens, lengths)["final_state"],
                    lambda: model(tokens, lengths, PREV_OUTPUT)[0]):
            first, second = twice(run)
            assert torch.equal(first, second)
        model.make_generation_fast_(retain_dropout=True, retain_dropout_modules=modules)
        encoder = twice(lambda: model.encoder(tokens, lengths)["final_state"])
        assert (not torch.equal(*encoder)) == ("encoder" in changed)
        model.encoder.dropout.apply_during_inference = False  # the decoder's own dropout alone
        decoder = twice(lambda: model(tokens, lengths, PREV_OUTPUT)[0])
        assert not torch.equal(*decoder)


def generate_with_alignment(model, dictionary, tokens, lengths):
    from fairseq.sequence_generator import SequenceGeneratorWithAlignment

    generator = SequenceGeneratorWithAlignment([model], dictionary, beam_size=2, max_len_b=6)
    sample = {"id": torch.arange(tokens.size(0)), "net_input": {"src_tokens": tokens, "src_lengths": lengths}}
    return generator.generate([model], sample)


def test_sequence_generator_with_alignment_gets_beta_alpha_transposed(dictionary, monkeypatch):
    """fairseq's SequenceGeneratorWithAlignment, without make_generation_fast_,
    gets memory attention's alignments: beta x alpha^T (Sec. 5), here checked
    against alpha (Eq. 5) and beta (Eq. 7) computed by hand from the states
    the model attends with."""
    model = build_model(dictionary, attention_type="memory", memory_k=3)
    tokens, lengths = left_padded_batch(dictionary, SOURCES)
    hypos = generate_with_alignment(model, dictionary, tokens, lengths)

    attention = model.encoder.attention
    seen = {}
    build_memory, lookup = attention.build_memory, attention.lookup
    monkeypatch.setattr(attention, "build_memory",
                        lambda states, mask: seen.update(states=states) or build_memory(states, mask))
    monkeypatch.setattr(attention, "lookup",
                        lambda memory, query: seen.update(query=query) or lookup(memory, query))
    W_alpha, W_beta = attention.writer.W_alpha.weight, attention.read.W_beta.weight
    for row, sentence in enumerate(SOURCES):
        best = hypos[row][0]
        assert "alignment" in best
        # Teacher-force the hypothesis for the states and decoder queries, the sentence alone.
        alone_tokens, alone_lengths = left_padded_batch(dictionary, [sentence])
        prev = torch.cat([torch.tensor([dictionary.eos()]), best["tokens"][:-1]]).unsqueeze(0)
        with torch.no_grad():
            model(alone_tokens, alone_lengths, prev)
        states, queries = seen["states"][0], seen["query"][0]
        expected = torch.zeros(len(best["tokens"]), tokens.size(1))
        offset = tokens.size(1) - len(states)  # left padding of this row in the batch
        for i, h in enumerate(queries):
            beta = torch.softmax(W_beta @ h, 0)
            for t, s in enumerate(states):
                alpha = torch.softmax(W_alpha @ s, 0)
                expected[i, offset + t] = sum(beta[k] * alpha[k] for k in range(3))
        torch.testing.assert_close(best["attention"].T, expected, atol=1e-5, rtol=1e-5)


def test_sequence_generator_with_alignment_refuses_no_attention(dictionary):
    model = build_model(dictionary, attention_type="none")
    tokens, lengths = left_padded_batch(dictionary, SOURCES)
    with pytest.raises(ValueError, match="needs an attention to align with, but this model was "
                                         "trained with --attention-type none"):
        generate_with_alignment(model, dictionary, tokens, lengths)


def test_checkpoint_with_the_memory_parameters_named_as_before_loads(dictionary):
    """Checkpoints written before the memory attention held its writer and read as modules of
    their own name W_alpha, window_log_width and W_beta on the attention itself."""
    options = dict(attention_type="memory", memory_position_window=True)
    saved = build_model(dictionary, seed=1, **options).state_dict()
    old_names = {name.replace("attention.writer.", "attention.").replace("attention.read.", "attention."): tensor
                 for name, tensor in saved.items()}
    assert "encoder.attention.W_alpha.weight" in old_names and "decoder.attention.W_beta.weight" in old_names
    model = build_model(dictionary, seed=2, **options)
    model.load_state_dict(old_names)
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(tensor, saved[name], rtol=0, atol=0)


def test_shared_embeddings_are_one_table_through_training(dictionary):
    """--share-all-embeddings: the encoder's table is the decoder's and the output layer's
    W_o in softmax(W_o tanh(W_m [h; c] + b_m) + b), before and after an optimizer step."""
    model = build_model(dictionary, share_all_embeddings=True, attention_mix=True)
    assert model.decoder.attention_mix.out_features == 8  # --decoder-embed-dim, not the hidden size 16
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    features = torch.randn(2, 3, model.decoder.attention_mix.in_features)
    for _ in range(2):
        table = model.encoder.embed_tokens.weight.detach().clone()
        mix = model.decoder.attention_mix
        mixed = torch.tanh(features @ mix.weight.detach().T + mix.bias.detach())
        expected = mixed @ table.T + model.decoder.output_projection.bias.detach()
        torch.testing.assert_close(model.decoder.output_layer(features), expected)
        tokens, lengths = left_padded_batch(dictionary, [[3, 4, 5], [6]])
        model.train()
        logits, _ = model(tokens, lengths, tokens)
        optimizer.zero_grad()
        logits.logsumexp(-1).sum().backward()
        optimizer.step()
        assert not torch.equal(model.encoder.embed_tokens.weight, table)  # the step moved the one table


@pytest.mark.parametrize("options, message", [
    (dict(share_decoder_input_output_embed=True),
     "--share-decoder-input-output-embed ties the output layer to the decoder's embeddings (8 units), but "
     "Eq. 3's output layer reads [h; c] (16 + 16 units): add --attention-mix"),
    (dict(share_decoder_input_output_embed=True, attention_type="none"),
     "--decoder-hidden-size (16) must equal --decoder-embed-dim (8)"),
    (dict(share_all_embeddings=True, attention_mix=True, encoder_embed_dim=4),
     "--share-all-embeddings needs --encoder-embed-dim (4) equal to --decoder-embed-dim (8)"),
])
def test_sharing_refuses_sizes_it_cannot_tie(dictionary, options, message):
    with pytest.raises(UserError, match=re.escape(message)):
        build_model(dictionary, **options)


def test_sharing_all_embeddings_refuses_two_dictionaries(dictionary):
    task = SimpleNamespace(source_dictionary=dictionary, target_dictionary=make_dictionary(13))
    with pytest.raises(UserError, match=re.escape(
            "--share-all-embeddings needs one dictionary for both languages, but this data has 16 source and "
            "17 target symbols in different dictionaries: preprocess with fairseq-preprocess --joined-dictionary")):
        MemAttnLSTMModel.build_model(make_args(share_all_embeddings=True, attention_mix=True), task)


def test_untied_checkpoint_does_not_load_into_a_tied_model(dictionary):
    """Loading two tables into one would keep the second and silently change the first."""
    untied = build_model(dictionary, attention_mix=True, decoder_hidden_size=8).state_dict()
    tied = build_model(dictionary, attention_mix=True, decoder_hidden_size=8, share_decoder_input_output_embed=True)
    with pytest.raises(UserError, match=re.escape(
            "checkpoint has share_decoder_input_output_embed=False but the model was built with "
            "share_decoder_input_output_embed=True")):
        tied.load_state_dict(untied)
    tied.load_state_dict(tied.state_dict())


@pytest.mark.parametrize("saved, built", [("attention", "mix"), ("mix", "attention"), ("general", "mix"),
                                          ("general", "attention"), ("attention", "general")])
def test_a_checkpoint_of_the_other_memory_read_is_refused_by_name(dictionary, saved, built):
    state = build_model(dictionary, memory_read=saved).state_dict()
    with pytest.raises(UserError, match=re.escape(
            f"checkpoint has memory_read={saved} but the model was built with memory_read={built}")):
        build_model(dictionary, memory_read=built).load_state_dict(state)


@pytest.mark.parametrize("saved, built, fix", [
    ({"memory_read": "attention", "attention_dim": 8}, {"memory_read": "general"},
     "checkpoint has attention_dim=8, which the model has not; build the model with --memory-read attention, "
     "--attention-dim 8"),
    ({"memory_read": "general"}, {"attention_type": "general"},
     "checkpoint has memory_read=general, which the model has not; build the model with --attention-type memory, "
     "--memory-k 3, no --memory-position-window, --memory-read general"),
])
def test_a_checkpoint_of_another_kind_of_model_names_every_option_it_needs(dictionary, saved, built, fix):
    """Options the built model lacks were left out of the fix: giving it led to a second refusal."""
    state = build_model(dictionary, **saved).state_dict()
    with pytest.raises(UserError, match=re.escape(fix)):
        build_model(dictionary, **built).load_state_dict(state)


@pytest.mark.parametrize("overrides, warning", [
    ({"attention_type": "none", "input_feeding": True, "attention_mix": True},
     "--input-feeding and --attention-mix ignored: --attention-type none gives the decoder no context to feed or mix"),
    ({"attention_type": "general", "attention_dim": 8},
     "--attention-dim 8 ignored: only additive attention has a layer of that size (--attention-type additive, or "
     "memory with --memory-read attention; this model: --attention-type general)"),
    ({"attention_dim": 8}, "--attention-dim 8 ignored: only additive attention has a layer of that size "
     "(--attention-type additive, or memory with --memory-read attention; this model: --attention-type memory "
     "--memory-read mix)"),
    ({"memory_read": "attention", "memory_decoder_score": "sigmoid"},
     "--memory-decoder-score sigmoid ignored: --memory-read attention weighs the rows by a softmax of its scores "
     "(Eq. 2); the score of Eq. 7 is the mix's"),
    ({"memory_read": "general", "memory_decoder_score": "sigmoid", "attention_dim": 8},
     "--memory-decoder-score sigmoid ignored: --memory-read general weighs the rows by a softmax of its scores "
     "(Eq. 2); the score of Eq. 7 is the mix's"),
    ({"memory_read": "general", "attention_dim": 8},
     "--attention-dim 8 ignored: only additive attention has a layer of that size (--attention-type additive, or "
     "memory with --memory-read attention; this model: --attention-type memory --memory-read general)"),
    ({"attention_type": "additive", "memory_read": "attention"},
     "--memory-read attention ignored: only --attention-type memory has a memory (this model: "
     "--attention-type additive)"),
    ({"attention_type": "additive", "memory_k": 64, "memory_position_encoding": True},
     "--memory-k 64, --memory-position-encoding ignored: only --attention-type memory has a memory (this model: "
     "--attention-type additive)"),
    ({"arch": "lstm_att", "attention_type": "additive", "memory_k": 32, "memory_encoder_score": "sigmoid"},
     "--memory-encoder-score sigmoid ignored: only --attention-type memory has a memory (this model: "
     "--attention-type additive)"),
    ({"memory_position_normalize": "mean"},
     "--memory-position-normalize mean is ignored: position encodings are off (add --memory-position-encoding "
     "to use them)"),
])
def test_options_the_attention_does_not_use_are_said_to_be_ignored(caplog, overrides, warning):
    """They trained silently without them."""
    with caplog.at_level(logging.WARNING):
        build_model(**overrides)
    assert warning in caplog.text
    caplog.clear()
    # the recipes' baseline (lstm_memattn_wmt's memory defaults, the encodings switched off), from
    # fairseq-train's --arch and from fairseq-hydra-train's _name
    baseline = {"attention_type": "additive", "memory_k": 64, "memory_position_encoding": False,
                "memory_encoder_score": "sigmoid"}
    for unchanged in ({}, {"arch": "lstm_memattn_wmt", **baseline}, {"_name": "lstm_memattn_wmt", **baseline}):
        with caplog.at_level(logging.WARNING):
            build_model(**unchanged)
        assert "ignored" not in caplog.text
