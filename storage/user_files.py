"""Files the commands write where the user points them (--out, --output): reports, results, schemas.

Only a new path, or a file the same command wrote before, is written: never a file imagepipe did not write (a
manifest, a photo, a model's saved_model.pb: `report --out` once replaced them with HTML), and never a device,
pipe or socket (run as root, `report --out /dev/full` replaced the device node). Each kind of file says how to
know it as ours (`Kind`: a marker its first bytes carry). A file is written under a fresh temporary name and
moved into place whole, so a full disk leaves no partial file behind. Every problem is one line naming the
option (a ConfigError: exit status 2).
"""

import os
import shutil
import stat
import tempfile
from typing import Callable, NamedTuple, Optional

from storage.errors import ConfigError

HEAD_BYTES = 4096  # what is read of an existing file to tell whether imagepipe wrote it


class Kind(NamedTuple):
    """A kind of file a command writes: what it is called, and whether a file's first bytes are one of ours."""

    name: str
    ours: Callable[[bytes], bool]
    refusal: str = ""  # what to say instead of the general refusal


def check_target(path: str, option: str, kind: Optional[Kind] = None) -> None:
    """ConfigError unless `path` does not exist yet, or is a regular file that `kind` knows as one imagepipe wrote
    (a kind of None: any regular file), in a folder that exists or can be made."""
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
    if kind is not None and not kind.ours(head(path)):
        raise ConfigError(f"{option} {path}: " + (kind.refusal or f"the file exists and is not {kind.name} imagepipe "
                                                  "wrote, so it is never overwritten; give a new path (or move the "
                                                  "file away first)"))


def head(path: str) -> bytes:
    """The first bytes of a file (b"" if it cannot be read: then it is not known as ours)."""
    try:
        with open(path, "rb") as f:
            return f.read(HEAD_BYTES)
    except OSError:
        return b""


def partial_path(path: str) -> str:
    """A new temporary file beside `path` (hidden, unique: never a file that was already there) to write into
    before it is moved into place."""
    folder, name = os.path.split(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    handle, partial = tempfile.mkstemp(prefix=f".{name}.", suffix=".partial", dir=folder)
    os.close(handle)
    return partial


def write_whole(path: str, data: bytes, option: str, kind: Optional[Kind] = None) -> str:
    """Writes `data` to `path` (checked by check_target) through a temporary file; returns path."""
    check_target(path, option, kind)
    partial = None
    try:
        partial = partial_path(path)
        with open(partial, "wb") as f:
            f.write(data)
        os.replace(partial, path)
    except OSError as e:
        discard(partial)
        raise ConfigError(f"{option} {path}: cannot write it ({e.strerror or e}); give a path on a disk with "
                          "room that you can write to") from None
    return path


def discard(partial: Optional[str]) -> None:
    """Removes a temporary file if it is there (never leave half a file behind)."""
    try:
        if partial:
            os.remove(partial)
    except OSError:
        pass


COMPLETE = ".complete"  # the marker of a folder write_folder made (and finished); it holds the folder's kind


def _made_here(out: str, kind: str) -> bool:
    """Whether `out` is a finished folder of this kind made here (its COMPLETE marker names the kind: a folder of
    sample images is never taken for a folder of maps, and replaced)."""
    try:
        with open(os.path.join(out, COMPLETE)) as f:
            return f.read() == kind
    except (OSError, UnicodeDecodeError):
        return False


def write_folder(out: str, build: Callable[[str], None], option: str, replace: bool = False, kind: str = "") -> str:
    """Makes the folder `out` with build(folder) in a new temporary folder beside it, then moves it into place
    whole (a COMPLETE marker inside). `out` must be new, empty, or a folder of this `kind` made here before: that
    one is kept as it is, or with `replace` made again. A folder holding anything else is the user's, never deleted
    or written into (ConfigError)."""
    if _made_here(out, kind) and not replace:
        return out
    folder = FolderWriter(out, option, kind)
    try:
        build(folder.partial)
    except BaseException:
        folder.close(complete=False)
        raise
    folder.close(complete=True)
    return out


class FolderWriter:
    """A folder written as things come (`partial`: a new temporary folder beside `out`), moved into place whole by
    close(complete=True), with a COMPLETE marker naming `kind` inside; close(complete=False) removes it. `out` must
    be new, empty, or a folder of this kind made here before (replaced); a folder holding anything else is the
    user's (ConfigError at once)."""

    def __init__(self, out: str, option: str, kind: str = ""):
        self.out, self._kind = out, kind
        self._ours = _made_here(out, kind)
        if os.path.lexists(out) and not self._ours:
            if not os.path.isdir(out) or os.path.islink(out):
                raise ConfigError(f"{option} {out}: not a folder; give a new or empty folder")
            if os.listdir(out):
                raise ConfigError(f"{option} {out}: the folder holds files imagepipe did not write, which it never "
                                  "deletes or writes among; give a new or empty folder")
        parent, name = os.path.split(os.path.abspath(out))
        os.makedirs(parent, exist_ok=True)
        self.partial = tempfile.mkdtemp(prefix=f".{name}.", suffix=".partial", dir=parent)
        self._closed = False

    def close(self, complete: bool) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if complete:
                with open(os.path.join(self.partial, COMPLETE), "w") as f:
                    f.write(self._kind)
                if self._ours:  # made here before (its marker): replaced
                    shutil.rmtree(self.out)
                os.replace(self.partial, self.out)  # over an empty folder too (POSIX rename)
                return
        except BaseException:
            shutil.rmtree(self.partial, ignore_errors=True)
            raise
        shutil.rmtree(self.partial, ignore_errors=True)  # the temporary folder made here, nothing else


def same_file(a: str, b: str) -> bool:
    """Whether two local paths name one file (links followed)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def inside(path: str, folder: str) -> bool:
    """Whether a local path lies within a folder (links followed)."""
    real, base = os.path.realpath(path), os.path.realpath(folder)
    return real == base or real.startswith(base.rstrip(os.sep) + os.sep)
