"""fairseq's guided alignment training (--load-alignments, --criterion
label_smoothed_cross_entropy_with_alignment) with both models: built for that criterion, the decoder
returns its alignment in training too (beta x alpha^T for memory attention, Sec. 5), a distribution
over the source positions of src_tokens, as the criterion's loss -log attn[target, aligned source]
needs; a configuration whose alignment is not one is refused when the model is built."""

import math
import re
from types import SimpleNamespace

import pytest
import torch
from conftest import PLUGIN_DIR, SOURCES, build_model
from fairseq.criterions.label_smoothed_cross_entropy_with_alignment import (
    LabelSmoothedCrossEntropyCriterionWithAlignment,
)
from fairseq.data import LanguagePairDataset
from test_reliability import run_together
from test_transformer_memattn import build_transformer

from fairseq_memattn.errors import UserError
from fairseq_memattn.tasks.copy_task import CopyTaskConfig, export_copy_data

CRITERION = "label_smoothed_cross_entropy_with_alignment"
MODELS = {  # name: (builder, options)
    "transformer attention read": (build_transformer, {}),
    "transformer mix read": (build_transformer, {"memory_read": "mix"}),
    "lstm memory": (build_model, {"memory_encoder_normalize": "time"}),
    "lstm memory attention read": (build_model, {"memory_encoder_normalize": "time", "memory_read": "attention"}),
    "lstm memory general read": (build_model, {"memory_encoder_normalize": "time", "memory_read": "general"}),
    "lstm additive": (build_model, {"attention_type": "additive", "input_feeding": True}),
}


def copy_batch(dictionary):
    """fairseq's collated batch of SOURCES copied, with identity alignments (--load-alignments):
    left-padded sources, as fairseq-train pads them."""
    sentences = [torch.tensor([dictionary.index(str(t)) for t in s] + [dictionary.eos()]) for s in SOURCES]
    sizes = [len(s) for s in sentences]
    alignments = [torch.arange(len(s)).repeat_interleave(2) for s in SOURCES]  # "0-0 1-1 ..."
    dataset = LanguagePairDataset(sentences, sizes, dictionary, sentences, sizes, dictionary,
                                  align_dataset=alignments)
    return dataset.collater([dataset[i] for i in range(len(SOURCES))])


@pytest.mark.parametrize("name", MODELS)
def test_alignment_in_training_is_a_distribution_over_the_source(dictionary, name):
    build, options = MODELS[name]
    model = build(dictionary, criterion=CRITERION, **options)
    model.train()
    sample = copy_batch(dictionary)
    net_output = model(**sample["net_input"])
    attn = net_output[1]["attn"][0]
    tokens, target = sample["net_input"]["src_tokens"], sample["target"]
    assert attn.shape == (*target.shape, tokens.size(1))
    assert torch.allclose(attn.sum(dim=-1), torch.ones(target.shape), atol=1e-5)
    assert attn.masked_select(tokens.eq(dictionary.pad()).unsqueeze(1)).eq(0).all()  # left padding
    # dropout is 0: the training alignment is the evaluation one, which test_model and
    # test_transformer_memattn check against loops of beta x alpha^T (Sec. 5) or the attention's weights
    with torch.no_grad():
        evaluated = model.eval()(**sample["net_input"])[1]["attn"][0]
    model.train()
    torch.testing.assert_close(attn.detach(), evaluated)

    task = SimpleNamespace(source_dictionary=dictionary, target_dictionary=dictionary)
    criterion = LabelSmoothedCrossEntropyCriterionWithAlignment(task, False, 0.0, 0.5)
    loss = criterion.compute_alignment_loss(sample, net_output)
    assert math.isfinite(loss.item()) and loss.item() > 0
    loss.backward()  # the alignment trains the encoder (the write's alpha, or the attention's keys)
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.encoder.parameters())


@pytest.mark.parametrize("build, options, given", [
    (build_model, {}, "--memory-encoder-normalize contexts"),  # lstm_memattn's default, Eq. 5
    (build_model, {"memory_encoder_normalize": "time", "memory_decoder_score": "sigmoid"},
     "--memory-decoder-score sigmoid"),
    (build_model, {"attention_type": "linear"}, "--attention-type linear"),
    (build_model, {"attention_type": "none"}, "--attention-type none"),
    (build_transformer, {"memory_encoder_score": "sigmoid"}, "--memory-encoder-score sigmoid"),
    (build_transformer, {"memory_read": "mix", "memory_decoder_score": "sigmoid"}, "--memory-decoder-score sigmoid"),
])
def test_alignments_that_are_no_distribution_are_refused_naming_the_criterion(dictionary, build, options, given):
    with pytest.raises(UserError) as error:
        build(dictionary, criterion=CRITERION, **options)
    message = str(error.value)
    assert message.startswith(f"--criterion {CRITERION} trains each target token's") and "\n" not in message
    assert given in message


def test_attention_read_ignores_the_decoder_score_and_other_criteria_change_nothing(dictionary):
    """The attention read's weights are a softmax whatever --memory-decoder-score says; other
    criteria leave the alignments to eval mode, as before."""
    model = build_transformer(dictionary, criterion=CRITERION, memory_decoder_score="sigmoid")
    assert model.alignment_switch.alignment_request is True
    assert build_transformer(dictionary, criterion="cross_entropy").alignment_switch.alignment_request is None
    assert build_model(dictionary, criterion="cross_entropy").alignment_switch.alignment_request is None


TINY = {
    "transformer_memattn": ["--encoder-embed-dim", "8", "--decoder-embed-dim", "8", "--encoder-ffn-embed-dim", "16",
                            "--decoder-ffn-embed-dim", "16", "--encoder-layers", "1", "--decoder-layers", "1",
                            "--encoder-attention-heads", "2", "--decoder-attention-heads", "2", "--memory-k", "4"],
    "lstm_memattn": ["--encoder-embed-dim", "8", "--decoder-embed-dim", "8", "--encoder-hidden-size", "8",
                     "--decoder-hidden-size", "8", "--encoder-layers", "1", "--decoder-layers", "1", "--memory-k", "4",
                     "--memory-encoder-normalize", "time"],
}


@pytest.fixture(scope="module")
def alignment_runs(tmp_path_factory):
    """Copy-task text with identity alignments, preprocessed with --align-suffix, and two updates
    of fairseq-train with the alignment criterion for each model, side by side."""
    root = tmp_path_factory.mktemp("alignment")
    raw, data = root / "raw", root / "data-bin"
    export_copy_data(CopyTaskConfig(copy_max_len=6, copy_train_size=64, copy_valid_size=16), str(raw),
                     splits=("train", "valid"))
    for split in ("train", "valid"):
        lines = (raw / f"{split}.src").read_text().splitlines()
        (raw / f"{split}.align").write_text("".join(
            " ".join(f"{i}-{i}" for i in range(len(line.split()))) + "\n" for line in lines))
    run_together(("fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt", "--joined-dictionary",
                  "--trainpref", str(raw / "train"), "--validpref", str(raw / "valid"), "--align-suffix", "align",
                  "--workers", "1", "--destdir", str(data)))
    train = ["--user-dir", PLUGIN_DIR, "--optimizer", "adam", "--lr", "1e-3", "--batch-size", "8", "--cpu",
             "--max-update", "2", "--no-save", "--seed", "1", "--num-workers", "0", "--no-progress-bar",
             "--load-alignments", "--criterion", CRITERION, "--alignment-lambda", "0.5"]
    hydra = [hydra_run(root, data, arch, sizes) for arch, sizes in TINY.items()]
    # each its own --save-dir: fairseq checks even a --no-save run's folder by writing a file into it
    results = run_together(*[("fairseq-train", str(data), "--arch", arch, *sizes, *train, "--save-dir", str(root / arch))
                             for arch, sizes in TINY.items()], *hydra, check=False)
    return dict(zip([*TINY, *(f"{arch} hydra" for arch in TINY)], results))


def hydra_run(root, data, arch, sizes):
    """fairseq-hydra-train's command for the same run: its model config does not name the criterion,
    so the model learns from the task (load_alignments) that the loss reads its alignment."""
    import json

    model = {option[2:].replace("-", "_"): int(value) if value.isdigit() else value
             for option, value in zip(sizes[::2], sizes[1::2])}
    config = {"common": {"user_dir": PLUGIN_DIR, "cpu": True, "seed": 1},
              "task": {"_name": "translation", "data": str(data), "load_alignments": True},
              "model": {"_name": arch, **model},
              "criterion": {"_name": CRITERION, "alignment_lambda": 0.5},
              "optimizer": {"_name": "adam"}, "lr_scheduler": {"_name": "fixed"},
              "optimization": {"max_update": 2, "lr": [1e-3]}, "dataset": {"batch_size": 8, "num_workers": 0},
              "checkpoint": {"no_save": True, "save_dir": str(root / f"{arch} hydra")}}
    (root / f"{arch}.yaml").write_text(json.dumps(config))  # YAML is a superset of JSON
    return ("fairseq-hydra-train", "--config-dir", str(root), "--config-name", arch,
            f"hydra.run.dir={root / 'hydra' / arch}")


@pytest.mark.slow
@pytest.mark.parametrize("run", [*TINY, *(f"{arch} hydra" for arch in TINY)])
def test_fairseq_train_with_the_alignment_criterion(alignment_runs, run):
    result = alignment_runs[run]
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-3000:]
    train = re.search(r"(\| train \||\[train\]\[INFO\] -) epoch 001 \|.*", log).group(0)  # fairseq-train, hydra
    assert "num_updates 2" in train
    loss = float(re.search(r"alignment_loss (\S+)", train).group(1))
    assert math.isfinite(loss) and loss > 0
