"""A run's self-contained HTML report (`imagepipe report`, and the end of `imagepipe run`).

report.py          the page: summary, sections, timings
data_sections.py   data, validation, data health
model_sections.py  tuning, training, evaluation
report_data.py     what the sections show, read from the run's artifacts
report_html.py     tables, charts, thumbnails as inline HTML and SVG
"""
