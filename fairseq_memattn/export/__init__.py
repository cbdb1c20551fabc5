"""Export a checkpoint of this plugin to ONNX graphs for ONNX Runtime (``fairseq_memattn.deploy``
translates with them); ``fairseq-memattn-export`` (``fairseq_memattn.cli.export``) runs it.

Exports ``transformer_memattn`` (both reads; shared or per-layer memories)
and ``lstm_memattn`` with memory attention. OUT holds ``encoder.onnx``
(source -> what the decoder reads, projected once per source, and alpha of
Eq. 4-5 for alignments), ``decoder.onnx`` (one decoder step with its
self-attention cache, or the LSTM's h and c, as inputs and outputs, ending in the beam search's
choice of candidates), ``config.json``, the dictionaries and, when there is one, the
sentencepiece model. ``--quantize int8``: every matrix product with a constant
weight in int8, the weight per output column, its input per row (a sentence's
result does not depend on its batch), and the embedding tables in int8; an LSTM
stays float32. Needs onnx (the optional extra ``deploy``: ``pip install ".[deploy]"`` in a checkout).
"""

import json
import os
import shutil
import uuid

from ..errors import UserError, import_installed
from ..staging import staging_beside

FORMAT_VERSION = 4
SUPPORTED = ("transformer_memattn (model memattn_transformer), both reads, shared or per-layer memories, "
             "and lstm_memattn (model memattn_lstm) with --attention-type memory")


class ExportError(UserError):
    """A checkpoint or option the export cannot handle; the message says which."""


def load_checkpoint(path: str, data: str = None):
    """(model in eval mode, task) from a fairseq checkpoint of this plugin, or ExportError."""
    from fairseq import checkpoint_utils
    from fairseq.models.transformer import TransformerModel

    from .. import register
    from ..checkpoint_safety import CheckpointError, architecture, read_checkpoint, registered_model, setup_task
    from ..models.lstm_memattn import MemAttnLSTMModel
    from ..models.transformer_memattn import MemAttnTransformerModel

    register()
    try:
        state = read_checkpoint(path, data)  # with --data: load_model_ensemble_and_task takes the state as it is
    except CheckpointError as error:
        raise ExportError(str(error)) from None
    cfg = state["cfg"]
    arch = architecture(cfg["model"])
    model_class = registered_model(cfg["model"])
    if model_class not in (MemAttnTransformerModel, MemAttnLSTMModel):
        # fairseq's own transformer: the memory model is one conversion and a short fine-tuning away
        hint = ("; convert it first (fairseq-memattn-convert CHECKPOINT OUT.pt --memory-k 64, then fine-tune), "
                "or run it as it is with CTranslate2") if model_class is TransformerModel else ""
        raise ExportError(f"unsupported model {arch!r} in {path}: the export supports {SUPPORTED}{hint}")
    if model_class is MemAttnLSTMModel and cfg["model"].attention_type != "memory":
        raise ExportError(f"unsupported --attention-type {cfg['model'].attention_type!r} in {path}: "
                          f"the export supports {SUPPORTED}")
    try:
        task = setup_task(cfg["task"], path)
    except CheckpointError as error:
        raise ExportError(str(error)) from None
    models, _, _ = checkpoint_utils.load_model_ensemble_and_task([path], task=task, state=state)
    model = models[0].float().eval()
    return model, task


def export(checkpoint: str, out: str, data: str = None, quantize: str = None,
           sentencepiece_model: str = None, force: bool = False, short_source_rows: int = None) -> dict:
    """Write the graphs, config and dictionaries of ``checkpoint`` to ``out``; returns the config.
    An existing ``out`` must be an empty folder, or with ``force`` the files of an earlier export
    there are replaced once this one is complete (all of them: a stale sentencepiece model would be
    taken for this export's); anything refused or failing leaves ``out`` as it was.
    ``short_source_rows`` (transformer_memattn): sources shorter than this keep |S| memory rows
    (export/transformer.py's ``build``; None: its default, 0: never)."""
    onnx = import_installed("onnx", "the export needs onnx, which is not installed: pip install onnx onnxruntime",
                            ExportError)
    if quantize not in (None, "int8"):
        raise ExportError(f"invalid --quantize: {quantize!r} (choose from int8)")
    check_out(out, force)
    check_sentencepiece(sentencepiece_model)
    # Written beside OUT and moved in at the end: a refusal or a failure leaves an earlier export whole.
    with staging_beside(out, ExportError) as staging:
        config = write(staging, checkpoint, data, quantize, sentencepiece_model, short_source_rows, onnx)
        replace_export(out, staging)
    return config


def write(folder: str, checkpoint: str, data: str, quantize: str, sentencepiece_model: str,
          short_source_rows: int, onnx) -> dict:
    """export's files, written to FOLDER."""
    model, task = load_checkpoint(checkpoint, data)
    from ..models.transformer_memattn import MemAttnTransformerModel
    from . import lstm, transformer

    family = transformer if isinstance(model, MemAttnTransformerModel) else lstm
    if family is lstm and short_source_rows:
        raise ExportError(f"invalid --short-source-rows: {short_source_rows} (transformer_memattn only; an "
                          "lstm_memattn memory keeps K rows)")
    options = (short_source_rows,) if family is transformer else ()
    try:  # the families refuse what they do not export with a ValueError
        family.check_supported(model)
        graphs, config = family.build(model, quantize, *options)
    except ValueError as error:
        raise ExportError(str(error)) from None
    from ..deploy.config import EXPORT_ID

    export_id = uuid.uuid4().hex  # a graph copied in from another export is told at load
    for part, graph in graphs.items():
        graph_model = graph.model()
        onnx.helper.set_model_props(graph_model, {EXPORT_ID: export_id})
        onnx.save(graph_model, os.path.join(folder, f"{part}.onnx"))
    src_dict, tgt_dict = task.source_dictionary, task.target_dictionary
    src_dict.save(os.path.join(folder, "dict.source.txt"))
    tgt_dict.save(os.path.join(folder, "dict.target.txt"))
    spm = sentencepiece_model or _data_sentencepiece(task)
    if spm:
        shutil.copyfile(spm, os.path.join(folder, "spm.model"))
    config.update({
        "format_version": FORMAT_VERSION, "quantize": quantize, "export_id": export_id,
        "pad": tgt_dict.pad(), "eos": tgt_dict.eos(), "unk": tgt_dict.unk(), "bos": tgt_dict.bos(),
        "source_pad": src_dict.pad(), "source_eos": src_dict.eos(), "source_symbols": len(src_dict),
        "max_source_positions": int(model.max_positions()[0]),
        "max_target_positions": int(model.max_decoder_positions()),
    })
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    return config


def export_files(out: str):
    """What an export wrote to ``out``: graphs, dictionaries, sentencepiece model, config."""
    return [name for name in os.listdir(out) if name.endswith(".onnx") or name in
            ("dict.source.txt", "dict.target.txt", "spm.model", "config.json")]


def check_out(out: str, force: bool):
    if os.path.exists(out) and not os.path.isdir(out):
        raise ExportError(f"invalid OUT: {out} is a file (give a folder, new or empty)")
    if os.path.isdir(out) and os.listdir(out) and not force:
        raise ExportError(f"invalid OUT: {out} is not empty (give a new or empty folder, or pass "
                          "--force to replace an earlier export there)")


def check_sentencepiece(path: str):
    """--sentencepiece-model, read as the translator will read it."""
    if path is None:
        return
    from ..deploy.text import SentencePiece

    try:
        SentencePiece(path)
    except ValueError as error:
        raise ExportError(f"invalid --sentencepiece-model: {error}") from None


def replace_export(out: str, staging: str):
    """OUT's files of an earlier export (only those: a stale sentencepiece model would be taken for
    this export's) replaced by STAGING's."""
    os.makedirs(out, exist_ok=True)
    for name in export_files(out):
        os.remove(os.path.join(out, name))
    for name in os.listdir(staging):
        os.replace(os.path.join(staging, name), os.path.join(out, name))


def _data_sentencepiece(task):
    """spm.model in the task's data folder or the one above it (the WMT'17 recipe's layout)."""
    data = getattr(getattr(task, "cfg", None), "data", None)
    if not data:
        return None
    folder = os.path.abspath(data.split(os.pathsep)[0])
    for candidate in (folder, os.path.dirname(folder)):
        path = os.path.join(candidate, "spm.model")
        if os.path.isfile(path):
            return path
    return None
