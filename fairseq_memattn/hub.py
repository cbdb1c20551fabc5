"""fairseq's hub interface for this plugin's models, with alignments on request.

``MemAttnLSTMModel.from_pretrained`` and ``MemAttnTransformerModel.from_pretrained``
(both from :class:`MemAttnHubModel`) return a :class:`MemAttnHubInterface`, a
fairseq ``GeneratorHubInterface`` (``translate``, ``sample``, ``generate``,
``encode``, ``decode``) that differs in one point: ``generate(...,
print_alignment="hard"|"soft")`` returns alignments even when the model was
loaded without ``print_alignment``. The decoder then returns its attention for
that call only: for memory attention the S weights of target step i are
the read weights times alpha^T (the LSTM's K-way mix beta_i of Eq. 6-7, or a
Transformer layer's read of the K rows, spread back over the source positions
by the encoder scores of Eq. 4-5), which costs O(K |S|) per step, work that a
plain translation does not need and does not do.
"""

import contextlib
import dataclasses
import difflib
import os

import torch

from fairseq import hub_utils
from fairseq.dataclass.configs import GenerationConfig
from fairseq.hub_utils import GeneratorHubInterface

from . import register
from .checkpoint_fit import overrides_given_as
from .checkpoint_safety import NO_LANGUAGE_PAIR, no_language_pair
from .errors import UserError
from .models.memory_options import position_encoding_limit
from .modules.memory import source_too_long
from .search_settings import check_search_settings


# generate()'s keyword arguments: GeneratorHubInterface.generate's own, and the search's settings
GENERATE_SETTINGS = {"skip_invalid_size_inputs", "inference_step_args", "prefix_allowed_tokens_fn",
                     *(field.name for field in dataclasses.fields(GenerationConfig))}


class MemAttnHubModel:
    """For a fairseq model class of this plugin: ``from_pretrained`` returning
    a :class:`MemAttnHubInterface`. ``alignment_switch`` is the module
    (``modules.attention.AlignmentSwitch``) whose ``alignment_request``
    decides whether the model returns alignments."""

    @property
    def alignment_switch(self):
        raise NotImplementedError

    @classmethod
    def from_pretrained(cls, model_name_or_path, checkpoint_file="model.pt", data_name_or_path=".",
                        **kwargs):
        """fairseq's hub interface for a checkpoint (``translate``, ``sample``,
        ``generate``), with alignments on request (see hub.py). For the WMT'17
        recipe's output: ``from_pretrained("checkpoints/wmt17/en-de/CONFIG",
        checkpoint_file="checkpoint_best.pt", data_name_or_path="data/wmt17/en-de/data-bin",
        bpe="sentencepiece", sentencepiece_model="data/wmt17/en-de/spm.model")``."""
        register()  # checkpoints loadable under weights_only, loading errors said as UserError
        data = check_paths(model_name_or_path, checkpoint_file, data_name_or_path, cls.hub_models())
        try:
            with overrides_given_as("from_pretrained"):  # fairseq takes the keyword arguments as its overrides
                loaded = hub_utils.from_pretrained(model_name_or_path, checkpoint_file, data_name_or_path,
                                                   archive_map=cls.hub_models(), **kwargs)
        except Exception as error:
            unusable = unusable_data(data, error)
            if unusable is None:
                raise
            raise UserError(unusable) from None
        return MemAttnHubInterface(loaded["args"], loaded["task"], loaded["models"])


def check_paths(model_name_or_path, checkpoint_file: str, data_name_or_path: str, hub_models: dict):
    """The data folder fairseq will read (relative to the model folder where it starts with "."),
    or UserError for a model or data folder that is not one (nor a hub name), which fairseq would
    take for an archive to download or unpack; a checkpoint file given as the folder is a common slip."""
    path, data = str(model_name_or_path), str(data_name_or_path)
    if path in hub_models or data in hub_models:
        return data
    if not os.path.isdir(path):
        raise not_a_model_folder(path, checkpoint_file)
    data = os.path.abspath(os.path.join(path, data)) if data.startswith(".") else data
    if not os.path.isdir(data):
        raise UserError(f"data folder not found: {data} (data_name_or_path is the data-bin folder the model "
                        f"was trained on, with its dictionaries)")
    return data


def unusable_data(data: str, error: Exception):
    """Where fairseq's translation task stopped on the data folder ``data``: the sentence that says
    what it lacks and what to give; else None."""
    data_bin = "give data_name_or_path=, the data-bin folder the model was trained on"
    if str(error) == NO_LANGUAGE_PAIR:
        return no_language_pair(data, f"{data_bin}, or source_lang= and target_lang= with its dictionaries")
    name = os.path.basename(str(getattr(error, "filename", None) or ""))
    if isinstance(error, FileNotFoundError) and name.startswith("dict."):
        return f"{data} has no {name}; {data_bin}"
    return None


def not_a_model_folder(path: str, checkpoint_file: str) -> UserError:
    """The error for a model_name_or_path that is a file (the checkpoint itself?) or nothing."""
    if os.path.isfile(path):
        folder, name = os.path.split(path)
        return UserError(f"{path} is a file: give its folder and its name apart, "
                         f"from_pretrained({folder or '.'!r}, checkpoint_file={name!r}, ...)")
    return UserError(f"model folder not found: {path} (from_pretrained takes the folder that holds "
                     f"checkpoint_file={checkpoint_file!r})")


def with_close_match(name: str) -> str:
    close = difflib.get_close_matches(name, GENERATE_SETTINGS, 1)
    return f"{name} (did you mean {close[0]}?)" if close else name


@contextlib.contextmanager
def attention_returned(models):
    """Our decoders return their attention (as with --print-alignment) inside the block; fairseq's
    own models (a plain transformer loaded through our hub class) return theirs as fairseq does."""
    switches = [m.alignment_switch for m in models if isinstance(m, MemAttnHubModel)]
    saved = [switch.alignment_request for switch in switches]
    try:
        for switch in switches:
            switch.alignment_request = True
        yield
    finally:
        for switch, request in zip(switches, saved):
            switch.alignment_request = request


class MemAttnHubInterface(GeneratorHubInterface):
    def generate(self, tokenized_sentences, beam=5, verbose=False, **kwargs):
        """fairseq's generate; with ``print_alignment`` ("hard", "soft", or True
        for "hard" as the bare --print-alignment flag) each hypothesis also has
        "alignment" (hard: (source, target) token index pairs, without EOS) and
        "attention" (source x target weights)."""
        self.check_settings(beam, kwargs)
        if not kwargs.get("skip_invalid_size_inputs"):
            self.check_lengths(tokenized_sentences)
        if kwargs.get("print_alignment") is True:
            kwargs["print_alignment"] = "hard"
        if kwargs.get("print_alignment") not in (None, False, "hard", "soft"):
            raise UserError(f"invalid print_alignment: {kwargs['print_alignment']!r} "
                            f"(choose from 'hard', 'soft', True)")
        if not kwargs.get("print_alignment"):
            return super().generate(tokenized_sentences, beam, verbose, **kwargs)
        with attention_returned(self.models):
            return super().generate(tokenized_sentences, beam, verbose, **kwargs)

    def check_settings(self, beam, kwargs):
        """The search's settings, before fairseq's beam search fails on them deep inside (beam=0:
        a reshape of 0 elements) or ignores one (a misspelt name is a new attribute to it)."""
        unknown = sorted(set(kwargs) - GENERATE_SETTINGS)
        if unknown:
            raise UserError(f"unknown generation setting(s): {'; '.join(map(with_close_match, unknown))} (the "
                            "settings are fairseq's GenerationConfig fields: fairseq-generate's options with '_')")
        given = {**kwargs, "beam": beam}
        check_search_settings(lambda name: given.get(name, getattr(self.cfg.generation, name, None)), str)

    def check_lengths(self, tokenized_sentences):
        """A source longer than the position encodings' S (Eq. 10) stops here, naming the
        option, instead of in fairseq's batching with advice for its command lines."""
        limits = [limit for limit in map(position_encoding_limit, self.models) if limit is not None]
        if not limits:
            return
        one = torch.is_tensor(tokenized_sentences) and tokenized_sentences.dim() == 1
        sentences = [tokenized_sentences] if one else tokenized_sentences
        for index, tokens in enumerate(sentences):
            if tokens.numel() > min(limits):
                raise UserError(source_too_long(f"sentence {index}", tokens.numel(), min(limits)))
