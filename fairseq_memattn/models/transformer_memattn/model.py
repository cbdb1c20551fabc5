"""The ``memattn_transformer`` model, its checks and its architectures."""

import argparse
import contextlib
import logging
import re

from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY, register_model, register_model_architecture
from fairseq.models.transformer import (
    DEFAULT_MAX_SOURCE_POSITIONS,
    DEFAULT_MAX_TARGET_POSITIONS,
    TransformerConfig,
    TransformerModel,
)
from fairseq.models.transformer import base_architecture as transformer_base_architecture
from omegaconf import DictConfig, OmegaConf, open_dict

from ...checkpoint_fit import (RESHAPING_OPTIONS, check_family, checkpoint_misfit, differing,
                               parameters_said_by_name, transformer_shape_options)
from ...errors import UserError
from ...hub import MemAttnHubModel
from ...modules.memory_reads import READS
from ...modules.numerics import check_choice
from ..memory_options import (add_memory_args, check_alignment_distribution, check_all_embeddings_shared,
                              fill_position_max_len, memory_defaults, trains_alignment,
                              warn_ignored_decoder_score)
from .decoder import MemAttnTransformerDecoder
from .encoder import MemAttnTransformerEncoder

logger = logging.getLogger(__name__)

READ_MODES = tuple(READS)
WRITE_PREFIX = "encoder.writers."  # the parameters of the write (Eq. 4-5)


@register_model("memattn_transformer")
class MemAttnTransformerModel(MemAttnHubModel, TransformerModel):
    """fairseq's Transformer with fixed-size memory attention (Sec. 3)."""

    @classmethod
    def hub_models(cls):
        return {}  # fairseq's pretrained Transformers are not memory models

    @property
    def alignment_switch(self):
        return self.encoder  # it keeps alpha, which the reads' alignments need

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        add_memory_args(parser)
        parser.add_argument("--memory-read", choices=READ_MODES,
                            help="how each decoder layer reads the K memory rows: multi-head "
                                 "attention over them, or the paper's mix c = beta C (Eq. 6-7)")
        parser.add_argument("--memory-per-layer", action="store_true",
                            help="write one memory per decoder layer (a W_alpha each) "
                                 "instead of one shared by all layers")
        parser.add_argument("--memory-train-write-only", action="store_true",
                            help="train only the write (Eq. 4-5), e.g. first when fine-tuning a converted "
                                 "transformer: the other parameters' gradients are dropped, so the optimizer "
                                 "leaves them as they are while its state keeps the layout of a full run")

    @classmethod
    def build_model(cls, args, task):
        with open_dict(args) if isinstance(args, DictConfig) else contextlib.nullcontext():
            fill_options(args, task)  # into fairseq-hydra-train's config too: its checkpoints keep them
        if isinstance(args, DictConfig):
            # fairseq's Transformer keeps the options it has no field for (ours) only from a Namespace
            args = argparse.Namespace(**OmegaConf.to_container(args, resolve=True))
        model = super().build_model(args, task)
        if trains_alignment(args, task):
            model.alignment_switch.keep_alignment = True  # in training too: the criterion's loss reads them
        if getattr(args, "memory_train_write_only", False):
            for name, parameter in model.named_parameters():
                if not name.startswith(WRITE_PREFIX):
                    parameter.register_post_accumulate_grad_hook(drop_gradient)
        return model

    def load_state_dict(self, state_dict, strict=True, model_cfg=None, args=None):
        """fairseq's, with the pruning of --encoder-layers-to-keep and
        --decoder-layers-to-keep done here (fairseq's prune_state_dict, which
        is then skipped, renumbers the decoder's layers but not the writers of
        --memory-per-layer, and given only one of the two options drops the
        other side's layers): each kept decoder layer keeps its own writer.
        A checkpoint that does not fit stops with the options that differ
        (``checkpoint_fit``); with ``strict=False`` only those that change a
        parameter's shape (torch's non-strict load still refuses those, and
        allows missing and unexpected parameters)."""
        cfg = model_cfg if model_cfg is not None else args
        check_family(state_dict, self.state_dict())
        state_dict = keep_layers(state_dict, cfg, bool(getattr(cfg, "memory_per_layer", False)))
        differences = differing(transformer_shape_options(state_dict), transformer_shape_options(self.state_dict()))
        if differences.get("memory_position_window") == (False, True):
            del differences["memory_position_window"]  # inferred: see upgrade_state_dict_named
        if not strict:
            differences = {name: values for name, values in differences.items() if name in RESHAPING_OPTIONS}
        if differences:
            raise checkpoint_misfit(differences)
        with parameters_said_by_name():
            return super().load_state_dict(state_dict, strict, model_cfg=None, args=None)

    @classmethod
    def build_encoder(cls, cfg, src_dict, embed_tokens):
        return MemAttnTransformerEncoder(TransformerConfig.from_namespace(cfg), src_dict, embed_tokens)

    @classmethod
    def build_decoder(cls, cfg, tgt_dict, embed_tokens):
        return MemAttnTransformerDecoder(TransformerConfig.from_namespace(cfg), tgt_dict, embed_tokens)


def fill_options(args, task):
    """The architecture's defaults, checked, and the positions and S of Eq. 10 filled in: fairseq's
    build_model fills its position defaults too, but only after S must be read from the training
    pairs they keep. A criterion that trains the alignment (fairseq's only one that reads the decoder's
    attention) needs beta x alpha^T to be each target token's distribution over the source."""
    base_architecture(args)
    check_memory_options(args)
    check_all_embeddings_shared(args, task)
    if trains_alignment(args, task):
        check_alignment_distribution(args)
    for name, default in (("max_source_positions", DEFAULT_MAX_SOURCE_POSITIONS),
                          ("max_target_positions", DEFAULT_MAX_TARGET_POSITIONS)):
        if getattr(args, name, None) is None:
            setattr(args, name, default)
    fill_position_max_len(args, task)


def drop_gradient(parameter):
    parameter.grad = None  # fairseq's optimizers skip a parameter without a gradient


def keep_layers(state_dict, cfg, writers_follow_decoder: bool):
    """The state dict of the layers that ``cfg``'s *_layers_to_keep keep, renumbered
    from 0 in their order, as fairseq builds the pruned model; with
    ``writers_follow_decoder`` (--memory-per-layer) writer N goes with
    decoder layer N. Like fairseq's prune_state_dict, it clears the options
    in ``cfg`` afterwards: the state is pruned."""
    prunings = []
    for option, prefixes in (("encoder_layers_to_keep", ["encoder.layers"]),
                             ("decoder_layers_to_keep", ["decoder.layers"] + ["encoder.writers"] * writers_follow_decoder)):
        kept = getattr(cfg, option, None) if cfg is not None else None
        if kept:
            numbers = sorted(int(n) for n in (kept.split(",") if isinstance(kept, str) else kept))
            prunings += [(prefix, numbers) for prefix in prefixes]
    if not prunings:
        return state_dict
    logger.info("pruning the checkpoint to the kept layers: " + ", ".join(
        f"{prefix} {numbers}" for prefix, numbers in prunings))
    pruned = {}
    for name, tensor in state_dict.items():
        for prefix, numbers in prunings:
            match = re.match(re.escape(prefix) + r"\.(\d+)\.(.*)", name)
            if match:
                if int(match.group(1)) in numbers:
                    pruned[f"{prefix}.{numbers.index(int(match.group(1)))}.{match.group(2)}"] = tensor
                break
        else:
            pruned[name] = tensor
    with open_dict(cfg) if isinstance(cfg, DictConfig) else contextlib.nullcontext():
        for option in ("encoder_layers_to_keep", "decoder_layers_to_keep"):
            if hasattr(cfg, option):
                setattr(cfg, option, None)
    return pruned


def check_memory_options(args):
    """Clear errors, naming the value, for options the model cannot honour."""
    check_choice("--memory-read", args.memory_read, READ_MODES)  # the memory's own: MemoryConfig
    if args.cross_self_attention:
        raise UserError("--cross-self-attention attends to the encoder states at every step; "
                         "memory attention reads only the K memory rows, so it cannot be combined")
    if args.no_cross_attention:
        raise UserError("--no-cross-attention removes the decoder's only access to the source "
                         "memory; use fairseq's own transformer for that")
    # fairseq's FP16Optimizer: --fp16 or --bf16 without their memory-efficient variant
    fp32_copies = (any(getattr(args, name, False) for name in ("fp16", "bf16"))
                   and not any(getattr(args, name, False) for name in ("memory_efficient_fp16", "memory_efficient_bf16")))
    if getattr(args, "memory_train_write_only", False) and fp32_copies:
        raise UserError("--memory-train-write-only drops the other parameters' gradients, but fairseq's optimizer "
                        "for --fp16 and --bf16 gives a dropped gradient as zeros, which the optimizer's moments and "
                        "weight decay still turn into steps: use --memory-efficient-fp16 (or "
                        "--memory-efficient-bf16, or --amp)")
    warn_ignored_decoder_score(args)


@register_model_architecture("memattn_transformer", "transformer_memattn")
def base_architecture(args):
    """fairseq's ``transformer`` (transformer base) with a K = 64 memory, written
    with the softmax over time (each C_k a weighted average of the states),
    without the position encodings of Eq. 9-10, and, for the attention read, with
    the position window (``memory.window_scores``).

    Why these differ from the paper's LSTM setting: Eq. 9 scales the write's
    logits by l_s, about 1/|x|, so the memory starts near the mean of the
    states, and fairseq's encoder already encodes positions; the window starts
    each context on its own stretch of the source, which helps a read that
    addresses the rows by content (attention), not one that addresses them by
    position (mix). Measurements: docs/transformer.md, "Why these defaults"."""
    args.memory_read = getattr(args, "memory_read", "attention")
    memory_defaults(args, memory_k=64, position_encoding=False, encoder_normalize="time",
                    position_window=args.memory_read == "attention")
    args.memory_per_layer = getattr(args, "memory_per_layer", False)
    transformer_base_architecture(args)


def memory_architecture(fairseq_arch: str) -> str:
    """The memory version's name of fairseq's --arch transformer_SUFFIX: transformer_memattn_SUFFIX."""
    return "transformer_memattn" + fairseq_arch[len("transformer"):]


def fairseq_sized(name: str, sizes):
    """Registers ``memory_architecture(name)`` for fairseq's --arch ``name``: its sizes (``sizes``,
    fairseq's own architecture function) with the memory of ``transformer_memattn``."""
    def architecture(args):
        sizes(args)
        base_architecture(args)

    architecture.__doc__ = f"fairseq's ``{name}`` sizes with the memory of ``transformer_memattn``."
    return register_model_architecture("memattn_transformer", memory_architecture(name))(architecture)


# Every named size of fairseq's transformer (transformer_wmt_en_de_big, ...), so that a recipe
# switches by its --arch alone and a converted checkpoint keeps its architecture's name.
FAIRSEQ_SIZES = [name for name, model in ARCH_MODEL_REGISTRY.items()
                 if model is TransformerModel and name.startswith("transformer_")]
for _name in FAIRSEQ_SIZES:
    fairseq_sized(_name, ARCH_CONFIG_REGISTRY[_name])
iwslt_de_en_architecture = ARCH_CONFIG_REGISTRY["transformer_memattn_iwslt_de_en"]
