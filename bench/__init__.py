"""The benchmark: ``python -m bench`` (see bench/__main__.py and docs/performance.md)."""

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
