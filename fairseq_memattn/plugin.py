"""Registration with fairseq: the architectures and tasks, checkpoints loadable under torch's
``weights_only``, and fairseq's loading and batching made to raise our ``UserError`` where they
meet an error a user can fix (a checkpoint that is missing or unreadable, a source longer than
the position encodings' S), and name the options to fix a checkpoint that does not fit where
they came from. In one of fairseq's command lines it also installs the hook that
prints such an error in one line (``errors.install_hook``).

``fairseq_memattn.register()`` runs this once per process; the package runs it on import when
fairseq is already imported, which is always so when fairseq loads it through ``--user-dir``.
"""

import functools
import inspect
import logging
import os
import weakref

from .errors import UserError, fairseq_command_line, install_hook

logger = logging.getLogger(__name__)
_done = False
# S of Eq. 10 of the models built or loaded for a task (the smallest), by task
_position_limits = weakref.WeakKeyDictionary()


def note_position_limit(task, limit: int) -> None:
    """Keep the S of a model built or loaded for ``task``, for ``guard_source_lengths``."""
    from fairseq.tasks import FairseqTask

    if isinstance(task, FairseqTask):  # the tasks whose length filter that guards
        _position_limits[task] = min(limit, _position_limits.get(task, limit))


def register() -> None:
    global _done
    if _done:
        return
    try:
        import fairseq  # noqa: F401
    except Exception as error:  # pragma: no cover - depends on the user's install
        raise ImportError(
            "fairseq_memattn needs an importable fairseq, but 'import fairseq' failed with: "
            f"{type(error).__name__}: {error}\n"
            "On Python 3.11+ install the 've-fairseq==0.12.3' wheel (pip install "
            "ve-fairseq==0.12.3) or keep your own fairseq checkout; PyPI's "
            "fairseq==0.12.2 does not import on Python 3.11. See README.md."
        ) from error
    from . import checkpoint_safety, models, tasks  # noqa: F401  models and tasks register themselves

    checkpoint_safety.allow_fairseq_checkpoints()
    checkpoint_safety.guard_fairseq_loading()
    guard_model_loading()
    guard_training_restore()
    guard_source_lengths()
    if fairseq_command_line():
        install_hook()
    _done = True


def guard_model_loading() -> None:
    """fairseq's ensemble loader (-generate, -interactive, the hub): a missing checkpoint is a
    UserError naming it, a checkpoint that does not fit its saved options names
    --model-overrides (``checkpoint_fit.loading``), and the position encodings' S of the models
    loaded for a task is kept for ``guard_source_lengths``."""
    from fairseq import checkpoint_utils

    from .checkpoint_fit import loading
    from .checkpoint_safety import not_a_file
    from .models.memory_options import position_encoding_limit

    load = checkpoint_utils.load_model_ensemble_and_task
    if getattr(load, "guarded", False):
        return
    signature = inspect.signature(load)

    @functools.wraps(load)
    def guarded(*args, **kwargs):
        call = signature.bind(*args, **kwargs)
        filenames = call.arguments["filenames"] = list(call.arguments["filenames"])
        path = filenames[0] if len(filenames) == 1 else f"one of {', '.join(map(str, filenames))}"
        try:
            with loading("saved", path, call.arguments.get("arg_overrides"), call.arguments.get("task")):
                models, cfg, task = load(*call.args, **call.kwargs)
        except IsADirectoryError as error:  # fairseq's check passes a folder on to torch.load
            if str(error.filename) not in map(str, filenames):
                raise
            raise not_a_file(error.filename) from error
        except OSError as error:
            if str(error).startswith("Model file not found: "):  # fairseq's check, before loading
                raise not_a_file(str(error).split(": ", 1)[1]) from error
            raise
        for limit in map(position_encoding_limit, models):
            if limit is not None:
                note_position_limit(task, limit)
        return models, cfg, task

    guarded.guarded = True
    checkpoint_utils.load_model_ensemble_and_task = guarded


def guard_training_restore() -> None:
    """fairseq's Trainer restoring a checkpoint (fairseq-train's --restore-file, --finetune-from-model,
    or --save-dir's checkpoint_last.pt) into the model built from the command line: a checkpoint that
    does not fit names the options to give (``checkpoint_fit.loading``), and a folder, or a
    --restore-file that is not there, is refused (fairseq would train a new model from scratch)."""
    from fairseq.trainer import Trainer

    from .checkpoint_fit import loading
    from .checkpoint_safety import not_a_file

    restore = Trainer.load_checkpoint
    if getattr(restore, "guarded", False):
        return

    @functools.wraps(restore)
    def guarded(self, filename, *args, **kwargs):
        options = self.cfg.checkpoint
        given = options.restore_file != "checkpoint_last.pt"  # fairseq's default: --save-dir's, if any
        if os.path.isdir(filename) or (given and not os.path.exists(filename)):
            raise not_a_file(filename)
        finetune = (options.finetune_from_model is not None and os.path.exists(filename)
                    and os.path.exists(options.finetune_from_model)
                    and os.path.samefile(filename, options.finetune_from_model))
        with loading("finetune" if finetune else "train", filename, task=self.task):
            return restore(self, filename, *args, **kwargs)

    guarded.guarded = True
    Trainer.load_checkpoint = guarded


def source_length(dataset, index) -> int:
    size = dataset.size(index)
    return int(size[0] if isinstance(size, tuple) else size)


def guard_source_lengths() -> None:
    """fairseq refuses a source longer than the models' limit with advice about
    --skip-invalid-size-inputs-valid-test only, and skips longer training pairs saying only
    max_positions; when the limit is the S of Eq. 10 that the position encodings cover, the
    error and the warning name the option that set S."""
    from fairseq.tasks import FairseqTask

    from .modules.memory import source_too_long

    filter_by_size = FairseqTask.filter_indices_by_size
    if getattr(filter_by_size, "guarded", False):
        return

    @functools.wraps(filter_by_size)
    def guarded(self, indices, dataset, max_positions=None, ignore_invalid_inputs=False):
        limit = _position_limits.get(self)
        sizes = getattr(dataset, "src_sizes", None)
        if ignore_invalid_inputs and limit is not None and sizes is not None:
            longer = int((sizes[indices] > limit).sum())
            if longer:
                logger.warning(f"{longer} of {len(indices)} sources are longer than the S = {limit} that the "
                               f"position encodings cover (--memory-position-max-len {limit}) and are skipped")
        try:
            return filter_by_size(self, indices, dataset, max_positions, ignore_invalid_inputs)
        except Exception as error:
            if limit is None or not str(error).startswith("Size of sample #"):
                raise
            index = next((i for i in indices if source_length(dataset, i) > limit), None)
            if index is None:  # too long for another limit than S
                raise
            raise UserError(source_too_long(f"source #{index}", source_length(dataset, index), limit)
                            + ", or skip such sources with --skip-invalid-size-inputs-valid-test") from None

    guarded.guarded = True
    FairseqTask.filter_indices_by_size = guarded
