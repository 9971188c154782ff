"""One module per CLI area; each exposes ``command`` (a click command or group)."""
