"""Splitting: each class split by content hash within one image of --eval-percent, and the final shards.

stratify.py    positions, bands and quotas: which files a worker writes to a split and which wait (PENDING)
placement.py   the waiting files placed by rank per stratum and their shards rewritten, as Beam stages
shards.py      the shards renamed into Split-<name>/ (the rare one holding a rejected copy rewritten)
"""
