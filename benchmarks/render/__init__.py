"""The renderers of the generated blocks of the docs, one module per family of recorded CSVs (benchmarks/report.py
runs them)."""
