"""Attention figures from trained checkpoints: the paper's Figs. 6-8.

    python -m fairseq_memattn.plot --user-dir fairseq_memattn --task copy_task --copy-max-len 20 \\
        --path ckpt/checkpoint_best.pt --gen-subset test --example-id 3 --min-len 0 \\
        --output attention.png

Takes fairseq-generate's options (task and data, --path, --beam, ...), decodes one example of
--gen-subset (or a --sentence) with fairseq's SequenceGenerator and draws, with source tokens on
the y axis and hypothesis tokens on the x axis:

* the alignment the model returns while decoding: for memory attention beta x alpha^T, "we
  multiply the attention scores alpha and beta from the encoder and decoder" (Sec. 5; Figs. 6
  and 8 right); for standard attention its attention matrix (Eq. 2);
* for memory attention, which context C_k carries each cell, one colour per k, intensity the
  combined weight (Figs. 7 and 8 left), and one small panel per k with C_k's share
  beta_tk * alpha_sk (Eq. 4-7), which sum over k to the alignment.

Several checkpoints (--path a.pt:b.pt:...) are decoded one by one, not as an ensemble, and set
side by side (Fig. 6's four scoring functions). The file type follows --output's extension.
"""

import logging
import math
import os
import sys
import warnings
from dataclasses import dataclass
from typing import List, Optional

import numpy as np
import torch

from .modules.attention import MemoryAttention, NoAttention

logger = logging.getLogger("fairseq_memattn.plot")

PROG = "python -m fairseq_memattn.plot"
CELL_INCHES = 0.2  # side of one token's cell in the main panels
MAIN_PANEL_INCHES = (2.5, 11.0)  # smallest and largest side of a main panel
CONTEXT_PANEL_INCHES = (1.1, 2.2)
CONTEXT_GRID_COLUMNS = 8


class PlotError(Exception):
    """Bad input found after the command line was parsed (reported argparse style)."""


@dataclass
class Alignment:
    """What is drawn for one checkpoint and one example."""

    label: str
    source: List[str]  # source tokens as the model saw them, </s> included
    target: List[str]  # best hypothesis, </s> included
    weights: np.ndarray  # S x T: the model's alignment, returned during beam search
    contributions: Optional[np.ndarray] = None  # K x S x T: beta_tk * alpha_sk (memory attention)


# ---------------------------------------------------------------------------------------------
# Decoding


def attention_of(model):
    """The plugin's attention module, or None for other fairseq models."""
    return getattr(getattr(model, "encoder", None), "attention", None)


def describe(model) -> str:
    """A short title for a model: its attention and, for memory attention, K and the scores."""
    attention = attention_of(model)
    if isinstance(attention, MemoryAttention):
        return (f"memory attention K={attention.num_contexts}, "
                f"{attention.encoder_score}/{attention.decoder_score}")
    if attention is not None:
        return type(attention).__name__.replace("Attention", " attention").strip().lower()
    return type(model).__name__


def check_has_attention(model, path: str) -> None:
    if isinstance(attention_of(model), NoAttention):
        raise PlotError(
            f"{path}: this model has no attention to plot (--attention-type none, e.g. "
            f"--arch lstm_noatt); use a checkpoint trained with attention"
        )


def memory_contributions(model, net_input, hypothesis: torch.Tensor) -> np.ndarray:
    """beta_tk * alpha_sk for the given hypothesis: K x S x T.

    alpha (Eq. 5) comes from the encoder's memory (kept because need_attn is on); beta (Eq. 7)
    from the decoder states of a teacher-forced pass over the hypothesis, caught on their way
    into W_beta. In eval mode this pass equals incremental decoding step by step.
    """
    attention: MemoryAttention = model.encoder.attention
    eos = hypothesis.new_full((1,), model.decoder.dictionary.eos())
    prev_output_tokens = torch.cat([eos, hypothesis[:-1]]).unsqueeze(0)
    queries = []
    hook = attention.W_beta.register_forward_hook(lambda _, inputs, __: queries.append(inputs[0]))
    try:
        encoder_out = model.encoder(net_input["src_tokens"], net_input["src_lengths"])
        model.decoder(prev_output_tokens, encoder_out)
    finally:
        hook.remove()
    alpha = encoder_out["memory"]["alpha"][0]  # S x K
    beta = attention.decoder_scores(torch.cat(queries, dim=1))[0]  # T x K
    return torch.einsum("sk,tk->kst", alpha, beta).float().cpu().numpy()


def decode(model, task, generation_cfg, sample, label: str) -> Alignment:
    """Beam search as fairseq-generate runs it; the best hypothesis and its alignment."""
    generator = task.build_generator([model], generation_cfg)
    hypo = task.inference_step(generator, [model], sample)[0][0]
    if hypo.get("attention") is None or hypo["attention"].numel() == 0:
        raise PlotError(f"{label}: the model returned no attention while decoding")
    src_dict, tgt_dict = task.source_dictionary, task.target_dictionary
    src_tokens = sample["net_input"]["src_tokens"][0]
    alignment = Alignment(
        label=label,
        source=[src_dict[i] for i in src_tokens.tolist()],
        target=[tgt_dict[i] for i in hypo["tokens"].tolist()],
        weights=hypo["attention"].float().cpu().numpy(),
    )
    if isinstance(attention_of(model), MemoryAttention):
        with torch.no_grad():
            alignment.contributions = memory_contributions(
                model, sample["net_input"], hypo["tokens"])
    return alignment


# ---------------------------------------------------------------------------------------------
# Drawing


def context_colours(num_contexts: int) -> np.ndarray:
    """K distinct RGB colours: tab10, or beyond 10 hues spread by the golden ratio so that
    neighbouring contexts (often on neighbouring tokens) never look alike."""
    from matplotlib import colormaps
    from matplotlib.colors import hsv_to_rgb

    if num_contexts <= 10:
        return np.array([colormaps["tab10"](k)[:3] for k in range(num_contexts)])
    k = np.arange(num_contexts)
    hue, saturation, value = (k * 0.618034) % 1.0, np.full(num_contexts, 0.75), 0.95 - 0.3 * (k % 2)
    hsv = np.stack([hue, saturation, value], axis=1)
    return hsv_to_rgb(hsv)


def dominant_context_image(contributions: np.ndarray, colours: np.ndarray) -> np.ndarray:
    """S x T x 3: each cell in the colour of its largest C_k, faded to white by the combined
    weight (relative to the largest), as in Figs. 7 and 8 (left)."""
    combined = contributions.sum(axis=0)
    strength = combined / max(float(combined.max()), 1e-12)
    colour = colours[contributions.argmax(axis=0)]
    return 1.0 - strength[..., None] * (1.0 - colour)


def label_axes(ax, source: List[str], target: List[str], max_ticks: int, fontsize=7) -> None:
    """Token ticks, every n-th one when there are more than max_ticks."""
    for tokens, set_ticks, set_labels, rotation in (
        (target, ax.set_xticks, ax.set_xticklabels, 90),
        (source, ax.set_yticks, ax.set_yticklabels, 0),
    ):
        step = max(1, math.ceil(len(tokens) / max_ticks))
        positions = list(range(0, len(tokens), step))
        set_ticks(positions)
        set_labels([tokens[i] for i in positions], fontsize=fontsize, rotation=rotation)
    ax.tick_params(length=2, pad=1)
    ax.set_xlabel("hypothesis tokens", fontsize=fontsize)
    ax.set_ylabel("source tokens", fontsize=fontsize)


def panel_size(length: int) -> float:
    """Inches for a main panel's side showing ``length`` tokens."""
    return float(np.clip(length * CELL_INCHES, *MAIN_PANEL_INCHES))


def draw_alignment(fig, ax, alignment: Alignment, max_ticks: int, title: str) -> None:
    weights = alignment.weights
    if weights.min() < 0:  # unnormalised weights (linear attention) can be negative
        bound = float(np.abs(weights).max())
        image = ax.imshow(weights, cmap="RdBu_r", vmin=-bound, vmax=bound, aspect="auto",
                          interpolation="nearest")
    else:
        image = ax.imshow(weights, cmap="Greys", vmin=0.0, aspect="auto", interpolation="nearest")
    ax.set_gid("alignment")  # found by the tests, and the group's id in SVG output
    label_axes(ax, alignment.source, alignment.target, max_ticks)
    ax.set_title(title, fontsize=8)
    fig.colorbar(image, ax=ax, fraction=0.05, pad=0.02).ax.tick_params(labelsize=6)


def draw_dominant_contexts(fig, ax, alignment: Alignment, max_ticks: int, title: str) -> None:
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import BoundaryNorm, ListedColormap

    num_contexts = alignment.contributions.shape[0]
    colours = context_colours(num_contexts)
    ax.imshow(dominant_context_image(alignment.contributions, colours), aspect="auto",
              interpolation="nearest")
    ax.set_gid("dominant-context")
    label_axes(ax, alignment.source, alignment.target, max_ticks)
    ax.set_title(title, fontsize=8)
    legend = ScalarMappable(norm=BoundaryNorm(np.arange(num_contexts + 1) + 0.5, num_contexts),
                            cmap=ListedColormap(colours))
    colorbar = fig.colorbar(legend, ax=ax, fraction=0.05, pad=0.02)
    step = max(1, math.ceil(num_contexts / 16))
    colorbar.set_ticks(np.arange(1, num_contexts + 1, step))
    colorbar.ax.tick_params(labelsize=6)
    colorbar.set_label("context k", fontsize=7)


def draw_context_grid(subfig, alignment: Alignment, aspect: float) -> None:
    """One small panel per C_k: beta_tk * alpha_sk, all on one colour scale (Fig. 8 left)."""
    from matplotlib.colors import LinearSegmentedColormap

    contributions = alignment.contributions
    num_contexts = contributions.shape[0]
    columns = min(num_contexts, CONTEXT_GRID_COLUMNS)
    axes = np.atleast_1d(subfig.subplots(math.ceil(num_contexts / columns), columns)).ravel()
    colours = context_colours(num_contexts)
    vmax = max(float(contributions.max()), 1e-12)
    for k, ax in enumerate(axes):
        if k >= num_contexts:
            ax.set_axis_off()
            continue
        cmap = LinearSegmentedColormap.from_list(f"C{k + 1}", [(1, 1, 1), colours[k]])
        ax.imshow(contributions[k], cmap=cmap, vmin=0.0, vmax=vmax, aspect="auto",
                  interpolation="nearest")
        ax.set_box_aspect(aspect)  # the main panels' shape, however wide the figure is
        ax.set_gid(f"context-{k + 1}")
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_title(f"$C_{{{k + 1}}}$", fontsize=7, pad=2)
    subfig.suptitle(r"each context's share $\beta_{tk}\,\alpha_{sk}$ (common scale)", fontsize=8)


def draw_single_memory(alignment: Alignment, max_ticks: int):
    """Fig. 8's layout: dominant contexts left, alignment right, the per-context grid below."""
    from matplotlib.figure import Figure

    width, height = panel_size(len(alignment.target)), panel_size(len(alignment.source))
    num_contexts = alignment.contributions.shape[0]
    columns = min(num_contexts, CONTEXT_GRID_COLUMNS)
    small_width = float(np.clip(width / 3, *CONTEXT_PANEL_INCHES))
    small_height = float(np.clip(height / 3, *CONTEXT_PANEL_INCHES))
    top_height = height + 1.4
    grid_height = math.ceil(num_contexts / columns) * (small_height + 0.35) + 0.3
    fig_width = max(2 * (width + 1.2), columns * (small_width + 0.2))
    fig = Figure(figsize=(fig_width, top_height + grid_height), layout="constrained")
    top, bottom = fig.subfigures(2, 1, height_ratios=[top_height, grid_height])
    left, right = top.subplots(1, 2)
    draw_dominant_contexts(top, left, alignment, max_ticks, r"dominant context $C_k$ per cell")
    draw_alignment(top, right, alignment, max_ticks, r"alignment $\beta\alpha^\top$")
    top.suptitle(alignment.label, fontsize=9)
    draw_context_grid(bottom, alignment, aspect=small_height / small_width)
    return fig


def draw_columns(alignments: List[Alignment], max_ticks: int):
    """One column per checkpoint (Fig. 6): alignments on top, dominant contexts below for the
    memory-attention ones."""
    from matplotlib.figure import Figure

    rows = 2 if any(a.contributions is not None for a in alignments) else 1
    widths = [panel_size(len(a.target)) + 1.2 for a in alignments]
    height = panel_size(max(len(a.source) for a in alignments)) + 1.4
    fig = Figure(figsize=(sum(widths), rows * height), layout="constrained")
    axes = fig.subplots(rows, len(alignments), width_ratios=widths, squeeze=False)
    for column, alignment in enumerate(alignments):
        is_memory = alignment.contributions is not None
        kind = "alignment $\\beta\\alpha^\\top$" if is_memory else "attention weights"
        title = f"{alignment.label}\n{kind}"
        draw_alignment(fig, axes[0, column], alignment, max_ticks, title)
        if rows == 2 and is_memory:
            draw_dominant_contexts(fig, axes[1, column], alignment, max_ticks,
                                   r"dominant context $C_k$")
        elif rows == 2:
            axes[1, column].set_axis_off()
            axes[1, column].text(0.5, 0.5, "no memory contexts\n(standard attention)",
                                 ha="center", va="center", fontsize=8, color="0.4")
    return fig


def draw(alignments: List[Alignment], max_ticks: int = 40):
    """The figure (a matplotlib Figure, not yet saved): Fig. 8's layout for one memory-attention
    checkpoint, otherwise one column per checkpoint."""
    if len(alignments) == 1 and alignments[0].contributions is not None:
        return draw_single_memory(alignments[0], max_ticks)
    return draw_columns(alignments, max_ticks)


def save(fig, path: str, dpi: int) -> None:
    """Write via a temporary file so that a failure never leaves a partial image behind."""
    directory, name = os.path.split(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    # Same directory (os.replace stays atomic), same extension (savefig picks the format by it).
    tmp = os.path.join(directory, f".{os.getpid()}.partial.{name}")
    try:
        fig.savefig(tmp, dpi=dpi)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


# ---------------------------------------------------------------------------------------------
# Command line


def build_parser():
    from fairseq import options

    parser = options.get_generation_parser(default_task="translation")
    parser.prog = PROG
    group = parser.add_argument_group("Plot (fairseq_memattn.plot)")
    which = group.add_mutually_exclusive_group(required=True)
    which.add_argument("--example-id", type=int, metavar="N",
                       help="plot example N of --gen-subset (as in fairseq-generate's S-N lines)")
    which.add_argument("--sentence", metavar="TEXT",
                       help="plot this source sentence instead (tokenised and BPE-encoded like "
                            "fairseq-interactive does)")
    group.add_argument("--output", "-o", required=True, metavar="FILE",
                       help="image to write; its extension chooses the format (png, svg, pdf, ...)")
    group.add_argument("--labels", metavar="A,B,...",
                       help="column titles, one per --path checkpoint (default: from each model)")
    group.add_argument("--max-ticks", type=int, default=40, metavar="N",
                       help="label at most N tokens per axis (every n-th beyond that)")
    group.add_argument("--dpi", type=int, default=150, metavar="N")
    return parser


def supported_formats():
    from matplotlib.figure import Figure

    return sorted(Figure().canvas.get_supported_filetypes())


def check_arguments(args, paths: List[str]) -> List[str]:
    """Everything that can be checked before loading a model; returns the column labels."""
    extension = os.path.splitext(args.output)[1].lstrip(".").lower()
    if extension not in supported_formats():
        raise PlotError(f"--output {args.output!r}: unknown image type {extension!r} "
                        f"(choose from {', '.join(supported_formats())})")
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        raise PlotError(f"--path: checkpoint not found: {', '.join(missing)}")
    if args.max_ticks < 1:
        raise PlotError(f"invalid --max-ticks: {args.max_ticks} (must be >= 1)")
    if args.labels is None:
        return [None] * len(paths)
    labels = args.labels.split(",")
    if len(labels) != len(paths):
        raise PlotError(f"--labels gives {len(labels)} labels for {len(paths)} checkpoints "
                        f"in --path")
    return labels


def warn_task_mismatch(task_cfg, saved_task_cfg, path: str) -> None:
    """A task generated from other options (e.g. --copy-test-size) has other examples."""
    if saved_task_cfg is None:
        return
    for key in task_cfg:
        if key in saved_task_cfg and key != "data" and task_cfg[key] != saved_task_cfg[key]:
            logger.warning(f"--{key.replace('_', '-')} is {task_cfg[key]!r} here but was "
                           f"{saved_task_cfg[key]!r} when {path} was trained")


def load_sample(cfg, args, task):
    """A one-example batch: example --example-id of --gen-subset, or --sentence encoded."""
    if args.sentence is not None:
        tokenizer, bpe = task.build_tokenizer(cfg.tokenizer), task.build_bpe(cfg.bpe)
        text = args.sentence
        for encoder in (tokenizer, bpe):
            text = encoder.encode(text) if encoder is not None else text
        tokens = task.source_dictionary.encode_line(text, add_if_not_exist=False).long()
        if (tokens == task.source_dictionary.unk()).any():
            logger.warning("--sentence has tokens outside the source dictionary; shown as <unk>")
        dataset, index = task.build_dataset_for_inference([tokens], [tokens.numel()]), 0
    else:
        subset = cfg.dataset.gen_subset
        task.load_dataset(subset)
        dataset, index = task.dataset(subset), args.example_id
        if not 0 <= index < len(dataset):
            raise PlotError(f"--example-id {index} is out of range for --gen-subset {subset!r}, "
                            f"which has examples 0..{len(dataset) - 1}")
    return dataset.collater([dataset[index]])


def run(args) -> List[Alignment]:
    """Load, check and decode every checkpoint; nothing is drawn before all of them worked."""
    import ast

    from fairseq import checkpoint_utils, tasks, utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    with warnings.catch_warnings():  # hydra deprecation notices about fairseq's own configs
        warnings.simplefilter("ignore", UserWarning)
        cfg = convert_namespace_to_omegaconf(args)
    paths = utils.split_paths(cfg.common_eval.path) if cfg.common_eval.path else []
    if not paths:
        raise PlotError("--path: give the checkpoint(s) to plot")
    labels = check_arguments(args, paths)
    use_cuda = torch.cuda.is_available() and not cfg.common.cpu
    task = tasks.setup_task(cfg.task)
    sample = load_sample(cfg, args, task)
    if use_cuda:
        sample = utils.move_to_cuda(sample)

    alignments = []
    for path, label in zip(paths, labels):
        models, saved_cfg = checkpoint_utils.load_model_ensemble(
            [path], arg_overrides=ast.literal_eval(cfg.common_eval.model_overrides), task=task)
        model = models[0]
        warn_task_mismatch(cfg.task, getattr(saved_cfg, "task", None), path)
        check_has_attention(model, path)
        if use_cuda:
            model.cuda()
        model.make_generation_fast_(need_attn=True)  # what --print-alignment does
        alignments.append(decode(model, task, cfg.generation, sample, label or describe(model)))
    return alignments


def parse_args(argv=None):
    """fairseq's own parsing: --user-dir, the task's and the generation options, and ours."""
    from fairseq import options

    return options.parse_args_and_arch(build_parser(), argv)


def main(argv=None):
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s",
                        level=os.environ.get("LOGLEVEL", "WARNING").upper(), stream=sys.stderr,
                        force=True)  # some fairseq modules set DEBUG on import
    args = parse_args(argv)
    try:
        alignments = run(args)
    except PlotError as error:
        # argparse's format, without the usage: fairseq's parser has hundreds of options.
        print(f"{PROG}: error: {error}", file=sys.stderr)
        sys.exit(2)
    save(draw(alignments, args.max_ticks), args.output, args.dpi)
    for alignment in alignments:
        print(alignment.label)
        print(f"  S: {' '.join(alignment.source)}\n  H: {' '.join(alignment.target)}")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
