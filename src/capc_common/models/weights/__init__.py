"""Shipped backbone weights (package data): ``NAME.safetensors`` plus ``NAME.json`` (recipe and hash).

A package of its own so that setuptools ships the files (pyproject's package-data patterns apply per package).
See docs/models.md for how each file was produced.
"""
