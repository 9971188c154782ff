"""The teacher party."""
