"""Beam search shares each source's memory among its hypotheses (modules/beam_sharing.py)
and decodes exactly what one copy per hypothesis decodes."""

import pytest
import torch
from conftest import ALL_ATTENTION, BEAM_SOURCES, beam_search, build_model

from fairseq_memattn.modules import beam_sharing


def test_beam_expansion_keeps_one_row_per_source():
    rows, group = beam_sharing.share_rows(torch.arange(3).repeat_interleave(4), group=1)
    assert rows.tolist() == [0, 1, 2] and group == 4


def test_moves_within_blocks_keep_the_rows():
    new_order = torch.tensor([1, 1, 0, 5, 3, 4])  # beam 3: hypotheses moved within blocks
    rows, group = beam_sharing.share_rows(new_order, group=3)
    assert rows.tolist() == [0, 1] and group == 3


def test_finished_sentences_drop_their_rows():
    new_order = torch.tensor([1, 0, 5, 5])  # beam 2, 3 sources: the second one finished
    rows, group = beam_sharing.share_rows(new_order, group=2)
    assert rows.tolist() == [0, 2] and group == 2


def test_other_orders_fall_back_to_a_row_per_hypothesis():
    new_order = torch.tensor([0, 2, 3, 3, 1])
    rows, group = beam_sharing.share_rows(new_order, group=2)
    assert rows.tolist() == [0, 1, 1, 1, 0] and group == 1


def test_no_hypotheses_left():
    rows, group = beam_sharing.share_rows(torch.zeros(0, dtype=torch.long), group=4)
    assert rows.numel() == 0 and group == 1


def beam_search_with_varied_lengths(model, dictionary, sources_must_differ=True):
    """Beam search, after making the untrained model end sentences at different
    steps (sharper outputs, a bias towards EOS), so that finished sources leave the
    batch while others go on; where no bias does that (untrained linear attention's
    outputs hardly depend on the source) and not ``sources_must_differ``, a search
    whose hypotheses at least end at different steps."""
    hypotheses_differ = None
    with torch.no_grad():
        model.decoder.output_projection.weight.mul_(10)
        model.decoder.output_projection.bias[dictionary.eos()] -= 3
        for _ in range(40):
            hypos = beam_search(model, dictionary)
            # a source finishes when its last hypothesis does
            if len({max(len(h["tokens"]) for h in sentence) for sentence in hypos}) > 1:
                return hypos
            if hypotheses_differ is None and len({len(h["tokens"]) for sentence in hypos for h in sentence}) > 1:
                hypotheses_differ = hypos, model.decoder.output_projection.bias[dictionary.eos()].item()
            model.decoder.output_projection.bias[dictionary.eos()] += 0.25
        if hypotheses_differ is not None and not sources_must_differ:
            hypos, bias = hypotheses_differ
            model.decoder.output_projection.bias[dictionary.eos()] = bias  # the model that searched them
            return hypos
    pytest.fail("no EOS bias made sources end at different steps")


@pytest.mark.parametrize("input_feeding", [False, True])
@pytest.mark.parametrize("attention_type", ALL_ATTENTION)
def test_shared_memory_decodes_like_a_copy_per_hypothesis(dictionary, attention_type,
                                                          input_feeding, monkeypatch):
    model = build_model(dictionary, attention_type=attention_type, input_feeding=input_feeding)
    model.decoder.make_generation_fast_(need_attn=attention_type != "none")
    shared = beam_search_with_varied_lengths(model, dictionary, attention_type.startswith("memory"))
    # The reference: every reorder selects one row per hypothesis, as fairseq's own models do.
    monkeypatch.setattr(beam_sharing, "share_rows", lambda new_order, group: (new_order // group, 1))
    copied = beam_search(model, dictionary)

    for shared_hypos, copied_hypos in zip(shared, copied):
        for a, b in zip(shared_hypos, copied_hypos):
            assert a["tokens"].tolist() == b["tokens"].tolist()
            torch.testing.assert_close(a["positional_scores"], b["positional_scores"])
            if attention_type != "none":
                torch.testing.assert_close(a["attention"], b["attention"])


def test_beam_search_keeps_the_memory_at_one_row_per_source(dictionary, monkeypatch):
    model = build_model(dictionary, attention_type="memory")
    seen = []
    reorder = model.encoder.reorder_encoder_out

    def spy(encoder_out, new_order):
        out = reorder(encoder_out, new_order)
        seen.append((out["memory"]["contexts"].size(0), out["group"], new_order.numel()))
        return out

    monkeypatch.setattr(model.encoder, "reorder_encoder_out", spy)
    beam_search(model, dictionary, beam=4)
    assert seen[0] == (len(BEAM_SOURCES), 4, 4 * len(BEAM_SOURCES))
    assert all(rows * group == hypotheses for rows, group, hypotheses in seen)
    assert all(group == 4 for _, group, _ in seen)
