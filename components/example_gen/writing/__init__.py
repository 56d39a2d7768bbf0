"""Writing the examples: batches of files read, checked and written to staging shards in one pass.

batch_ingest.py  one batch of candidates -> staging shards and what the run needs back (Meta, Pending, counts)
worker_pool.py   the spawned worker processes the local runner ingests with (they import Pillow and batch_ingest)
beam_steps.py    the Beam transforms: InspectAndWrite, Resolve (exact copies), CollectResults
"""
