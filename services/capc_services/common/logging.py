"""Structured logs: one JSON object per line on stderr, with the party name and any ``extra`` fields."""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys
from typing import Any

# Record attributes that are not user fields (uvicorn adds an ANSI-coloured copy of its message).
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "color_message",
}


class JsonFormatter(logging.Formatter):
    """Formats a record as JSON: ts, level, party, logger, msg, then every ``extra={...}`` key."""

    def __init__(self, *, party: str) -> None:
        super().__init__()
        self._party = party

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "party": self._party,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_") and key not in entry:
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure_logging(*, party: str, level: str = "info") -> None:
    """Send every log record of this process to stderr as JSON lines (call once, in the entry point)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(party=party))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("uvicorn.access",):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    for name in ("uvicorn", "uvicorn.error"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
