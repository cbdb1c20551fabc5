"""Transformer whose decoder reads a fixed-size memory instead of the encoder states.

Built on fairseq's own Transformer (``TransformerEncoderBase``,
``TransformerDecoderBase``, ``TransformerDecoderLayerBase``); only two pieces
change:

* the encoder, after fairseq's layers, writes K attention contexts
  C (B x K x d) from its final states with the write of Sec. 3 (Eq. 4-5, with
  the position encodings of Eq. 8-10: ``modules/memory.MemoryWrite``), one memory
  for all decoder layers or one per layer (``--memory-per-layer``, a separate
  W_alpha each), and returns only that memory: never the |S| x d states;
* every decoder layer's encoder-attention is replaced by a *read* of the
  memory: ``--memory-read attention`` (fairseq's multi-head attention over the
  K rows) or ``--memory-read mix`` (the paper's Eq. 6-7, per layer); both in
  ``modules/memory_reads.py``.

Beam search. As in the LSTM model (``modules/beam_sharing.py``), ``encoder_out`` holds
one row per source, shared by the ``group`` consecutive hypotheses of that
source, and reordering moves whole rows only when a source finishes. What a
read derives from the memory (keys and values) is computed at the first
decoder step, once per source, kept in the incremental state and reordered
the same way: per step, neither recomputed nor copied. A source's hypotheses
are read as extra query steps of its one row. A step's cost is then O(K d)
per layer and hypothesis, whatever |S| is.
"""

import contextlib
import logging
import re
from typing import Dict, List, Optional

import torch
from fairseq.distributed import fsdp_wrap
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import (
    DEFAULT_MAX_SOURCE_POSITIONS,
    DEFAULT_MAX_TARGET_POSITIONS,
    TransformerConfig,
    TransformerDecoderBase,
    TransformerEncoderBase,
    TransformerModel,
)
from fairseq.models.transformer import base_architecture as transformer_base_architecture
from fairseq.models.transformer import transformer_iwslt_de_en
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase
from omegaconf import DictConfig, open_dict
from torch import Tensor, nn

from ..checkpoint_fit import RESHAPING_OPTIONS, checkpoint_misfit, differing, transformer_shape_options
from ..hub import MemAttnHubModel
from ..modules.attention import AlignmentSwitch, position_encoding_length
from ..modules.beam_sharing import select_rows
from ..modules.memory import MemoryWrite
from ..modules.memory_reads import READS, group_tensor
from ..modules.numerics import check_choice
from .memory_options import add_memory_args, fill_position_max_len, memory_defaults

logger = logging.getLogger(__name__)

READ_MODES = tuple(READS)


class MemAttnTransformerEncoder(AlignmentSwitch, TransformerEncoderBase):
    """fairseq's Transformer encoder followed by the write of Eq. 4-5.

    ``encoder_out`` is typed as fairseq's (``Dict[str, List[Tensor]]``):
      * ``memory``: [B x M x K x d], the M = 1 (shared) or decoder-layers
        (``--memory-per-layer``) memories C, memory m written by ``writers[m]``;
      * ``alpha``: [B x M x S x K], the write weights, in the layout of
        ``src_tokens``, only when alignments are kept (``keep_alignment``: by
        default in eval mode, never in training; make_generation_fast_, i.e.
        ``--print-alignment`` or its absence, decides for fairseq-generate),
        else [];
      * ``group``: [a 1-element tensor], how many consecutive hypotheses share each row.
    """

    alignment_request: Optional[bool]

    def __init__(self, cfg, dictionary, embed_tokens):
        super().__init__(cfg, dictionary, embed_tokens)
        self.alignment_request = None  # an instance attribute, typed above, for TorchScript
        num_memories = cfg.decoder.layers if cfg.memory_per_layer else 1
        self.writers = nn.ModuleList(
            MemoryWrite(cfg.encoder.embed_dim, cfg.memory_k, cfg.memory_encoder_score,
                        cfg.memory_encoder_normalize, position_encoding_length(cfg),
                        cfg.memory_position_window)
            for _ in range(num_memories)
        )

    def forward(self, src_tokens, src_lengths: Optional[Tensor] = None,
                return_all_hiddens: bool = False, token_embeddings: Optional[Tensor] = None):
        out = self.forward_scriptable(src_tokens, src_lengths, False, token_embeddings)
        states = out["encoder_out"][0].transpose(0, 1)  # S x B x d -> B x S x d
        padding_mask = out["encoder_padding_mask"][0]
        memories: List[Tensor] = []
        alphas: List[Tensor] = []
        for writer in self.writers:
            C, alpha = writer.write(states, padding_mask)
            memories.append(C)
            alphas.append(alpha)
        kept: List[Tensor] = [torch.stack(alphas, dim=1)] if self.keep_alignment else []
        return {"memory": [torch.stack(memories, dim=1)], "alpha": kept,
                "group": [group_tensor(1)]}

    @torch.jit.export
    def reorder_encoder_out(self, encoder_out: Dict[str, List[Tensor]], new_order):
        tensors = encoder_out["memory"] + encoder_out["alpha"]
        tensors, group = select_rows(tensors, new_order, int(encoder_out["group"][0]))
        return {"memory": tensors[:1], "alpha": tensors[1:], "group": [group_tensor(group)]}

    def max_positions(self):
        # fairseq filters or refuses longer sources, so none exceeds Eq. 10's S.
        covered = self.writers[0].position_encoding_max_len
        limit = super().max_positions()
        return limit if covered is None else min(limit, covered)

    @torch.jit.unused
    def make_generation_fast_(self, need_attn=False, **kwargs):
        # fairseq passes print_alignment itself, None when it is not given: that is a "no".
        self.keep_alignment = bool(need_attn)

    def upgrade_state_dict_named(self, state_dict, name):
        """A checkpoint saved before --memory-position-window was a default has
        no window widths and a config without the option: it was trained
        without the window, so its writers are loaded without one."""
        for index, writer in enumerate(self.writers):
            prefix = f"{name}.writers.{index}."
            if (writer.window_log_width is not None and prefix + "W_alpha.weight" in state_dict
                    and prefix + "window_log_width" not in state_dict):
                logger.info(f"{prefix}window_log_width is not in the checkpoint: it was trained "
                            f"without --memory-position-window, and is loaded without it")
                writer.window_log_width = None
        return super().upgrade_state_dict_named(state_dict, name)


class MemoryReadDecoderLayer(TransformerDecoderLayerBase):
    """fairseq's decoder layer with its encoder-attention replaced by a memory read.

    Its read returns alignments only when the decoder asks for them
    (``need_attn`` of forward: fairseq's ``alignment_layer``, the last by
    default), never for every layer in eval mode as fairseq's layers do: a
    read's alignment costs O(K |S|) per query, the read itself O(K d).
    """

    def __init__(self, cfg, memory_index: int):
        self.memory_index = memory_index  # read by build_encoder_attention during __init__
        super().__init__(cfg)
        self.need_attn = False

    def build_encoder_attention(self, embed_dim, cfg):
        return READS[cfg.memory_read].from_config(cfg, embed_dim, self.memory_index, self.quant_noise,
                                                  self.quant_noise_block_size)

    @torch.jit.unused
    def make_generation_fast_(self, need_attn: bool = False, **kwargs):
        self.need_attn = False  # the decoder asks its alignment layer (see above)


class MemAttnTransformerDecoder(TransformerDecoderBase):
    """fairseq's Transformer decoder over :class:`MemoryReadDecoderLayer` layers."""

    def __init__(self, cfg, dictionary, embed_tokens):
        self.layers_built = 0  # counts layers while fairseq builds them, for --memory-per-layer
        super().__init__(cfg, dictionary, embed_tokens)

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        memory_index = self.layers_built if cfg.memory_per_layer else 0
        self.layers_built += 1
        layer = MemoryReadDecoderLayer(cfg, memory_index)
        # as fairseq wraps its own layers
        if cfg.checkpoint_activations:
            layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
        return fsdp_wrap(layer, min_num_params=0 if cfg.checkpoint_activations else cfg.min_params_to_wrap)

    def extract_features(self, prev_output_tokens, encoder_out: Optional[Dict[str, List[Tensor]]],
                         incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
                         full_context_alignment: bool = False, alignment_layer: Optional[int] = None,
                         alignment_heads: Optional[int] = None):
        # fairseq's decoder passes encoder_out["encoder_out"][0] and
        # ["encoder_padding_mask"][0], if any, to every layer's encoder-attention:
        # here the memories and alpha (see MemoryRead), tensors, as activation
        # checkpointing needs them.
        layer_inputs: Optional[Dict[str, List[Tensor]]] = None
        if encoder_out is not None:
            layer_inputs = {"encoder_out": encoder_out["memory"], "encoder_padding_mask": encoder_out["alpha"]}
        return self.extract_features_scriptable(prev_output_tokens, layer_inputs, incremental_state,
                                                full_context_alignment, alignment_layer, alignment_heads)


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

    @classmethod
    def build_model(cls, args, task):
        base_architecture(args)
        check_memory_options(args)
        # fairseq's build_model fills these defaults in too, but only after S of
        # Eq. 10 must be read from the training pairs they keep.
        for name, default in (("max_source_positions", DEFAULT_MAX_SOURCE_POSITIONS),
                              ("max_target_positions", DEFAULT_MAX_TARGET_POSITIONS)):
            if getattr(args, name, None) is None:
                setattr(args, name, default)
        fill_position_max_len(args, task)
        return super().build_model(args, task)

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
        state_dict = keep_layers(state_dict, cfg, bool(getattr(cfg, "memory_per_layer", False)))
        differences = differing(transformer_shape_options(state_dict), transformer_shape_options(self.state_dict()))
        if differences.get("memory_position_window") == (False, True):
            del differences["memory_position_window"]  # inferred: see upgrade_state_dict_named
        if not strict:
            differences = {name: values for name, values in differences.items() if name in RESHAPING_OPTIONS}
        if differences:
            raise checkpoint_misfit(differences)
        return super().load_state_dict(state_dict, strict, model_cfg=None, args=None)

    @classmethod
    def build_encoder(cls, cfg, src_dict, embed_tokens):
        return MemAttnTransformerEncoder(TransformerConfig.from_namespace(cfg), src_dict, embed_tokens)

    @classmethod
    def build_decoder(cls, cfg, tgt_dict, embed_tokens):
        return MemAttnTransformerDecoder(TransformerConfig.from_namespace(cfg), tgt_dict, embed_tokens)


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
    check_choice("--memory-read", args.memory_read, READ_MODES)
    length = args.memory_position_max_len
    if length is not None and (not isinstance(length, int) or length < 1):
        raise ValueError(f"invalid --memory-position-max-len: {length!r} (must be an integer >= 1)")
    if args.cross_self_attention:
        raise ValueError("--cross-self-attention attends to the encoder states at every step; "
                         "memory attention reads only the K memory rows, so it cannot be combined")
    if args.no_cross_attention:
        raise ValueError("--no-cross-attention removes the decoder's only access to the source "
                         "memory; use fairseq's own transformer for that")


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


@register_model_architecture("memattn_transformer", "transformer_memattn_iwslt_de_en")
def iwslt_de_en_architecture(args):
    """fairseq's ``transformer_iwslt_de_en`` sizes with the memory of ``transformer_memattn``."""
    transformer_iwslt_de_en(args)
    base_architecture(args)
