"""The weights of the attention figures, captured from a checkpoint with torch: fairseq's beam
search decodes the example, one teacher-forced pass with hooks on the memory's modules gives what
alpha and the read's weights are recomputed from (``memory_weights``)."""

import logging
from dataclasses import dataclass
from typing import List, Optional

import torch

from ..errors import UserError
from ..modules.attention import MemoryAttention, NoAttention
from ..modules.memory import MemoryWrite
from .figure import Alignment

logger = logging.getLogger("fairseq_memattn.plot")


class PlotError(UserError):
    """Bad input found after the command line was parsed (reported argparse style)."""


@dataclass
class ReadChoice:
    """--layer and --head: which Transformer read to plot (None: fairseq's alignment)."""

    layer: Optional[int] = None
    head: Optional[int] = None


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
        read = (f"{attention.read_name} read" if attention.reads_content
                else f"{attention.read.decoder_score} read")
        return (f"{name}: memory attention K={attention.writer.num_contexts}, "
                f"{attention.writer.encoder_score} write, {read}")
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


def read_score(model, choice: ReadChoice) -> str:
    """The scoring function of the plotted read (Eq. 7); an attention read's is a softmax."""
    if is_memory_transformer(model):
        layer = len(model.decoder.layers) - 1 if choice.layer is None else choice.layer
        return getattr(model.decoder.layers[layer].encoder_attn, "decoder_score", "softmax")
    return getattr(attention_of(model).read, "decoder_score", "softmax")


def task_name(task_cfg) -> str:
    """A task and where its dictionaries come from, as its command line says it."""
    data = getattr(task_cfg, "data", None)
    return f"--task {task_cfg._name}" + (f" {data}" if data else "")


# Task options of the training run alone: the length limits of its batches (the plot filters
# nothing by length), its split and its validation (eval_*); other values plot the same.
TRAINING_ONLY = ("max_source_positions", "max_target_positions", "train_subset")


def changes_the_plot(key: str, task_cfg) -> bool:
    """Whether task option ``key`` can change the examples or tokens plotted."""
    if key == "max_source_positions" and task_cfg.get("truncate_source"):
        return True  # fairseq's translation cuts the source to it
    return key != "data" and key not in TRAINING_ONLY and not key.startswith("eval_")


def check_task(task_cfg, task, saved_task_cfg, path: str) -> None:
    """The task the plot runs against the one ``path`` was trained with: other options (e.g.
    --copy-test-size) make other examples, a warning; other dictionaries make other tokens of
    the same ids, an error naming both."""
    from fairseq import tasks

    if saved_task_cfg is None:
        return
    for key in task_cfg:
        if key in saved_task_cfg and changes_the_plot(key, task_cfg) and task_cfg[key] != saved_task_cfg[key]:
            option = "--task" if key == "_name" else "--" + key.replace("_", "-")
            logger.warning(f"{option} is {task_cfg[key]!r} here but was {saved_task_cfg[key]!r} "
                           f"when {path} was trained")
    try:
        saved_task = tasks.setup_task(saved_task_cfg)
    except (OSError, ValueError) as error:  # e.g. its data directory is gone: nothing to compare
        logger.info(f"{path}: the dictionaries it was trained with cannot be read ({error})")
        return
    for side in ("source", "target"):
        here = getattr(task, f"{side}_dictionary")
        there = getattr(saved_task, f"{side}_dictionary")
        if here is None or there is None or here.symbols == there.symbols:
            continue
        index = next((i for i, (a, b) in enumerate(zip(here.symbols, there.symbols)) if a != b),
                     min(len(here), len(there)))
        raise PlotError(
            f"{path} was trained with the {side} dictionary of {task_name(saved_task_cfg)} "
            f"({len(there)} symbols), not with that of {task_name(task_cfg)} ({len(here)} symbols; "
            f"symbol {index} is {symbol(there, index)} there, {symbol(here, index)} here): plot "
            f"with the task options and data it was trained with")


def symbol(dictionary, index: int) -> str:
    return repr(dictionary.symbols[index]) if index < len(dictionary) else "missing"


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


def capture_first_output(module, store: list):
    """A forward hook appending the first of ``module``'s outputs to ``store``; returns the handle."""
    def hook(_, args, output):
        store.append(output[0])
    return module.register_forward_hook(hook)


def memory_weights(model, net_input, hypothesis: torch.Tensor, choice: ReadChoice):
    """(alphas, read, memory index, read name) for one source and its hypothesis.

    One teacher-forced pass of the model (in eval mode the same as incremental decoding) over
    the hypothesis, with hooks catching what the memories are written from (the input of
    each W_alpha: the encoder's final states) and what the plotted read is queried with (the
    LSTM decoder's outputs, its read's queries; the Transformer layer's input to its
    encoder-attention). The weights are then recomputed from those with the model's own
    modules: alpha (S x K) and C by the write (Eq. 4-5), the read's weights (T x K) by the LSTM's
    read (Eq. 7, or its content attention over the K rows) or the layer's multi-head attention over them.
    """
    writers = memory_writers(model)
    transformer = is_memory_transformer(model)
    layer = (len(model.decoder.layers) - 1 if choice.layer is None else choice.layer) if transformer else 0
    states, queries = [[] for _ in writers], []
    hooks = [capture_inputs(writer.W_alpha, store, "input") for writer, store in zip(writers, states)]
    if transformer:  # the query of the layer's read
        queried = model.decoder.layers[layer].encoder_attn
        hooks.append(capture_inputs(queried, queries, "query"))
    else:  # the LSTM's outputs, which its read is queried with (with input feeding, one call a step)
        hooks.append(capture_first_output(model.decoder.lstm, queries))
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
    if not transformer:  # the LSTM's read is queried once per decoder step
        attention = attention_of(model)
        _, beta = attention.read_rows(attention.read_memory(written[0][0]), torch.cat(queries, dim=1))
        beta = beta[0]  # T x K
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


def check_length_range(generator, source_length: int) -> None:
    """The longest output fairseq's beam search allows for this source must not be shorter than
    --min-len (it asserts so); which options set it. Other generators are left alone."""
    if not hasattr(generator, "min_len"):
        return
    if generator.match_source_len:
        longest, limit, fix = source_length, "--match-source-len allows", ""
    else:
        by_options = int(generator.max_len_a * source_length + generator.max_len_b)
        longest = min(by_options, generator.max_len - 1)
        if by_options <= longest:
            limit, fix = (f"--max-len-a {generator.max_len_a:g} and --max-len-b {generator.max_len_b} allow",
                          " or raise --max-len-a/--max-len-b")
        else:
            limit, fix = f"the model's {generator.max_len} target positions allow", ""
    if generator.min_len > longest:
        raise PlotError(f"--min-len {generator.min_len} is more than the {longest} tokens {limit} for "
                        f"this source of {source_length} tokens (EOS included): lower --min-len{fix}")


def check_source_length(model, source_length: int, label: str) -> None:
    """A source the model can encode: fairseq-generate skips a longer one, fairseq-interactive refuses it."""
    limit = model.encoder.max_positions()
    if limit is not None and source_length > limit:
        raise PlotError(f"{label}: the source has {source_length} tokens (EOS included), more than the model's "
                        f"maximum of {limit}")


def decode(model, task, generation_cfg, sample, label: str,
           choice: Optional[ReadChoice] = None) -> Alignment:
    """Beam search as fairseq-generate runs it; the best hypothesis and its alignment."""
    source_length = sample["net_input"]["src_tokens"].size(1)
    check_source_length(model, source_length, label)
    generator = task.build_generator([model], generation_cfg)
    check_length_range(generator, source_length)
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
                         read_name=read_name, memory_index=memory_index,
                         write_score=memory_writers(model)[memory_index].encoder_score,
                         read_score=read_score(model, choice or ReadChoice()))
    if hypo.get("attention") is None or hypo["attention"].numel() == 0:
        raise PlotError(f"{label}: the model returned no attention while decoding")
    return Alignment(label, source, target, weights=hypo["attention"].float().cpu().numpy())

