"""Files focusfl writes: marked output folders, locks, atomic writes, tagged figures.

The bottom layer: it imports nothing of focusfl but errors and the version.

- ``atomic``: the one atomic write (tables, configs, markers, checkpoints, a node's state,
  downloads, figures all go through ``atomic_path``);
- ``folders``: output folders focusfl marks as its own, one writer each, replaced whole;
  stores (a sweep's folder) updated in place;
- ``figures``: figures at paths the user named, tagged so that only focusfl's are replaced.
- ``digest``: the SHA-256 of a file (the inputs a run read, a user's algorithm code).
"""
