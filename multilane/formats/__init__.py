"""The data formats several layers share: key hashing and key ranges (``keyranges``), the progress
record and its codec (``progress``), the changelog envelope (``changelog``). Pure: no I/O.

The worker, the snapshot format and the snapshot pipeline all import these; this package imports
nothing of multilane but :mod:`multilane.api` (the ordering modes), so none of them has to import
another to read what it writes.
"""
