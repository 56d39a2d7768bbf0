"""Finding the files to ingest: the input's layout (class folders, pre-split folders, a CSV manifest, a Vertex AI
AutoML import file), each file's label and split, the rows quarantined before any file is read.

listing.py        Candidate, Listing, the class-folder and pre-split trees, labels and split names
sources.py        the layout detected and listed, manifests read, the listing checked as usable
automl_import.py  Vertex AI AutoML import files (JSON Lines, CSV), gs:// URIs mapped under the data root
"""
