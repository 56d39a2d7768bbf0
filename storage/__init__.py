"""The bottom layer: files local or in an object store, and the user's own files written whole.

errors.py       ConfigError and DataError, the one-line mistakes every layer raises
files.py        is_remote, join, exists, is_dir, read_bytes, write_bytes, remote_files (gs:// through Beam)
user_files.py   reports, results and schemas written where the user points, whole or not at all
"""
