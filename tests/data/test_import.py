"""``capc data import``: a hospital's image folder or CSV of (path, label) into the site's ``.npz``, checked
as preflight checks a site's data, on real PNG files written to disk."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from capc_cli.main import main
from capc_common.data import FASHION_MNIST_CLASSES, load_dataset
from capc_common.federation import FederationConfig
from capc_common.federation.site_data import dataset_findings

REPO = Path(__file__).resolve().parents[2]
FEDERATION = (
    REPO / "deploy" / "compose" / "federation-confident-gnmax.yaml"
)  # 28x28x1, 10 classes, 25 heads a party
CLASSES = ",".join(FASHION_MNIST_CLASSES)
PER_CLASS = 10


@pytest.fixture(scope="module")
def originals() -> tuple[np.ndarray, np.ndarray]:
    """Fashion-MNIST images of classes 1, 2 and 3 (real images: adjacent pixels correlate; class 0's name,
    T-shirt/top, cannot name a folder)."""
    data = load_dataset("fashion-mnist", split="test")
    index = np.concatenate([np.flatnonzero(data.labels == c)[:PER_CLASS] for c in (1, 2, 3)])
    return data.images[index], data.labels[index]


def _png(path: Path, image: np.ndarray, *, size: int = 32, mode: str = "RGB") -> Path:
    """A 28x28 grey image saved as a size x size PNG (RGB: what a hospital's scanner might export)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(image[..., 0]).convert(mode).resize((size, size), Image.Resampling.BICUBIC).save(path)
    return path


@pytest.fixture
def folder(tmp_path: Path, originals: tuple[np.ndarray, np.ndarray]) -> Path:
    """An image folder: one sub-folder per class, named as the federation's classes are."""
    images, labels = originals
    for i, (image, label) in enumerate(zip(images, labels, strict=True)):
        _png(tmp_path / "xrays" / FASHION_MNIST_CLASSES[label] / f"{i:03d}.png", image)
    return tmp_path / "xrays"


def _capc(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """The real entry point in-process (exit-code mapping included)."""
    with pytest.raises(SystemExit) as info:
        main(["data", "import", *args])
    out, err = capsys.readouterr()
    return int(info.value.code or 0), out, err


def test_an_image_folder_becomes_the_npz_a_site_file_names(
    folder: Path, tmp_path: Path, originals: tuple[np.ndarray, np.ndarray], capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "site" / "hospital-a.npz"
    args = [str(folder), "--out", str(out), "--classes", CLASSES, "--federation", str(FEDERATION)]
    # 3 of the federation's 10 classes: refused unless the site says it has no examples of the others
    code, stdout, err = _capc(capsys, *args, "--resize", "--party", "hospital-a")
    assert code == 2 and "no example of class(es) [0, 4, 5, 6, 7, 8, 9]" in err, err
    assert "--allow-missing-classes" in err and not out.exists()
    args.append("--allow-missing-classes")
    code, stdout, err = _capc(capsys, *args, "--resize", "--party", "hospital-a", "--format", "json")
    assert code == 0, err
    result = json.loads(stdout)
    site = load_dataset(f"npz:{out}")  # what `data: {dataset: …}` reads
    images, labels = originals
    assert site.images.shape == (3 * PER_CLASS, 28, 28, 1) and site.class_names == FASHION_MNIST_CLASSES
    order = sorted(range(len(labels)), key=lambda i: (FASHION_MNIST_CLASSES[labels[i]], i))  # folder order
    assert site.labels.tolist() == labels[order].tolist()  # folder names mapped by --classes
    assert np.abs(site.images.astype(int) - images[order].astype(int)).mean() < 8  # 28 → 32 → 28 px
    assert result["shape"] == "28x28x1" and result["per_class"] == [0] + [PER_CLASS] * 3 + [0] * 6
    checks = {c["check"]: c for c in result["checks"]}
    assert (
        checks["dataset"]["status"] == "warn"
        and "no example of class(es) [0, 4, 5" in checks["dataset"]["detail"]
    )
    assert checks["dataset.images"]["status"] == "ok"
    # the same finding preflight reports for this site's data
    config = FederationConfig.load(FEDERATION)
    again = dataset_findings(site.images, site.labels, config=config, name=str(folder), heads=25)
    assert again.detail == checks["dataset"]["detail"]
    code, text, _ = _capc(capsys, *args, "--resize", "--force")
    assert code == 0 and f"site file: data: {{dataset: {out}}}" in text and "WARN  dataset" in text


def test_images_of_another_size_are_refused_without_resize(
    folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "site.npz"
    code, _, err = _capc(
        capsys, str(folder), "--out", str(out), "--classes", CLASSES, "--federation", str(FEDERATION)
    )
    assert code == 2 and "images are 32x32x3, the federation's queries are 28x28x1" in err
    assert "--resize" in err and "Traceback" not in err and not out.exists()
    code, _, err = _capc(capsys, str(folder), "--out", str(out), "--resize")
    assert code == 2 and "--resize, --party and --allow-missing-classes need --federation" in err


def test_a_csv_of_paths_and_labels(
    tmp_path: Path, originals: tuple[np.ndarray, np.ndarray], capsys: pytest.CaptureFixture[str]
) -> None:
    images, labels = originals
    rows = ["path,label,ward"]  # extra columns are ignored; paths are relative to the CSV
    for i, (image, label) in enumerate(zip(images, labels, strict=True)):
        _png(tmp_path / "scans" / f"{i}.png", image, size=28, mode="L")
        rows.append(f"scans/{i}.png,{FASHION_MNIST_CLASSES[label] if i % 2 else label},B{i % 3}")
    table = tmp_path / "labels.csv"
    table.write_text("\n".join(rows) + "\n")
    out = tmp_path / "site.npz"
    code, _, err = _capc(
        capsys, str(table), "--out", str(out), "--classes", CLASSES, "--federation", str(FEDERATION),
        "--allow-missing-classes",
    )  # fmt: skip
    assert code == 0, err
    site = load_dataset(f"npz:{out}")
    assert site.labels.tolist() == labels.tolist() and site.images.shape == (len(labels), 28, 28, 1)
    # names need --classes: without it a label must be an index
    code, _, err = _capc(capsys, str(table), "--out", str(tmp_path / "b.npz"))
    assert code == 2 and "are not class indices: 'Trouser' (1.png)" in err and "--classes" in err


@pytest.mark.parametrize(
    ("spoil", "says"),
    [
        (
            lambda d: (d / "scans" / "3.png").write_text("<html>not an image</html>"),
            r"1 of 6 image file\(s\) cannot be read:\n  .*3\.png: cannot be decoded",
        ),
        (
            lambda d: _png(d / "scans" / "4.png", np.zeros((28, 28, 1), np.uint8), size=30),
            r"1 of 6 images are not 28x28 \(WxH\) like the others:\n  .*4\.png: 30x30",
        ),
        (
            lambda d: _row(d, "scans/0.png,Pneumonia"),
            r"1 label\(s\) are not among the 10 classes .*'Pneumonia' \(0\.png\)",
        ),
        (lambda d: _row(d, "scans/missing.png,0"), r"  line 8: image .*missing\.png does not exist"),
    ],
    ids=["unreadable image", "mixed sizes", "unknown label", "missing file"],
)
def test_bad_input_is_refused_naming_the_file_and_nothing_is_written(
    tmp_path: Path,
    originals: tuple[np.ndarray, np.ndarray],
    capsys: pytest.CaptureFixture[str],
    spoil,
    says: str,
) -> None:
    images, labels = originals
    rows = ["path,label"]
    for i in range(6):
        _png(tmp_path / "scans" / f"{i}.png", images[i], size=28, mode="L")
        rows.append(f"scans/{i}.png,{labels[i]}")
    (tmp_path / "labels.csv").write_text("\n".join(rows) + "\n")
    spoil(tmp_path)
    out = tmp_path / "site.npz"
    code, stdout, err = _capc(capsys, str(tmp_path / "labels.csv"), "--out", str(out), "--classes", CLASSES)
    assert code == 2 and stdout == "" and "Traceback" not in err
    assert re.search(says, err), err
    assert not out.exists() and not list(tmp_path.glob(".*.partial"))


def _row(directory: Path, row: str) -> None:
    with (directory / "labels.csv").open("a") as handle:
        handle.write(row + "\n")


def test_blank_images_are_refused_and_noise_is_flagged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The "do they look like images" check preflight runs, before anything is written."""
    rng = np.random.default_rng(0)
    for kind, make in (
        ("blank", lambda: np.full((28, 28, 1), 128, np.uint8)),
        ("noise", lambda: rng.integers(0, 256, (28, 28, 1), dtype=np.uint8)),
    ):
        for c in ("a", "b"):
            for i in range(3):
                _png(tmp_path / kind / c / f"{i}.png", make(), size=28, mode="L")
    code, _, err = _capc(capsys, str(tmp_path / "blank"), "--out", str(tmp_path / "blank.npz"))
    assert code == 2 and "100 % of the images are blank" in err and not (tmp_path / "blank.npz").exists()
    code, text, err = _capc(capsys, str(tmp_path / "noise"), "--out", str(tmp_path / "noise.npz"))
    assert code == 0, err
    assert "WARN  dataset.images" in text and "may be scrambled" in text
    assert "not checked against a federation" in text and (tmp_path / "noise.npz").exists()
    code, _, err = _capc(capsys, str(tmp_path / "noise"), "--out", str(tmp_path / "noise.npz"))
    assert code == 2 and "exists; choose another --out, or pass --force" in err


def _named_federation(tmp_path: Path) -> Path:
    """The compose federation with its classes named (``class_names``, Fashion-MNIST's, in index order)."""
    named = FederationConfig.load(FEDERATION).model_copy(update={"class_names": FASHION_MNIST_CLASSES})
    path = tmp_path / "named" / "federation.yaml"
    FederationConfig.from_dict(named.model_dump(mode="json")).save(path)
    return path


def test_class_names_in_federation_yaml_decide_every_hospitals_indices(
    folder: Path, tmp_path: Path, originals: tuple[np.ndarray, np.ndarray], capsys: pytest.CaptureFixture[str]
) -> None:
    """Two hospitals whose folders name the classes differently cannot get different indices silently: the
    federation's class_names map one; the other is refused, each unknown folder named."""
    federation = _named_federation(tmp_path)
    flags = ["--federation", str(federation), "--resize", "--allow-missing-classes"]
    out = tmp_path / "a.npz"
    code, stdout, err = _capc(capsys, str(folder), "--out", str(out), *flags, "--format", "json")
    assert code == 0, err
    assert json.loads(stdout)["labelled_by"] == f"class names (class_names of {federation})"
    images, labels = originals
    site = load_dataset(f"npz:{out}")
    assert (
        sorted(site.labels.tolist()) == sorted(labels.tolist()) and site.class_names == FASHION_MNIST_CLASSES
    )
    other = tmp_path / "hospital-b"
    for i, (image, label) in enumerate(zip(images, labels, strict=True)):  # same classes, lower-case folders
        _png(other / FASHION_MNIST_CLASSES[label].lower() / f"{i}.png", image, size=28, mode="L")
    code, _, err = _capc(capsys, str(other), "--out", str(tmp_path / "b.npz"), *flags)
    assert code == 2 and "3 label(s) are not among the 10 classes" in err
    assert all(f"'{name}' (folder {other / name})" in err for name in ("dress", "pullover", "trouser"))
    code, _, err = _capc(capsys, str(other), "--out", str(tmp_path / "b.npz"), *flags, "--classes", "x,y")
    assert code == 2 and "differ from the class_names of" in err
    # a federation that names no classes: folder names map onto no index, so they are refused
    code, _, err = _capc(
        capsys, str(other), "--out", str(tmp_path / "b.npz"), "--federation", str(FEDERATION), "--resize"
    )
    assert code == 2 and "neither --classes nor the federation's class_names say which index" in err
    assert not (tmp_path / "b.npz").exists()


def test_a_sixteen_bit_xray_folder_imports_with_its_contrast(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The usual X-ray export: 16-bit grey PNGs of a 12-bit detector, one 56x28 among them; a path that is
    not there says so."""
    y, x = np.mgrid[0:28, 0:28]
    for c, name in enumerate(("0", "1")):
        for i in range(4):
            values = (x + y + 10 * i + 20 * c) * 4095 // 104  # the last reaches 4095
            Image.fromarray(values.astype(np.uint16)).save(_dir(tmp_path / "xr" / name) / f"{i}.png")
    wide = np.concatenate([values, values], axis=1)
    Image.fromarray(wide.astype(np.uint16)).save(tmp_path / "xr" / "1" / "wide.png")
    out = tmp_path / "xr.npz"
    args = [str(tmp_path / "xr"), "--out", str(out), "--federation", str(FEDERATION), "--resize"]
    code, text, err = _capc(capsys, *args, "--fit", "pad", "--allow-missing-classes")
    assert code == 0, err
    assert "pixels: read 9 16-bit grey PNG" in text and "scaled from 12 bits (largest value 4095)" in text
    assert "resized 1 image(s) to 28x28; 1 of another aspect ratio padded with black (--fit pad)" in text
    site = load_dataset(f"npz:{out}")
    assert len(np.unique(site.images)) > 100 and site.images.max() > 200  # not 0/200/255
    np.testing.assert_array_equal(site.images[0, ..., 0], np.rint(((x + y) * 4095 // 104) * 255 / 4095))
    code, _, err = _capc(capsys, str(tmp_path / "no-such-folder"), "--out", str(tmp_path / "n.npz"))
    assert code == 2 and "no-such-folder does not exist" in err
    code, _, err = _capc(capsys, *args[:3], "--fit", "crop")
    assert code == 2 and "--fit says how --resize treats another aspect ratio" in err


def _dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path
