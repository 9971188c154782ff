"""The guardian party."""
