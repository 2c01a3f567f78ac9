"""The sweep machinery any study runs on: grids of runs (sweep.py), tune, the executors that run
them, aggregation, the result cache, the sweep folder's layout and the conformance kit of
`focusfl check` (docs/architecture.md)."""
