"""``--user-dir fairseq_memattn`` for fairseq-memattn-plot, which is this package already imported.

fairseq imports a --user-dir folder as a module named after the folder, and refuses one whose
name is taken by a package from another folder ("module name (fairseq_memattn) is not globally
unique"). Our command is that package: after ``pip install .`` it runs from site-packages while
``--user-dir fairseq_memattn`` from the repository root names the repository's copy. Such a copy
is counted among the folders fairseq has already imported, so fairseq skips it and the running
package serves, as it does for a folder it imported itself.
"""

import logging
import os

PACKAGE_NAME = __name__.split(".")[0]
PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
logger = logging.getLogger("fairseq_memattn.plot")


def is_this_package(path: str) -> bool:
    """A folder holding a package of this package's name (this one, or another copy of it)."""
    return os.path.basename(path) == PACKAGE_NAME and os.path.isfile(os.path.join(path, "__init__.py"))


class ImportedUserDirs(set):
    """fairseq's record of the --user-dir folders it has imported (``import_user_module.memo``,
    absolute paths), in which any copy of this package counts as imported."""

    def __contains__(self, path) -> bool:
        if set.__contains__(self, path):
            return True
        if not (isinstance(path, str) and is_this_package(path)):
            return False
        if path != PACKAGE_DIR:
            logger.info(f"--user-dir {path}: {PACKAGE_NAME} is already imported from {PACKAGE_DIR}; "
                        f"that copy runs")
        return True


def accept_this_package() -> None:
    from fairseq import utils

    memo = getattr(utils.import_user_module, "memo", set())
    if not isinstance(memo, ImportedUserDirs):
        utils.import_user_module.memo = ImportedUserDirs(memo)
