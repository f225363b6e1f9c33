"""Errors of the runtime package.

``RlxError`` is the base for every runtime failure; ``UsageError`` marks a user's mistake
(bad config value, bad path, bad data). The CLI prints either as one line, never a traceback.
"""


class RlxError(Exception):
    """Base class of runtime errors."""


class UsageError(RlxError):
    """A user's mistake: the message names the bad value and what would be accepted."""
