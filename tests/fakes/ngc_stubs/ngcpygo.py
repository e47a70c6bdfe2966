"""Import-only stand-in for ``ngcpygo`` (the standalone CLI's Go extension, used only by exec/attach).

basecommand.api.kubewrappers imports these names at module import; calling exec_attach is an error here.
"""


class NoGoException(Exception):
    """Stand-in for ngcpygo.NoGoException."""


class NotFoundException(Exception):
    """Stand-in for ngcpygo.NotFoundException."""


class ExecAttachArgs:  # pylint: disable=too-few-public-methods
    """Stand-in for ngcpygo.ExecAttachArgs: keeps the keyword arguments."""

    def __init__(self, **kwargs: object) -> None:
        self.__dict__.update(kwargs)


def exec_attach(_args: ExecAttachArgs) -> None:
    """exec/attach needs the real standalone CLI; the stand-in refuses."""
    raise NoGoException("ngcpygo stand-in: exec/attach is not available offline")
