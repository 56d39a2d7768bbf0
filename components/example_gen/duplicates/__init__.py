"""Near-duplicate images: the search over the perceptual signatures (in memory, or as Beam stages past a bound) and
the groups it finds, decided under --near-duplicates (report, drop, off).

near_duplicates.py  buckets, pairs, groups, the decisions and the near_duplicates.csv rows (the signatures and their
                    distances: checking/signature.py, checking/similarity.py)
"""
