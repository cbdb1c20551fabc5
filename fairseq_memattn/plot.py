"""Attention figures from trained checkpoints: the paper's Figs. 6-8 (``fairseq-memattn-plot``,
``fairseq_memattn.cli.plot``, draws them from the command line).

Takes fairseq-generate's options (task and data, --path, --beam, ...), decodes one example of
--gen-subset (or a --sentence) with fairseq's SequenceGenerator and draws, with source tokens on
the y axis and hypothesis tokens on the x axis:

* the alignment: for memory attention beta x alpha^T, "we multiply the attention scores alpha
  and beta from the encoder and decoder" (Sec. 5; Figs. 6 and 8 right); for standard attention
  the attention matrix the model returns while decoding (Eq. 2);
* for memory attention, its two factors: the write weights alpha (S x K, Eq. 5) of each memory
  and the read's weights beta (K x T: Eq. 7 for the LSTM and the Transformer's mix read, a
  head's attention over the K rows, or their mean, for its attention read); which context C_k
  carries each cell, one colour per k, intensity the combined weight (Figs. 7 and 8 left); and
  one small panel per k with C_k's share beta_tk * alpha_sk (Eq. 4-7), which sum over k to the
  alignment.

A transformer_memattn decoder reads the memory in every layer: --layer and --head choose the
read plotted; by default the one fairseq's alignments use (the last layer, mean over heads).

Several checkpoints (--path a.pt:b.pt:...) are decoded one by one, not as an ensemble, and set
side by side (Fig. 6's four scoring functions). The file type follows --output's extension.
"""

import math
import os
from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np
import torch

from .modules.attention import MemoryAttention, NoAttention
from .modules.memory import MemoryWrite


CELL_INCHES = 0.2  # side of one token's cell in the main panels
MAIN_PANEL_INCHES = (2.5, 11.0)  # smallest and largest side of a main panel
CONTEXT_PANEL_INCHES = (1.1, 2.2)
FACTOR_PANEL_INCHES = (1.0, 3.0)  # K side of the alpha and read panels
CONTEXT_GRID_COLUMNS = 8


class PlotError(Exception):
    """Bad input found after the command line was parsed (reported argparse style)."""


@dataclass
class Alignment:
    """What is drawn for one checkpoint and one example."""

    label: str
    source: List[str]  # source tokens as the model saw them, </s> included
    target: List[str]  # best hypothesis, </s> included
    weights: np.ndarray  # S x T: the alignment (memory attention: beta alpha^T of the plotted read)
    contributions: Optional[np.ndarray] = None  # K x S x T: beta_tk * alpha_sk (memory attention)
    alphas: List[np.ndarray] = field(default_factory=list)  # per memory, S x K: the write (Eq. 5)
    read: Optional[np.ndarray] = None  # K x T: the plotted read's weights over the K rows (Eq. 7)
    read_name: str = ""  # which read is plotted, e.g. "layer 1 (last), mean of 4 heads"
    memory_index: int = 0  # which of ``alphas`` the plotted read reads


@dataclass
class ReadChoice:
    """--layer and --head: which Transformer read to plot (None: fairseq's alignment)."""

    layer: Optional[int] = None
    head: Optional[int] = None


# ---------------------------------------------------------------------------------------------
# Decoding


def attention_of(model):
    """The LSTM's attention module, or None for other fairseq models."""
    return getattr(getattr(model, "encoder", None), "attention", None)


def memory_writers(model) -> List[MemoryWrite]:
    """The modules that write the memories (Eq. 4-5): the LSTM's memory attention, or the
    Transformer encoder's writers (one, or one per decoder layer); [] for other models."""
    attention = attention_of(model)
    if isinstance(attention, MemoryAttention):
        return [attention.writer]
    writers = getattr(getattr(model, "encoder", None), "writers", None)
    return list(writers) if writers is not None else []


def is_memory_transformer(model) -> bool:
    return not isinstance(attention_of(model), MemoryAttention) and bool(memory_writers(model))


def describe(model, arch: Optional[str] = None) -> str:
    """A title for a model: its architecture, its attention and, for memory attention, K and
    the scores (LSTM) or the read (Transformer)."""
    name = arch or type(model).__name__
    attention = attention_of(model)
    if isinstance(attention, MemoryAttention):
        return (f"{name}: memory attention K={attention.writer.num_contexts}, "
                f"{attention.writer.encoder_score}/{attention.read.decoder_score} scores")
    writers = memory_writers(model)
    if writers:
        per_layer = f", {len(writers)} memories (one per layer)" if len(writers) > 1 else ""
        return (f"{name}: memory K={writers[0].num_contexts}, "
                f"{model.decoder.layers[0].encoder_attn.name} read{per_layer}")
    if attention is not None:
        return f"{name}: " + type(attention).__name__.replace("Attention", " attention").strip().lower()
    return name


def check_has_attention(model, path: str) -> None:
    if isinstance(attention_of(model), NoAttention):
        raise PlotError(
            f"{path}: this model has no attention to plot (--attention-type none, e.g. "
            f"--arch lstm_noatt); use a checkpoint trained with attention"
        )


def check_read_choice(model, path: str, choice: ReadChoice) -> None:
    """--layer / --head must name a read the model has (heads are checked once read)."""
    if choice.layer is None and choice.head is None:
        return
    if not is_memory_transformer(model):
        raise PlotError(f"--layer/--head choose a read of a transformer_memattn decoder layer; "
                        f"{path} has a single attention ({describe(model)})")
    layers = len(model.decoder.layers)
    if choice.layer is not None and not 0 <= choice.layer < layers:
        raise PlotError(f"--layer {choice.layer} is out of range: {path} has decoder layers "
                        f"0..{layers - 1}")


def teacher_forced_input(model, hypothesis: torch.Tensor) -> torch.Tensor:
    """The decoder's input for a hypothesis: EOS (fairseq's BOS) then the tokens but the last."""
    eos = hypothesis.new_full((1,), model.decoder.dictionary.eos())
    return torch.cat([eos, hypothesis[:-1]]).unsqueeze(0)


def capture_inputs(module, store: list, keyword: str):
    """A forward pre-hook appending the tensor ``module`` is called with (positional or
    ``keyword``) to ``store``; returns the handle."""
    def hook(_, args, kwargs):
        store.append(kwargs[keyword] if keyword in kwargs else args[0])
    return module.register_forward_pre_hook(hook, with_kwargs=True)


def memory_weights(model, net_input, hypothesis: torch.Tensor, choice: ReadChoice):
    """(alphas, read, memory index, read name) for one source and its hypothesis.

    One teacher-forced pass of the model (in eval mode the same as incremental decoding) over
    the hypothesis, with hooks catching what the memories are written from (the input of
    each W_alpha: the encoder's final states) and what the plotted read is queried with (the
    LSTM's decoder states on their way into W_beta; the Transformer layer's input to its
    encoder-attention). The weights are then recomputed from those with the model's own
    modules: alpha (S x K) and C by the write (Eq. 4-5), the read's weights (T x K) by Eq. 7
    (LSTM, mix read) or the layer's multi-head attention over the K rows of C.
    """
    writers = memory_writers(model)
    transformer = is_memory_transformer(model)
    layer = (len(model.decoder.layers) - 1 if choice.layer is None else choice.layer) if transformer else 0
    # The module the read's query goes into: the layer's read, or the LSTM's W_beta (Eq. 7).
    queried = model.decoder.layers[layer].encoder_attn if transformer else attention_of(model).read.W_beta
    states, queries = [[] for _ in writers], []
    hooks = [capture_inputs(writer.W_alpha, store, "input") for writer, store in zip(writers, states)]
    hooks.append(capture_inputs(queried, queries, "query" if transformer else "input"))
    try:
        encoder_out = model.encoder(net_input["src_tokens"], net_input["src_lengths"])
        model.decoder(teacher_forced_input(model, hypothesis), encoder_out)
    finally:
        for hook in hooks:
            hook.remove()
    written = []
    for writer, (source_states, *_) in zip(writers, states):
        no_padding = torch.zeros(source_states.shape[:2], dtype=torch.bool, device=source_states.device)
        written.append(writer.write(source_states, no_padding))  # (C, alpha): one example, no padding
    alphas = [alpha[0].float() for _, alpha in written]
    if not transformer:  # the LSTM's W_beta is called once per decoder step
        beta = attention_of(model).read.read_weights(torch.cat(queries, dim=1))[0]  # T x K (Eq. 7)
        return alphas, beta.float(), 0, ""
    memory_index = layer if len(writers) > 1 else 0  # --memory-per-layer: layer l reads memory l
    contexts = written[memory_index][0]
    query = queries[0].transpose(0, 1)  # T x 1 x D -> 1 x T x D
    _, weights = queried.read(query, queried.project_memory(contexts.to(query.dtype)))  # 1 x H x T x K
    heads = weights.size(1)
    if choice.head is not None and not 0 <= choice.head < heads:
        raise PlotError(f"--head {choice.head} is out of range: layer {layer}'s "
                        f"{queried.name} read has heads 0..{heads - 1}")
    last = " (last)" if layer == len(model.decoder.layers) - 1 else ""
    name = f"layer {layer}{last}"
    if heads > 1:
        name += f", mean of {heads} heads" if choice.head is None else f", head {choice.head} of 0..{heads - 1}"
    chosen = weights[0].mean(dim=0) if choice.head is None else weights[0, choice.head]
    return alphas, chosen.float(), memory_index, name


def decode(model, task, generation_cfg, sample, label: str,
           choice: Optional[ReadChoice] = None) -> Alignment:
    """Beam search as fairseq-generate runs it; the best hypothesis and its alignment."""
    generator = task.build_generator([model], generation_cfg)
    hypo = task.inference_step(generator, [model], sample)[0][0]
    src_dict, tgt_dict = task.source_dictionary, task.target_dictionary
    src_tokens = sample["net_input"]["src_tokens"][0]
    source = [src_dict[i] for i in src_tokens.tolist()]
    target = [tgt_dict[i] for i in hypo["tokens"].tolist()]
    if memory_writers(model):
        with torch.no_grad():
            alphas, read, memory_index, read_name = memory_weights(
                model, sample["net_input"], hypo["tokens"], choice or ReadChoice())
        alpha = alphas[memory_index]
        contributions = torch.einsum("sk,tk->kst", alpha, read)  # Sec. 5: beta alpha^T by k
        return Alignment(label, source, target, weights=contributions.sum(0).cpu().numpy(),
                         contributions=contributions.cpu().numpy(),
                         alphas=[a.cpu().numpy() for a in alphas], read=read.T.cpu().numpy(),
                         read_name=read_name, memory_index=memory_index)
    if hypo.get("attention") is None or hypo["attention"].numel() == 0:
        raise PlotError(f"{label}: the model returned no attention while decoding")
    return Alignment(label, source, target, weights=hypo["attention"].float().cpu().numpy())


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


def label_axis(ax, axis: str, tokens: List[str], name: str, max_ticks: int, fontsize=7) -> None:
    """Token (or context) ticks on one axis, every n-th one when there are more than max_ticks."""
    step = max(1, math.ceil(len(tokens) / max_ticks))
    positions = list(range(0, len(tokens), step))
    labels = [tokens[i] for i in positions]
    if axis == "x":
        ax.set_xticks(positions)
        ax.set_xticklabels(labels, fontsize=fontsize, rotation=90)
        ax.set_xlabel(name, fontsize=fontsize)
    else:
        ax.set_yticks(positions)
        ax.set_yticklabels(labels, fontsize=fontsize)
        ax.set_ylabel(name, fontsize=fontsize)
    ax.tick_params(length=2, pad=1)


def label_axes(ax, source: List[str], target: List[str], max_ticks: int, fontsize=7) -> None:
    label_axis(ax, "x", target, "hypothesis tokens", max_ticks, fontsize)
    label_axis(ax, "y", source, "source tokens", max_ticks, fontsize)


def context_names(num_contexts: int) -> List[str]:
    return [str(k + 1) for k in range(num_contexts)]


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


def factor_size(num_contexts: int) -> float:
    """Inches for the K side of the alpha and read panels."""
    return float(np.clip(num_contexts * CELL_INCHES, *FACTOR_PANEL_INCHES))


def alignment_title(alignment: Alignment) -> str:
    read = f" ({alignment.read_name})" if alignment.read_name else ""
    return r"alignment $\beta\alpha^\top$" + read


def draw_weights(fig, ax, weights: np.ndarray, gid: str, title: str) -> None:
    """A heat map of weights in [0, 1] (alpha, the read's weights)."""
    image = ax.imshow(weights, cmap="Greys", vmin=0.0, aspect="auto", interpolation="nearest")
    ax.set_gid(gid)
    ax.set_title(title, fontsize=8)
    fig.colorbar(image, ax=ax, fraction=0.05, pad=0.02).ax.tick_params(labelsize=6)


def draw_single_memory(alignment: Alignment, max_ticks: int):
    """Fig. 8's panels, laid out as the product they show: alpha of each memory (S x K, the
    write of Eq. 5) left of the alignment, the read's weights (K x T) above it, so that
    alignment = alpha x read; the dominant contexts right of it; the per-context grid below."""
    from matplotlib.figure import Figure

    width, height = panel_size(len(alignment.target)), panel_size(len(alignment.source))
    num_contexts = alignment.contributions.shape[0]
    num_memories = len(alignment.alphas)
    factor = factor_size(num_contexts)
    columns = min(num_contexts, CONTEXT_GRID_COLUMNS)
    small_width = float(np.clip(width / 3, *CONTEXT_PANEL_INCHES))
    small_height = float(np.clip(height / 3, *CONTEXT_PANEL_INCHES))
    top_height = factor + height + 2.4
    grid_height = math.ceil(num_contexts / columns) * (small_height + 0.35) + 0.3
    fig_width = max(num_memories * (factor + 1.4) + 2 * (width + 1.2), columns * (small_width + 0.2))
    fig = Figure(figsize=(fig_width, top_height + grid_height), layout="constrained")
    top, bottom = fig.subfigures(2, 1, height_ratios=[top_height, grid_height])
    grid = top.add_gridspec(2, num_memories + 2, height_ratios=[factor, height],
                            width_ratios=[factor] * num_memories + [width, width])
    contexts = context_names(num_contexts)
    for m, alpha in enumerate(alignment.alphas):
        ax = top.add_subplot(grid[1, m])
        which = f", memory {m}" if num_memories > 1 else ""
        plotted = " (read)" if num_memories > 1 and m == alignment.memory_index else ""
        draw_weights(top, ax, alpha, f"alpha-{m}", rf"write $\alpha${which}{plotted}")
        label_axis(ax, "x", contexts, "context k", max_ticks)
        label_axis(ax, "y", alignment.source, "source tokens" if m == 0 else "", max_ticks)
    ax = top.add_subplot(grid[0, num_memories])
    read_name = f": {alignment.read_name}" if alignment.read_name else ""
    draw_weights(top, ax, alignment.read, "read", rf"read $\beta${read_name}")
    label_axis(ax, "y", contexts, "context k", max_ticks)
    ax.set_xticks([])
    draw_alignment(top, top.add_subplot(grid[1, num_memories]), alignment, max_ticks,
                   alignment_title(alignment))
    draw_dominant_contexts(top, top.add_subplot(grid[1, num_memories + 1]), alignment, max_ticks,
                           r"dominant context $C_k$ per cell")
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
        kind = alignment_title(alignment) if is_memory else "attention weights"
        title = f"{alignment.label}\n{kind}"
        draw_alignment(fig, axes[0, column], alignment, max_ticks, title)
        if rows == 2 and is_memory:
            draw_dominant_contexts(fig, axes[1, column], alignment, max_ticks,
                                   r"dominant context $C_k$")
        elif rows == 2:
            axes[1, column].set_axis_off()
            axes[1, column].text(0.5, 0.5, "no memory contexts\n(attention over the states)",
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



if __name__ == "__main__":
    from .cli.plot import main

    main(prog="python -m fairseq_memattn.plot")
