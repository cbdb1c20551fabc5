"""fairseq_memattn.convert: a trained fairseq transformer (3 updates on the toy en-fr corpus) as a
transformer_memattn: every weight kept, the decoder unchanged when the write copies the states,
the converted checkpoint loaded by fairseq-train, fairseq-generate, the hub and the export, and
every refusal one line."""

import copy
import json
import logging
import math
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch
from fairseq import checkpoint_utils, tasks
from fairseq.sequence_generator import SequenceGenerator

from conftest import PLUGIN_DIR, REPO, clean_env, run_fairseq, without_language_pair
import wmt17_toy

from fairseq_memattn import convert
from fairseq_memattn.cli import convert as convert_cli

# fairseq's transformer_iwslt_de_en at toy sizes, trained as recipes/bible/compare.py trains it.
TINY_SIZES = ["--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "16",
              "--decoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32",
              "--encoder-attention-heads", "2", "--decoder-attention-heads", "2", "--warmup-updates", "10",
              "--max-tokens", "500", "--dropout", "0.1", "--log-interval", "1", "--num-workers", "0"]
K = 4


def prepare_toy_data(root):
    """The toy en-fr corpus (wmt17_toy) prepared as recipes/bible prepares the Bible: DATA with
    data-bin/, ref/ and spm.model."""
    raw = wmt17_toy.write_corpus(root / "raw", sizes={"train": 300, "valid": 20, "test": 20}, pair="en-fr")
    data = root / "data"
    result = subprocess.run([sys.executable, "-m", "recipes.wmt17.run", "prepare", "en-fr",
                             "--raw-dir", str(raw), "--out", str(data), "--vocab-size", "100"],
                            env=clean_env(OMP_NUM_THREADS="1"), capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    return data


def train_transformer(data, save_dir, updates=3):
    """fairseq's transformer_iwslt_de_en with compare.py's training options, at toy sizes."""
    from recipes.bible import compare

    run_fairseq("fairseq-train", str(data / "data-bin"), "--task", "translation", "--source-lang", "en",
                "--target-lang", "fr", *compare.MODELS["transformer"], *TINY_SIZES,
                "--max-update", str(updates), "--save-dir", str(save_dir), "--no-epoch-checkpoints", "--cpu")
    return save_dir / "checkpoint_last.pt"


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    root = tmp_path_factory.mktemp("convert")
    data = prepare_toy_data(root)
    transformer = train_transformer(data, root / "transformer")
    converted = root / "converted.pt"
    convert_cli.main([str(transformer), str(converted), "--memory-k", str(K)])
    return dict(root=root, data=data, transformer=transformer, converted=converted)


def load(path):
    models, _, task = checkpoint_utils.load_model_ensemble_and_task([str(path)])
    return models[0].eval(), task


def test_every_transformer_weight_is_kept_and_only_the_write_is_new(toy):
    original = checkpoint_utils.load_checkpoint_to_cpu(str(toy["transformer"]))
    converted = checkpoint_utils.load_checkpoint_to_cpu(str(toy["converted"]))
    for key, tensor in original["model"].items():
        assert torch.equal(converted["model"][key], tensor), key
    assert sorted(set(converted["model"]) - set(original["model"])) == [
        "encoder.writers.0.W_alpha.weight", "encoder.writers.0.window_log_width"]
    # The write starts as the position window alone, each width at half a row, 1/(2K) (start_write_nearest).
    assert torch.allclose(converted["model"]["encoder.writers.0.window_log_width"], torch.full((K,), -math.log(2 * K)))
    assert not converted["model"]["encoder.writers.0.W_alpha.weight"].any()
    assert converted["cfg"].model.arch == "transformer_memattn_iwslt_de_en"
    assert converted["cfg"].model.memory_k == K
    # The training position and the optimizer moments of the kept weights carry over, the write's start fresh.
    assert converted["optimizer_history"][-1]["num_updates"] == 3
    assert "best" not in converted["extra_state"]
    groups = converted["last_optimizer_state"]["param_groups"]
    assert len(groups[0]["params"]) == len(original["last_optimizer_state"]["param_groups"][0]["params"]) + 2
    assert len(converted["last_optimizer_state"]["state"]) == len(original["last_optimizer_state"]["state"])


def test_optimizer_state_is_carried_by_parameter_with_its_loss_scale():
    """Each kept parameter's moments move to its index in the memory model, the write's start
    fresh, and the loss scale of --amp or --memory-efficient-fp16 comes along; --fp16's one flat
    entry for all parameters cannot be split."""
    moments = {0: {"exp_avg": torch.ones(2)}, 1: {"exp_avg": torch.zeros(3)}}
    state = {"state": moments, "param_groups": [{"params": [0, 1], "lr": 0.1}], "loss_scale": 128.0}
    carried = convert.carried_optimizer_state(state, ["a", "b"], ["a", "writer", "b"])
    assert carried == {"state": {0: moments[0], 2: moments[1]}, "param_groups": [{"params": [0, 1, 2], "lr": 0.1}],
                       "loss_scale": 128.0}
    flat = {"state": {0: {"exp_avg": torch.ones(5)}}, "param_groups": [{"params": [0]}], "loss_scale": 128.0}
    assert convert.carried_optimizer_state(flat, ["a", "b"], ["a", "writer", "b"]) is None


def test_converts_a_checkpoint_that_holds_args_not_cfg(toy, tmp_path):
    """fairseq's models published before its dataclass configs (its WMT'14-'19 transformers) hold
    their options as a Namespace under "args"; fairseq's loader makes the cfg from it."""
    state = torch.load(toy["transformer"], weights_only=False)
    state["args"] = checkpoint_utils.load_checkpoint_to_cpu(str(toy["transformer"]))["cfg"].model
    del state["cfg"]
    legacy, converted = tmp_path / "legacy.pt", tmp_path / "converted.pt"
    torch.save(state, legacy)
    convert_cli.main([str(legacy), str(converted), "--memory-k", str(K)])
    model, _ = load(converted)
    assert type(model).__name__ == "MemAttnTransformerModel"
    assert all(torch.equal(model.state_dict()[key], tensor) for key, tensor in state["model"].items())


def test_converts_the_layers_that_layers_to_keep_kept(toy, tmp_path):
    """A checkpoint whose args hold --*-layers-to-keep (its weights still all layers, as fairseq
    saves them): the memory model has the kept layers, renumbered, and the other side all of its."""
    state = checkpoint_utils.load_checkpoint_to_cpu(str(toy["transformer"]))
    state["cfg"].model.decoder_layers_to_keep = "1"
    pruned, converted = tmp_path / "keep_1.pt", tmp_path / "converted.pt"
    convert.save_checkpoint(state, str(pruned))
    convert_cli.main([str(pruned), str(converted), "--memory-k", str(K)])
    model, _ = load(converted)
    assert len(model.decoder.layers) == 1 and len(model.encoder.layers) == 2
    assert model.cfg.decoder.layers_to_keep is None
    for key, tensor in state["model"].items():
        kept = key.replace("decoder.layers.1.", "decoder.layers.0.")
        if not key.startswith("decoder.layers.0.") and "version" not in key:
            assert torch.equal(model.state_dict()[kept], tensor), key


def identity_write(model):
    """Forces alpha to the identity when K = |S| (no padding): W_alpha = 0 and windows so narrow
    that row k takes source position k alone (window_scores: -(r_s - c_k)^2 / 2w^2, r_k = c_k)."""
    state = model.state_dict()
    for key in state:
        if key.startswith(convert.WRITE_PREFIX):
            state[key] = torch.zeros_like(state[key]) if key.endswith("W_alpha.weight") else torch.full_like(state[key], -12.0)
    model.load_state_dict(state)


def test_converted_decoder_equals_the_transformer_when_the_write_copies_the_states(toy, tmp_path):
    original, task = load(toy["transformer"])
    dictionary = task.source_dictionary
    length = 6  # |S| with EOS: K rows, one per position
    path = tmp_path / "k_equals_s.pt"
    convert_cli.main([str(toy["transformer"]), str(path), "--memory-k", str(length)])
    converted, _ = load(path)
    identity_write(converted)

    torch.manual_seed(0)
    words = torch.randint(dictionary.nspecial, len(dictionary), (3, length - 1))
    src_tokens = torch.cat([words, torch.full((3, 1), dictionary.eos())], dim=1)
    src_lengths = torch.full((3,), length)
    prev_output = torch.cat([torch.full((3, 1), dictionary.eos()),
                             torch.randint(dictionary.nspecial, len(dictionary), (3, 7))], dim=1)
    with torch.no_grad():
        expected = original.get_normalized_probs(original(src_tokens, src_lengths, prev_output), log_probs=True)
        got = converted.get_normalized_probs(converted(src_tokens, src_lengths, prev_output), log_probs=True)
    assert torch.allclose(got, expected, atol=1e-5), (got - expected).abs().max()

    sample = {"id": torch.arange(3), "net_input": {"src_tokens": src_tokens, "src_lengths": src_lengths}}
    generate = SequenceGenerator([original], task.target_dictionary, beam_size=3, max_len_b=10)
    with torch.no_grad():
        expected, got = generate.generate([original], sample), generate.generate([converted], sample)
    for hypotheses, reference in zip(got, expected):
        for hypothesis, wanted in zip(hypotheses, reference):
            assert torch.equal(hypothesis["tokens"], wanted["tokens"])
            assert torch.allclose(hypothesis["positional_scores"], wanted["positional_scores"], atol=1e-5)


def window_weights(length, rows, width):
    """alpha of a write that is its position window alone, by loops: row k (0-based) weighs
    token s by exp(-(r_s - c_k)^2 / 2 width^2), r_s = (s + 1/2) / length, c_k = (k + 1/2) / rows,
    normalised over the tokens (transformer_memattn's --memory-encoder-normalize time)."""
    alpha = torch.zeros(length, rows, dtype=torch.float64)
    for k in range(rows):
        scores = [math.exp(-((s + 0.5) / length - (k + 0.5) / rows) ** 2 / (2 * width ** 2)) for s in range(length)]
        for s in range(length):
            alpha[s, k] = scores[s] / sum(scores)
    return alpha


@pytest.mark.parametrize("length", [2, 6, 11])
def test_the_write_starts_at_the_nearest_states(toy, length):
    """The default start: C_k is the states around (k - 1/2)/K, each window half a row wide; with
    |S| <= K/2 each row is within 2 % of the one nearest state."""
    converted, task = load(toy["converted"])
    dictionary = task.source_dictionary
    torch.manual_seed(length)
    src_tokens = torch.cat([torch.randint(dictionary.nspecial, len(dictionary), (2, length - 1)),
                            torch.full((2, 1), dictionary.eos())], dim=1)
    with torch.no_grad():
        out = converted.encoder.forward_scriptable(src_tokens, torch.full((2,), length), False, None)
        states = out["encoder_out"][0].transpose(0, 1).double()
        memory = converted.encoder(src_tokens, torch.full((2,), length))["memory"][0][:, 0].double()
    alpha = window_weights(length, K, 1 / (2 * K))
    assert torch.allclose(memory, alpha.T @ states, atol=1e-5)
    if 2 * length <= K:
        nearest = [min(range(length), key=lambda s: abs((s + 0.5) / length - (k + 0.5) / K)) for k in range(K)]
        assert all(alpha[nearest[k], k] > 0.98 for k in range(K))


def test_write_start_model_keeps_the_initialisation_of_training_from_scratch(toy, tmp_path, capsys):
    """--write-start model: W_alpha random, each window a row wide (1/K), as MemoryWrite starts."""
    path = tmp_path / "model_start.pt"
    convert_cli.main([str(toy["transformer"]), str(path), "--memory-k", str(K), "--write-start", "model"])
    converted = checkpoint_utils.load_checkpoint_to_cpu(str(path))["model"]
    assert torch.allclose(converted["encoder.writers.0.window_log_width"], torch.full((K,), -math.log(K)))
    assert converted["encoder.writers.0.W_alpha.weight"].std() > 0
    without_window = tmp_path / "no_window.pt"
    convert_cli.main([str(toy["transformer"]), str(without_window), "--memory-k", str(K), "--no-memory-position-window"])
    assert "encoder.writers.0.window_log_width" not in checkpoint_utils.load_checkpoint_to_cpu(str(without_window))["model"]


def save_variant(toy, path, arch=None, **model_options):
    """The trained transformer's checkpoint with another --arch or model options, its
    weights rebuilt by fairseq for them."""
    state = checkpoint_utils.load_checkpoint_to_cpu(str(toy["transformer"]))
    model_args = copy.deepcopy(state["cfg"].model)
    vars(model_args).update(model_options)
    model_args.arch = arch or model_args.arch
    if model_options:
        task = tasks.setup_task(state["cfg"].task)
        state["model"] = task.build_model(copy.deepcopy(model_args)).state_dict()
    state["cfg"].model = model_args
    convert.save_checkpoint(state, str(path))
    return path


REFUSALS = {  # name: (how to make the checkpoint, extra options, what the error says)
    "lstm": (dict(arch="lstm"), [], "cannot convert --arch lstm"),
    "alignment": (dict(arch="transformer_align"), [], "cannot convert --arch transformer_align"),
    "cross-self-attention": (dict(cross_self_attention=True), [], "--cross-self-attention attends"),
    "no-cross-attention": (dict(no_cross_attention=True), [], "--no-cross-attention removes"),
    "mix read": (None, ["--memory-read", "mix"], "--memory-read mix reads the memory"),
    "other option": (None, ["--lr", "1"], "unrecognized arguments: --lr"),
    "bad value": (None, ["--memory-encoder-score", "cosine"], "argument --memory-encoder-score: invalid choice"),
    "bad write start": (None, ["--write-start", "zero"], "argument --write-start: invalid choice: 'zero'"),
    "nearest without window": (None, ["--write-start", "nearest", "--no-memory-position-window"],
                               "--write-start nearest starts the write from the position window"),
    "not a checkpoint": ("text", [], "is not a fairseq checkpoint (not a file torch.save writes"),
    "missing": ("missing", [], "checkpoint not found"),
    "folder": ("folder", [], "is a folder: give a checkpoint file in it (checkpoint_last.pt)"),
}


def test_help_lists_the_memory_options_and_that_memory_k_is_required():
    """fairseq-train --help cannot show them (fairseq adds an architecture's options after its help)."""
    text = " ".join(convert_cli.build_parser().format_help().split())
    assert "[--memory-k" not in text and "--memory-k K number of attention contexts K of memory attention (required)" in text
    for option in ("--memory-encoder-score {softmax,sigmoid}", "--memory-encoder-normalize {contexts,time}",
                   "--memory-position-window, --no-memory-position-window", "--memory-position-max-len S",
                   "--memory-read {attention,mix}", "--memory-per-layer"):
        assert option in text, option


@pytest.mark.parametrize("name", sorted(REFUSALS))
def test_refusals_are_one_line(toy, tmp_path, capsys, name):
    make, options, message = REFUSALS[name]
    if make is None:
        checkpoint = toy["transformer"]
    elif make == "text":
        checkpoint = tmp_path / "notes.txt"
        checkpoint.write_text("not a checkpoint\n")
    elif make == "missing":
        checkpoint = tmp_path / "none.pt"
    elif make == "folder":
        checkpoint = tmp_path / "checkpoints"
        checkpoint.mkdir()
        (checkpoint / "checkpoint_last.pt").write_text("")
    else:
        checkpoint = save_variant(toy, tmp_path / "variant.pt", **make)
    with pytest.raises(SystemExit) as stopped:
        convert_cli.main([str(checkpoint), str(tmp_path / "out.pt"), "--memory-k", "4", *options])
    error = capsys.readouterr().err.strip().splitlines()
    assert stopped.value.code == 2
    assert error[-1].startswith("fairseq-memattn-convert: error: ") and message in error[-1], error[-1]
    assert not any("Traceback" in line for line in error)
    assert not (tmp_path / "out.pt").exists()


def test_refuses_a_converted_model_and_an_existing_out(toy, tmp_path, capsys):
    for argv, message in (([str(toy["converted"]), str(tmp_path / "again.pt")], "already a memory attention model"),
                          ([str(toy["transformer"]), str(toy["converted"])], "exists: pass --force"),
                          ([str(toy["transformer"]), str(tmp_path / "no_k.pt")], "required: --memory-k"),
                          ([str(toy["transformer"]), str(tmp_path), "--force"],
                           f"{tmp_path} is a folder: give the converted checkpoint's file, e.g. "
                           f"{tmp_path / 'converted.pt'}")):
        with pytest.raises(SystemExit) as stopped:
            convert_cli.main(argv + (["--memory-k", "4"] if "no_k" not in argv[1] else []))
        assert stopped.value.code == 2
        assert message in capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize("out", ["a_file/out.pt", "a_file/folder/out.pt"])
def test_refuses_an_out_it_cannot_write_before_reading_the_checkpoint(tmp_path, capsys, monkeypatch, out):
    """An OUT under a file (as under a folder without write permission, which root could write):
    one line naming it before any work, not a traceback once the conversion is done."""
    (tmp_path / "a_file").write_text("")
    monkeypatch.setattr(convert, "load_source", lambda *args: pytest.fail("the checkpoint was read first"))
    with pytest.raises(SystemExit) as stopped:
        convert_cli.main([str(tmp_path / "checkpoint.pt"), str(tmp_path / out), "--memory-k", "4"])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"fairseq-memattn-convert: error: invalid OUT: cannot write {tmp_path / out} "
        f"({tmp_path / 'a_file'} is a file, not a folder)")
    assert os.listdir(tmp_path) == ["a_file"]


def test_data_with_other_dictionaries_is_refused_naming_them(toy, tmp_path, capsys):
    """--data whose dictionaries are not the checkpoint's: said so, not blamed on the --arch."""
    data = tmp_path / "other"
    data.mkdir()
    data_bin = toy["data"] / "data-bin"
    (data / "dict.en.txt").write_text((data_bin / "dict.en.txt").read_text() + "extra1 1\nextra2 1\n")
    shutil.copyfile(data_bin / "dict.fr.txt", data / "dict.fr.txt")
    rows = checkpoint_utils.load_checkpoint_to_cpu(str(toy["transformer"]))["model"]["encoder.embed_tokens.weight"].size(0)
    with pytest.raises(SystemExit) as stopped:
        convert_cli.main([str(toy["transformer"]), str(tmp_path / "out.pt"), "--memory-k", str(K), "--data", str(data)])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"fairseq-memattn-convert: error: the dictionaries in {data} are not those of {toy['transformer']}: "
        f"source dictionary {rows + 2} symbols, the checkpoint's {rows} (give --data the folder with the "
        f"dictionaries the transformer was trained with)")
    assert not (tmp_path / "out.pt").exists()


def test_data_holding_only_dictionaries_for_a_checkpoint_without_its_pair_is_one_line(toy, tmp_path, capsys):
    """fairseq tells the pair from the data folder's binarized splits (a bare Exception without them):
    one line naming what to give, and nothing written."""
    data = tmp_path / "dictionaries"
    data.mkdir()
    for name in ("dict.en.txt", "dict.fr.txt"):
        shutil.copyfile(toy["data"] / "data-bin" / name, data / name)
    checkpoint = without_language_pair(toy["transformer"], tmp_path / "no_pair.pt")
    with pytest.raises(SystemExit) as stopped:
        convert_cli.main([str(checkpoint), str(tmp_path / "out.pt"), "--memory-k", str(K), "--data", str(data)])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"fairseq-memattn-convert: error: cannot set up the task of {checkpoint}: {data} has no fairseq-preprocess "
        f"output (train.SRC-TGT.SRC.idx) to tell the language pair from; pass --data DIR, the data-bin folder it "
        f"was trained on")
    assert not (tmp_path / "out.pt").exists()


def test_an_empty_out_is_refused_by_argparse(capsys):
    with pytest.raises(SystemExit) as stopped:
        convert_cli.main(["checkpoint.pt", "", "--memory-k", "4"])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "fairseq-memattn-convert: error: argument out: invalid value '' (give a path)")


def test_warns_that_an_S_below_max_source_positions_refuses_longer_sources(toy, tmp_path, caplog):
    """S of Eq. 10 (--memory-position-max-len) is the longest source the converted model takes:
    below the transformer's --max-source-positions (1024) it refuses sources the transformer took."""
    options = ["--memory-k", str(K), "--memory-position-encoding", "--memory-position-max-len"]
    with caplog.at_level(logging.WARNING, logger=convert.__name__):
        for limit in (9, 1024):
            convert_cli.main([str(toy["transformer"]), str(tmp_path / f"s{limit}.pt"), *options, str(limit)])
    assert [record.getMessage() for record in caplog.records if "--max-source-positions" in record.getMessage()] == [
        f"--memory-position-max-len 9 (S of Eq. 10) is below the --max-source-positions 1024 of {toy['transformer']}: "
        "the converted model refuses sources of more than 9 tokens (EOS included), which the transformer took; "
        "give a larger --memory-position-max-len to cover them"]
    assert load(tmp_path / "s9.pt")[0].max_positions()[0] == 9


@pytest.mark.slow
def test_console_command_and_force(toy, tmp_path):
    out = tmp_path / "out.pt"
    out.write_text("old")
    command = [os.path.join(os.path.dirname(sys.executable), "fairseq-memattn-convert"), str(toy["transformer"]), str(out),
               "--memory-k", "3", "--memory-per-layer", "--force"]
    result = subprocess.run(command, env=clean_env(OMP_NUM_THREADS="1"), capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stderr[-2000:]
    model, _ = load(out)
    assert sum(key.startswith(convert.WRITE_PREFIX) and key.endswith("W_alpha.weight")
               for key in model.state_dict()) == 2  # one write per decoder layer


@pytest.mark.slow
def test_fairseq_generate_and_the_hub_load_the_converted_model(toy):
    data_bin = str(toy["data"] / "data-bin")
    result = run_fairseq("fairseq-generate", data_bin, "--user-dir", PLUGIN_DIR, "--path", str(toy["converted"]),
                         "--gen-subset", "test", "--beam", "2", "--cpu", "--source-lang", "en", "--target-lang", "fr")
    translated = int(re.search(r"Translated (\d+) sentences", result.stderr).group(1))
    assert translated > 0 and sum(line.startswith("H-") for line in result.stdout.splitlines()) == translated

    from fairseq.models.transformer import TransformerModel

    hub = TransformerModel.from_pretrained(str(toy["root"]), checkpoint_file=toy["converted"].name,
                                           data_name_or_path=data_bin, user_dir=PLUGIN_DIR,
                                           bpe="sentencepiece", sentencepiece_model=str(toy["data"] / "spm.model"))
    assert isinstance(hub.translate("The dog sees the house."), str)  # loads and runs: 3 updates make no translator
    assert type(hub.models[0]).__name__ == "MemAttnTransformerModel"

    from fairseq_memattn.models.transformer_memattn import MemAttnTransformerModel

    for checkpoint in (toy["converted"], toy["transformer"]):  # the plain transformer too, with fairseq's alignments
        hub = MemAttnTransformerModel.from_pretrained(str(checkpoint.parent), checkpoint_file=checkpoint.name,
                                                      data_name_or_path=data_bin)
        source = hub.encode("4 5 6")
        best = hub.generate(source, beam=2, print_alignment="hard")[0]
        # fairseq's hard alignment: (source, target) for each target token but EOS, the source's EOS left out
        assert [t for _, t in best["alignment"]] == list(range(len(best["tokens"]) - 1)), checkpoint
        assert all(0 <= s < len(source) - 1 for s, _ in best["alignment"]), checkpoint


@pytest.mark.slow
def test_the_export_loads_the_converted_model(toy, tmp_path):
    pytest.importorskip("onnxruntime")
    result = subprocess.run([sys.executable, "-m", "fairseq_memattn.export", str(toy["converted"]),
                             str(tmp_path / "onnx")], env=clean_env(OMP_NUM_THREADS="1"),
                            capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads((tmp_path / "onnx" / "config.json").read_text())["max_source_positions"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("how", ["restore", "finetune"])
def test_fairseq_train_fine_tunes_the_converted_model(toy, tmp_path, how):
    """--restore-file continues at the transformer's update count with its optimizer state;
    --finetune-from-model starts the count and the optimizer afresh."""
    start = ["--restore-file", str(toy["converted"])] if how == "restore" else [
        "--finetune-from-model", str(toy["converted"])]
    from recipes.bible import compare

    result = run_fairseq("fairseq-train", str(toy["data"] / "data-bin"), "--user-dir", PLUGIN_DIR,
                         "--task", "translation", "--source-lang", "en", "--target-lang", "fr",
                         *compare.SMALL_TRANSFORMER, *TINY_SIZES, "--arch", "transformer_memattn_iwslt_de_en",
                         "--memory-k", str(K), "--max-update", "5", *start, "--save-dir", str(tmp_path),
                         "--no-epoch-checkpoints", "--cpu")
    log = result.stdout + result.stderr
    assert f"@ {3 if how == 'restore' else 0} updates)" in log, log[-2000:]
    assert "num_updates 5" in log
    assert (tmp_path / "checkpoint_last.pt").is_file()


def test_the_recipe_trains_the_write_alone_to_each_total_on_its_way():
    """recipes.convert.run's fairseq-train runs, (total, write alone), for N = 2,000."""
    from argparse import Namespace

    from recipes.convert.run import stages

    def plan(fractions, write_only_updates):
        return stages(Namespace(fractions=fractions, write_only_updates=write_only_updates), 2000)

    assert plan([0.02, 0.05, 0.1], 0) == [(2040, False), (2100, False), (2200, False)]
    assert plan([0.02, 0.05, 0.1], 40) == [(2040, True), (2100, False), (2200, False)]
    assert plan([0.05, 0.1], 150) == [(2100, True), (2150, True), (2200, False)]
    assert plan([0.05, 0.1], 200) == [(2100, True), (2200, True)]


def recipe(*argv):
    """python -m recipes.convert.run, as a user runs it."""
    result = subprocess.run([sys.executable, "-m", "recipes.convert.run", *argv],
                            env=clean_env(), capture_output=True, text=True, cwd=REPO, timeout=1800)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result


@pytest.mark.slow
def test_recipe_converts_trains_and_reports_at_toy_size(toy, tmp_path):
    """N = 3 and one total, 5 = N + 0.67 N: the converted model fine-tuned (the write alone for one
    update first, then all parameters) and the scratch run, the report; re-running does nothing again.
    The plain converted and original runs are the conversion of test_bible_converge's two drivers."""
    work, out = tmp_path / "work", tmp_path / "results"
    common = ["--data", str(toy["data"]), "--source", str(toy["transformer"]), "--work", str(work),
              "--out", str(out), "--fractions", "0.67", "--long-length", "40"]
    recipe("convert", *common)
    for run in (["converted", "--write-only-updates", "1"], ["scratch"]):
        recipe("train", *run, *common, *TINY_SIZES)
    converted = torch.load(work / "converted.pt", weights_only=True)["model"]
    write_first = torch.load(work / "converted_write1" / "transformer_memattn_window" / "checkpoint_4.pt",
                             weights_only=True)["model"]
    for key, tensor in converted.items():
        assert torch.equal(write_first[key], tensor) != key.startswith(convert.WRITE_PREFIX), key
    for run in ("converted_write1", "scratch"):
        assert any((work / run).glob("*/checkpoint_5.pt")), run

    recipe("report", *common)
    table = (out / "table.md").read_text()
    for label in ("transformer (the source) | 3 | 0 |", "converted, before fine-tuning | 3 | 0 |",
                  "| converted_write1 | 5 | 2 |", "| scratch | 5 | 5 |"):
        assert label in table, table
    long_rows = table[table.index("Long inputs"):].splitlines()[-2:]
    assert [row.split("|")[1].strip() for row in long_rows] == ["transformer (the source)", "converted"]
    assert all(row.split("|")[4].strip().isdigit() for row in long_rows), long_rows  # output tokens counted

    logs = sorted(out.glob("*/*/train.log"))
    sizes = [log.stat().st_size for log in logs]
    recipe("train", "scratch", *common, *TINY_SIZES)
    recipe("report", *common)
    assert [log.stat().st_size for log in logs] == sizes and (out / "table.md").read_text() == table


@pytest.mark.slow
def test_write_start_recipe_measures_each_start_beside_the_converter(toy, tmp_path):
    """recipes.convert.write_start's table: the transformer and every start, on valid and on valid
    joined two by two; its nearest row is what fairseq-memattn-convert writes by default."""
    from recipes.convert import run as convert_run
    from recipes.convert import write_start

    result = subprocess.run([sys.executable, "-m", "recipes.convert.write_start", "--data", str(toy["data"]),
                             "--source", str(toy["transformer"]), "--out", str(tmp_path), "--group", "2"],
                            env=clean_env(), capture_output=True, text=True, cwd=REPO, timeout=1800)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [[cell.strip() for cell in line.strip("|").split("|")]
            for line in (tmp_path / "write_start.md").read_text().splitlines()
            if line.startswith("| ") and not line.startswith(("| write", "| ---"))]
    assert [row[0] for row in rows] == ["the transformer"] + [
        f"W_alpha {alpha}, w_k = {width:.2f} rows" for alpha, width in write_start.VARIANTS]
    assert all(float(cell) > 0 for row in rows for cell in row[1:])
    default = tmp_path / "default.pt"
    convert_cli.main([str(toy["transformer"]), str(default), "--memory-k", "64"])
    nearest = rows[1 + write_start.VARIANTS.index(("zero", convert.NEAREST_WIDTH))]
    assert nearest[1] == f"{convert_run.validation_loss(str(default), str(toy['data']))[0]:.3f}"


def recipe_refusal(main, capsys, *argv):
    """The error of a recipe's MAIN refusing ARGV (exit 2), without the program's name."""
    with pytest.raises(SystemExit) as stopped:
        main(list(argv))
    assert stopped.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1].split(": error: ", 1)[1]


def test_recipe_refuses_bad_options_before_any_work(toy, tmp_path, capsys):
    """Options neither the recipe nor fairseq-train knows, and numbers out of range, in one line
    before anything is converted, trained or evaluated."""
    from recipes.convert import run as convert_run

    work = tmp_path / "work"
    common = ["--data", str(toy["data"]), "--source", str(toy["transformer"]), "--work", str(work),
              "--out", str(tmp_path / "out")]
    (tmp_path / "binarized" / "data-bin").mkdir(parents=True)
    memory_arch = convert_run.compare.MODELS[convert_run.MEMORY][1]
    for step, options, message in [
        (["convert"], ["--memory-k", "16", "--long-lenght", "100"],
         f"unrecognized arguments: --long-lenght 100 (options this driver does not know go to fairseq-train "
         f"--arch {memory_arch})"),
        (["train", "original"], ["--memory-k", "16"], "unrecognized arguments: --memory-k 16 (options this driver "
         f"does not know go to fairseq-train --arch {convert_run.compare.MODELS[convert_run.ORIGINAL][1]})"),
        (["train", "converted"], ["--write-only-updates", "-50"],
         "argument --write-only-updates: invalid value -50 (must be an integer >= 0)"),
        (["train", "scratch"], ["--write-only-updates", "50"], "argument --write-only-updates: 50 trains the "
         "converted model's write alone first: give it to train converted only"),
        (["report"], ["--fractions", "-0.5"], "argument --fractions: invalid value -0.5 (must be a finite number > 0)"),
        (["report"], ["--fractions", "0.1", "0"],
         "argument --fractions: invalid value 0 (must be a finite number > 0)"),
        (["report"], ["--long-length", "1"], "argument --long-length: invalid value 1 (must be an integer >= 2)"),
        (["convert"], ["--source", str(tmp_path / "none.pt")],
         f"argument --source: {tmp_path / 'none.pt'}: no such file"),
        (["convert"], ["--data", str(tmp_path)], f"argument --data: {tmp_path}: no data-bin in it"),
        (["report"], ["--data", str(tmp_path / "binarized")],
         f"argument --data: {tmp_path / 'binarized'}: no ref/test.fr, bpe/test.en, bpe/test.fr in it"),
    ]:
        assert recipe_refusal(convert_run.main, capsys, *step, *common, *options) == message
    assert not work.exists()


def test_recipe_convert_stops_with_the_converters_own_error(toy, tmp_path, capfd):
    """A checkpoint the converter refuses: its one line and its exit status, no traceback."""
    from recipes.convert import run as convert_run

    with pytest.raises(SystemExit) as stopped:
        convert_run.main(["convert", "--data", str(toy["data"]), "--source", str(toy["converted"]),
                          "--work", str(tmp_path / "work")])
    assert stopped.value.code == 2
    error = capfd.readouterr().err
    assert error.strip().splitlines()[-1].startswith(
        f"fairseq-memattn-convert: error: {toy['converted']} is already a memory attention model")
    assert "Traceback" not in error and not (tmp_path / "work" / "converted.pt").exists()


def test_recipe_refuses_a_work_converted_from_another_source_or_with_other_options(toy, tmp_path, capsys):
    """WORK/converted.pt is kept only where it is the conversion of --source with the memory options
    given now: it holds every weight of its source and the options it was made with."""
    from recipes.convert import run as convert_run

    work = tmp_path / "work"
    work.mkdir()
    shutil.copyfile(toy["converted"], work / "converted.pt")  # K = 4
    common = ["--data", str(toy["data"]), "--work", str(work)]
    convert_run.main(["convert", *common, "--source", str(toy["transformer"]), "--memory-k", str(K)])
    assert capsys.readouterr().out == f"{work / 'converted.pt'}: converted already\n"

    other = save_variant(toy, tmp_path / "other.pt", dropout=0.2)  # the same model, other weights
    remove = f"give another --work, or remove {work / 'converted.pt'} and the runs trained from it"
    for step in (["convert"], ["train", "converted"], ["report"]):
        assert recipe_refusal(convert_run.main, capsys, *step, *common, "--source", str(other),
                              "--memory-k", str(K)) == (
            f"--work {work} holds a converted.pt made from another checkpoint than --source {other}: {remove}")
    assert recipe_refusal(convert_run.main, capsys, "convert", *common, "--source", str(toy["transformer"])) == (
        f"--work {work} holds a converted.pt made with --memory-k {K} (now 64): {remove}")


def test_write_start_refuses_in_one_line_before_measuring(toy, tmp_path, capsys):
    from recipes.convert import write_start

    common = ["--data", str(toy["data"]), "--source", str(toy["transformer"]), "--out", str(tmp_path / "out")]
    for argv, message in [
        (["--source", str(tmp_path / "none.pt")], f"argument --source: {tmp_path / 'none.pt'}: no such file"),
        (["--source", str(toy["converted"])], f"{toy['converted']} is already a memory attention model"),
        (["--data", str(tmp_path / "none")], f"argument --data: {tmp_path / 'none'}: no such folder"),
        (["--group", "1"], "argument --group: invalid value 1 (must be an integer >= 2)"),
        (["--group", "21"], "argument --group: 21 is more than the 20 sentences of the valid split"),
    ]:
        assert recipe_refusal(write_start.main, capsys, *common, *argv).startswith(message)
    assert not (tmp_path / "out").exists()
