"""The copy task of Sec. 4.1."""

from . import copy_task  # noqa: F401
