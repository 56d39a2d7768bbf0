"""ImageExampleGen: image files to validated, split, sharded tf.Examples (component.py is the entry point).

component.py        the component, its spec and parameters; vertex_driver.py its driver on Vertex AI
ingest_defaults.py  the ingestion settings, each declared once (Ingestion); ingest_settings.py the parameters as
                    the executor reads them
executor.py         the Beam graph of a run (its module docstring draws it), then the report
ingest_report.py    the summary, the quarantine list and their checks
writing/            batches of files written to staging shards in worker processes, as Beam steps
splitting/          the split by content hash per class, the waiting files placed, the final shards

Finding the files (the input's layouts), each image's check, signature and example encoding and the near-duplicate
groups are the image library's (images/), which the pre-flight, prediction, the report and review use too.
"""

# Files of the component's `report` output (read by runs/run_summary.py without importing TFX).
LABEL_MAP_FILE = "label_map.json"
QUARANTINE_FILE = "quarantine.csv"
NEAR_DUPLICATES_FILE = "near_duplicates.csv"  # group, path, label, split: every near-duplicate group
SUMMARY_FILE = "summary.json"
# Beside the examples (Split-*/): what was ingested, per class, format and size bin (components/drift.py).
PROFILE_FILE = "profile.json"
# An ingestion that fails keeps its summary and quarantine list in <pipeline root>/<component>/failed/<execution
# id>/ (TFX removes a failed execution's outputs; the user needs the list to fix the data).
FAILED_DIR = "failed"
