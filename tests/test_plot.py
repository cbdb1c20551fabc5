"""The attention plot (paper Figs. 6-8) from checkpoints trained by fairseq-train: the image is
written and not blank, what it shows is the model's own alignment (and fairseq-generate's), and
bad input stops with a clear message and no image."""

import os
import math
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import PLUGIN_DIR, REPO

from fairseq_memattn import plot
from fairseq_memattn.cli import plot as plot_cli

BIN = os.path.dirname(sys.executable)
TASK = ["--task", "copy_task", "--copy-max-len", "6", "--copy-vocab-size", "8",
        "--copy-train-size", "1000", "--copy-valid-size", "20", "--copy-test-size", "20"]
SIZES = ["--encoder-hidden-size", "32", "--decoder-hidden-size", "32", "--encoder-embed-dim", "16",
         "--decoder-embed-dim", "16", "--dropout", "0"]
EXAMPLE = 3  # an example of the test split with a few tokens (checked below)


def environment():
    return {**os.environ, "PYTHONPATH": REPO}


TRANSFORMER_SIZES = ["--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
                     "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32",
                     "--encoder-layers", "1", "--decoder-layers", "2", "--encoder-attention-heads", "2",
                     "--decoder-attention-heads", "2", "--memory-k", "4", "--dropout", "0"]


def train(save_dir, arch, updates, *extra, sizes=SIZES):
    result = subprocess.run(
        [os.path.join(BIN, "fairseq-train"), "--user-dir", PLUGIN_DIR, *TASK, *sizes,
         "--arch", arch, *extra, "--optimizer", "adam", "--lr", "1e-2", "--clip-norm", "1",
         "--batch-size", "32", "--max-update", str(updates), "--seed", "1", "--cpu",
         "--no-progress-bar", "--no-epoch-checkpoints", "--no-last-checkpoints",
         "--save-dir", str(save_dir)],
        env=environment(), capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    return str(save_dir / "checkpoint_best.pt")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("plot")
    return {
        "memory": train(root / "memory", "lstm_memattn", 150, "--memory-k", "4"),
        "memory_attention_read": train(root / "memory_attention_read", "lstm_memattn", 60, "--memory-k", "4",
                                       "--memory-read", "attention"),
        "memory_general_read": train(root / "memory_general_read", "lstm_memattn", 60, "--memory-k", "4",
                                     "--memory-read", "general", "--input-feeding"),
        "additive": train(root / "additive", "lstm_att", 30),
        "none": train(root / "none", "lstm_noatt", 1),
        "transformer": train(root / "transformer", "transformer_memattn", 60,
                             sizes=TRANSFORMER_SIZES),
        "transformer_mix": train(root / "transformer_mix", "transformer_memattn", 30,
                                 "--memory-read", "mix", "--memory-per-layer",
                                 sizes=TRANSFORMER_SIZES),
    }


def plot_args(path, output, *extra):
    return ["--user-dir", PLUGIN_DIR, *TASK, "--path", path, "--gen-subset", "test",
            "--beam", "5", "--cpu", "--output", str(output), *extra]


def decode(path, *extra):
    """What the command decodes, in-process: one Alignment per checkpoint in ``path``."""
    return plot_cli.run(plot_cli.parse_args(plot_args(path, "unused.png", *extra)))


def axes_with_gid(fig, gid):
    return [ax for ax in fig.get_axes() if ax.get_gid() == gid]


@pytest.mark.slow
def test_command_writes_a_png_with_content(checkpoints, tmp_path):
    output = tmp_path / "figure.png"
    result = subprocess.run(
        [sys.executable, "-m", "fairseq_memattn.plot",
         *plot_args(checkpoints["memory"], output, "--example-id", str(EXAMPLE))],
        env=environment(), capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"wrote {output}" in result.stdout

    import matplotlib.image

    pixels = matplotlib.image.imread(output)[..., :3]  # H x W x RGB in [0, 1]
    assert pixels.shape[0] > 300 and pixels.shape[1] > 300
    not_white = (pixels < 0.9).any(axis=-1)
    coloured = pixels.max(axis=-1) - pixels.min(axis=-1) > 0.3  # the per-context colours
    assert 0.02 < not_white.mean() < 0.9, not_white.mean()
    assert coloured.sum() > 100
    assert [p for p in os.listdir(tmp_path) if p != "figure.png"] == []  # no temporary left


def teacher_forced_alignment(path, alignment):
    """The model's alignment for the plotted hypothesis, from its plain forward pass (T x S)."""
    from fairseq import checkpoint_utils

    models, _, task = checkpoint_utils.load_model_ensemble_and_task([path])
    model = models[0]
    model.make_generation_fast_(need_attn=True)
    d = task.source_dictionary
    src = torch.tensor([[d.index(t) for t in alignment.source]])
    hyp = [d.index(t) for t in alignment.target]
    prev = torch.tensor([[d.eos()] + hyp[:-1]])
    with torch.no_grad():
        encoder_out = model.encoder(src, torch.tensor([src.size(1)]))
        _, extra = model.decoder(prev, encoder_out)
    return extra["attn"][0][0].numpy(), encoder_out["memory"]["alpha"][0].numpy()


def soft_alignment_from_fairseq_generate(path, example_id):
    """fairseq-generate --print-alignment soft: T x S for one example of the test split."""
    result = subprocess.run(
        [os.path.join(BIN, "fairseq-generate"), "--user-dir", PLUGIN_DIR, *TASK, "--path", path,
         "--gen-subset", "test", "--beam", "5", "--batch-size", "1", "--cpu",
         "--print-alignment", "soft"],
        env=environment(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    line = re.search(rf"^A-{example_id}\t(.*)$", result.stdout, re.M).group(1)
    return np.array([[float(p) for p in row.split(",")] for row in line.split()])


@pytest.mark.slow
@pytest.mark.parametrize("model", ["memory", "memory_attention_read", "memory_general_read"])
def test_plotted_alignment_is_the_models_alignment(checkpoints, model):
    path = checkpoints[model]
    (alignment,) = decode(path, "--example-id", str(EXAMPLE))
    assert len(alignment.source) >= 3 and alignment.source[-1] == "</s>"
    fig = plot.draw([alignment])
    (ax,) = axes_with_gid(fig, "alignment")
    plotted = np.asarray(ax.images[0].get_array())  # S x T: source on y, hypothesis on x
    assert plotted.shape == (len(alignment.source), len(alignment.target))
    np.testing.assert_array_equal(plotted, alignment.weights)

    model_alignment, alpha = teacher_forced_alignment(path, alignment)
    np.testing.assert_allclose(plotted, model_alignment.T, atol=1e-5)
    np.testing.assert_allclose(plotted, soft_alignment_from_fairseq_generate(path, EXAMPLE).T,
                               atol=1e-4)

    # Each C_k's panel is beta_k * alpha_k: rank one, its source profile is the encoder's
    # alpha_k, the decoder's beta recovered from it is a softmax over k, and they sum to the
    # alignment (Sec. 5: beta x alpha^T).
    contributions = alignment.contributions
    assert contributions.shape == (4, *plotted.shape)
    np.testing.assert_allclose(contributions.sum(axis=0), plotted, atol=1e-5)
    strongest = alpha.argmax(axis=0)  # per context, the source position it weighs most
    beta = np.stack([contributions[k, strongest[k]] / alpha[strongest[k], k] for k in range(4)], 1)
    np.testing.assert_allclose(np.einsum("sk,tk->kst", alpha, beta), contributions, atol=1e-5)
    np.testing.assert_allclose(beta.sum(axis=1), 1.0, atol=1e-5)
    for k in range(4):
        np.testing.assert_array_equal(np.asarray(axes_with_gid(fig, f"context-{k + 1}")[0]
                                                 .images[0].get_array()), contributions[k])


def load_model(path):
    from fairseq import checkpoint_utils

    models, _, task = checkpoint_utils.load_model_ensemble_and_task([path])
    return models[0].eval(), task


def transformer_inputs(model, task, alignment, layer):
    """For the plotted example: the encoder's final states (fairseq's own encoder layers, S x d)
    and the input of decoder layer ``layer`` to its memory read (T x D)."""
    from fairseq.models.transformer import TransformerEncoderBase

    d = task.source_dictionary
    src = torch.tensor([[d.index(t) for t in alignment.source]])
    lengths = torch.tensor([src.size(1)])
    prev = torch.tensor([[d.eos()] + [d.index(t) for t in alignment.target[:-1]]])
    queries = []
    hook = model.decoder.layers[layer].encoder_attn.register_forward_pre_hook(
        lambda module, args, kwargs: queries.append(kwargs["query"]), with_kwargs=True)
    with torch.no_grad():
        states = TransformerEncoderBase.forward_scriptable(model.encoder, src, lengths)
        model.decoder(prev, model.encoder(src, lengths))
    hook.remove()
    return states["encoder_out"][0][:, 0].double().numpy(), queries[0][:, 0].double().numpy()


def softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def write_weights(writer, states):
    """alpha (S x K): Eq. 5's scores W_alpha s_t plus the position window, softmax over the
    writer's axis, written out with loops."""
    assert writer.encoder_score == "softmax" and writer.position_encoding_max_len is None
    weight = writer.W_alpha.weight.detach().double().numpy()
    length, contexts = len(states), writer.num_contexts
    scores = np.zeros((length, contexts))
    for s in range(length):
        for k in range(contexts):
            scores[s, k] = weight[k] @ states[s]
            if writer.window_log_width is not None:
                r, c = (s + 0.5) / length, (k + 0.5) / contexts
                width = math.exp(float(writer.window_log_width[k].detach()))
                scores[s, k] -= 0.5 * ((r - c) / width) ** 2
    return softmax(scores, axis=0 if writer.encoder_normalize == "time" else 1)


def attention_read_weights(read, contexts, query):
    """Each head's softmax(q_h k_h^T / sqrt(d_h)) over the K rows of C: H x T x K."""
    def project(linear, x):
        return x @ linear.weight.detach().double().numpy().T + linear.bias.detach().double().numpy()

    q, k = project(read.q_proj, query), project(read.k_proj, contexts)
    head_dim = q.shape[1] // read.num_heads
    return np.stack([softmax(q[:, h * head_dim:(h + 1) * head_dim] @ k[:, h * head_dim:(h + 1) * head_dim].T
                             / math.sqrt(head_dim), axis=1) for h in range(read.num_heads)])


def figure_texts(fig):
    from matplotlib.text import Text

    return [t.get_text() for t in fig.findobj(Text) if t.get_text()]


def image_of(fig, gid):
    (ax,) = axes_with_gid(fig, gid)
    return np.asarray(ax.images[0].get_array()), ax.get_title()


@pytest.mark.slow
@pytest.mark.parametrize("layer, head", [(None, None), (0, 1)])
def test_transformer_plot_shows_alpha_the_read_and_their_product(checkpoints, layer, head):
    path = checkpoints["transformer"]
    options = [] if layer is None else ["--layer", str(layer), "--head", str(head)]
    (alignment,) = decode(path, "--example-id", str(EXAMPLE), *options)
    fig = plot.draw([alignment])
    texts = figure_texts(fig)
    assert "transformer_memattn: memory K=4, attention read" in texts
    assert not any("standard attention" in t for t in texts)
    expected_read = "layer 1 (last), mean of 2 heads" if layer is None else "layer 0, head 1 of 0..1"
    alpha_shown, _ = image_of(fig, "alpha-0")
    read_shown, read_title = image_of(fig, "read")
    alignment_shown, alignment_title = image_of(fig, "alignment")
    assert expected_read in read_title and expected_read in alignment_title
    assert len(axes_with_gid(fig, "dominant-context")) == 1
    assert [len(axes_with_gid(fig, f"context-{k}")) for k in range(1, 6)] == [1, 1, 1, 1, 0]

    model, task = load_model(path)
    states, query = transformer_inputs(model, task, alignment, 1 if layer is None else layer)
    alpha = write_weights(model.encoder.writers[0], states)
    heads = attention_read_weights(model.decoder.layers[1 if layer is None else layer].encoder_attn,
                                   alpha.T @ states, query)
    read = heads.mean(axis=0) if head is None else heads[head]  # T x K
    np.testing.assert_allclose(alpha_shown, alpha, atol=1e-5)
    np.testing.assert_allclose(read_shown, read.T, atol=1e-5)
    np.testing.assert_allclose(alignment_shown, alpha @ read.T, atol=1e-5)  # Sec. 5: beta alpha^T
    np.testing.assert_allclose(alignment.contributions.sum(axis=0), alignment_shown, atol=1e-6)
    if layer is None:  # what the model itself returns as its alignment
        np.testing.assert_allclose(alignment_shown, soft_alignment_from_fairseq_generate(
            path, EXAMPLE).T, atol=1e-4)


@pytest.mark.slow
def test_transformer_mix_read_with_a_memory_per_layer(checkpoints, tmp_path):
    path = checkpoints["transformer_mix"]
    output = tmp_path / "figure.png"
    result = subprocess.run(
        [sys.executable, "-m", "fairseq_memattn.plot",
         *plot_args(path, output, "--example-id", str(EXAMPLE), "--layer", "0")],
        env=environment(), capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "transformer_memattn: memory K=4, mix read, 2 memories (one per layer)" in result.stdout
    assert output.stat().st_size > 10000

    (alignment,) = decode(path, "--example-id", str(EXAMPLE), "--layer", "0")
    fig = plot.draw([alignment])
    model, task = load_model(path)
    states, query = transformer_inputs(model, task, alignment, 0)
    for m in range(2):
        alpha_shown, title = image_of(fig, f"alpha-{m}")
        np.testing.assert_allclose(alpha_shown, write_weights(model.encoder.writers[m], states),
                                   atol=1e-5)
        assert title.endswith("(read)") == (m == 0)
    W_beta = model.decoder.layers[0].encoder_attn.W_beta.weight.detach().double().numpy()
    beta = softmax(query @ W_beta.T, axis=1)  # Eq. 7, T x K
    read_shown, read_title = image_of(fig, "read")
    assert read_title.endswith("layer 0")
    np.testing.assert_allclose(read_shown, beta.T, atol=1e-5)
    np.testing.assert_allclose(image_of(fig, "alignment")[0], image_of(fig, "alpha-0")[0] @ beta.T,
                               atol=1e-5)


@pytest.mark.slow
def test_comparison_side_by_side_and_sentence_input(checkpoints, tmp_path):
    both = f"{checkpoints['memory']}:{checkpoints['additive']}"
    alignments = decode(both, "--sentence", "1 2 3 4", "--labels", "memory,standard")
    assert [a.label for a in alignments] == ["memory", "standard"]
    assert all(a.source == ["1", "2", "3", "4", "</s>"] for a in alignments)
    assert alignments[0].contributions is not None and alignments[1].contributions is None
    np.testing.assert_allclose(alignments[1].weights.sum(axis=0), 1.0, atol=1e-5)  # softmax, Eq. 2

    fig = plot.draw(alignments)
    panels = axes_with_gid(fig, "alignment")
    assert [ax.get_title().split("\n")[0] for ax in panels] == ["memory", "standard"]
    for ax, alignment in zip(panels, alignments):
        np.testing.assert_array_equal(np.asarray(ax.images[0].get_array()), alignment.weights)
    assert len(axes_with_gid(fig, "dominant-context")) == 1  # only memory attention has C_k

    for name, magic in (("figure.svg", b"<?xml"), ("figure.pdf", b"%PDF")):
        plot.save(fig, str(tmp_path / name), dpi=72)
        assert (tmp_path / name).read_bytes().startswith(magic)


def test_long_sequences_thin_the_ticks_and_bound_the_size():
    rng = np.random.default_rng(0)
    source, target = [f"s{i}" for i in range(150)], [f"t{i}" for i in range(170)]
    alpha, read = rng.random((150, 32)), rng.random((32, 170))
    contributions = np.einsum("sk,kt->kst", alpha, read)
    alignment = plot.Alignment("long", source, target, contributions.sum(axis=0), contributions,
                               alphas=[alpha], read=read)
    fig = plot.draw([alignment], max_ticks=30)
    width, height = fig.get_size_inches()
    main_panels = 2 * (plot.MAIN_PANEL_INCHES[1] + 1.2)
    assert width <= main_panels + plot.FACTOR_PANEL_INCHES[1] + 1.4 and height < 30
    (ax,) = axes_with_gid(fig, "alignment")
    assert 25 <= len(ax.get_xticks()) <= 30 and 25 <= len(ax.get_yticks()) <= 30
    assert ax.get_xticklabels()[1].get_text() == "t6"  # every 6th of 170 tokens
    assert len([a for a in fig.get_axes() if (a.get_gid() or "").startswith("context-")]) == 32
    (ax,) = axes_with_gid(fig, "alpha-0")
    assert len(ax.get_xticks()) == 16 and len(ax.get_yticks()) == 30  # 32 contexts, 150 tokens


@pytest.mark.slow
@pytest.mark.parametrize("case, expected", [
    ("missing", "checkpoint not found"),
    ("folder", "is a folder with no .pt file"),
    ("out_of_range", "--example-id 20 is out of range for --gen-subset 'test', which has "
                     "examples 0..19"),
    ("negative", "--example-id -1 is out of range"),
    ("no_attention", "has no attention to plot"),
    ("bad_extension", "unknown image type 'bmpx'"),
    ("layer_out_of_range", "--layer 2 is out of range: "),
    ("head_out_of_range", "--head 2 is out of range: layer 1's attention read has heads 0..1"),
    ("layer_of_an_lstm", "--layer/--head choose a read of a transformer_memattn decoder layer"),
    ("zero_dpi", "argument --dpi: invalid value 0 (must be an integer >= 1)"),
    ("huge_dpi", "invalid --dpi: 100000 (must be <= 1200)"),
    ("zero_beam", "invalid --beam: 0 (must be an integer >= 1)"),
    ("max_len_below_min_len_option", "invalid --max-len-b: 3 (must be >= --min-len 4)"),
    ("negative_max_len_a", "invalid --max-len-a: -1 (must be a finite number >= 0)"),
    ("nan_max_len_a", "invalid --max-len-a: nan (must be a finite number >= 0)"),
    ("negative_min_len", "invalid --min-len: -2 (must be a finite number >= 0)"),
    ("top_k_without_sampling", "--sampling-topk 5 samples: give --sampling too, or leave it out"),
    ("zero_temperature", "invalid --temperature: 0.0 (must be a finite number > 0)"),
    ("nan_unkpen", "invalid --unkpen: nan (must be a number, inf to ban <unk>)"),
    ("groups_not_dividing_the_beam", "invalid --diverse-beam-groups: 3 (must be a divisor of --beam 5, or -1 for none)"),
    ("prefix", "--prefix-size: not taken by fairseq-memattn-plot, which plots the search's best hypothesis"),
    ("constraints", "--constraints: not taken by fairseq-memattn-plot"),
    ("overrides", "invalid --model-overrides: '{bad' (must be a Python dict, e.g."),
    # 0.1 x the source's at most 7 tokens rounds down to 0: fairseq asserted min_len <= max_len
    ("max_len_below_min_len", "--min-len 1 is more than the 0 tokens --max-len-a 0.1 and --max-len-b 0 "
                              "allow for this source of "),
    ("output_folder", "is a folder: give the image's file name in it"),
    ("output_in_a_file", "--output '/dev/null/figure.png': /dev/null is a file, not a folder"),
])
def test_bad_input_gives_a_clear_message_and_no_image(checkpoints, tmp_path, capsys, case,
                                                      expected):
    output = tmp_path / ("figure.bmpx" if case == "bad_extension" else "figure.png")
    if case == "output_folder":
        output.mkdir()
    elif case == "output_in_a_file":
        output = "/dev/null/figure.png"
    path = {"missing": str(tmp_path / "nope.pt"), "folder": str(tmp_path), "no_attention": checkpoints["none"],
            "layer_out_of_range": checkpoints["transformer"],
            "head_out_of_range": checkpoints["transformer"]}.get(case, checkpoints["memory"])
    example = {"out_of_range": "20", "negative": "-1"}.get(case, "0")
    read = {"layer_out_of_range": ["--layer", "2"], "head_out_of_range": ["--head", "2"],
            "layer_of_an_lstm": ["--layer", "0"], "zero_dpi": ["--dpi", "0"], "huge_dpi": ["--dpi", "100000"], "zero_beam": ["--beam", "0"],
            "max_len_below_min_len_option": ["--min-len", "4", "--max-len-b", "3"],
            "negative_max_len_a": ["--max-len-a", "-1"],
            "nan_max_len_a": ["--max-len-a", "nan"], 
            "negative_min_len": ["--min-len", "-2"], "zero_temperature": ["--temperature", "0"],
            "top_k_without_sampling": ["--sampling-topk", "5"],
            "nan_unkpen": ["--unkpen", "nan"], "groups_not_dividing_the_beam": ["--beam", "5", "--diverse-beam-groups", "3"],
            "prefix": ["--prefix-size", "1"], "constraints": ["--constraints"], "overrides": ["--model-overrides", "{bad"],
            "max_len_below_min_len": ["--max-len-a", "0.1", "--max-len-b", "0"]}.get(case, [])
    with pytest.raises(SystemExit) as exit_info:
        plot_cli.main(plot_args(path, output, "--example-id", example, *read))
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert f"{plot_cli.PROG}: error: " in error and expected in error, error
    assert "Traceback" not in error
    assert os.listdir(tmp_path) == (["figure.png"] if case == "output_folder" else [])


def test_sigmoid_weights_are_labelled_unnormalised():
    rng = np.random.default_rng(0)
    alpha, read = rng.random((5, 4)), rng.random((4, 6))
    contributions = np.einsum("sk,kt->kst", alpha, read)
    labels = {}
    for write_score, read_score in (("softmax", "softmax"), ("sigmoid", "softmax"), ("softmax", "sigmoid")):
        alignment = plot.Alignment("m", list("abcde"), list("uvwxyz"), contributions.sum(axis=0),
                                   contributions, alphas=[alpha], read=read,
                                   write_score=write_score, read_score=read_score)
        fig = plot.draw([alignment])
        # each heat map's colour bar is the axes matplotlib adds beside it
        labels[write_score, read_score] = {gid: fig.get_axes()[fig.get_axes().index(ax) + 1].get_ylabel()
                                           for gid in ("alpha-0", "read", "alignment")
                                           for ax in axes_with_gid(fig, gid)}
    unnormalised = "unnormalised (sigmoid scores)"
    assert labels["softmax", "softmax"] == {"alpha-0": "", "read": "", "alignment": ""}
    assert labels["sigmoid", "softmax"] == {"alpha-0": unnormalised, "read": "", "alignment": unnormalised}
    assert labels["softmax", "sigmoid"] == {"alpha-0": "", "read": unnormalised, "alignment": unnormalised}


def task_of(*options):
    """The task config and task fairseq-memattn-plot builds from these task options."""
    from fairseq import tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    args = plot_cli.parse_args(["--user-dir", PLUGIN_DIR, *options, "--path", "unused.pt",
                                "--example-id", "0", "-o", "unused.png"])
    cfg = convert_namespace_to_omegaconf(args).task
    return cfg, tasks.setup_task(cfg)


def plot_warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "fairseq_memattn.plot" and r.levelname == "WARNING"]


def test_other_task_options_warn_by_their_names(caplog):
    trained, _ = task_of(*TASK)
    cfg, task = task_of(*TASK[:-1], "30")  # another --copy-test-size: other test examples
    with caplog.at_level("WARNING", logger="fairseq_memattn.plot"):
        plot.check_task(cfg, task, trained, "model.pt")
    assert plot_warnings(caplog) == ["--copy-test-size is 30 here but was 20 when model.pt was trained"]


def translation_data(data, symbols=tuple(str(s) for s in range(8))):
    """A translation task's data folder src-tgt with these symbols (the copy task's by default)
    and no split yet; returns the task options."""
    data.mkdir()
    for side in ("src", "tgt"):
        (data / f"dict.{side}.txt").write_text("".join(f"{s} 1\n" for s in symbols))
    return ["--task", "translation", str(data), "--source-lang", "src", "--target-lang", "tgt"]


def test_other_dictionaries_are_an_error_naming_both(tmp_path, caplog):
    """The copy task's data written out and binarized has the same symbols in another order
    (fairseq-preprocess sorts them by count), so the model would load and plot other tokens."""
    data = tmp_path / "data-bin"
    translation = translation_data(data, [str(s) for s in range(8)][::-1])
    trained, _ = task_of(*TASK)
    cfg, task = task_of(*translation)
    assert len(task.source_dictionary) == 12  # 8 symbols and fairseq's 4 specials, as the copy task's
    with pytest.raises(plot.PlotError) as error, caplog.at_level("WARNING", logger="fairseq_memattn.plot"):
        plot.check_task(cfg, task, trained, "model.pt")
    assert str(error.value) == (
        f"model.pt was trained with the source dictionary of --task copy_task (12 symbols), not with "
        f"that of --task translation {data} (12 symbols; symbol 4 is '0' there, '7' here): plot with "
        f"the task options and data it was trained with")
    assert "--task is 'translation' here but was 'copy_task' when model.pt was trained" in plot_warnings(caplog)
    assert not any("---" in message for message in plot_warnings(caplog))
    plot.check_task(trained, task_of(*TASK)[1], trained, "model.pt")  # the same dictionaries: no error


@pytest.mark.slow
def test_a_source_longer_than_the_model_takes_is_one_line(checkpoints):
    """fairseq-interactive and the translator refuse a source beyond the encoder's positions; so does the plot
    (a --sentence as long as the user likes), before decoding."""
    from fairseq import checkpoint_utils

    model = checkpoint_utils.load_model_ensemble([checkpoints["transformer"]])[0][0]
    limit = model.encoder.max_positions()
    plot.check_source_length(model, limit, "transformer")
    with pytest.raises(plot.PlotError) as error:
        plot.check_source_length(model, limit + 1, "transformer")
    assert str(error.value) == (f"transformer: the source has {limit + 1} tokens (EOS included), more than the "
                                f"model's maximum of {limit}")


def test_options_of_the_training_run_alone_do_not_warn(tmp_path, caplog):
    """Length limits and validation options the model was trained with (as the Bible recipes'
    --max-source-positions 256) change nothing the plot shows: no warning about the defaults the
    plot's own command line left them at. With --truncate-source the limit cuts the source."""
    translation = translation_data(tmp_path / "data-bin")
    trained, _ = task_of(*translation, "--max-source-positions", "256", "--max-target-positions", "256",
                         "--eval-bleu", "--eval-bleu-print-samples", "--train-subset", "bible")
    cfg, task = task_of(*translation)
    with caplog.at_level("WARNING", logger="fairseq_memattn.plot"):
        plot.check_task(cfg, task, trained, "model.pt")
        assert plot_warnings(caplog) == []
        truncated, _ = task_of(*translation, "--truncate-source", "--max-source-positions", "256")
        cfg, task = task_of(*translation, "--truncate-source")
        plot.check_task(cfg, task, truncated, "model.pt")
    assert plot_warnings(caplog) == ["--max-source-positions is 1024 here but was 256 when model.pt was trained"]


def test_a_missing_split_is_named_with_its_folder_and_the_splits_there(tmp_path, capsys):
    """fairseq's "Dataset not found: nope (FOLDER)" is an OSError without a file name."""
    data = tmp_path / "data-bin"
    translation = translation_data(data)
    for name in ("train.src-tgt.src", "valid.tgt-src.src", "test.de-en.de"):  # test: another pair's
        for extension in ("idx", "bin"):
            (data / f"{name}.{extension}").touch()
    model = tmp_path / "model.pt"
    model.touch()  # not read: the split is looked up first
    with pytest.raises(SystemExit) as exit_info:
        plot_cli.main(["--user-dir", PLUGIN_DIR, *translation, "--path", str(model), "--gen-subset", "nope",
                       "--example-id", "0", "-o", str(tmp_path / "figure.png")])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"{plot_cli.PROG}: error: --gen-subset 'nope': no such split in {data} (splits there: train, valid)")


def test_a_data_folder_that_does_not_tell_the_language_pair_is_one_line(tmp_path, capsys):
    """Only the dictionaries and no --source-lang/--target-lang: fairseq's bare Exception."""
    data = tmp_path / "data-bin"
    task_options = translation_data(data)[:3]
    model = tmp_path / "model.pt"
    model.touch()  # not read: the task is set up first
    with pytest.raises(SystemExit) as exit_info:
        plot_cli.main(["--user-dir", PLUGIN_DIR, *task_options, "--path", str(model), "--example-id", "0",
                       "-o", str(tmp_path / "figure.png")])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"{plot_cli.PROG}: error: {data} has no fairseq-preprocess output (train.SRC-TGT.SRC.idx) to tell the "
        "language pair from; pass --source-lang and --target-lang")


@pytest.mark.slow
def test_user_dir_naming_another_copy_of_the_package(tmp_path):
    """From the repository root after a non-editable install, --user-dir fairseq_memattn names
    the repository's copy while the command runs from site-packages: here a link to the package
    stands for the other copy."""
    (tmp_path / "fairseq_memattn").symlink_to(PLUGIN_DIR)
    result = subprocess.run(
        [os.path.join(BIN, "fairseq-memattn-plot"), "--user-dir", "fairseq_memattn", *TASK, "--path",
         "missing.pt", "--example-id", "0", "-o", "x.png"],
        env=environment(), capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert "not globally unique" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == \
        "fairseq-memattn-plot: error: --path: checkpoint not found: missing.pt", result.stderr[-2000:]
