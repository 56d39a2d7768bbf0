"""The bottom layer: files local or in an object store, the user's own files written whole, and the types
every layer shares.

errors.py            ConfigError and DataError, the one-line mistakes every layer raises
files.py             is_remote, join, exists, is_dir, read_bytes, read_range, open_for_write, write_bytes,
                     remote_files (gs:// through Beam; ranged reads through one Cloud Storage client)
user_files.py        reports, results and schemas written where the user points, whole or not at all
artifact_types.py    this project's own artifact types
progress_events.py   fine-grained progress events (files ingested, epochs trained) for whoever runs a stage
relocation.py        the latest blessed model's artifacts, found where they are now
review_file.py       the review file: decisions about images, appended a whole line at a time
spreadsheet.py       CSV cells that spreadsheets show as text
"""
