"""Files the commands write where the user points them (--out, --output): reports, results, schemas.

Only a regular file or a new path is written, never a device, pipe or socket (run as root,
`report --out /dev/full` replaced the device node with an HTML file), and a file is written under a
temporary name and moved into place whole, so a full disk leaves no partial file behind. Every
problem is one line naming the option (a ConfigError: exit status 2).
"""

import os
import stat

from storage.errors import ConfigError


def check_target(path: str, option: str) -> None:
    """ConfigError unless `path` is a regular file or does not exist yet, in a folder that exists or can be made."""
    try:
        mode = os.stat(path).st_mode  # follows links: a link to /dev/null is a device
    except FileNotFoundError:
        return
    except OSError as e:
        raise ConfigError(f"{option} {path}: cannot use it ({e.strerror}); give the path of a new or regular file") \
            from None
    if stat.S_ISDIR(mode):
        raise ConfigError(f"{option} {path}: a folder; give a file name, e.g. {os.path.join(path, 'out')}")
    if not stat.S_ISREG(mode):
        raise ConfigError(f"{option} {path}: not a regular file (a device, pipe or socket), which is never written; "
                          "give the path of a new or regular file")


def partial_path(path: str) -> str:
    return path + ".partial"


def write_whole(path: str, data: bytes, option: str) -> str:
    """Writes `data` to `path` (checked by check_target) through a temporary file; returns path."""
    check_target(path, option)
    partial = partial_path(path)
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(partial, "wb") as f:
            f.write(data)
        os.replace(partial, path)
    except OSError as e:
        discard(partial)
        raise ConfigError(f"{option} {path}: cannot write it ({e.strerror or e}); give a path on a disk with "
                          "room that you can write to") from None
    return path


def discard(partial: str) -> None:
    """Removes a temporary file if it is there (never leave half a file behind)."""
    try:
        os.remove(partial)
    except OSError:
        pass
