"""Development-time generators, not shipped in the wheel: ``python -m tools.reference`` writes docs/reference/ and the
chart's monitoring files (``tools.monitoring``). Nothing shipped imports this package (an import-linter contract)."""
