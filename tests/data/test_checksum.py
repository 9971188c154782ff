"""A data file awaited while it is copied in, and checked by its SHA-256 (``capc_common.data.checksum``)."""

from __future__ import annotations

import hashlib
import threading
import time
from pathlib import Path

import pytest

from capc_common.data.checksum import await_file, dataset_file, file_sha256, verify_file
from capc_common.errors import InputError, IntegrityError, UnavailableError


def test_the_file_a_dataset_string_names() -> None:
    assert dataset_file("npz:/data/a.npz") == Path("/data/a.npz")
    assert dataset_file("/data/a.npz") == Path("/data/a.npz")
    assert dataset_file("folder:/data/xrays") is None and dataset_file("fashion-mnist") is None


def test_a_file_is_hashed_whole_and_compared(tmp_path: Path) -> None:
    path = tmp_path / "a.npz"
    content = bytes(range(256)) * 9000  # more than one read block
    path.write_bytes(content)
    digest = hashlib.sha256(content).hexdigest()
    assert file_sha256(path) == digest
    verify_file(path, digest)
    with pytest.raises(IntegrityError, match=rf"has SHA-256 {file_sha256(path)} \(2304000 bytes\)"):
        verify_file(path, "0" * 64)
    with pytest.raises(InputError, match="does not exist; copy it there"):
        verify_file(tmp_path / "missing.npz", digest)


def test_a_copy_is_awaited_until_complete_and_a_wrong_one_reported(tmp_path: Path) -> None:
    """As `kubectl cp` writes it: the file appears, grows, stalls half way (hashed: incomplete), is finished;
    the wait ends only then. A finished file with another checksum is reported, not accepted."""
    path = tmp_path / "hospital.npz"
    content = b"x" * 300_000 + b"y" * 300_000
    said: list[str] = []
    done = threading.Event()

    def copy() -> None:
        time.sleep(0.3)
        with path.open("wb") as f:
            f.write(content[:200_000])
            f.flush()
            time.sleep(0.5)  # a stalled copy: long enough to be hashed
            f.write(content[200_000:])
        done.set()

    writer = threading.Thread(target=copy)
    writer.start()
    await_file(path, hashlib.sha256(content).hexdigest(), timeout=30, poll=0.05, say=said.append)
    writer.join()
    assert done.is_set() and path.read_bytes() == content
    assert said[0].startswith(f"waiting for {path}") and said[-1].startswith(f"{path}: SHA-256")
    assert any("the copy is incomplete or another file" in line for line in said)  # the stalled half
    with pytest.raises(UnavailableError, match=r"gave up after 0\.3 s: data file .* has SHA-256"):
        await_file(path, "0" * 64, timeout=0.3, poll=0.05)
