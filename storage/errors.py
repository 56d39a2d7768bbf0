"""The two kinds of mistakes a user fixes: one line naming the option or file, the problem and the fix (the
command line prints it and exits with status 2). Here, at the bottom, so every layer raises the same ones.

one_line() is how every entry point shows such an error (the CLI, the TFX CLI's runner file, the Vertex driver):
on one line, of a readable length, whatever value it echoes (a 100,000-character --model was echoed whole)."""

import re


class ConfigError(ValueError):
    """A bad setting; the message names the option and the fix in one line."""


class DataError(ValueError):
    """Input the user must fix. The message is one line: the path, the problem, the fix."""


# Characters of a value shown whole in an error (a long path fits); a longer one is cut in its middle.
LONGEST_WORD = 300
LONGEST_LINE = 1500


def shown(value: str, most: int = LONGEST_WORD) -> str:
    """A value as an error shows it: whole, or its start and end around how much was left out."""
    value = str(value)
    if len(value) <= most:
        return value
    keep = max(most // 2 - 10, 8)
    return f"{value[:keep]}...({len(value) - 2 * keep:,} characters)...{value[-keep:]}"


def one_line(message: str, most: int = LONGEST_LINE) -> str:
    """An error's message on one line: its lines joined, every value over LONGEST_WORD characters cut (shown), and
    the whole at most `most` characters."""
    text = " ".join(part.strip() for part in str(message).splitlines() if part.strip())
    text = re.sub(r"\S{%d,}" % (LONGEST_WORD + 1), lambda m: shown(m.group(0)), text)
    return shown(text, most) if len(text) > most else text
