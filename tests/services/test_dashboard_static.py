"""The dashboard's packaged files name no external asset: the page works offline and its CSP holds.

The browser test (``test_dashboard.py``) checks the requests a real page makes; this one reads every file
the package ships under ``capc_services/guardian/static`` (what a wheel installs, not the source tree) for
absolute or protocol-relative URLs, so it also runs where Chromium is not installed.
"""

from __future__ import annotations

import re
from importlib import resources

import pytest

# XML namespace names look like URLs but are never fetched: the SVG namespace is the one the page uses.
NAMESPACES = ("http://www.w3.org/2000/svg",)
# scheme://… anywhere (http, https, ws, wss, ftp, …), or //host after a quote, "(", "=" or "@import "
# (src="//cdn…", url(//…)); a bare "//" elsewhere is a JavaScript comment.
EXTERNAL = re.compile(
    r"""[a-z][a-z0-9+.-]*://[^\s"'()<>]+|(?:["'(=]|@import\s)\s*//[A-Za-z0-9]""", re.IGNORECASE
)


def external_urls(text: str) -> list[str]:
    """Every absolute or protocol-relative URL in ``text`` except the allowed namespace names."""
    return [m.group(0) for m in EXTERNAL.finditer(text) if m.group(0) not in NAMESPACES]


@pytest.mark.parametrize(
    "text",
    [
        '<script src="https://cdn.example.org/chart.js"></script>',
        "<link rel=stylesheet href='//fonts.example.com/css'>",
        "body { background: url(//img.example.net/a.png) }",
        '@import "//example.com/x.css";',
        'fetch("HTTP://10.0.0.1/api")',
        'new WebSocket("wss://example.org/live")',
    ],
)
def test_the_scan_finds_external_urls(text: str) -> None:
    assert external_urls(text)


def test_the_scan_passes_local_paths_comments_and_namespaces() -> None:
    text = (
        '// a comment\nfetch("/api/v1/" + path); document.createElementNS("http://www.w3.org/2000/svg", "g")'
    )
    assert external_urls(text) == []


def test_the_packaged_dashboard_files_name_no_external_url() -> None:
    static = resources.files("capc_services.guardian") / "static"
    files = {f.name: f.read_text(encoding="utf-8") for f in static.iterdir() if f.is_file()}
    assert {"dashboard.html", "dashboard.js", "dashboard.css", "favicon.svg"} <= files.keys()
    found = {name: urls for name, text in files.items() if (urls := external_urls(text))}
    assert found == {}, f"the dashboard must work offline, but names external URLs: {found}"
