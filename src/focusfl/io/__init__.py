"""Files focusfl writes: marked output folders, locks, atomic writes, tagged figures.

The bottom layer: it imports nothing of focusfl but errors and the version.
"""
