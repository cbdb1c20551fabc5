"""Padding is read from the batch, not from the checkpoint: fairseq decides the
padding side per command (fairseq-interactive pads sources on the left,
fairseq-generate as its own --left-pad-source says), so a model gives the same
outputs for left-padded, right-padded, unpadded and mixed batches."""

import re

import pytest
import torch
from conftest import PLUGIN_DIR, PREV_OUTPUT, SOURCES, build_every_model, for_every_model
from test_reliability import run_together

from fairseq_memattn.tasks.copy_task import CopyTaskConfig, export_copy_data


def padded_batch(dictionary, sentences, left):
    """Sources ending in EOS, each row padded on the left or on the right (``left``: one bool per row)."""
    width = max(len(s) for s in sentences) + 1
    tokens = torch.full((len(sentences), width), dictionary.pad(), dtype=torch.long)
    for row, (sentence, row_left) in enumerate(zip(sentences, left)):
        ids = torch.tensor([dictionary.index(str(t)) for t in sentence] + [dictionary.eos()])
        start = width - len(ids) if row_left else 0
        tokens[row, start : start + len(ids)] = ids
    return tokens, tokens.ne(dictionary.pad()).sum(1)


def outputs_by_sentence(model, dictionary, sentences, left):
    """Per sentence: logits and the alignment over its own tokens only (padding columns removed)."""
    tokens, lengths = padded_batch(dictionary, sentences, left)
    prev = PREV_OUTPUT[: len(sentences)]
    with torch.no_grad():
        logits, extra = model(tokens, lengths, prev)
    attn = extra["attn"][0]
    result = []
    for row in range(len(sentences)):
        tokens_at = tokens[row].ne(dictionary.pad())
        result.append((logits[row], None if attn is None else attn[row][:, tokens_at]))
    if attn is not None:  # and no weight on padding, in either layout
        assert attn.masked_select(tokens.eq(dictionary.pad()).unsqueeze(1).expand_as(attn)).abs().max() == 0
    return result


@for_every_model
def test_left_right_mixed_and_unpadded_batches_agree(dictionary, attention_type, input_feeding):
    model = build_every_model(dictionary, attention_type, input_feeding)
    model.decoder.make_generation_fast_(need_attn=attention_type != "none")
    n = len(SOURCES)
    layouts = {"left": [True] * n, "right": [False] * n, "mixed": [row % 2 == 0 for row in range(n)]}
    batched = {name: outputs_by_sentence(model, dictionary, SOURCES, left)
               for name, left in layouts.items()}
    for row, sentence in enumerate(SOURCES):
        # The sentence alone has no padding at all.
        tokens, lengths = padded_batch(dictionary, [sentence], [True])
        with torch.no_grad():
            logits, extra = model(tokens, lengths, PREV_OUTPUT[row : row + 1])
        alone_attn = extra["attn"][0]
        for name, outputs in batched.items():
            batch_logits, batch_attn = outputs[row]
            torch.testing.assert_close(batch_logits, logits[0], atol=1e-5, rtol=1e-5,
                                       msg=lambda m: f"{name}-padded, sentence {row}: {m}")
            if attention_type != "none":
                torch.testing.assert_close(batch_attn, alone_attn[0], atol=1e-5, rtol=1e-5,
                                           msg=lambda m: f"{name}-padded alignment, sentence {row}: {m}")


# --- end to end: fairseq-generate and fairseq-interactive, either padding side ----

COPY = CopyTaskConfig(copy_max_len=6, copy_vocab_size=8, copy_train_size=800,
                      copy_valid_size=16, copy_test_size=24)
# Memory attention with position encodings (Eq. 8-10 count positions within each
# sentence, so they see padding too); S is read from the training data.
MODEL = ["--arch", "lstm_memattn", "--memory-k", "4", "--memory-position-encoding",
         "--encoder-embed-dim", "8", "--decoder-embed-dim", "8", "--encoder-hidden-size", "8",
         "--decoder-hidden-size", "8", "--encoder-layers", "1", "--decoder-layers", "1"]
TRAIN = ["--optimizer", "adam", "--lr", "1e-2", "--batch-size", "16", "--seed", "1", "--cpu",
         "--num-workers", "0", "--no-progress-bar", "--max-update", "60", "--no-epoch-checkpoints"]
DECODE = ["--cpu", "--beam", "3", "--max-len-a", "0", "--max-len-b", "10"]
# The training padding side: fairseq's --left-pad-source turns left padding off.
TRAINED_WITH = {"left": [], "right": ["--left-pad-source"]}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("copy_text")
    export_copy_data(COPY, str(root))
    data_bin = root / "data-bin"
    run_together(("fairseq-preprocess", "-s", "src", "-t", "tgt", "--joined-dictionary",
                  "--workers", "1", "--trainpref", str(root / "train"),
                  "--validpref", str(root / "valid"), "--testpref", str(root / "test"),
                  "--destdir", str(data_bin)))
    return root, data_bin


@pytest.fixture(scope="module")
def checkpoints(data, tmp_path_factory):
    """One tiny copy model per training padding side (short: a real checkpoint, not a good copier)."""
    _, data_bin = data
    root = tmp_path_factory.mktemp("padding_checkpoints")
    run_together(*[("fairseq-train", str(data_bin), "--user-dir", PLUGIN_DIR, "--task", "translation",
                    *MODEL, *TRAIN, *flags, "--save-dir", str(root / side))
                   for side, flags in TRAINED_WITH.items()])
    return {side: root / side / "checkpoint_last.pt" for side in TRAINED_WITH}


def hypotheses(stdout):
    """{sentence id: (hypothesis, score, positional scores)} from H- and P- lines."""
    scores = {i: (hyp, float(score)) for i, score, hyp in re.findall(r"^H-(\d+)\t(\S+)\t(.*)$", stdout, re.M)}
    positional = {i: [float(x) for x in p.split()] for i, p in re.findall(r"^P-(\d+)\t(.*)$", stdout, re.M)}
    assert scores and scores.keys() == positional.keys(), stdout[-2000:]
    return {i: (hyp, score, positional[i]) for i, (hyp, score) in scores.items()}


def assert_same_hypotheses(actual, expected, what):
    assert actual.keys() == expected.keys(), what
    for i, (hyp, score, positional) in expected.items():
        got_hyp, got_score, got_positional = actual[i]
        assert got_hyp == hyp, f"{what}, sentence {i}: {got_hyp!r} != {hyp!r} alone"
        assert got_score == pytest.approx(score, abs=1e-4), f"{what}, sentence {i}"
        # P- lines are printed to 4 decimals
        assert got_positional == pytest.approx(positional, abs=2e-4), f"{what}, sentence {i}"


@pytest.mark.slow
@pytest.mark.parametrize("trained_with", TRAINED_WITH)
def test_batches_decode_like_single_sentences(data, checkpoints, trained_with):
    text, data_bin = data
    common = [str(data_bin), "--user-dir", PLUGIN_DIR, "--task", "translation",
              "--path", str(checkpoints[trained_with]), *DECODE]
    generate = ["fairseq-generate", *common, "--gen-subset", "test", "--required-batch-size-multiple", "1"]
    interactive = ["fairseq-interactive", *common, "--input", str(text / "test.src")]
    runs = dict(zip(
        ["alone", "left-padded batches", "right-padded batches", "interactive alone", "interactive batches"],
        run_together((*generate, "--batch-size", "1"),
                     (*generate, "--batch-size", "8"),
                     (*generate, "--batch-size", "8", "--left-pad-source"),
                     (*interactive, "--batch-size", "1", "--buffer-size", "1"),
                     (*interactive, "--batch-size", "32", "--buffer-size", "32"))))
    alone = hypotheses(runs["alone"].stdout)
    assert len(alone) == COPY.copy_test_size
    for name in ("left-padded batches", "right-padded batches"):
        assert_same_hypotheses(hypotheses(runs[name].stdout), alone, f"fairseq-generate, {name}")
    assert_same_hypotheses(hypotheses(runs["interactive batches"].stdout),
                           hypotheses(runs["interactive alone"].stdout), "fairseq-interactive, batches of 32")
