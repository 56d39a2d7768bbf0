"""Classifying images with a pushed model: `imagepipe predict`.

predict.py         the model's calls: load, label, the confidence threshold
image_inputs.py    what it reads (files, folders, manifests, gs://), checked as ingestion checks
result_files.py    what it writes (JSON Lines, CSV, AutoML's shape), whole or not at all
batch_predict.py   the same on Beam (--workers, --dataflow)
"""
