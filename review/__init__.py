"""The review loop (docs/review.md): what a run flags, looked at by a person, decided, and used by the next run.

(The review file itself, decisions by content hash appended whole lines, is storage/review_file.py: ingestion
reads it too.)
  items.py      what a run lists for review, most useful first (label suspects, conflicting near-duplicates,
                misclassified eval images, outliers, unsure predictions)
  server.py     `imagepipe review`'s page, on 127.0.0.1 with a random token; page.html is the page itself
"""
