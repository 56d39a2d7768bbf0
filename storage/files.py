"""Files where the user keeps them: a local path or an object store URI (gs://, through Beam's FileSystems,
imported only then, so processes that read local files never pay for Beam's import). The lowest layer:
it imports nothing of this project but its errors.
"""

import os
import posixpath
import socket
import threading
import urllib.parse
from typing import BinaryIO, Dict, List, Optional, Tuple

from storage.errors import DataError


def is_remote(path: str) -> bool:
    return "://" in path


SUPPORTED_SCHEMES = ("gs://",)  # object stores Beam's FileSystems reaches with this install


def local_or_supported(path: str, what: str) -> str:
    """The path to read: a local path as given, a file:// URI as its local path, a gs:// URI as it is. Any other
    scheme (s3://, http://, hdfs://) is a DataError naming `what` (e.g. '--data s3://b/x'): Beam would fail on it
    deep in a run with a long traceback, or suggest installing packages that do not help."""
    if not is_remote(path):
        return path
    if path.lower().startswith("file://"):
        return urllib.parse.unquote(urllib.parse.urlsplit(path).path) or "/"
    if path.lower().startswith(SUPPORTED_SCHEMES):
        return path
    scheme = path.split("://", 1)[0]
    raise DataError(
        f"{what}: imagepipe reads local paths and Cloud Storage (gs://), not {scheme}://; copy the "
        "files to a local folder or a gs:// bucket (or mount the store) and give that path"
    )


def join(base: str, *parts: str) -> str:
    if is_remote(base):
        return posixpath.join(base, *parts)
    return os.path.join(base, *parts)


_REACHED = set()  # (host, port) of object stores this process has reached


def check_reachable(uri: str, timeout: float = 10.0) -> None:
    """DataError naming the service when Cloud Storage cannot be reached (offline, DNS, a firewall): its
    client would retry each call for two minutes, then raise a chain of tracebacks. Checked once per process."""
    if not uri.startswith("gs://"):
        return

    proxy = os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy")
    endpoint = os.environ.get("STORAGE_EMULATOR_HOST") or proxy or "https://storage.googleapis.com"
    parsed = urllib.parse.urlsplit(endpoint if "://" in endpoint else "http://" + endpoint)
    address = (parsed.hostname or "", parsed.port or (443 if parsed.scheme == "https" else 80))
    if address in _REACHED:
        return
    try:
        socket.create_connection(address, timeout=timeout).close()
    except OSError as e:
        raise DataError(
            f"{uri}: cannot reach Cloud Storage at {address[0]}:{address[1]} "
            f"({e.strerror or type(e).__name__}); check the network (or proxy) and try again"
        ) from None
    _REACHED.add(address)


def exists(path: str) -> bool:
    if is_remote(path):
        from apache_beam.io.filesystems import FileSystems  # Beam (~2 s): only gs:// paths need it

        check_reachable(path)
        # An object store "folder" is only a name prefix: it exists when an object has it.
        return FileSystems.exists(path) or bool(remote_files(path, limit=1))
    return os.path.exists(path)


def is_dir(path: str) -> bool:
    if is_remote(path):
        from apache_beam.io.filesystems import FileSystems  # Beam (~2 s): only gs:// paths need it

        check_reachable(path)
        return not FileSystems.exists(path) and bool(remote_files(path, limit=1))
    return os.path.isdir(path)


def read_bytes(uri: str) -> bytes:
    if is_remote(uri):
        from apache_beam.io.filesystems import CompressionTypes, FileSystems  # Beam (~2 s): only gs:// paths need it

        with FileSystems.open(uri, compression_type=CompressionTypes.UNCOMPRESSED) as f:
            return f.read()
    with open(uri, "rb") as f:
        return f.read()


def read_range(path: str, start: int, length: int) -> bytes:
    """`length` bytes of a file from `start` (fewer at its end): a local read, or one ranged request through a
    Cloud Storage client shared by the process (its connections reused)."""
    if not is_remote(path):
        with open(path, "rb") as f:
            f.seek(start)
            return f.read(length)
    if length <= 0:
        return b""
    bucket, _, name = path[len("gs://") :].partition("/")
    return _storage_client().bucket(bucket).blob(name).download_as_bytes(start=start, end=start + length - 1)


_CLIENT: Dict[str, object] = {}
_CLIENT_LOCK = threading.Lock()


def _storage_client():
    with _CLIENT_LOCK:
        if "client" not in _CLIENT:
            from google.cloud import storage  # the Cloud Storage client: only ranged reads of gs:// objects need it

            _CLIENT["client"] = storage.Client()
        return _CLIENT["client"]


def open_for_write(path: str) -> BinaryIO:
    """A binary file to write, creating parent folders (local) as needed."""
    if is_remote(path):
        from apache_beam.io.filesystems import CompressionTypes, FileSystems  # Beam (~2 s): only gs:// paths need it

        return FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return open(path, "wb")


def write_bytes(path: str, data: bytes) -> None:
    with open_for_write(path) as f:
        f.write(data)


def remote_files(root: str, limit: Optional[int] = None) -> List[Tuple[str, int, int]]:
    from apache_beam.io.filesystems import FileSystems  # Beam (~2 s): only gs:// paths need it

    prefix = root.rstrip("/") + "/"
    (match,) = FileSystems.match([prefix + "**"], limits=[limit] if limit else None)
    return [(m.path[len(prefix) :], m.size_in_bytes, int(m.last_updated_in_seconds * 1e9)) for m in match.metadata_list]


def remote_top_files(root: str) -> List[str]:
    """The names of the objects directly under a gs:// folder (one level: no recursive listing)."""
    from apache_beam.io.filesystems import FileSystems  # Beam (~2 s): only gs:// paths need it

    prefix = root.rstrip("/") + "/"
    (match,) = FileSystems.match([prefix + "*"])
    return [m.path[len(prefix) :] for m in match.metadata_list if "/" not in m.path[len(prefix) :]]
