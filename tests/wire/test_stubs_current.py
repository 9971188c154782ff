"""The committed stubs are exactly what the committed protos generate."""

from __future__ import annotations

from pathlib import Path

from capc_common.wire import _generate


def test_committed_stubs_match_protos(tmp_path: Path) -> None:
    # Prepare
    committed_root = _generate.STUB_ROOT
    # Execute
    generated = _generate.generate(tmp_path)
    # Assert
    assert generated, "no proto files found under protos/capc/v1"
    for path in generated:
        rel = path.relative_to(tmp_path)
        committed = committed_root / rel
        assert committed.is_file(), f"{rel} is not committed; run python -m capc_common.wire._generate"
        assert committed.read_text() == path.read_text(), (
            f"{rel} is stale; run python -m capc_common.wire._generate"
        )
    stale = {
        p.relative_to(committed_root)
        for p in (committed_root / "capc").rglob("*.py*")
        if "__pycache__" not in p.parts
    } - {p.relative_to(tmp_path) for p in generated}
    assert not stale, f"stubs without a proto: {sorted(map(str, stale))}"
