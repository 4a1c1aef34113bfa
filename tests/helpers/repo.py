"""The repository's root, for tests that read its files (docs, sources, scripts)."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
