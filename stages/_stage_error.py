"""StageError: what a stage program and its shared helpers raise when an item cannot be completed.

It has a module of its own so that the helper modules (_ranks, _completion, _durable, ...) and `_common`, which
re-exports it, can all import it without importing one another.
"""


class StageError(Exception):
    """A stage could not complete some of its items; the message names them."""
