"""The paper's build: tables and figures generated from benchmarks/results/*.json (see make_figures.py)."""
