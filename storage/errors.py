"""The two kinds of mistakes a user fixes: one line naming the option or file, the problem and the fix (the
command line prints it and exits with status 2). Here, at the bottom, so every layer raises the same ones."""


class ConfigError(ValueError):
    """A bad setting; the message names the option and the fix in one line."""


class DataError(ValueError):
    """Input the user must fix. The message is one line: the path, the problem, the fix."""
