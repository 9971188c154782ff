"""Every depth and mode a hospital's files come in, brought to 8 bits as docs/data.md says: real 16-bit,
palette, RGBA and TIFF files written by Pillow, and DICOM files written by pydicom, decoded from disk."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pydicom
import pytest
from PIL import Image
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import ExplicitVRLittleEndian, SecondaryCaptureImageStorage, generate_uid

from capc_common.data import load_image_folder
from capc_common.data.pixels import read_images
from capc_common.errors import InputError


def _ramp(top: int, *, shape: tuple[int, int] = (28, 28)) -> np.ndarray:
    """A diagonal ramp from 0 to ``top`` (a smooth image, as a scan is)."""
    y, x = np.mgrid[0 : shape[0], 0 : shape[1]]
    return np.rint((x + y) * top / (shape[0] + shape[1] - 2)).astype(np.int64)


def _save(path: Path, picture: Image.Image) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    picture.save(path)
    return path


def _grey16(path: Path, values: np.ndarray) -> Path:
    return _save(path, Image.fromarray(values.astype(np.uint16)))


def test_sixteen_bit_grey_spans_the_full_range_scaled_by_the_bits_used(tmp_path: Path) -> None:
    """A 12-bit detector's export (0..4095 in a 16-bit PNG) and a full 16-bit one both reach 0..255, each
    pixel ``round(v · 255 / (2^b − 1))`` with one ``b`` for the whole import; nothing is clipped."""
    twelve = _ramp(4095)
    image = _grey16(tmp_path / "x12.png", twelve)
    assert Image.open(image).mode.startswith("I")  # what Pillow reads a 16-bit PNG as
    pixels, report = read_images([image])
    np.testing.assert_array_equal(pixels[0, ..., 0], np.rint(twelve * 255 / 4095))
    assert (pixels.min(), pixels.max()) == (0, 255) and len(np.unique(pixels)) > 50
    assert (report.bit_depth, report.max_value) == (12, 4095)
    full = _ramp(65535)
    both, report = read_images([image, _grey16(tmp_path / "x16.png", full)])
    assert report.bit_depth == 16  # one scale: the 12-bit image stays darker than the 16-bit one
    np.testing.assert_array_equal(both[1, ..., 0], np.rint(full * 255 / 65535))
    np.testing.assert_array_equal(both[0, ..., 0], np.rint(twelve * 255 / 65535))
    # a fixed depth scales by it, and refuses (never clips) a value above it, naming every such file
    fixed, _ = read_images([image], bit_depth=14)
    np.testing.assert_array_equal(fixed[0, ..., 0], np.rint(twelve * 255 / 16383))
    over = _grey16(tmp_path / "over.png", _ramp(5000))
    with pytest.raises(
        InputError,
        match=r"1 image\(s\) hold values outside --bit-depth 12 \(0\.\.4095\):\n"
        r"  .*over\.png: values 0\.\.5000",
    ):
        read_images([image, over], bit_depth=12)


def test_sixteen_bit_tiff_and_eight_bit_files_mix_in_one_folder(tmp_path: Path) -> None:
    """The folder loader reads the same way: a 16-bit TIFF beside an 8-bit PNG keeps both intact."""
    _grey16(tmp_path / "site" / "a" / "0.tif", _ramp(1023))
    _save(tmp_path / "site" / "b" / "1.png", Image.fromarray(_ramp(200).astype(np.uint8)))
    site = load_image_folder(tmp_path / "site")
    np.testing.assert_array_equal(site.images[0, ..., 0], np.rint(_ramp(1023) * 255 / 1023))
    np.testing.assert_array_equal(site.images[1, ..., 0], _ramp(200))  # 8-bit pixels as they are


def test_palette_images_are_looked_up_grey_or_colour(tmp_path: Path) -> None:
    grey = Image.fromarray(_ramp(255).astype(np.uint8)).convert(
        "P", palette=Image.Palette.ADAPTIVE, colors=64
    )
    grey_file = _save(tmp_path / "grey-palette.png", grey)
    assert Image.open(grey_file).mode == "P"
    pixels, report = read_images([grey_file])
    assert pixels.shape == (1, 28, 28, 1)  # a palette of greys is a grey image
    np.testing.assert_array_equal(pixels[0, ..., 0], np.asarray(Image.open(grey_file).convert("L")))
    colours = np.stack([_ramp(255), 255 - _ramp(255), np.full((28, 28), 90)], axis=-1).astype(np.uint8)
    colour_file = _save(tmp_path / "colour-palette.png", Image.fromarray(colours).quantize(colors=32))
    both, report = read_images([grey_file, colour_file])
    assert both.shape == (2, 28, 28, 3) and report.kinds == {"palette PNG": 2}
    np.testing.assert_array_equal(both[1], np.asarray(Image.open(colour_file).convert("RGB")))
    assert (both[0, ..., 0] == both[0, ..., 2]).all()  # the grey one replicated


def test_alpha_is_composited_over_black(tmp_path: Path) -> None:
    rgb = np.stack([_ramp(255), _ramp(128), np.full((28, 28), 40)], axis=-1)
    alpha = np.full((28, 28, 1), 255)
    alpha[:, :14] = 64  # the left half mostly transparent
    rgba = _save(tmp_path / "rgba.png", Image.fromarray(np.concatenate([rgb, alpha], -1).astype(np.uint8)))
    assert Image.open(rgba).mode == "RGBA"
    pixels, report = read_images([rgba])
    np.testing.assert_array_equal(pixels[0], np.rint(rgb * alpha / 255.0))
    assert report.kinds == {"RGBA PNG (alpha over black)": 1}
    la = np.stack([_ramp(255), alpha[..., 0]], axis=-1).astype(np.uint8)
    grey, _ = read_images([_save(tmp_path / "la.png", Image.fromarray(la, "LA"))])
    np.testing.assert_array_equal(grey[0, ..., 0], np.rint(_ramp(255) * alpha[..., 0] / 255.0))


def test_float_tiff_in_the_unit_range_and_every_bad_file_listed(tmp_path: Path) -> None:
    unit = _save(tmp_path / "unit.tif", Image.fromarray((_ramp(1000) / 1000).astype(np.float32)))
    pixels, _ = read_images([unit])
    np.testing.assert_array_equal(pixels[0, ..., 0], np.rint(_ramp(1000) / 1000 * 255))
    hounsfield = _save(tmp_path / "hu.tif", Image.fromarray((_ramp(3000) - 1000).astype(np.float32)))
    frames = [Image.fromarray(_ramp(255).astype(np.uint8)) for _ in range(3)]
    pages = tmp_path / "pages.tif"
    frames[0].save(pages, save_all=True, append_images=frames[1:])
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    with pytest.raises(InputError) as info:
        read_images([unit, hounsfield, pages, broken])
    lines = str(info.value).splitlines()
    assert lines[0] == "3 of 4 image file(s) cannot be read:"
    assert "hu.tif: holds 32-bit floats in [-1000, 2000]" in lines[1]
    assert "pages.tif: holds 3 frames (a multi-page TIFF" in lines[2]
    assert "broken.png: cannot be decoded" in lines[3]


def _dicom(
    path: Path, stored: np.ndarray, *, bits: int, signed: bool = False, photometric: str = "MONOCHROME2"
) -> Path:
    """A real single-frame DICOM file (Secondary Capture, explicit VR little endian) by pydicom's writer."""
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = SecondaryCaptureImageStorage
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = Dataset()
    ds.file_meta = meta
    ds.SOPClassUID, ds.SOPInstanceUID = meta.MediaStorageSOPClassUID, meta.MediaStorageSOPInstanceUID
    ds.Modality, (ds.Rows, ds.Columns) = "DX", stored.shape
    ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, photometric
    ds.BitsAllocated, ds.BitsStored, ds.HighBit = 16, bits, bits - 1
    ds.PixelRepresentation = int(signed)
    ds.RescaleIntercept, ds.RescaleSlope = (-1024, 1) if signed else (0, 1)
    ds.PixelData = stored.astype(np.int16 if signed else np.uint16).tobytes()
    ds.save_as(path, enforce_file_format=True)
    return path


def test_an_import_holds_one_full_size_image_at_a_time(tmp_path: Path) -> None:
    """Each image is resized as soon as it is read, a deep one at its own depth: importing sixteen 1024x1024
    16-bit scans into 28x28 allocates a few scans' worth of arrays, not sixteen (the import kept every scan
    at full size, as 32-bit integers, before resizing any: 20 MB per 2048x2048 X-ray, a site's folder more
    than a machine holds). A MONOCHROME1 image's padding is black, as every padding."""
    import shutil
    import tracemalloc

    scan = _grey16(tmp_path / "scans" / "0.png", _ramp(4095, shape=(1024, 1024)))
    files = [scan] + [Path(shutil.copy(scan, tmp_path / "scans" / f"{i}.png")) for i in range(1, 16)]
    tracemalloc.start()
    try:
        pixels, report = read_images(files, size=(28, 28, 1))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    one_scan = 1024 * 1024 * 4  # as 32-bit integers
    assert peak < 4 * one_scan, f"{peak / 2**20:.0f} MiB traced at the peak"
    assert (report.resized, report.bit_depth) == (16, 12)
    eight = Image.fromarray(np.rint(_ramp(4095, shape=(1024, 1024)) * 255 / 4095).astype(np.uint8))
    expected = np.asarray(eight.resize((28, 28), Image.Resampling.LANCZOS), dtype=np.int64)
    assert np.abs(pixels[0, ..., 0].astype(np.int64) - expected).max() <= 1  # as an 8-bit resize, or finer
    wide = _dicom(tmp_path / "wide.dcm", _ramp(4095, shape=(28, 56)), bits=16, photometric="MONOCHROME1")
    padded, _ = read_images([wide], size=(28, 28, 3))
    assert padded[0, :7].max() == 0 and padded[0, -7:].max() == 0 and padded[0, 7:21].max() > 200
    assert (padded[0, ..., 0] == padded[0, ..., 2]).all()  # grey replicated into RGB


def test_dicom_grey_at_its_stored_depth(tmp_path: Path) -> None:
    """MONOCHROME2 12-bit, MONOCHROME1 (inverted: higher is brighter) and signed CT values, read back by
    pydicom from files its writer made; each scaled like a 16-bit PNG."""
    ramp = _ramp(4095)
    plain = _dicom(tmp_path / "dx.dcm", ramp, bits=12)
    assert pydicom.dcmread(plain).pixel_array.max() == 4095
    pixels, report = read_images([plain])
    np.testing.assert_array_equal(pixels[0, ..., 0], np.rint(ramp * 255 / 4095))
    assert report.kinds == {"12-bit grey DICOM": 1} and report.bit_depth == 12
    inverted, _ = read_images([_dicom(tmp_path / "m1.dcm", ramp, bits=12, photometric="MONOCHROME1")])
    np.testing.assert_array_equal(inverted[0, ..., 0], np.rint((4095 - ramp) * 255 / 4095))
    ct = _ramp(3000) - 1024  # signed stored values, -1024..1976: shifted by 1024, then 12 bits used
    signed, _ = read_images([_dicom(tmp_path / "ct.dcm", ct, bits=12, signed=True)])
    np.testing.assert_array_equal(signed[0, ..., 0], np.rint((ct + 1024) * 255 / 4095))
    not_dicom = tmp_path / "scan.dcm"
    not_dicom.write_bytes(b"not a dicom file at all")
    with pytest.raises(InputError, match=r"scan\.dcm: is not a DICOM image"):
        read_images([plain, not_dicom])


def test_dicom_in_a_wider_container_keeps_its_grey_levels(tmp_path: Path) -> None:
    """BitsStored is a container, like a 16-bit PNG's 16: a CT's signed -1000..1700 stored in 16 bits, and a
    12-bit MONOCHROME1 image stored in 16, span the 8-bit range. Shifting by 2^15 and inverting within 2^16
    (as the import did) left each a dozen grey levels (124..134 and 239..255)."""
    ct = _ramp(2700) - 1000
    signed, report = read_images([_dicom(tmp_path / "ct.dcm", ct, bits=16, signed=True)])
    np.testing.assert_array_equal(signed[0, ..., 0], np.rint((ct + 1000) * 255 / 4095))
    assert (report.shift, report.bit_depth, report.max_value) == (1000, 12, 2700)
    assert "signed values shifted up by 1000, one shift for every image" in report.lines(size=None)
    assert (signed.min(), signed.max()) == (0, 168) and len(np.unique(signed)) == len(np.unique(ct))
    ramp = _ramp(4095)
    m1, report = read_images([_dicom(tmp_path / "m1.dcm", ramp, bits=16, photometric="MONOCHROME1")])
    np.testing.assert_array_equal(m1[0, ..., 0], np.rint((4095 - ramp) * 255 / 4095))
    assert report.kinds == {"16-bit grey DICOM (MONOCHROME1)": 1} and (m1.min(), m1.max()) == (0, 255)
    # a consortium's fixed depth shifts signed values by 2^(b - 1), and refuses what falls outside
    fixed, _ = read_images([tmp_path / "ct.dcm"], bit_depth=12)
    np.testing.assert_array_equal(fixed[0, ..., 0], np.rint((ct + 2048) * 255 / 4095))
    outside = r"outside --bit-depth 10 \(0\.\.1023, signed values shifted up by 512\)"
    with pytest.raises(InputError, match=outside):
        read_images([tmp_path / "ct.dcm"], bit_depth=10)


def test_a_decompression_bomb_is_a_listed_bad_file_dicom_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pillow refuses an image of more than 2 · MAX_IMAGE_PIXELS; a DICOM file was decoded whatever its
    header declared (a 372 kB deflated file of 14000x14000 pixels: read, 2.7 GB peak). The limit is lowered
    here so that 64x64 files exceed it."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    png = _grey16(tmp_path / "big.png", _ramp(4095, shape=(64, 64)))
    dcm = _dicom(tmp_path / "big.dcm", _ramp(4095, shape=(64, 64)), bits=12)
    with pytest.raises(InputError) as info:
        read_images([png, dcm])
    lines = str(info.value).splitlines()
    assert lines[0] == "2 of 2 image file(s) cannot be read:"
    assert "big.png: cannot be decoded (Image size (4096 pixels) exceeds limit of 2000 pixels" in lines[1]
    assert "big.dcm: declares 64x64 pixels, more than the 2000 of any image the import decodes" in lines[2]


def test_resizing_keeps_the_aspect_ratio_by_padding_or_cropping(tmp_path: Path) -> None:
    """A 56x28 (WxH) image into 28x28: padded (black bands above and below), centre-cropped, or stretched
    only when asked; the report counts the images changed."""
    wide = np.zeros((28, 56), np.uint8)
    wide[:, 14:42] = 255  # a white square in the middle
    files = [
        _save(tmp_path / "wide.png", Image.fromarray(wide)),
        _save(tmp_path / "square.png", Image.fromarray(_ramp(255).astype(np.uint8))),
    ]
    padded, report = read_images(files, size=(28, 28, 1), fit="pad")
    assert (report.resized, report.reshaped) == (1, 1)
    assert padded[0, :7].max() == 0 and padded[0, -7:].max() == 0  # 56x28 → 28x14, centred
    assert padded[0, 7:21, 7:21].min() > 200 and padded[0, 7:21, :5].max() < 30
    np.testing.assert_array_equal(padded[1, ..., 0], _ramp(255))  # already 28x28: untouched
    cropped, report = read_images(files, size=(28, 28, 1), fit="crop")
    assert cropped[0].min() == 255 and report.reshaped == 1  # the middle 28 columns: all white
    stretched, _ = read_images(files, size=(28, 28, 1), fit="stretch")
    assert stretched[0, :, :5].max() < 30 and stretched[0, :, 10:18].min() > 200  # squeezed, no bands
    assert "1 of another aspect ratio centre-cropped (--fit crop)" in " ".join(report.lines(size=(28, 28, 1)))
