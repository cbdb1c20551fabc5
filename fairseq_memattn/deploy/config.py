"""config.json of an exported model: read in this one place, checked for its format version, the
keys the translator reads, their types and the special symbols' range in the dictionaries."""

import json
import os

from .exceptions import ModelFolderError
from .search import EDITED_COLUMNS

# config.json's format_version values this translator reads (fairseq_memattn.export.FORMAT_VERSION)
# 3: short_source_rows (optional), each step reading one layout; 4: a step reads both layouts
FORMAT_VERSIONS = (2, 3, 4)
CONFIG_KEYS = ("model", "pad", "eos", "unk", "source_pad", "source_eos", "source_padding", "memory_k",
               "memory_outputs", "decoder_state", "alignment_memory", "max_source_positions",
               "max_target_positions")
# keys holding integers, and the least each may be
INTEGER_KEYS = {"pad": 0, "eos": 0, "unk": 0, "source_pad": 0, "source_eos": 0, "memory_k": 1,
                "alignment_memory": 0, "max_source_positions": 1, "max_target_positions": 2}
TARGET_SYMBOLS = ("pad", "eos", "unk")
SOURCE_SYMBOLS = ("source_pad", "source_eos")


def read_config(folder: str) -> dict:
    """config.json of an exported model, checked for its format version, the keys the translator
    reads and their types."""
    if not os.path.isdir(folder):
        reason = "a file, not a folder" if os.path.exists(folder) else "no such folder"
        raise ModelFolderError(f"not an exported model folder ({reason}): {folder}")
    path = config_path(folder)
    if not os.path.isfile(path):
        raise ModelFolderError(f"not an exported model folder (no config.json): {folder}")
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        raise ModelFolderError(f"{path}: not readable as JSON ({error})") from None
    if not isinstance(config, dict):
        raise ModelFolderError(f"{path}: not a JSON object")
    version = config.get("format_version")
    if version not in FORMAT_VERSIONS:
        found = "no format_version" if version is None else f"format_version {version!r}"
        raise ModelFolderError(f"{path}: {found}, this translator reads format_version "
                               f"{', '.join(map(str, FORMAT_VERSIONS))} (export the model again with this "
                               f"version of fairseq-memattn-export)")
    missing = [key for key in CONFIG_KEYS if key not in config]
    if missing:
        raise ModelFolderError(f"{path}: missing key {', '.join(map(repr, missing))}")
    check_types(config, path)
    return config


def short_memory_name(memory_output: str) -> str:
    """The decoder step's input for the short sources' memory (short_source_rows) from this encoder output."""
    return "short_" + memory_output


# The metadata key whose value config.json's export_id and both graphs share: one export's files.
EXPORT_ID = "fairseq_memattn_export_id"


def config_path(folder: str) -> str:
    return os.path.join(folder, "config.json")


def check_types(config: dict, path: str) -> None:
    for key, least in INTEGER_KEYS.items():
        value = config[key]
        if not is_integer(value, least):
            raise ModelFolderError(f"{path}: {key} is {value!r}, expected an integer >= {least}")
    if config["source_padding"] not in ("left", "right"):
        raise ModelFolderError(f"{path}: source_padding is {config['source_padding']!r}, expected 'left' or 'right'")
    names = config["memory_outputs"]
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise ModelFolderError(f"{path}: memory_outputs is {names!r}, expected a list of graph output names")
    state = config["decoder_state"]
    if not isinstance(state, list) or not all(isinstance(e, dict) and isinstance(e.get("name"), str)
                                              and (isinstance(e["from"], str) if "from" in e else
                                                   is_shape(e.get("zeros"))) for e in state):
        raise ModelFolderError(f"{path}: decoder_state is {state!r}, expected a list of {{'name', and 'from' "
                               "(an encoder output's name) or 'zeros' (a list of dimensions)}} entries")
    exported = config.get("source_symbols")
    if exported is not None and not is_integer(exported, 4):
        raise ModelFolderError(f"{path}: source_symbols is {exported!r}, expected an integer >= 4 (the source "
                               "dictionary's size, its four special symbols included)")
    short = config.get("short_source_rows")
    if short is not None and not (is_integer(short, 1) and short <= config["memory_k"]):
        raise ModelFolderError(f"{path}: short_source_rows is {short!r}, expected an integer from 1 to "
                               f"memory_k ({config['memory_k']})")
    if short is not None and config["format_version"] < 4:
        raise ModelFolderError(f"{path}: short_source_rows in format_version {config['format_version']}, which this "
                               f"translator no longer reads (export the model again with this version of "
                               f"fairseq-memattn-export)")
    layers = config.get("self_attention_cache")
    if layers is not None and not (isinstance(layers, list) and all(
            isinstance(layer, dict) and isinstance(layer.get("heads"), int) and isinstance(layer.get("head_dim"), int)
            for layer in layers)):
        raise ModelFolderError(f"{path}: self_attention_cache is {layers!r}, expected a list of "
                               "{'heads', 'head_dim'} entries")


def is_integer(value, least: int) -> bool:
    """A JSON integer (not a boolean) of at least ``least``."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def is_shape(value) -> bool:
    """A list of dimensions (integers >= 1)."""
    return isinstance(value, list) and all(is_integer(d, 1) for d in value)


def check_symbols(config: dict, path: str, source_symbols: int, target_symbols: int) -> None:
    """The special symbols' ids in config.json are rows of the dictionaries, the target's among its
    first EDITED_COLUMNS."""
    for keys, size, name in ((TARGET_SYMBOLS, target_symbols, "dict.target.txt"),
                             (SOURCE_SYMBOLS, source_symbols, "dict.source.txt")):
        for key in keys:
            if config[key] >= size:
                raise ModelFolderError(f"{path}: {key} is {config[key]}, outside {name}'s {size} symbols "
                                       f"(0..{size - 1})")
    for key in TARGET_SYMBOLS:
        if config[key] >= EDITED_COLUMNS:
            raise ModelFolderError(f"{path}: {key} is {config[key]}, expected one of the first {EDITED_COLUMNS} "
                                   f"target symbols (0..{EDITED_COLUMNS - 1}), where fairseq's Dictionary puts "
                                   "its special symbols")
