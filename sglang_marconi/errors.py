"""The one exception type for bad user input: the CLI prints it as one ``error: ...`` line and
exits with status 2."""


class UserError(ValueError):
    """Bad input from the user: the message names the file/line or the field at fault."""
