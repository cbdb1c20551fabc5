"""fairseq plugin: fixed-size memory attention (Britz, Guan & Luong, EMNLP 2017).

Use it with any fairseq command line through ``--user-dir``; where fairseq is installed,
importing this package registers the architectures and tasks and makes fairseq checkpoints
loadable under torch's ``weights_only`` protection. Without fairseq only the translator
runtime (``fairseq_memattn.deploy``: numpy, onnxruntime, sentencepiece) is usable.
"""

import importlib.util

__version__ = "0.2.0"


def _fairseq_installed() -> bool:
    try:
        return importlib.util.find_spec("fairseq") is not None
    except (ImportError, ValueError):  # a finder that refuses it, or a broken fairseq entry in sys.modules
        return False


if _fairseq_installed():
    try:
        import fairseq  # noqa: F401
    except Exception as error:  # pragma: no cover - depends on the user's install
        raise ImportError(
            "fairseq_memattn needs an importable fairseq, but 'import fairseq' failed with: "
            f"{type(error).__name__}: {error}\n"
            "On Python 3.11+ install the 've-fairseq==0.12.3' wheel (pip install "
            "'fairseq_memattn[ve-fairseq]') or keep your own fairseq checkout; PyPI's "
            "fairseq==0.12.2 does not import on Python 3.11. See README.md."
        ) from error

    from . import checkpoint_safety, errors, models, tasks  # noqa: F401,E402

    checkpoint_safety.allow_fairseq_checkpoints()
    errors.explain_errors()
