"""The papers' claims, built on the sweep machinery: the `focusfl reproduce` presets (registry.py
lists them), the studies, the report and its verdicts (docs/architecture.md)."""
