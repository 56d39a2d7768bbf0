"""Run history: what ML Metadata recorded of each run, one run of a pipeline at a time, live progress.

run_store.py     ML Metadata: runs, states, recorded failures
run_lock.py      one run of a pipeline at a time
run_summary.py   what each component did, read from ML Metadata and its artifacts
run_text.py      the summary lines and their phrases
progress.py      live progress (human, JSON, quiet)
verdicts.py      what a run's outcome means: the data and model verdicts, the next steps
"""
