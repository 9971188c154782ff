"""``capc data``: the real command on a site's own files, including a broken one."""

from __future__ import annotations

import numpy as np


def test_show_and_partition(capc_json, tmp_path):
    path = tmp_path / "site.npz"
    np.savez(path, images=np.zeros((12, 8, 8), np.uint8), labels=np.arange(12) % 3)
    shown = capc_json("data", "show", f"npz:{path}")
    assert (
        shown["examples"] == 12
        and shown["shape"] == "8x8x1"
        and shown["class_counts"] == {"0": 4, "1": 4, "2": 4}
    )
    parts = capc_json("data", "partition", f"npz:{path}", "--shards", "3", "--seed", "1")
    assert parts["sizes"] == [4, 4, 4] and sum(map(sum, parts["class_counts"])) == 12


def test_corrupt_file_exits_2_and_names_it(capc, tmp_path):
    path = tmp_path / "broken.npz"
    path.write_bytes(b"not a zip")
    proc = capc("data", "show", f"npz:{path}")
    assert proc.returncode == 2 and str(path) in proc.stderr and "Traceback" not in proc.stderr
