"""A checkpoint that does not fit the model built for it, said by option, for both model families.

A checkpoint records the options that shape its parameters only as tensor
shapes; reading them back (:func:`lstm_shape_options`,
:func:`transformer_shape_options`) lets a misfit be reported as "checkpoint has
memory_k=4 but the model was built with memory_k=8" and not as torch's list of
tensor shapes, with the fix that applies where the model's options came from:
the command line in fairseq-train, the checkpoint's saved options and
--model-overrides in fairseq-generate, -interactive and the hub.
"""

import argparse
import contextlib
import contextvars
import dataclasses
import re
from typing import Dict, Tuple

import torch

from .errors import UserError
from .modules.attention import ATTENTION_TYPES, build_attention
from .modules.memory import MemoryConfig


def _count(state, prefix: str) -> int:
    """How many numbered modules ``prefix.N.`` the state dict has."""
    return len({m.group(1) for name in state for m in [re.match(rf"{re.escape(prefix)}\.(\d+)\.", name)] if m})


def _dim(state, name: str, axis: int):
    return state[name].shape[axis] if name in state else None


def _tied(state, first: str, second: str):
    """Whether two weights hold the same values: tied in training (a checkpoint saved from a GPU
    holds them as two copies, so identity would not tell)."""
    if first not in state or second not in state:
        return None
    return state[first].shape == state[second].shape and bool(torch.equal(state[first], state[second]))


def shared_tables(state) -> Dict[str, object]:
    """The embedding options that tie tables, read back from a state dict: loading two tables into
    one would keep the second."""
    return {"share_decoder_input_output_embed": _tied(state, "decoder.output_projection.weight",
                                                      "decoder.embed_tokens.weight"),
            "share_all_embeddings": _tied(state, "encoder.embed_tokens.weight", "decoder.embed_tokens.weight")}


def _memory_read(attention_parameters) -> str:
    """Memory attention's --memory-read, told by its parameters (names below the attention): the
    content reads project the rows (``read.source_proj``), the additive one scores them (``read.v``)."""
    if "read.v.weight" in attention_parameters:
        return "attention"
    return "general" if "read.source_proj.weight" in attention_parameters else "mix"


def _attention_type(parameter_names, has_context) -> str:
    """The LSTM's --attention-type values whose attention has exactly these parameters
    and gives the output layer a context (has_context) or not; "dot/scaled_dot"
    have the same (no) parameters, so they cannot be told apart."""
    memory = {"memory_" + f.name: f.default for f in dataclasses.fields(MemoryConfig)}

    read = _memory_read(parameter_names)

    def fits(kind):
        args = argparse.Namespace(attention_type=kind, attention_dim=None, memory_read=read,
                                  **{**memory, "memory_k": 2})
        attention = build_attention(args, 2, 2)
        # window_log_width is an option of memory attention, read by lstm_shape_options.
        return (sorted(attention.state_dict()) == sorted(set(parameter_names) - {"writer.window_log_width"})
                and has_context in (None, attention.context_dim > 0))

    return "/".join(kind for kind in ATTENTION_TYPES if fits(kind))


def lstm_shape_options(state) -> Dict[str, object]:
    """lstm_memattn's options that decide parameter shapes, read back from a state dict."""
    attention = "encoder.attention."
    embed_dim = _dim(state, "decoder.embed_tokens.weight", 1)
    lstm_input = _dim(state, "decoder.lstm.weight_ih_l0", 1)
    hidden_size = _dim(state, "decoder.lstm.weight_hh_l0", 1)
    # Eq. 3: the output layer (or the attention mix before it) reads [h_i; c_i], so it is wider
    # than h_i by the context.
    mix = "decoder.attention_mix.weight" in state
    output_input = _dim(state, "decoder.attention_mix.weight" if mix else "decoder.output_projection.weight", 1)
    has_context = None if None in (hidden_size, output_input) else output_input > hidden_size
    attention_parameters = [name[len(attention):] for name in state if name.startswith(attention)]
    memory = "writer.W_alpha.weight" in attention_parameters
    return {
        "attention_type": _attention_type(attention_parameters, has_context),
        "memory_k": _dim(state, attention + "writer.W_alpha.weight", 0),
        "memory_position_window": "writer.window_log_width" in attention_parameters if memory else None,
        "memory_read": _memory_read(attention_parameters) if memory else None,
        "attention_dim": _dim(state, attention + "v.weight", 1) or _dim(state, attention + "read.v.weight", 1),
        "encoder_embed_dim": _dim(state, "encoder.embed_tokens.weight", 1),
        "encoder_hidden_size": _dim(state, "encoder.lstm.weight_hh_l0", 1),
        "encoder_layers": _lstm_layers(state, "encoder.lstm"),
        "decoder_embed_dim": embed_dim,
        "decoder_hidden_size": hidden_size,
        "decoder_layers": _lstm_layers(state, "decoder.lstm"),
        # The previous context is concatenated to the decoder's embeddings.
        "input_feeding": None if None in (embed_dim, lstm_input) else lstm_input > embed_dim,
        "attention_mix": mix,
        **shared_tables(state),
        "source vocabulary size": _dim(state, "encoder.embed_tokens.weight", 0),
        "target vocabulary size": _dim(state, "decoder.embed_tokens.weight", 0),
    }


# A parameter only each family's checkpoints have, by family.
FAMILY_MARKERS = (("transformer_memattn", "encoder.writers.0.W_alpha.weight"),
                  ("fairseq's transformer", "encoder.layers.0.self_attn.k_proj.weight"),
                  ("lstm_memattn", "decoder.lstm.weight_hh_l0"),
                  ("fairseq's lstm", "decoder.layers.0.weight_hh"))


# What a misfit's fix says where the model is built from fairseq-train's command line (``loading``)
BUILT_HERE = "the model is built from this command line"
NEW_MODEL = "to train a new model use another --save-dir"


def family(state):
    """Which kind of model a state dict is of (FAMILY_MARKERS), or None."""
    return next((name for name, marker in FAMILY_MARKERS if marker in state), None)


def check_family(checkpoint_state, model_state) -> None:
    """A checkpoint of another kind of model than the one built for it: said as such, before its
    parameters are compared option by option (a transformer's have no LSTM layers, not 0)."""
    saved, built = family(checkpoint_state), family(model_state)
    if saved is None or saved == built:
        return
    context, path, _, _ = _loading.get()
    if saved == "fairseq's transformer" and built == "transformer_memattn":
        fix = ("convert it first (fairseq-memattn-convert CHECKPOINT OUT --memory-k K), then train from OUT "
               "(--finetune-from-model OUT)")
    else:
        fix = "give the --arch it was trained with"
    if context == "train":
        fix += f"; {NEW_MODEL}"
    raise UserError(f"{path or 'the checkpoint'} is a checkpoint of {saved}, not of {built}: {fix}")


def _lstm_layers(state, lstm: str) -> int:
    return sum(bool(re.fullmatch(rf"{lstm}\.weight_hh_l\d+", name)) for name in state)


def check_lstm_fits(checkpoint_state, model_state) -> None:
    """lstm_memattn: fail with the options that differ, instead of torch's tensor shapes."""
    differences = differing(lstm_shape_options(checkpoint_state), lstm_shape_options(model_state))
    if differences:
        raise checkpoint_misfit(differences)


def transformer_shape_options(state) -> Dict[str, object]:
    """transformer_memattn's options that decide parameter shapes, read back from a state dict."""
    writers = _count(state, "encoder.writers")
    return {
        "memory_k": _dim(state, "encoder.writers.0.W_alpha.weight", 0),
        "memory_position_window": "encoder.writers.0.window_log_width" in state if writers else None,
        "memory_per_layer": writers > 1 if writers else None,
        "memory_read": "mix" if any(".encoder_attn.W_beta." in name for name in state) else "attention",
        **shared_tables(state),
        "encoder_embed_dim": _dim(state, "encoder.embed_tokens.weight", 1),
        "decoder_embed_dim": _dim(state, "decoder.embed_tokens.weight", 1),
        "encoder_layers": _count(state, "encoder.layers"),
        "decoder_layers": _count(state, "decoder.layers"),
        "encoder_ffn_embed_dim": _dim(state, "encoder.layers.0.fc1.weight", 0),
        "decoder_ffn_embed_dim": _dim(state, "decoder.layers.0.fc1.weight", 0),
        "layernorm_embedding": "encoder.layernorm_embedding.weight" in state,
        "source vocabulary size": _dim(state, "encoder.embed_tokens.weight", 0),
        "target vocabulary size": _dim(state, "decoder.embed_tokens.weight", 0),
    }


# the options of transformer_shape_options that change a parameter's shape (the others add or remove parameters)
RESHAPING_OPTIONS = ("memory_k", "encoder_embed_dim", "decoder_embed_dim", "encoder_ffn_embed_dim",
                     "decoder_ffn_embed_dim", "source vocabulary size", "target vocabulary size")


# Options that decide which others a model has (an --attention-dim only with an additive score, ...).
KIND_OPTIONS = ("attention_type", "memory_read")


def differing(saved: Dict[str, object], built: Dict[str, object]) -> Dict[str, Tuple[object, object]]:
    """{name: (checkpoint's, model's)} for the options both tell and that differ; where the model is
    of another kind (KIND_OPTIONS), also those only the checkpoint tells (model's: None), which the
    fix needs as well."""
    differences = {name: (saved[name], built.get(name)) for name in saved
                   if None not in (saved[name], built.get(name)) and saved[name] != built[name]}
    if any(name in differences for name in KIND_OPTIONS):
        differences.update({name: (value, None) for name, value in saved.items()
                            if value is not None and built.get(name) is None})
    return differences


# Where the options of the model a checkpoint is being loaded into came from, set by the plugin's
# wrappers of fairseq's loaders (plugin.py): (context, path, overrides, task), see ``loading``.
_loading = contextvars.ContextVar("fairseq_memattn_loading", default=(None, None, None, None))


# Who gave the overrides of a "saved" load: None for --model-overrides, else the Python call
# (from_pretrained) whose keyword arguments fairseq takes as its overrides.
_overrides_giver = contextvars.ContextVar("fairseq_memattn_overrides_giver", default=None)


@contextlib.contextmanager
def overrides_given_as(caller: str):
    """While loading: the overrides are ``caller``'s keyword arguments, and a misfit names them so."""
    token = _overrides_giver.set(caller)
    try:
        yield
    finally:
        _overrides_giver.reset(token)


@contextlib.contextmanager
def loading(context: str, path: str, overrides: dict = None, task=None):
    """While fairseq loads checkpoint ``path``: ``context`` "train" when its Trainer restores it into
    the model built from the command line (--restore-file, or --save-dir's checkpoint_last.pt),
    "finetune" when that checkpoint is --finetune-from-model's;
    "saved" when it builds the model from the checkpoint's saved options and ``overrides``
    (--model-overrides: fairseq-generate, -interactive, -validate, the hub, our plot). A model
    built in Python and loaded outside of both has neither. ``task``, when known, may say how its
    dictionary is made (a ``dictionary_advice(size)`` method: the copy task's option)."""
    token = _loading.set((context, path, overrides or {}, task))
    try:
        yield
    finally:
        _loading.reset(token)


def as_option(name: str, value) -> str:
    """A saved value as the command line gives it: --memory-k 8, --input-feeding, ..."""
    if name.endswith("vocabulary size"):
        return f"a {name} of {value}"
    flag = "--" + name.replace("_", "-")
    if value is True:
        return flag
    if value is False:
        return f"no {flag}"
    return f"{flag} {str(value).replace('/', ' or ')}"


def checkpoint_misfit(differences: Dict[str, Tuple[object, object]]) -> UserError:
    """The error for a checkpoint whose weights do not fit the model built for it: each
    option that differs with both values ({name: (checkpoint's, model's)}), and how to make
    them fit where the model's options came from (``loading``)."""
    context, path, overrides, task = _loading.get()
    found = "; ".join(f"checkpoint has {name}={saved} but the model was built with {name}={built}"
                      if built is not None else f"checkpoint has {name}={saved}, which the model has not"
                      for name, (saved, built) in differences.items())
    options = [name for name in differences if not name.endswith("vocabulary size")]
    fit = [as_option(name, differences[name][0]) for name in options]
    vocabularies = [saved for name, (saved, _) in differences.items() if name.endswith("vocabulary size")]
    if vocabularies:
        advice = getattr(task, "dictionary_advice", None)
        fit.append(advice(vocabularies[0]) if advice else "the dictionaries it was trained with (its data directory)")
    fit = ", ".join(fit)
    if context == "train":
        fix = f"{BUILT_HERE}: to continue training the checkpoint give {fit}; {NEW_MODEL}"
    elif context == "finetune":
        fix = f"{BUILT_HERE}: to fine-tune the checkpoint give {fit}"
    elif context == "saved":
        overridden = [name for name in options if name in overrides]
        caller = _overrides_giver.get()
        if overridden and caller:
            found = "; ".join(f"checkpoint has {name}={differences[name][0]} but {caller} was given "
                              f"{name}={overrides[name]!r}" for name in overridden)
            passed = ", ".join(f"{name}={overrides[name]!r}" for name in overridden)
            fix = f"remove {passed} from {caller}'s keyword arguments"
        elif overridden:
            fix = (f"--model-overrides sets {', '.join(overridden)}: remove "
                   f"{'it' if len(overridden) == 1 else 'them'} from --model-overrides")
        elif not options:
            fix = f"use {fit}"
        else:  # the checkpoint's own options, edited or damaged
            saved = {name: differences[name][0] for name in options}
            given = (", ".join(f"{name}={value!r}" for name, value in saved.items()) + f" to {caller}" if caller
                     else f"--model-overrides \"{saved}\"")
            fix = f"the checkpoint's saved options do not match its weights: pass {given}"
    else:
        fix = f"build the model with {fit}"
    where = f"{path} " if path else "the checkpoint "
    return UserError(f"{where}does not fit the model: {found}; {fix}")


def _unmatched_parameters(error: RuntimeError):
    """torch's strict load refusing parameters that no option above told apart (say, another
    --encoder-attention-heads layout or --encoder-normalize-before) as a one-line UserError where
    the fix depends on how the model was built (``loading``); None for any other RuntimeError."""
    lines = str(error).splitlines()
    if not lines or not lines[0].startswith("Error(s) in loading state_dict"):
        return None
    context, path, _, _ = _loading.get()
    found = "; ".join(line.strip() if len(line.strip()) <= 160 else line.strip()[:157] + "..."
                      for line in lines[1:] if line.strip())
    fix = {"train": f"{BUILT_HERE}: give the options the checkpoint was trained with; {NEW_MODEL}",
           "finetune": f"{BUILT_HERE}: give the options the checkpoint was trained with"}.get(
        context, "build the model with the options the checkpoint was trained with")
    return UserError(f"{path or 'the checkpoint'} does not fit the model ({found}): {fix}")


@contextlib.contextmanager
def parameters_said_by_name():
    """Around a model's strict load: torch's refusal as ``_unmatched_parameters``'s one line."""
    try:
        yield
    except RuntimeError as error:
        misfit = _unmatched_parameters(error)
        if misfit is None:
            raise
        raise misfit from None
