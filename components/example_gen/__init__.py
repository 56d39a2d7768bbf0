"""ImageExampleGen: image files to validated, split, sharded tf.Examples (component.py is the entry point)."""

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
