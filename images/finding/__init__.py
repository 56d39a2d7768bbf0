"""Finding the files of a dataset: the input's layout (class folders, pre-split folders, a CSV manifest, a Vertex AI
AutoML import file), each file's label and split, the rows quarantined before any file is read. ImageExampleGen,
the local runner's pre-flight and `imagepipe predict` list files here.

listing.py        Candidate, Listing, the class-folder and pre-split trees, labels and split names, manifests
sources.py        the layout detected and listed, manifests read, the listing checked as usable
automl_import.py  Vertex AI AutoML import files (JSON Lines, CSV), gs:// URIs mapped under the data root
"""

# The layouts an input may have (--layout); auto tells them apart by what the data holds (sources.py). Here, not
# in sources.py: the CLI reads them at start-up without Pillow.
LAYOUTS = ("auto", "folders", "presplit", "manifest", "automl")
