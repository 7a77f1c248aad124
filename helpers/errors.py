"""The launcher's exceptions; each message names the rank, the operation and what to do next."""


class LaunchError(RuntimeError):
    """A multi-rank run could not complete."""


class RankFailed(LaunchError):
    """A rank raised an exception or its process died."""

    def __init__(self, message, rank, exitcode=None, exc_type=None):
        super().__init__(message)
        self.rank = rank
        self.exitcode = exitcode
        self.exc_type = exc_type


class CollectiveHang(LaunchError):
    """No rank made progress for hang_timeout seconds; `reports` says where each rank was."""

    def __init__(self, message, reports):
        super().__init__(message)
        self.reports = reports


class CollectiveMismatch(LaunchError):
    """Ranks were about to call different collectives (check_collectives=True); `calls` holds each rank's call."""

    def __init__(self, message, calls):
        super().__init__(message)
        self.calls = calls
