"""The runtime's errors: a broken model folder, a source the limits refuse."""

from ..errors import UserError


class ModelFolderError(UserError):
    """An exported model folder that is incomplete, unreadable or inconsistent; the message names the file."""


class SourceError(UserError):
    """A source that cannot be translated with the given limits (an impossible --min-len)."""


class SourceTooLong(SourceError):
    """A source longer than the model's positions or the batch's --max-tokens."""
