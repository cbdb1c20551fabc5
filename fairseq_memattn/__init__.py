"""fairseq plugin: fixed-size memory attention (Britz, Guan & Luong, EMNLP 2017).

Use it with any fairseq command line through ``--user-dir``. fairseq imports this package
(``fairseq.utils.import_user_module``) after importing itself, so the package registers its
architectures and tasks, makes fairseq checkpoints loadable under torch's ``weights_only``
protection and reports the errors a user can fix in one line exactly when fairseq is already
imported (``register``). Importing it otherwise imports neither torch nor fairseq and changes
nothing in the process: the translator runtime (``fairseq_memattn.deploy``: numpy,
onnxruntime, sentencepiece) runs without them. A program of yours that loads checkpoints
through fairseq before importing fairseq itself calls ``fairseq_memattn.register()``.
"""

import sys

__version__ = "0.2.0"


def register() -> None:
    """Register with fairseq (see plugin.py); once per process, idempotent."""
    from .plugin import register as register_with_fairseq

    register_with_fairseq()


if "fairseq" in sys.modules:
    register()
