"""The student party."""
