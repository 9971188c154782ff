"""``capc synth``: preview grids, .npz batches, listing, and exit code 2 with a message on bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from capc_cli.main import main
from capc_common.errors import InputError
from capc_common.synth import GENERATOR_NAMES, generate, image_grid, images_digest, write_png


def _capc(capsys, *args: str) -> tuple[int, str, str]:
    """Run the real ``capc`` entry point in-process; returns (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def test_preview_writes_a_png_grid(tmp_path, capc_json):
    out = tmp_path / "grid.png"
    result = capc_json(
        "synth", "preview", "dead_leaves", "--out", str(out), "--count", "6", "--size", "28x28x1"
    )
    picture = Image.open(out)
    picture.verify()
    # 6 tiles in 3 columns x 2 rows, magnified 3x (28 -> 84 pixels), 1-pixel gaps
    assert Image.open(out).size == (3 * 84 + 2, 2 * 84 + 1) and Image.open(out).mode == "L"
    expected = generate("dead_leaves", seed=0, start=0, count=6, height=28, width=28, channels=1)
    assert result["digest"] == images_digest(expected) and result["size"] == "28x28x1"
    tiles = np.asarray(Image.open(out))
    assert np.array_equal(tiles[:84:3, :84:3], expected[0, :, :, 0])


def test_preview_bad_name_exits_2(tmp_path, capsys):
    code, _, err = _capc(capsys, "synth", "preview", "plasma", "--out", str(tmp_path / "g.png"))
    assert code == 2
    assert "unknown generator 'plasma'; choose one of gaussian, dead_leaves" in err
    assert not (tmp_path / "g.png").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--size", "32x32"], "expected HxWxC such as 28x28x1"),
        (["--size", "axbxc"], "expected HxWxC"),
        (["--size", "32x32x2"], "channels must be 1 (grayscale) or 3 (RGB), got 2"),
        (["--size", "0x32x3"], "height must be in [1, 1024] pixels, got 0"),
        (["--count", "0"], "0 is not in the range 1<=x<=1024"),
        (["--seed", "-1"], "-1 is not in the range"),
        (["--scale", "0"], "0 is not in the range 1<=x<=16"),
    ],
)
def test_preview_bad_options_exit_2(tmp_path, capsys, args, message):
    code, _, err = _capc(capsys, "synth", "preview", "fractal", "--out", str(tmp_path / "g.png"), *args)
    assert code == 2 and message in err
    assert not (tmp_path / "g.png").exists()


def test_preview_needs_out_and_an_existing_directory(tmp_path, capsys):
    code, _, err = _capc(capsys, "synth", "preview", "fractal")
    assert code == 2 and "Missing option '--out'" in err
    code, _, err = _capc(capsys, "synth", "preview", "fractal", "--out", str(tmp_path / "no" / "g.png"))
    assert code == 2 and "does not exist" in err


def test_generate_writes_npz(tmp_path, capsys):
    out = tmp_path / "batch.npz"
    code, stdout, _ = _capc(
        capsys, "synth", "generate", "shaders", "--out", str(out), "--count", "5", "--start", "3",
        "--seed", "9", "--size", "16x12x3", "--format", "json",
    )  # fmt: skip
    assert code == 0
    result = json.loads(stdout)
    with np.load(out) as data:
        images = data["images"]
        assert str(data["generator"]) == "shaders" and int(data["seed"]) == 9 and int(data["start"]) == 3
    expected = generate("shaders", seed=9, start=3, count=5, height=16, width=12, channels=3)
    assert np.array_equal(images, expected) and result["digest"] == images_digest(expected)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["batch.npz"]


def test_generate_refuses_bad_input_before_writing(tmp_path, capsys):
    cases = [
        ("shaders", "b.npy", "2", "must name a .npz file"),
        ("noise", "b.npz", "2", "unknown generator 'noise'"),
        ("fractal", "b.npz", "1e9", "'1e9' is not a valid integer"),
        ("fractal", "b.npz", "2000000", "split the range over several --start values"),
    ]
    for name, file, count, message in cases:
        code, _, err = _capc(
            capsys, "synth", "generate", name, "--out", str(tmp_path / file), "--count", count
        )
        assert code == 2 and message in err
    assert list(tmp_path.iterdir()) == []


def test_list_as_json(capsys):
    code, stdout, _ = _capc(capsys, "synth", "list", "--format", "json")
    result = json.loads(stdout)
    assert code == 0 and list(result["generators"]) == list(GENERATOR_NAMES)
    assert result["default"] in GENERATOR_NAMES


def test_grid_layout_and_png_errors(tmp_path):
    images = np.arange(5 * 2 * 3 * 3, dtype=np.uint8).reshape(5, 2, 3, 3)
    grid = image_grid(images, columns=2, scale=2, gap=1)
    assert grid.shape == (3 * 4 + 2, 2 * 6 + 1, 3)
    assert np.array_equal(grid[5:9:2, 7:13:2], images[3]) and (grid[4] == 255).all()
    with pytest.raises(InputError, match="non-empty uint8 batch"):
        image_grid(images[:0])
    with pytest.raises(InputError, match="columns >= 1"):
        image_grid(images, columns=0)
    with pytest.raises(InputError, match="does not exist"):
        write_png(tmp_path / "absent" / "g.png", grid)
    with pytest.raises(InputError, match="uint8"):
        write_png(tmp_path / "g.png", grid.astype(np.float32))
    assert not (tmp_path / "g.png").exists()
