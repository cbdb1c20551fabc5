"""Convert a trained fairseq ``transformer`` into a ``transformer_memattn``
(the command line: ``fairseq-memattn-convert``, in ``cli/convert.py``).

The two models share every weight but the write (Eq. 4-5): embeddings, positions, encoder
layers, decoder self-attention, feed-forward blocks, layer norms and output projection are
copied, and each decoder layer's encoder-attention (q/k/v/out projections and its layer norm)
becomes that layer's attention read of the memory under the same state-dict keys, so the
decoder reads the K rows with what it learned reading the |S| states. The write is new. With
the position window (the default) it starts from the window alone (``start_write_nearest``):
C_k is the encoder state nearest relative position (k - 1/2)/K, or a local average of the
states there where |S| > K, so the decoder reads rows like the states it was trained on.

OUT keeps the checkpoint's update count, learning-rate schedule, data position and, for
fairseq's plain optimizers, the optimizer moments of the kept weights (the write's start
fresh), so ``fairseq-train --restore-file OUT.pt`` continues where the transformer
stopped; ``--finetune-from-model OUT.pt`` starts afresh.
"""

import argparse
import copy
import logging
import math
import os
import sys
from typing import Dict, List, Optional

from .checkpoint_fit import transformer_shape_options
from .checkpoint_safety import CheckpointError, architecture, read_checkpoint, registered_model, setup_task
from .errors import UserError
from .staging import replace_atomically, staging_beside
# WRITE_PREFIX: the only parameters the source lacks
from .models.transformer_memattn.model import WRITE_PREFIX, keep_layers, memory_architecture

logger = logging.getLogger(__name__)

MEMATTN_ARCH = "transformer_memattn"
SOURCE_MODEL = "transformer"  # fairseq's registered model name, whatever the --arch
# extra_state entries that describe the source model's training, not the converted model's
SOURCE_ONLY_STATE = ("best", "val_loss", "ema", "ema_fp32_params")
# How the write starts: at the nearest states (start_write_nearest), or as transformer_memattn
# initialises it for training from scratch (W_alpha random, window widths 1/K).
WRITE_STARTS = ("nearest", "model")
# start_write_nearest's window width, in rows (1/K of the source each): chosen on the Bible's
# validation loss before fine-tuning (docs/convert.md)
NEAREST_WIDTH = 0.5


class ConvertError(UserError):
    """A checkpoint or option the conversion cannot take; the message names it."""


def load_source(path: str, data: Optional[str] = None) -> dict:
    """The checkpoint's state (fairseq's loader: args or cfg, old formats upgraded)."""
    try:
        return read_checkpoint(path, data)
    except CheckpointError as error:
        raise ConvertError(str(error)) from None


def check_source_architecture(model_cfg, path: str) -> None:
    """Only fairseq's ``transformer`` model itself (any of its --arch) converts."""
    from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_REGISTRY

    arch = architecture(model_cfg)
    model_class = registered_model(model_cfg)
    if model_class is not None and issubclass(model_class, ARCH_MODEL_REGISTRY[MEMATTN_ARCH]):
        raise ConvertError(f"{path} is already a memory attention model (--arch {arch})")
    if model_class is not MODEL_REGISTRY[SOURCE_MODEL]:
        raise ConvertError(f"cannot convert --arch {arch} in {path}: the conversion takes fairseq's "
                           f"transformer model (--arch transformer, transformer_iwslt_de_en, "
                           f"transformer_wmt_en_de, ...)")


def target_architecture(source_arch: str) -> str:
    """transformer_memattn_SUFFIX where registered (transformer_iwslt_de_en ->
    transformer_memattn_iwslt_de_en), else transformer_memattn; the sizes are
    the checkpoint's own either way (they are all in its args)."""
    from fairseq.models import ARCH_MODEL_REGISTRY

    target = memory_architecture(source_arch) if source_arch.startswith(SOURCE_MODEL + "_") else MEMATTN_ARCH
    return target if target in ARCH_MODEL_REGISTRY else MEMATTN_ARCH


def check_memory_read(memory_options: Dict[str, object]) -> None:
    """Only the attention read reuses the decoder's encoder-attention."""
    if memory_options.get("memory_read", "attention") != "attention":
        raise ConvertError(f"--memory-read {memory_options['memory_read']} reads the memory with "
                           f"parameters a transformer does not have (W_beta, Eq. 7); convert with "
                           f"--memory-read attention, whose read is the decoder's encoder-attention")


def target_args(source_args: argparse.Namespace, memory_options: Dict[str, object]) -> argparse.Namespace:
    """The loaded source's args with the memory architecture and options; what is not
    given takes the architecture's default when the model is built."""
    args = copy.deepcopy(source_args)
    args.arch = target_architecture(architecture(source_args))
    if hasattr(args, "_name"):
        args._name = args.arch
    vars(args).update(memory_options)
    return args


def as_namespace(model_cfg) -> argparse.Namespace:
    """A model config (a Namespace, or a DictConfig of a dataclass model) as a Namespace."""
    if isinstance(model_cfg, argparse.Namespace):
        return model_cfg
    from omegaconf import OmegaConf

    return argparse.Namespace(**OmegaConf.to_container(model_cfg, resolve=True))


def check_dictionaries(task, cfg, weights: dict, path: str) -> None:
    """The task's dictionaries (--data's) as large as the checkpoint's embeddings: others would
    fail later as weights that do not fit the --arch."""
    sizes = transformer_shape_options(weights)
    differ = [f"{side} dictionary {len(dictionary)} symbols, the checkpoint's {sizes[side + ' vocabulary size']}"
              for side, dictionary in (("source", task.source_dictionary), ("target", task.target_dictionary))
              if sizes[side + " vocabulary size"] not in (None, len(dictionary))]
    if differ:
        raise ConvertError(f"the dictionaries in {getattr(cfg.task, 'data', None) or 'the task'} are not those of "
                           f"{path}: {'; '.join(differ)} (give --data the folder with the dictionaries the "
                           f"transformer was trained with)")


def build_model(task, args: argparse.Namespace, path: str):
    """fairseq's model building, its errors (an unsupported option) as ConvertError."""
    try:
        return task.build_model(args)
    except ValueError as error:
        raise ConvertError(f"cannot convert {path} to --arch {args.arch}: {error}")


def trainable_names(model) -> List[str]:
    """Parameter names in the order fairseq's trainer hands them to the optimizer."""
    return [name for name, parameter in model.named_parameters() if parameter.requires_grad]


def check_only_write_is_new(source_state: dict, target_state: dict) -> List[str]:
    """The target's keys the source lacks, which must all be the write's, and
    every source key kept with its shape; else ConvertError naming the keys."""
    dropped = [k for k in source_state if k not in target_state]
    reshaped = [k for k in source_state if k in target_state and source_state[k].shape != target_state[k].shape]
    new = [k for k in target_state if k not in source_state]
    unexpected = [k for k in new if not k.startswith(WRITE_PREFIX)]
    if dropped or reshaped or unexpected:
        problems = [f"{what}: {', '.join(keys[:4])}{' ...' if len(keys) > 4 else ''}"
                    for what, keys in (("not kept", dropped), ("reshaped", reshaped),
                                       ("new besides the write", unexpected)) if keys]
        raise ConvertError("the memory model does not hold the transformer's weights (" + "; ".join(problems) + ")")
    return new


def carried_optimizer_state(state: Optional[dict], source_names: List[str],
                            target_names: List[str]) -> Optional[dict]:
    """The source's optimizer state for the target's parameters: the moments of
    every kept parameter, none (a fresh start) for the write, and what else the
    state holds (the loss scale of --fp16 with --fp16-no-flatten-grads, of
    --memory-efficient-fp16 and --amp). Only for a torch-style state with one entry
    per parameter (fairseq's adam, sgd, ...); otherwise (--fp16's flattened
    parameters) None."""
    if not state or not {"state", "param_groups"} <= set(state) or len(state["param_groups"]) != 1:
        return None
    group = state["param_groups"][0]
    if len(group["params"]) != len(source_names):
        return None
    old_id = dict(zip(source_names, group["params"]))
    moments = {index: state["state"][old_id[name]] for index, name in enumerate(target_names)
               if name in old_id and old_id[name] in state["state"]}
    return {**state, "state": moments, "param_groups": [dict(group, params=list(range(len(target_names))))]}


def start_write_nearest(target, width: float = NEAREST_WIDTH) -> None:
    """The write's scores reduced to the position window (W_alpha = 0), every width w_k at
    ``width`` rows (``window_scores``): at the default half row, C_k takes the states within
    about half a row's stretch of (k - 1/2)/K, i.e. the nearest state where |S| <= K."""
    import torch

    with torch.no_grad():
        for writer in target.encoder.writers:
            writer.W_alpha.weight.zero_()
            writer.window_log_width.fill_(math.log(width / writer.num_contexts))


def warn_position_limit(args: argparse.Namespace, path: str) -> None:
    """S of Eq. 10 below the transformer's --max-source-positions: a smaller S is the models' own
    default (the longest training source), but the converted model then refuses sources the
    transformer took."""
    limit = args.memory_position_max_len
    if args.memory_position_encoding and limit < args.max_source_positions:
        logger.warning(f"--memory-position-max-len {limit} (S of Eq. 10) is below the --max-source-positions "
                       f"{args.max_source_positions} of {path}: the converted model refuses sources of more than "
                       f"{limit} tokens (EOS included), which the transformer took; give a larger "
                       f"--memory-position-max-len to cover them")


def write_start(requested: Optional[str], args: argparse.Namespace) -> str:
    """--write-start, checked; by default nearest with the position window, else model."""
    window = bool(getattr(args, "memory_position_window", False))
    if requested is None:
        return "nearest" if window else "model"
    if requested not in WRITE_STARTS:
        raise ConvertError(f"invalid --write-start {requested!r} (choose from {', '.join(WRITE_STARTS)})")
    if requested == "nearest" and not window:
        raise ConvertError("--write-start nearest starts the write from the position window, which "
                           "--no-memory-position-window turns off: drop one of the two")
    return requested


def convert_model(state: dict, memory_options: Dict[str, object], path: str = "checkpoint",
                  start: Optional[str] = None):
    """(source, target, target args): the checkpoint's transformer as fairseq loads it, and the
    memory model built by fairseq from the converted args with the transformer's weights in
    every parameter but the write's, which start as ``start`` says (``write_start``)."""
    cfg = state["cfg"]
    check_source_architecture(cfg.model, path)
    source_args = copy.deepcopy(as_namespace(cfg.model))
    check_memory_read(memory_options)
    try:
        task = setup_task(cfg.task, path)
    except CheckpointError as error:
        raise ConvertError(str(error)) from None
    check_dictionaries(task, cfg, state["model"], path)
    source = build_model(task, source_args, path)
    # --*-layers-to-keep pruned as the memory model prunes them (fairseq's pruning, given one side's
    # option, drops the other side's layers), which clears the options
    weights = keep_layers(state["model"], source_args, writers_follow_decoder=False)
    try:
        # fairseq's own loading: upgrades old key names
        source.load_state_dict(weights, strict=True, model_cfg=source_args)
    except RuntimeError as error:
        details = " ".join(line.strip() for line in str(error).splitlines()[:2])
        raise ConvertError(f"the weights of {path} do not fit its own --arch {architecture(source_args)} "
                           f"({details[:300]})")
    # From the built source's args: the layers --*-layers-to-keep kept are now all its layers
    args = target_args(source_args, memory_options)
    target = build_model(task, args, path)  # fills in the architecture's defaults
    warn_position_limit(args, path)
    start = write_start(start, args)
    if not getattr(args, "memory_position_window", False):
        logger.warning("the write starts without --memory-position-window: each C_k starts as a "
                       "random average of the encoder states, not a local one")
    if start == "nearest":
        start_write_nearest(target)
    source_state, fresh = source.state_dict(), target.state_dict()
    new = check_only_write_is_new(source_state, fresh)
    target.load_state_dict({key: source_state.get(key, fresh[key]) for key in fresh}, strict=True, model_cfg=args)
    logger.info(f"kept {len(source_state)} tensors of {path}; new, the write (Eq. 4-5): {', '.join(new)}")
    return source, target, args


def converted_checkpoint(state: dict, source, target, args: argparse.Namespace) -> dict:
    """The source checkpoint's state for the target model: its weights and args, the
    optimizer state carried over, the training position kept, the source's scores dropped."""
    from fairseq.dataclass.utils import omegaconf_no_object_check
    from omegaconf import open_dict

    converted = {key: value for key, value in state.items() if key != "args"}
    converted["cfg"] = copy.deepcopy(state["cfg"])
    # A cfg fairseq made from an old checkpoint's args takes a Namespace only as fairseq set it there
    with open_dict(converted["cfg"]), omegaconf_no_object_check():
        converted["cfg"].model = args
    converted["model"] = target.state_dict()
    converted["last_optimizer_state"] = carried_optimizer_state(
        state.get("last_optimizer_state"), trainable_names(source), trainable_names(target))
    if converted["last_optimizer_state"] is None and state.get("last_optimizer_state"):
        logger.warning("the optimizer state is not carried over (not one entry per parameter, as with --fp16's "
                       "flattened parameters): fairseq-train restarts the update count and the learning-rate "
                       "schedule, so fine-tune with --reset-optimizer and count --max-update and --warmup-updates "
                       "from 0")
    extra = state.get("extra_state") or {}
    converted["extra_state"] = {key: value for key, value in extra.items() if key not in SOURCE_ONLY_STATE}
    return converted


def convert_state(state: dict, memory_options: Dict[str, object], path: str = "checkpoint",
                  start: Optional[str] = None) -> dict:
    """The checkpoint state of the converted model, from a transformer's (``load_source``)."""
    source, target, args = convert_model(state, memory_options, path, start)
    return converted_checkpoint(state, source, target, args)


def save_checkpoint(state: dict, path: str) -> None:
    """``state`` written as fairseq writes checkpoints (the config as plain
    containers), atomically: an interrupted write leaves no file at ``path``."""
    import torch
    from omegaconf import OmegaConf

    if OmegaConf.is_config(state.get("cfg")):
        state = dict(state, cfg=OmegaConf.to_container(state["cfg"], resolve=True, enum_to_str=True))
    replace_atomically(path, lambda partial: torch.save(state, partial))


def convert(checkpoint: str, out: str, memory_options: Dict[str, object], data: Optional[str] = None,
            force: bool = False, start: Optional[str] = None) -> None:
    """Write the conversion of ``checkpoint`` to ``out``; an ``out`` it cannot write is refused
    before any work."""
    if os.path.isdir(out):
        raise ConvertError(f"{out} is a folder: give the converted checkpoint's file, e.g. "
                           f"{os.path.join(out, 'converted.pt')}")
    if os.path.exists(out) and not force:
        raise ConvertError(f"{out} exists: pass --force to replace it")
    with staging_beside(out, ConvertError) as staging:
        staged = os.path.join(staging, "converted.pt")
        save_checkpoint(convert_state(load_source(checkpoint, data), memory_options, checkpoint, start), staged)
        os.replace(staged, out)


if __name__ == "__main__":  # the command line is in cli/; say where rather than do nothing
    print("python -m fairseq_memattn.convert: error: run fairseq-memattn-convert (or python -m fairseq_memattn.cli.convert)",
          file=sys.stderr)
    sys.exit(2)
