"""fairseq-generate's other search strategies, options and ensembles over both memory models, built as
fairseq-generate builds them (``FairseqTask.build_generator``), on untrained tiny models: each test
checks what the option promises of the hypotheses, so a model whose incremental state or reorder
breaks under a strategy fails. Left out, as fairseq's main fails them for its own ``transformer``
too: ``--print-step`` ends in an error, and ``--no-repeat-ngram-size`` blocks nothing on CPU (it
compares the padding after the hypothesis, facebookresearch/fairseq#4709)."""

from argparse import Namespace
from types import SimpleNamespace

import pytest
import torch
from conftest import BEAM_SOURCES, build_model, left_padded_batch
from fairseq.sequence_scorer import SequenceScorer
from fairseq.tasks import FairseqTask
from fairseq.token_generation_constraints import pack_constraints
from test_transformer_memattn import build_transformer

MODELS = {"lstm_memattn": lambda d: build_model(d, attention_type="memory"),
          "transformer_memattn": build_transformer}


@pytest.fixture(params=sorted(MODELS))
def model(request, dictionary):
    return MODELS[request.param](dictionary)


def build_generator(models, dictionary, options):
    """What fairseq-generate builds for OPTIONS (its options, as attributes) over MODELS (a list
    for an ensemble)."""
    return FairseqTask.build_generator(SimpleNamespace(target_dictionary=dictionary), models, Namespace(**options))


def generate(model, dictionary, prefix_tokens=None, constraint_tokens=None, **options):
    """Hypotheses of BEAM_SOURCES by MODEL (or a list of models, an ensemble), beam 4 unless OPTIONS say."""
    models = model if isinstance(model, list) else [model]
    generator = build_generator(models, dictionary, {"beam": 4, "max_len_b": 12, **options})
    tokens, lengths = left_padded_batch(dictionary, BEAM_SOURCES)
    sample = {"id": torch.arange(len(BEAM_SOURCES)), "net_input": {"src_tokens": tokens, "src_lengths": lengths}}
    with torch.no_grad():
        return generator.generate(models, sample, prefix_tokens=prefix_tokens, constraints=constraint_tokens)


def token_lists(beams):
    return [[h["tokens"].tolist() for h in hypotheses] for hypotheses in beams]


def test_sampling_from_the_top_token_is_greedy_search(model, dictionary):
    greedy = generate(model, dictionary, beam=1)
    sampled = generate(model, dictionary, beam=1, sampling=True, sampling_topk=1)
    assert token_lists(sampled) == token_lists(greedy)
    for a, b in zip(sampled, greedy):
        torch.testing.assert_close(a[0]["positional_scores"], b[0]["positional_scores"])


def test_diverse_siblings_without_a_penalty_is_beam_search(model, dictionary):
    """--diversity-rate 0 ranks the same candidates as beam search; a rate of 2 changes the beams."""
    beams = generate(model, dictionary)
    assert token_lists(generate(model, dictionary, diversity_rate=0)) == token_lists(beams)
    assert token_lists(generate(model, dictionary, diversity_rate=2)) != token_lists(beams)


def test_diverse_beam_groups_without_a_penalty_are_greedy_searches(model, dictionary):
    """--diverse-beam-groups 4 at beam 4: four groups of one hypothesis, each a greedy search
    while --diverse-beam-strength is 0; a strength of 5 makes the groups choose other tokens."""
    greedy = [beam[0] for beam in token_lists(generate(model, dictionary, beam=1))]
    groups = token_lists(generate(model, dictionary, diverse_beam_groups=4, diverse_beam_strength=0.0))
    assert groups == [[best] * 4 for best in greedy]
    penalised = token_lists(generate(model, dictionary, diverse_beam_groups=4, diverse_beam_strength=5.0))
    assert all(len({tuple(h) for h in beam}) > 1 for beam in penalised)


def test_prefix_tokens_start_every_hypothesis(model, dictionary):
    prefix = torch.tensor([[5, 6], [7, 7], [4, 9], [8, 5], [6, 4]])
    for row, hypotheses in zip(prefix.tolist(), generate(model, dictionary, prefix_tokens=prefix)):
        assert all(h["tokens"].tolist()[:2] == row for h in hypotheses)


def test_match_source_len_gives_each_hypothesis_its_sources_length(model, dictionary):
    """fairseq counts the source with its EOS, the hypothesis without."""
    for source, hypotheses in zip(BEAM_SOURCES, generate(model, dictionary, match_source_len=True)):
        assert [len(h["tokens"]) - 1 for h in hypotheses] == [len(source) + 1] * 4


def bigrams(tokens):
    return list(zip(tokens, tokens[1:]))


@pytest.mark.parametrize("order", ["ordered", "unordered"])
def test_lexical_constraints_appear_in_every_hypothesis(model, dictionary, order):
    """--constraints: the phrase (9, 3) in every hypothesis of every sentence, which the plain
    beam search does not give."""
    phrase = (9, 3)
    tokens = pack_constraints([[torch.tensor(phrase)]] * len(BEAM_SOURCES))

    def holding(beams):
        return [phrase in bigrams(h["tokens"].tolist()) for hypotheses in beams for h in hypotheses]

    assert not all(holding(generate(model, dictionary)))
    constrained = generate(model, dictionary, constraint_tokens=tokens, constraints=order)
    assert all(constrained) and all(holding(constrained))  # each sentence has at least one hypothesis


def reference_scores(models, dictionary, hypotheses):
    """--score-reference of HYPOTHESES (one per BEAM_SOURCES sentence): their positional scores in one
    teacher-forced pass of MODELS."""
    tokens, lengths = left_padded_batch(dictionary, BEAM_SOURCES)
    width = max(len(h["tokens"]) for h in hypotheses)
    target = torch.full((len(hypotheses), width), dictionary.pad())
    prev = torch.full((len(hypotheses), width), dictionary.pad())
    for row, h in enumerate(hypotheses):
        target[row, : len(h["tokens"])] = h["tokens"]
        prev[row, : len(h["tokens"])] = torch.cat([torch.tensor([dictionary.eos()]), h["tokens"][:-1]])
    sample = {"id": torch.arange(len(hypotheses)), "target": target,
              "net_input": {"src_tokens": tokens, "src_lengths": lengths, "prev_output_tokens": prev}}
    scorer = build_generator(models, dictionary, {"score_reference": True})
    assert isinstance(scorer, SequenceScorer)
    with torch.no_grad():
        scored = scorer.generate(models, sample)
    for h, (reference,) in zip(hypotheses, scored):
        assert reference["tokens"].tolist() == h["tokens"].tolist()
    return [reference["positional_scores"] for (reference,) in scored]


def test_score_reference_gives_the_search_scores_of_its_own_best_hypotheses(model, dictionary):
    """--score-reference scores a target in one teacher-forced pass; given the best hypotheses of
    the beam search (incremental, with beam reorders) it must give their positional scores; so must
    every other hypothesis of the beam."""
    beams = generate(model, dictionary)
    for rank in range(4):  # the best hypotheses alone may never leave their first beam row
        ranked = [hypotheses[rank] for hypotheses in beams]
        for h, reference in zip(ranked, reference_scores([model], dictionary, ranked)):
            torch.testing.assert_close(reference, h["positional_scores"], rtol=0, atol=2e-5)


def test_an_ensemble_scores_its_hypotheses_by_its_models_mean_probability(dictionary):
    """fairseq-generate --path A.pt:B.pt:C.pt, both memory models in one ensemble: each decodes
    incrementally with its own state and beam reorders, and the ensemble's positional scores are
    log((p_A + p_B + p_C) / 3) of the tokens, which each model alone gives teacher-forced, for every
    hypothesis of the beam."""
    models = [MODELS["lstm_memattn"](dictionary), build_transformer(dictionary, seed=0),
              build_transformer(dictionary, seed=1, memory_read="mix")]
    beams = generate(models, dictionary)
    for rank in range(4):
        ranked = [hypotheses[rank] for hypotheses in beams]
        alone = [reference_scores([m], dictionary, ranked) for m in models]
        for row, h in enumerate(ranked):
            each = torch.stack([scores[row] for scores in alone])
            expected = torch.logsumexp(each, dim=0) - torch.log(torch.tensor(float(len(models))))
            torch.testing.assert_close(h["positional_scores"], expected, rtol=0, atol=2e-5)
