"""The one exception type for bad user input (configs, traces, flags).

The CLI prints it as a single ``error: ...`` line and exits with status 2; everything else
is a bug and keeps its traceback.
"""


class UserError(ValueError):
    """Bad input from the user: the message names the file/line or the field at fault."""
