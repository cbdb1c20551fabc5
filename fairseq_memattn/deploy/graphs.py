"""The exported graphs on ONNX Runtime: sessions loaded, and checked at load against what the
translator feeds and reads (names, ranks, the dictionaries' widths), so that a folder whose parts
do not fit together (swapped graphs, another model's dictionary) is refused with one line naming
the file, not at the first sentence."""

import os
import re
from typing import Dict, Optional

import numpy as np

from ..errors import import_installed
from .config import EXPORT_ID, config_path, short_memory_name
from .exceptions import ModelFolderError

# the decoder step's inputs from export/search.py and the step itself, with their ranks
SEARCH_INPUTS = {"prev_tokens": 1, "step": 1, "lprob_edits": 2, "edit_rows": 1, "hypothesis_scores": 1,
                 "beam": 1, "candidates": 1}
STEP_OUTPUTS = {"candidate_scores": 2, "candidate_indices": 2, "read_weights": 2}


def require_onnxruntime():
    return import_installed("onnxruntime", "the translator needs onnxruntime: pip install onnxruntime")


def default_session_options(threads: Optional[int] = None):
    """The translator's ONNX Runtime SessionOptions: ``threads`` intra-op threads (ONNX Runtime's
    default if None) and every graph optimization."""
    ort = require_onnxruntime()
    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return options


def load_session(ort, path: str, options, providers):
    """An ONNX Runtime session of one exported graph; a missing or unreadable file is named."""
    if not os.path.isfile(path):
        raise ModelFolderError(f"{path}: no such file (the folder's export is incomplete)")
    try:
        return ort.InferenceSession(path, options, providers=providers)
    except Exception as error:  # onnxruntime's own exception types (InvalidProtobuf, Fail, ...)
        raise ModelFolderError(f"{path}: not a readable ONNX graph ({first_line(error)})") from None


def first_line(error: Exception) -> str:
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(error)).strip()
    return text.splitlines()[0] if text else type(error).__name__


def ranks(args) -> Dict[str, int]:
    return {arg.name: len(arg.shape) for arg in args}


def expected_interface(config: dict, encoder_outputs: Dict[str, int]):
    """(decoder inputs, decoder outputs), by name with their ranks, for this config and encoder."""
    inputs, outputs = dict(SEARCH_INPUTS), dict(STEP_OUTPUTS)
    for name in config["memory_outputs"]:
        inputs[name] = encoder_outputs[name]
    if "short_source_rows" in config:  # short sources' memory, read through alpha
        inputs["alpha"] = 4
        for name in config["memory_outputs"]:
            inputs[short_memory_name(name)] = encoder_outputs[name]
    for entry in config["decoder_state"]:
        rank = encoder_outputs[entry["from"]] if "from" in entry else 1 + len(entry["zeros"])
        inputs[entry["name"]] = outputs["new_" + entry["name"]] = rank
    layers = config.get("self_attention_cache")
    if layers:
        inputs["history"] = 3
        for index in range(len(layers)):
            for part in ("key", "value"):
                inputs[f"self_{part}_{index}"], outputs[f"new_{part}_{index}"] = 2, 3
    else:
        inputs["reorder"] = 1
    return inputs, outputs


def check_args(path: str, kind: str, found: Dict[str, int], expected: Dict[str, int], exact: bool) -> None:
    """``found`` names and ranks against ``expected``; ``exact``: no others (inputs the translator
    would not feed)."""
    listed = ", ".join(found) or "none"
    for name, rank in expected.items():
        if name not in found:
            raise ModelFolderError(f"{path}: no {kind} {name!r} (its {kind}s: {listed}); not the graph this "
                                   f"folder's config.json describes (are encoder.onnx and decoder.onnx swapped?)")
        if found[name] != rank:
            raise ModelFolderError(f"{path}: {kind} {name!r} has {found[name]} dimensions, the translator "
                                   f"expects {rank}")
    extra = [name for name in found if name not in expected]
    if exact and extra:
        raise ModelFolderError(f"{path}: {kind} {extra[0]!r} that the translator does not know (its "
                               f"{kind}s: {', '.join(expected)})")


def static_width(args, name: str, axis: int = -1) -> Optional[int]:
    """Dimension ``axis`` (the last) of ``name`` where the graph fixes it."""
    width = next(arg.shape[axis] for arg in args if arg.name == name)
    return width if isinstance(width, int) else None


def check_graphs(encoder, decoder, config: dict, folder: str, source_symbols: int, target_symbols: int) -> None:
    """The two sessions' inputs and outputs as the translator runs them, and the dictionaries'
    sizes against the graphs' widths; raises ModelFolderError naming the file."""
    encoder_path, decoder_path = (os.path.join(folder, f"{part}.onnx") for part in ("encoder", "decoder"))
    for session, path in ((encoder, encoder_path), (decoder, decoder_path)):
        check_export_id(session, config, path)
    check_args(encoder_path, "input", ranks(encoder.get_inputs()), {"src_tokens": 2}, exact=True)
    encoder_outputs = ranks(encoder.get_outputs())
    wanted = {"alpha": 4, **{name: encoder_outputs.get(name, -1) for name in config["memory_outputs"]},
              **{e["from"]: encoder_outputs.get(e["from"], -1) for e in config["decoder_state"] if "from" in e}}
    check_args(encoder_path, "output", encoder_outputs, wanted, exact=False)
    inputs, outputs = expected_interface(config, encoder_outputs)
    check_args(decoder_path, "input", ranks(decoder.get_inputs()), inputs, exact=True)
    check_args(decoder_path, "output", ranks(decoder.get_outputs()), outputs, exact=False)
    vocab = static_width(decoder.get_inputs(), "lprob_edits")
    if vocab is not None and vocab != target_symbols:
        raise ModelFolderError(f"{os.path.join(folder, 'dict.target.txt')}: {target_symbols} symbols (the four "
                               f"special ones included), but {decoder_path} scores {vocab}: not this model's "
                               f"dictionary")
    k = static_width(decoder.get_outputs(), "read_weights")
    if k is not None and k != config["memory_k"]:
        raise ModelFolderError(f"{decoder_path}: reads {k} memory rows, config.json's memory_k is "
                               f"{config['memory_k']}")
    memories = static_width(encoder.get_outputs(), "alpha", 1)
    if memories is not None and config["alignment_memory"] >= memories:
        raise ModelFolderError(f"{config_path(folder)}: alignment_memory is "
                               f"{config['alignment_memory']}, but {encoder_path} writes {memories} memories "
                               f"(0..{memories - 1})")
    for index, layer in enumerate(config.get("self_attention_cache") or []):
        shape = (static_width(decoder.get_outputs(), f"new_key_{index}", 1),
                 static_width(decoder.get_outputs(), f"new_key_{index}"))
        if shape != (layer["heads"], layer["head_dim"]):
            raise ModelFolderError(f"{config_path(folder)}: self_attention_cache[{index}] is "
                                   f"{layer}, but {decoder_path} writes keys of {shape[0]} heads x {shape[1]}")
    check_source_vocabulary(encoder, config, os.path.join(folder, "dict.source.txt"), source_symbols)


def check_export_id(session, config: dict, path: str) -> None:
    """The graph was written by the export that wrote config.json (exports before export_id: not checked)."""
    expected = config.get("export_id")
    found = session.get_modelmeta().custom_metadata_map.get(EXPORT_ID)
    if expected is not None and found != expected:
        raise ModelFolderError(f"{path}: not written by the export of this folder's config.json (a file of "
                               f"another export?): export the model again into an empty folder")


def check_source_vocabulary(encoder, config: dict, path: str, symbols: int) -> None:
    """The source dictionary has the symbols the model was exported with (config.json's
    source_symbols, in exports that have it), and the encoder's embedding a row for its last symbol:
    the graph does not show its width, so one two-token source is encoded (ONNX Runtime refuses an
    id beyond it)."""
    exported = config.get("source_symbols")
    if exported is not None and exported != symbols:
        raise ModelFolderError(f"{path}: {symbols} symbols (the four special ones included), but the model was "
                               f"exported with {exported}: not this model's dictionary")
    ort = require_onnxruntime()
    quiet = ort.RunOptions()
    quiet.log_severity_level = 4  # the refusal is reported below, not logged by ONNX Runtime too
    try:
        encoder.run(None, {"src_tokens": np.array([[symbols - 1, config["source_eos"]]], np.int64)}, quiet)
    except Exception as error:  # onnxruntime's own exception types
        raise ModelFolderError(f"{path}: {symbols} symbols (the four special ones included), more than the "
                               f"encoder's embedding has: not this model's dictionary ({first_line(error)})") \
            from None
