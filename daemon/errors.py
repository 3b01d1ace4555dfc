"""The one error hierarchy of swarmd.

Every package raises from here, ``swarmd.peers`` and ``swarmd.models`` included: this module
imports nothing of swarmd, so it is the single exception to the rule that ``peers`` never
imports the daemon's modules. A message says what failed, the value and the limit, and what
to do; the CLI prints it on one line (a traceback only with ``--debug``).
"""


class SwarmdError(Exception):
    """Base of every error swarmd raises on purpose."""


class ConfigError(SwarmdError):
    """The config file or a command-line value is malformed or out of range."""


class IdentityError(SwarmdError):
    """The identity key on disk is missing, unreadable or corrupt."""


class RecordError(SwarmdError):
    """A signed record failed its size, schema, signature or expiry check."""


class RunSpecError(SwarmdError):
    """A run spec is malformed, or its signature or run ID does not check out."""


class MalformedRunId(ConfigError, RunSpecError):
    """A run ID not of the form ``NAME.HASH``: the user's input (exit 2), or a peer's record."""


class JoinError(SwarmdError):
    """The daemon could not join the run's swarm (peers unreachable, spec not served)."""


class BootstrapError(JoinError):
    """None of the initial peers could be reached; worth retrying, they may come back."""


class ControlError(SwarmdError):
    """The local control socket could not be reached or answered garbage."""


class AlreadyRunningError(SwarmdError):
    """Another daemon already uses this state directory."""
