"""fairseq's Transformer decoder whose layers read the memory instead of the encoder states."""

from typing import Dict, List, Optional

import torch
from fairseq.distributed import fsdp_wrap
from fairseq.models.transformer import TransformerDecoderBase
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase
from torch import Tensor

from ...modules.memory_reads import READS


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
