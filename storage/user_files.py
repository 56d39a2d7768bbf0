"""Files the commands write where the user points them (--out, --output): reports, results, schemas.

Only a new path, or a file the same command wrote before, is written: never a file imagepipe did not write (a
manifest, a photo, a model's saved_model.pb: `report --out` once replaced them with HTML), and never a device,
pipe or socket (run as root, `report --out /dev/full` replaced the device node). Each kind of file says how to
know it as ours (`Kind`: a marker its first bytes carry). A file is written under a fresh temporary name and
moved into place whole, so a full disk leaves no partial file behind. Every problem is one line naming the
option (a ConfigError: exit status 2).
"""

import contextlib
import fcntl
import json
import os
import shutil
import stat
import tempfile
from typing import Callable, List, NamedTuple, Optional

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
        raise ConfigError(
            f"{option} {path}: cannot use it ({e.strerror}); give the path of a new or regular file"
        ) from None
    if stat.S_ISDIR(mode):
        raise ConfigError(f"{option} {path}: a folder; give a file name, e.g. {os.path.join(path, 'out')}")
    if not stat.S_ISREG(mode):
        raise ConfigError(
            f"{option} {path}: not a regular file (a device, pipe or socket), which is never written; "
            "give the path of a new or regular file"
        )
    if kind is not None and not kind.ours(head(path)):
        raise ConfigError(
            f"{option} {path}: "
            + (
                kind.refusal
                or f"the file exists and is not {kind.name} imagepipe "
                "wrote, so it is never overwritten; give a new path (or move the "
                "file away first)"
            )
        )


def check_source(path: str, option: str, give: str) -> None:
    """ConfigError, naming `option` and what to `give` instead, unless the local `path` is a regular file (a pipe
    would block a reader, a device never end, a folder fail in a traceback)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise ConfigError(f"{option} {path}: no such file; {give}") from None
    except OSError as e:
        raise ConfigError(f"{option} {path}: cannot read it ({e.strerror}); {give}") from None
    if stat.S_ISDIR(mode):
        raise ConfigError(f"{option} {path}: a folder; {give}")
    if not stat.S_ISREG(mode):
        raise ConfigError(
            f"{option} {path}: not a regular file (a device, pipe or socket), which is never read; {give}"
        )


def head(path: str) -> bytes:
    """The first bytes of a file (b"" if it cannot be read: then it is not known as ours)."""
    try:
        with open(path, "rb") as f:
            return f.read(HEAD_BYTES)
    except OSError:
        return b""


def _real_folder(path: str) -> bool:
    """A folder, not a link to one (nor a file of the same name as a folder imagepipe wrote)."""
    return os.path.isdir(path) and not os.path.islink(path)


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
        raise ConfigError(
            f"{option} {path}: cannot write it ({e.strerror or e}); give a path on a disk with "
            "room that you can write to"
        ) from None
    return path


def discard(partial: Optional[str]) -> None:
    """Removes a temporary file if it is there (never leave half a file behind)."""
    try:
        if partial:
            os.remove(partial)
    except OSError:
        pass


COMPLETE = ".complete"  # the marker of a folder write_folder made (and finished): its kind and the files it wrote


class _Marker(NamedTuple):
    kind: str
    files: Optional[List[str]]  # relative paths of the files imagepipe wrote there; None: an earlier marker


def _marker(out: str) -> Optional[_Marker]:
    """The COMPLETE marker of a finished folder made here (JSON: its kind and files; an earlier one held only the
    kind), or None."""
    try:
        with open(os.path.join(out, COMPLETE), encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError):
        return None
    try:
        found = json.loads(text)
        return _Marker(str(found["kind"]), [str(name) for name in found["files"]])
    except (ValueError, KeyError, TypeError):
        return _Marker(text, None)


def _made_here(out: str, kind: str) -> bool:
    """Whether `out` is a finished folder of this kind made here (its COMPLETE marker names the kind: a folder of
    sample images is never taken for a folder of maps, and replaced)."""
    marker = _marker(out)
    return marker is not None and marker.kind == kind and not os.path.islink(out)


def write_folder(out: str, build: Callable[[str], None], option: str, replace: bool = False, kind: str = "") -> str:
    """Makes the folder `out` with build(folder) in a new temporary folder beside it, then moves it into place
    whole (a COMPLETE marker inside). `out` must be new, empty, or a folder of this `kind` made here before: that
    one is kept as it is, or with `replace` made again (only what imagepipe wrote in it is replaced). Anything else
    is the user's, never deleted or written into (ConfigError)."""
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
    close(complete=True), with a COMPLETE marker inside naming `kind` and listing the files written;
    close(complete=False) removes it. `out` must be new, empty, or a folder of this kind made here before. That one
    is replaced in what imagepipe wrote there only (its marker's list): a file the user added to it is kept, moved
    into the new folder (refused, at close, if the new folder writes a file of that name). Writers of one parent
    folder take turns at close (a lock on the parent), so two runs into one new folder leave the last one's whole.
    Every problem is one line naming the option (ConfigError)."""

    def __init__(self, out: str, option: str, kind: str = ""):
        self.out, self._option, self._kind = out, option, kind
        self._check(_marker(out))
        parent, name = os.path.split(os.path.abspath(out))
        try:
            os.makedirs(parent, exist_ok=True)
            self.partial = tempfile.mkdtemp(prefix=f".{name}.", suffix=".partial", dir=parent)
        except OSError as e:
            raise ConfigError(
                f"{option} {out}: cannot write there ({e.strerror or e}); give a folder you can write to"
            ) from None
        self._closed = False

    def _check(self, marker: Optional[_Marker]) -> bool:
        """Whether `out` is a folder of ours to replace (False: new or empty); ConfigError when it cannot be."""
        out, option = self.out, self._option
        if os.path.islink(out):
            raise ConfigError(
                f"{option} {out}: a symbolic link, which is never written through; give the folder's "
                "own path (new, empty, or one imagepipe wrote)"
            )
        if not os.path.lexists(out):
            return False
        if not os.path.isdir(out):
            raise ConfigError(f"{option} {out}: not a folder; give a new or empty folder")
        if marker is not None and marker.kind == self._kind:
            if marker.files is None:
                raise ConfigError(
                    f"{option} {out}: written by an earlier imagepipe that did not list its files, so "
                    "files of yours there cannot be told from its own; give a new folder (or empty "
                    "this one first)"
                )
            return True
        try:
            empty = not os.listdir(out)
        except OSError as e:
            raise ConfigError(f"{option} {out}: cannot read it ({e.strerror}); give a new or empty folder") from None
        if not empty:
            raise ConfigError(
                f"{option} {out}: the folder holds files imagepipe did not write, which it never "
                "deletes or writes among; give a new or empty folder"
            )
        return False

    def close(self, complete: bool) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if complete:
                written = _files_under(self.partial)
                with open(os.path.join(self.partial, COMPLETE), "w", encoding="utf-8") as f:
                    json.dump({"kind": self._kind, "files": written}, f)
                with _parent_locked(self.out):
                    self._move_into_place(set(written))
                return
        except OSError as e:
            shutil.rmtree(self.partial, ignore_errors=True)
            raise ConfigError(
                f"{self._option} {self.out}: cannot write there ({e.strerror or e}); give a folder you "
                "can write to, on a disk with room"
            ) from None
        except BaseException:
            shutil.rmtree(self.partial, ignore_errors=True)
            raise
        shutil.rmtree(self.partial, ignore_errors=True)  # the temporary folder made here, nothing else

    def _move_into_place(self, written: set) -> None:
        marker = _marker(self.out)  # again: another writer may have finished since __init__
        if not self._check(marker):
            os.replace(self.partial, self.out)  # new, or over an empty folder (POSIX rename)
            return
        ours = set(marker.files)
        folders_of_ours = {rel.rsplit("/", i)[0] for rel in ours for i in range(1, rel.count("/") + 1)}
        theirs = [
            rel
            for rel in _entries_under(self.out)
            if rel not in ours
            and rel != COMPLETE
            and not (rel in folders_of_ours and _real_folder(os.path.join(self.out, rel)))
        ]  # emptied, ours
        # Every clash first, both ways (a file of theirs where this run writes one, or under a name it writes as a
        # file), before anything is moved.
        clash = next(
            (
                rel
                for rel in theirs
                if rel in written
                or any(w.startswith(rel + "/") for w in written)
                or any(rel.startswith(w + "/") for w in written)
            ),
            None,
        )
        if clash:
            raise ConfigError(
                f"{self._option} {self.out}: {clash} is not a file imagepipe wrote, and this run writes "
                "one of that name; move it away, or give another folder"
            )
        moved: List[str] = []
        old = tempfile.mkdtemp(
            prefix=f".{os.path.basename(os.path.abspath(self.out))}.",
            suffix=".old",
            dir=os.path.dirname(os.path.abspath(self.out)),
        )
        aside = os.path.join(old, "folder")
        try:
            for rel in theirs:  # the user's files go on living in the folder: moved, never copied or deleted
                target = os.path.join(self.partial, rel)
                os.makedirs(os.path.dirname(target), exist_ok=True)
                os.rename(os.path.join(self.out, rel), target)
                moved.append(rel)
            os.rename(self.out, aside)
            os.replace(self.partial, self.out)
        except BaseException:  # a failed replace leaves the folder as it was, the user's files back in it
            if os.path.lexists(aside) and not os.path.lexists(self.out):
                os.rename(aside, self.out)
            for rel in reversed(moved):
                os.makedirs(os.path.dirname(os.path.join(self.out, rel)), exist_ok=True)
                os.rename(os.path.join(self.partial, rel), os.path.join(self.out, rel))
            shutil.rmtree(old, ignore_errors=True)  # empty, or the folder as it was when it could not go back
            raise
        _remove_listed(aside, ours | {COMPLETE}, self.out)
        try:
            os.rmdir(old)
        except OSError:  # a file that appeared meanwhile under a name the new folder has: kept there, never deleted
            pass


def _files_under(folder: str) -> List[str]:
    """The relative '/'-separated paths of every file (not folder) under `folder`, sorted."""
    found = []
    for dirpath, _, filenames in os.walk(folder):
        for name in filenames:
            found.append(os.path.relpath(os.path.join(dirpath, name), folder).replace(os.sep, "/"))
    return sorted(found)


def _entries_under(folder: str) -> List[str]:
    """Every file, link and empty folder under `folder` (relative, '/'-separated): what a user may have put there."""
    found = []
    for dirpath, dirnames, filenames in os.walk(folder):
        rel = os.path.relpath(dirpath, folder).replace(os.sep, "/")
        found += [name if rel == "." else f"{rel}/{name}" for name in filenames]
        found += [
            name if rel == "." else f"{rel}/{name}"
            for name in dirnames
            if os.path.islink(os.path.join(dirpath, name)) or not os.listdir(os.path.join(dirpath, name))
        ]
    return sorted(found)


def _remove_listed(folder: str, listed: set, keep_in: str) -> None:
    """Removes the listed files of a replaced folder, then its empty folders; anything else (a file that appeared
    meanwhile) is moved into `keep_in`, never deleted."""
    for rel in _entries_under(folder):
        path = os.path.join(folder, rel)
        if rel in listed:
            os.remove(path)
        elif not (os.path.isdir(path) and not os.path.islink(path)):
            target = os.path.join(keep_in, rel)
            if not os.path.lexists(target):
                os.makedirs(os.path.dirname(target), exist_ok=True)
                os.rename(path, target)
    for dirpath, _, _ in sorted(os.walk(folder, topdown=False), key=lambda w: -len(w[0])):
        try:
            os.rmdir(dirpath)
        except OSError:
            pass  # not empty: something of the user's that could not be moved stays where it is


@contextlib.contextmanager
def _parent_locked(out: str):
    """An exclusive lock on the folder that holds `out` (flock on the folder itself: no lock file is left behind),
    for a writer's check-and-move."""
    parent = os.path.dirname(os.path.abspath(out))
    handle = os.open(parent, os.O_RDONLY)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
    finally:
        os.close(handle)


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
