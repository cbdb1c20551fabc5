"""fairseq's Transformer encoder followed by the write of the memory (Eq. 4-5)."""

import logging
from typing import Dict, List, Optional

import torch
from fairseq.models.transformer import TransformerEncoderBase
from torch import Tensor, nn

from ...modules.attention import AlignmentSwitch
from ...modules.beam_sharing import select_rows
from ...modules.memory import MemoryConfig, MemoryWrite
from ...modules.memory_reads import group_tensor

logger = logging.getLogger(__name__)


class MemAttnTransformerEncoder(AlignmentSwitch, TransformerEncoderBase):
    """fairseq's Transformer encoder followed by the write of Eq. 4-5.

    ``encoder_out`` is typed as fairseq's (``Dict[str, List[Tensor]]``):
      * ``memory``: [B x M x K x d], the M = 1 (shared) or decoder-layers
        (``--memory-per-layer``) memories C, memory m written by ``writers[m]``;
      * ``alpha``: [B x M x S x K], the write weights, in the layout of
        ``src_tokens``, only when alignments are kept (``keep_alignment``: by
        default in eval mode, in training only where guided alignment reads
        them; make_generation_fast_, i.e. ``--print-alignment`` or its absence,
        decides for fairseq-generate), else [];
      * ``group``: [a 1-element tensor], how many consecutive hypotheses share each row.
    """

    alignment_request: Optional[bool]

    def __init__(self, cfg, dictionary, embed_tokens):
        super().__init__(cfg, dictionary, embed_tokens)
        self.alignment_request = None  # an instance attribute, typed above, for TorchScript
        num_memories = cfg.decoder.layers if cfg.memory_per_layer else 1
        self.writers = nn.ModuleList(
            MemoryWrite(cfg.encoder.embed_dim, MemoryConfig.from_options(cfg)) for _ in range(num_memories)
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
                logger.warning(f"{prefix}window_log_width is not in the checkpoint: it was trained without "
                               f"--memory-position-window, and is loaded without it (training it on goes on "
                               f"without the window, whatever the command line says)")
                writer.window_log_width = None
        return super().upgrade_state_dict_named(state_dict, name)
