"""Near-duplicate images (resized, recompressed, slightly cropped copies), all in one place.

signature.py   the perceptual signature of an image, made while image_check decodes it
similarity.py  the signature's parameters and the distances between signatures (when two images are near)
grouping.py    the signatures' files, the search (in memory, or as Beam stages past a bound), the groups it finds
               and what --near-duplicates (report, drop, off) decides of them, the near_duplicates.csv rows
"""
