"""transformer_memattn on fairseq's other paths: activation checkpointing (and
offloading), the cost of alignments (only fairseq's alignment layer computes
them), checkpoints saved before --memory-position-window was a default,
--decoder-layers-to-keep with --memory-per-layer, TorchScript (the model and
fairseq's SequenceGenerator over it), and --attention-dropout / quant-noise in
the mix read."""

import copy
import io
import re

import pytest
import torch
from conftest import BEAM_SOURCES, PLUGIN_DIR, SOURCES, build_model, left_padded_batch
from conftest import run_fairseq as run
from fairseq import checkpoint_utils
from fairseq.sequence_generator import SequenceGenerator
from test_numerics import logits_and_gradients
from test_transformer_memattn import PREV_OUTPUT, READ_AND_SHARING, TASK, build_transformer

from fairseq_memattn.modules.memory import MemoryConfig
from fairseq_memattn.modules.memory_reads import MemoryRead, MixRead

# --- activation checkpointing --------------------------------------------------------


@pytest.mark.parametrize("offload", [False, True])
@READ_AND_SHARING
def test_activation_checkpointing_gives_the_plain_gradients(dictionary, memory_read, per_layer, offload):
    """--checkpoint-activations (fairseq's checkpoint_wrapper around each decoder layer) and
    --offload-activations, 3 decoder layers, with dropout: the loss and every parameter's
    gradient equal the plain model's (the layers' recomputation replays the same dropout)."""
    sizes = dict(decoder_layers=3, dropout=0.1, attention_dropout=0.1, memory_read=memory_read,
                 per_layer=per_layer)
    plain = build_transformer(dictionary, **sizes)
    checkpointed = build_transformer(dictionary, checkpoint_activations=True, offload_activations=offload,
                                     **sizes)
    assert all(hasattr(layer, "precheckpoint_forward") for layer in checkpointed.decoder.layers)
    plain.train()
    checkpointed.train()
    tokens, lengths = left_padded_batch(dictionary, SOURCES)
    torch.manual_seed(1)
    expected_logits, expected = logits_and_gradients(plain, tokens, lengths, PREV_OUTPUT)
    torch.manual_seed(1)
    logits, grads = logits_and_gradients(checkpointed, tokens, lengths, PREV_OUTPUT)
    torch.testing.assert_close(logits, expected_logits)
    for (name, _), grad, reference in zip(plain.named_parameters(), grads, expected):
        assert grad is not None, name
        torch.testing.assert_close(grad, reference, msg=lambda m: f"{name}: {m}")


FEW_UPDATES = [*TASK[:2], "--copy-max-len", "8", "--copy-vocab-size", "10", "--copy-train-size", "64",
               "--copy-valid-size", "16", "--copy-test-size", "16", "--arch", "transformer_memattn",
               "--memory-k", "4", "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
               "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32", "--encoder-layers", "2",
               "--decoder-layers", "3", "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
               "--memory-per-layer", "--optimizer", "adam", "--lr", "1e-3", "--batch-size", "16",
               "--max-update", "3", "--log-interval", "1", "--no-progress-bar", "--cpu", "--num-workers", "0",
               "--seed", "1"]


@pytest.mark.slow
def test_fairseq_train_with_checkpoint_and_offload_activations(tmp_path):
    result = run("fairseq-train", "--user-dir", PLUGIN_DIR, *FEW_UPDATES, "--memory-read", "mix",
                 "--checkpoint-activations", "--offload-activations", "--no-save",
                 "--save-dir", str(tmp_path))
    assert "num_updates=3" in result.stdout + result.stderr, result.stderr[-2000:]


# --- alignments: only the alignment layer computes them ----------------------------------


def count_source_wide_reads(model):
    """Per decoder layer, how many of its reads returned weights over the source."""
    counts = [0] * len(model.decoder.layers)
    for index, layer in enumerate(model.decoder.layers):
        forward = layer.encoder_attn.forward

        def counted(*args, _forward=forward, _index=index, **kwargs):
            out, weights = _forward(*args, **kwargs)
            counts[_index] += weights is not None
            return out, weights

        layer.encoder_attn.forward = counted
    return counts


@pytest.mark.parametrize("memory_read", ["attention", "mix"])
def test_only_the_alignment_layer_computes_alignments(dictionary, memory_read):
    """In eval mode (validation, fairseq-validate, --eval-bleu) one layer per call computes the
    read weights x alpha^T: fairseq's alignment_layer (the last, or the one asked for), and in
    beam search with --print-alignment one per step; in training none."""
    model = build_transformer(dictionary, memory_read=memory_read, per_layer=True, decoder_layers=3)
    counts = count_source_wide_reads(model)
    tokens, lengths = left_padded_batch(dictionary, SOURCES)
    with torch.no_grad():
        _, extra = model(tokens, lengths, PREV_OUTPUT)
        assert extra["attn"][0] is not None and counts == [0, 0, 1]
        model(tokens, lengths, PREV_OUTPUT, alignment_layer=0)
        assert counts == [1, 0, 1]
        model.train()
        model(tokens, lengths, PREV_OUTPUT)
        assert counts == [1, 0, 1]

    model = build_transformer(dictionary, memory_read=memory_read, per_layer=True, decoder_layers=3)
    model.make_generation_fast_(need_attn=True)  # fairseq-generate --print-alignment
    counts = count_source_wide_reads(model)
    steps = []
    forward_decoder = model.decoder.forward
    model.decoder.forward = lambda *args, **kwargs: steps.append(1) or forward_decoder(*args, **kwargs)
    from fairseq.sequence_generator import SequenceGeneratorWithAlignment

    tokens, lengths = left_padded_batch(dictionary, BEAM_SOURCES)
    sample = {"id": torch.arange(len(BEAM_SOURCES)), "net_input": {"src_tokens": tokens, "src_lengths": lengths}}
    hypos = SequenceGeneratorWithAlignment([model], dictionary, beam_size=3, max_len_b=8).generate([model], sample)
    assert all("alignment" in hypo for beams in hypos for hypo in beams)
    assert counts == [0, 0, len(steps)] and len(steps) > 1


# --- a real checkpoint: older config, pruning -----------------------------------------------


@pytest.fixture(scope="module")
def per_layer_checkpoint(tmp_path_factory):
    """fairseq-train, a few updates: 3 decoder layers, a memory per layer, attention read,
    without the position window (as before it became the default)."""
    save_dir = tmp_path_factory.mktemp("per_layer")
    run("fairseq-train", "--user-dir", PLUGIN_DIR, *FEW_UPDATES, "--no-memory-position-window",
        "--save-dir", str(save_dir), "--no-epoch-checkpoints")
    return save_dir / "checkpoint_last.pt"


def load(path, **overrides):
    [model], _, task = checkpoint_utils.load_model_ensemble_and_task([str(path)], arg_overrides=overrides)
    model.eval()
    return model, task


@pytest.mark.slow
def test_checkpoint_saved_without_the_window_option_loads_without_the_window(per_layer_checkpoint, tmp_path):
    """A checkpoint whose saved config has no memory_position_window (saved before the window
    became the attention read's default) loads as what it is, a model without the window:
    in Python and with fairseq-generate."""
    state = torch.load(per_layer_checkpoint, weights_only=False)
    del state["cfg"]["model"].memory_position_window
    old = tmp_path / "old.pt"
    torch.save(state, old)

    model, task = load(old)
    assert all(writer.window_log_width is None for writer in model.encoder.writers)
    reference, _ = load(per_layer_checkpoint)
    tokens, lengths = left_padded_batch(task.source_dictionary, SOURCES)
    with torch.no_grad():
        torch.testing.assert_close(model(tokens, lengths, PREV_OUTPUT)[0],
                                   reference(tokens, lengths, PREV_OUTPUT)[0])
    out = run("fairseq-generate", "--user-dir", PLUGIN_DIR, *TASK, "--path", str(old), "--gen-subset",
              "test", "--beam", "2", "--batch-size", "16", "--min-len", "0", "--cpu", "--print-alignment")
    assert "H-0\t" in out.stdout


@pytest.mark.slow
@pytest.mark.parametrize("keep", ["0,2", "1", "2,0"])
def test_decoder_layers_to_keep_keeps_each_layer_with_its_writer(per_layer_checkpoint, keep):
    """--decoder-layers-to-keep on a --memory-per-layer checkpoint: the pruned model's outputs
    are the full model's with only the kept layers, each reading the memory of its own writer."""
    full, task = load(per_layer_checkpoint)
    pruned, _ = load(per_layer_checkpoint, decoder_layers_to_keep=keep)
    kept = sorted(int(n) for n in keep.split(","))
    assert len(pruned.decoder.layers) == len(pruned.encoder.writers) == len(kept)
    for new, old in enumerate(kept):
        torch.testing.assert_close(pruned.encoder.writers[new].W_alpha.weight, full.encoder.writers[old].W_alpha.weight)
        assert pruned.decoder.layers[new].encoder_attn.memory_index == new
    # the reference: the full model (all writers), its decoder cut to the kept layers
    reference = copy.deepcopy(full)
    reference.decoder.layers = torch.nn.ModuleList(reference.decoder.layers[i] for i in kept)
    reference.decoder.num_layers = len(kept)
    tokens, lengths = left_padded_batch(task.source_dictionary, SOURCES)
    with torch.no_grad():
        out, extra = pruned(tokens, lengths, PREV_OUTPUT)
        expected, expected_extra = reference(tokens, lengths, PREV_OUTPUT)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(extra["attn"][0], expected_extra["attn"][0])


@pytest.mark.slow
def test_fairseq_generate_with_layers_to_keep(per_layer_checkpoint):
    out = run("fairseq-generate", "--user-dir", PLUGIN_DIR, *TASK, "--path", str(per_layer_checkpoint),
              "--gen-subset", "test", "--beam", "2", "--batch-size", "16", "--min-len", "0", "--cpu",
              "--model-overrides", "{'decoder_layers_to_keep': '0,2', 'encoder_layers_to_keep': '1'}")
    assert "H-0\t" in out.stdout


# --- TorchScript ------------------------------------------------------------------------


def scripted_roundtrip(module):
    """torch.jit.script, saved and loaded again as a deployment would."""
    buffer = io.BytesIO()
    torch.jit.save(torch.jit.script(module), buffer)
    buffer.seek(0)
    return torch.jit.load(buffer)


@pytest.mark.parametrize("memory_read, per_layer, window", [
    ("attention", False, True), ("attention", True, False), ("mix", False, False), ("mix", True, True)])
def test_torchscript_model_and_sequence_generator_equal_eager(dictionary, memory_read, per_layer, window):
    """torch.jit.script of the model (saved and loaded) gives the eager logits and alignments;
    of fairseq's SequenceGenerator over it, the eager hypotheses and scores (beam rows shared
    in both: the reorders are scripted too)."""
    model = build_transformer(dictionary, memory_read=memory_read, per_layer=per_layer,
                              memory_position_window=window)
    tokens, lengths = left_padded_batch(dictionary, BEAM_SOURCES)
    prev = torch.randint(4, len(dictionary), (len(BEAM_SOURCES), 6))
    scripted = scripted_roundtrip(model)
    with torch.no_grad():
        logits, extra = model(tokens, lengths, prev)
        scripted_logits, scripted_extra = scripted(tokens, lengths, prev)
    torch.testing.assert_close(scripted_logits, logits)
    torch.testing.assert_close(scripted_extra["attn"][0], extra["attn"][0])

    generator = SequenceGenerator([model], dictionary, beam_size=4, max_len_b=10)
    sample = {"net_input": {"src_tokens": tokens, "src_lengths": lengths}}
    with torch.no_grad():
        eager = generator.generate([model], sample)
        scripted = scripted_roundtrip(generator)(sample)
    for eager_beams, scripted_beams in zip(eager, scripted):
        assert [h["tokens"].tolist() for h in scripted_beams] == [h["tokens"].tolist() for h in eager_beams]
        for a, b in zip(eager_beams, scripted_beams):
            torch.testing.assert_close(a["positional_scores"], b["positional_scores"])


def test_lstm_model_refuses_torchscript_in_one_line():
    model = build_model()
    with pytest.raises(NotImplementedError, match="^lstm_memattn cannot be scripted with TorchScript"):
        torch.jit.script(model)
    with pytest.raises(NotImplementedError, match="^lstm_memattn cannot be scripted"):
        torch.jit.script(SequenceGenerator([model], model.decoder.dictionary, beam_size=2))


# --- the mix read: --attention-dropout and quant-noise -----------------------------------


def test_mix_read_applies_attention_dropout_to_beta(dictionary):
    """Dropout on beta (Eq. 7) in training, as the attention read on its weights; eval mode unchanged."""
    model = build_transformer(dictionary, memory_read="mix", attention_dropout=0.5)
    read = model.decoder.layers[0].encoder_attn
    assert isinstance(read, MixRead) and read.dropout_module.p == 0.5
    plain = MixRead(16, 16, MemoryConfig(k=3), memory_index=0)
    plain.load_state_dict(read.state_dict())
    memories, query = torch.randn(2, 1, 3, 16), torch.randn(4, 2, 16)
    expected, _ = plain(query, memories, memories)
    read.eval()
    torch.testing.assert_close(read(query, memories, memories)[0], expected)
    read.train()
    torch.manual_seed(0)
    dropped, weights = read(query, memories, memories, need_weights=False)
    assert not torch.allclose(dropped, expected)
    # the dropped beta, recomputed: the same entries zeroed and the rest scaled by 1 / (1 - p)
    torch.manual_seed(0)
    beta = torch.softmax(read.W_beta(query.transpose(0, 1)), dim=-1)
    mask = torch.nn.functional.dropout(torch.ones_like(beta), 0.5, training=True)
    out = torch.matmul(beta * mask, memories[:, 0] @ read.out_proj.weight.T) + read.out_proj.bias
    torch.testing.assert_close(dropped, out.transpose(0, 1))


@pytest.mark.parametrize("memory_read", ["attention", "mix"])
def test_quant_noise_wraps_the_reads_linear_layers(dictionary, memory_read):
    """--quant-noise-pq: every Linear of the read is wrapped (fairseq's quant_noise hook), which in
    training drops whole blocks of --quant-noise-pq-block-size input weights."""
    model = build_transformer(dictionary, memory_read=memory_read, quant_noise_pq=0.5,
                              quant_noise_pq_block_size=8)
    read = model.decoder.layers[0].encoder_attn
    linears = [m for m in read.modules() if isinstance(m, torch.nn.Linear)]
    assert len(linears) == (4 if memory_read == "attention" else 2)
    assert all(len(m._forward_pre_hooks) == 1 for m in linears)
    model.train()
    tokens, lengths = left_padded_batch(dictionary, SOURCES)
    torch.manual_seed(0)
    model(tokens, lengths, PREV_OUTPUT)
    for linear in linears:
        blocks = linear.weight.detach().view(linear.weight.size(0), -1, 8)
        zeroed = (blocks == 0).all(dim=-1)
        assert zeroed.any() and not zeroed.all()
    assert isinstance(read, MemoryRead)


@pytest.mark.slow
@pytest.mark.parametrize("overrides, message", [
    ({"memory_k": 8}, "checkpoint has memory_k=4 but the model was built with memory_k=8"),
    ({"memory_per_layer": False}, "checkpoint has memory_per_layer=True but the model was built with "
                                  "memory_per_layer=False"),
    ({"memory_read": "mix"}, "checkpoint has memory_read=attention but the model was built with memory_read=mix"),
])
def test_checkpoint_that_does_not_fit_names_the_option(per_layer_checkpoint, overrides, message):
    """Options that change the memory's parameters, overridden at load time: one line naming them."""
    with pytest.raises(ValueError, match=f"^{re.escape(str(per_layer_checkpoint))} does not fit the model: {message}; "
                                         "--model-overrides sets "):
        load(per_layer_checkpoint, **overrides)


@pytest.mark.slow
def test_misfit_in_an_ensemble_names_its_checkpoints(per_layer_checkpoint):
    paths = [str(per_layer_checkpoint)] * 2
    with pytest.raises(ValueError, match=f"^one of {re.escape(', '.join(paths))} does not fit the model: checkpoint "
                                         "has memory_k=4 but the model was built with memory_k=8; "):
        checkpoint_utils.load_model_ensemble_and_task(paths, arg_overrides={"memory_k": 8})


def test_non_strict_load_refuses_only_what_changes_a_shape(dictionary):
    """load_state_dict(strict=False), as torch: parameters the model lacks or the state lacks are
    allowed (here the second writer of --memory-per-layer), a different K is refused, by option."""
    per_layer = build_transformer(dictionary, per_layer=True)
    shared = build_transformer(dictionary, seed=1)
    result = shared.load_state_dict(per_layer.state_dict(), strict=False)
    assert [name for name in result.unexpected_keys if name.startswith("encoder.writers.1.")]
    torch.testing.assert_close(shared.encoder.writers[0].W_alpha.weight, per_layer.encoder.writers[0].W_alpha.weight)
    other_k = build_transformer(dictionary, memory_k=4)
    with pytest.raises(ValueError, match=r"^the checkpoint does not fit the model: checkpoint has memory_k=4 but the "
                                         r"model was built with memory_k=3; build the model with --memory-k 4$"):
        shared.load_state_dict(other_k.state_dict(), strict=False)
