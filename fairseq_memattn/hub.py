"""fairseq's hub interface for this plugin's models, with alignments on request.

``MemAttnLSTMModel.from_pretrained`` returns a :class:`MemAttnHubInterface`, a
fairseq ``GeneratorHubInterface`` (``translate``, ``sample``, ``generate``,
``encode``, ``decode``) that differs in one point: ``generate(...,
print_alignment="hard"|"soft")`` returns alignments even when the model was
loaded without ``print_alignment``. The decoder then returns its attention for
that call only: for memory attention the S weights of target step i are
beta_i alpha^T (the K-way mix of Eq. 6-7 spread back over the source positions
by the encoder scores of Eq. 4-5), which costs O(K |S|) per step, work that a
plain translation does not need and does not do.
"""

import contextlib

from fairseq.hub_utils import GeneratorHubInterface


@contextlib.contextmanager
def attention_returned(models):
    """The decoders return their attention (as with --print-alignment) inside the block."""
    saved = [m.decoder.attention.alignment_request for m in models]
    try:
        for model in models:
            model.decoder.make_generation_fast_(need_attn=True)
        yield
    finally:
        for model, request in zip(models, saved):
            model.decoder.attention.alignment_request = request


class MemAttnHubInterface(GeneratorHubInterface):
    def generate(self, tokenized_sentences, beam=5, verbose=False, **kwargs):
        """fairseq's generate; with ``print_alignment`` ("hard", "soft", or True
        for "hard" as the bare --print-alignment flag) each hypothesis also has
        "alignment" (hard: (source, target) token index pairs, without EOS) and
        "attention" (source x target weights)."""
        if kwargs.get("print_alignment") is True:
            kwargs["print_alignment"] = "hard"
        if not kwargs.get("print_alignment"):
            return super().generate(tokenized_sentences, beam, verbose, **kwargs)
        with attention_returned(self.models):
            return super().generate(tokenized_sentences, beam, verbose, **kwargs)
