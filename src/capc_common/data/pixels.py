"""Image files into the project's 8-bit pixels, keeping what each file holds.

The federation's models see uint8 ``(N, H, W, C)`` images (C 1 or 3), the format of the synthetic queries
they are pinned to; a hospital's files come in every depth and mode. How each is brought to 8 bits:

* **8-bit grey, RGB, bilevel, CMYK/YCbCr JPEG**: as they are (converted to grey or RGB).
* **Palette** (``P``): looked up in the palette; grey when every colour it uses is grey, otherwise RGB.
* **Alpha** (``RGBA``, ``LA``, palette transparency): composited over black (a transparent pixel carries no
  signal, as in a scan's background), then dropped.
* **Deeper grey** (16-bit PNG/TIFF, 32-bit integer TIFF, DICOM with more than 8 bits stored): scaled by the
  bit depth *actually used* across the whole import — ``b``, the bits of the largest value of any such image
  (at least 8), so a 12-bit detector's 0..4095 and a 16-bit one's 0..65535 both span 0..255 — as
  ``round(v · 255 / (2^b − 1))``. One ``b`` for every image of a site keeps their relative brightness; never
  clipped. ``bit_depth`` fixes ``b`` instead (e.g. a consortium agreeing on 12), and a value above it is
  refused, not clipped. The 8 bits are kept, not 16: the queries and the pinned backbone are 8-bit.
* **32-bit float TIFF**: values in [0, 1] are scaled by 255; others are refused (their range is unknown).
* **DICOM** (``.dcm``, read with pydicom, the optional extra ``diet-capc[dicom]``): the stored values, as a
  deeper grey image. Signed values (CT) are shifted up by one amount for the whole import, so that its lowest
  value becomes 0 (by ``2^(b − 1)`` under a fixed ``bit_depth``), and MONOCHROME1 (0 is white) is inverted
  within ``b`` once it is known, so that higher is brighter — ``BitsStored`` is a container, like a 16-bit
  PNG's 16: a CT's -1000..1700 or a 12-bit MONOCHROME1 image stored in 16 bits still spans the range instead
  of a dozen grey levels. The modality rescale is linear and changes nothing here; the VOI window is not
  applied (it clips).

Resizing (``size``) keeps the aspect ratio: ``pad`` fits the image inside the target and fills the rest
with black, ``crop`` fills the target and cuts the centre out; ``stretch`` ignores the ratio. Each image is
resized as soon as it is read, a deeper one at its own depth (scaled to 8 bits once the import's depth is
known), so an import holds one full-size image at a time, not a site's worth of X-rays. The report counts
what was changed. Every file that cannot be read is listed in one error, not only the first.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import numpy.typing as npt

from capc_common.errors import InputError

if TYPE_CHECKING:
    from PIL import Image

__all__ = ["DICOM_SUFFIXES", "FITS", "IMAGE_SUFFIXES", "PixelReport", "read_images"]

DICOM_SUFFIXES = (".dcm", ".dicom")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".tif", ".tiff", *DICOM_SUFFIXES)
Fit = Literal["pad", "crop", "stretch"]
FITS: tuple[Fit, ...] = ("pad", "crop", "stretch")

_DEEP_MODES = frozenset({"I;16", "I;16B", "I;16L", "I;16N", "I"})
_ALPHA_MODES = frozenset({"RGBA", "RGBa", "LA", "La", "PA"})


class _Unreadable(Exception):
    """Why one file cannot be imported (collected, then raised together as one InputError)."""


@dataclass(frozen=True)
class _Decoded:
    """One file at its own depth: ``pixels`` is ``(H, W)`` grey or ``(H, W, 3)`` RGB, uint8, or for a deep
    grey image an integer array (float once resized, NaN where padded) scaled later by the import's depth,
    whose smallest and largest value as read are ``low`` and ``high``."""

    pixels: npt.NDArray[Any]
    kind: str
    deep: bool = False
    low: int = 0
    high: int = 0
    #: deep values that may be negative (signed DICOM): shifted by the import's offset
    signed: bool = False
    #: MONOCHROME1 (0 is white): inverted within the import's bits once they are known
    inverted: bool = False

    @property
    def colour(self) -> bool:
        return self.pixels.ndim == 3


@dataclass(frozen=True)
class PixelReport:
    """What the import did to the pixels (printed by ``capc data import``).

    Attributes:
        kinds: files per kind read (``8-bit grey``, ``16-bit grey``, ``RGBA (alpha over black)``, …).
        bit_depth: the bits deep grey images were scaled by (None: there were none).
        max_value: the largest value of those images (after ``shift``).
        shift: what signed values were shifted up by (0: none were negative).
        resized: images whose height or width was changed.
        reshaped: of those, images of another aspect ratio (padded, cropped or stretched, per ``fit``).
        fit: how a different aspect ratio was handled.
        recoloured: images converted between grey and RGB.
    """

    kinds: dict[str, int] = field(default_factory=dict)
    bit_depth: int | None = None
    max_value: int | None = None
    shift: int = 0
    resized: int = 0
    reshaped: int = 0
    fit: Fit = "pad"
    recoloured: int = 0

    def lines(self, *, size: tuple[int, int, int] | None) -> list[str]:
        """One sentence per thing done, for the import's output."""
        read = ", ".join(f"{n} {kind}" for kind, n in sorted(self.kinds.items()))
        out = [f"read {read}"]
        if self.shift:
            out.append(f"signed values shifted up by {self.shift}, one shift for every image")
        if self.bit_depth is not None:
            out.append(
                f"deeper grey images scaled from {self.bit_depth} bits (largest value {self.max_value}) to "
                "0-255, one scale for every image"
            )
        if size is not None:
            changed = {"pad": "padded with black", "crop": "centre-cropped", "stretch": "stretched"}[self.fit]
            out.append(
                f"resized {self.resized} image(s) to {size[0]}x{size[1]}; {self.reshaped} of another aspect "
                f"ratio {changed} (--fit {self.fit})"
            )
            if self.recoloured:
                out.append(f"converted {self.recoloured} image(s) to {'grey' if size[2] == 1 else 'RGB'}")
        return out


def read_images(
    paths: Sequence[Path],
    *,
    size: tuple[int, int, int] | None = None,
    fit: Fit = "pad",
    bit_depth: int | None = None,
) -> tuple[npt.NDArray[np.uint8], PixelReport]:
    """Decode image files into one uint8 ``(N, H, W, C)`` array (the module's rules) and say what was done.

    Args:
        paths: PNG, JPEG, TIFF or DICOM files.
        size: ``(height, width, channels)`` to bring every image to; None: keep their size, which must be
            the same for all, and make them RGB if any has colour (grey ones replicated), otherwise grey.
        fit: how ``size`` treats another aspect ratio: ``pad``, ``crop`` or ``stretch``.
        bit_depth: the bits deeper grey images are scaled by (None: the bits their largest value needs).

    Raises:
        InputError: every file that cannot be read (each with its reason), a value above ``bit_depth``, or
            (without ``size``) images of different sizes, each of the odd-sized ones named.
    """
    if fit not in FITS:
        raise InputError(f"fit must be one of {', '.join(FITS)}, got {fit!r}")
    if bit_depth is not None and not 8 <= bit_depth <= 32:
        raise InputError(f"bit depth must be 8..32, got {bit_depth}")
    decoded: list[_Decoded] = []  # each at its final size once read: one full-size image at a time
    bad: list[str] = []
    changes: Counter[str] = Counter()
    for path in paths:
        try:
            image = _decode(path)
        except _Unreadable as exc:
            bad.append(f"{path}: {exc}")
            continue
        if size is not None:
            image, changed = _brought_to(image, size, fit=fit)
            changes.update(changed)
        decoded.append(image)
    if bad:
        raise InputError(_listed(f"{len(bad)} of {len(paths)} image file(s) cannot be read", bad))
    deep = [(p, d) for p, d in zip(paths, decoded, strict=True) if d.deep]
    shift = _shift([d for _, d in deep], bit_depth)
    ranges = [(p, d, *_range(d, shift)) for p, d in deep]
    top = max((high for *_, high in ranges), default=None)
    bits = None if top is None else (bit_depth or max(8, top.bit_length()))
    if bits is not None and bit_depth is not None:
        over = [f"{p}: values {low}..{high}" for p, _, low, high in ranges if low < 0 or high >= 2**bits]
        if over:
            shifted = f", signed values shifted up by {shift}" if shift else ""
            head = f"{len(over)} image(s) hold values outside --bit-depth {bits} (0..{2**bits - 1}{shifted})"
            fix = "raise --bit-depth, or leave it out to scale by the bits the images use"
            raise InputError(f"{_listed(head, over)}\n{fix}")
    report = PixelReport(
        kinds=dict(Counter(d.kind for d in decoded)),
        bit_depth=bits,
        max_value=top,
        shift=shift,
        fit=fit,
        resized=changes["resized"],
        reshaped=changes["reshaped"],
        recoloured=changes["recoloured"],
    )
    if size is None:
        return _same_size(paths, [_to_eight(d, bits, shift=shift) for d in decoded]), report
    out = np.empty((len(decoded), *size), dtype=np.uint8)
    for i, image in enumerate(decoded):
        out[i] = _to_eight(image, bits, shift=shift)  # a deep grey image into RGB: replicated by broadcasting
    return out, report


def _listed(head: str, items: Sequence[str]) -> str:
    return head + ":\n" + "\n".join(f"  {item}" for item in items)


def _shift(deep: Sequence[_Decoded], bit_depth: int | None) -> int:
    """What every signed image of the import is shifted up by: ``2^(bit_depth − 1)`` under a fixed depth (a
    consortium's agreed signed range), else what brings the lowest value of any of them to 0."""
    signed = [d for d in deep if d.signed]
    if not signed:
        return 0
    if bit_depth is not None:
        return int(2 ** (bit_depth - 1))
    return max(0, -min(int(d.pixels.min(initial=0)) for d in signed))


def _range(decoded: _Decoded, shift: int) -> tuple[int, int]:
    """The smallest and largest value of a deep image as read, signed ones shifted by ``shift``."""
    offset = shift if decoded.signed else 0
    return decoded.low + offset, decoded.high + offset


def _to_eight(decoded: _Decoded, bits: int | None, *, shift: int) -> npt.NDArray[np.uint8]:
    """``(H, W, C)`` uint8 pixels of one image (a deep one shifted, inverted and scaled by ``bits``)."""
    pixels = decoded.pixels
    if decoded.deep:
        assert bits is not None
        values = pixels.astype(np.float64) + (shift if decoded.signed else 0)
        if decoded.inverted:
            values = (2**bits - 1) - values
        scaled = np.rint(values * (255.0 / (2**bits - 1)))
        # Values as read lie in 0..2^b - 1 (b covers the largest), so the clip only removes the overshoot of
        # resampling at the image's own depth (Lanczos rings), as an 8-bit resize does; padding (NaN): black.
        pixels = np.nan_to_num(np.clip(scaled, 0.0, 255.0), nan=0.0).astype(np.uint8)
    return pixels if pixels.ndim == 3 else pixels[..., np.newaxis]


def _same_size(paths: Sequence[Path], images: list[npt.NDArray[np.uint8]]) -> npt.NDArray[np.uint8]:
    """Stack images of one size (RGB if any has colour), naming every image of another size."""
    if not images:
        return np.zeros((0, 0, 0, 1), dtype=np.uint8)
    sizes = Counter(image.shape[:2] for image in images)
    common = sizes.most_common(1)[0][0]
    odd = [
        f"{p}: {i.shape[1]}x{i.shape[0]}" for p, i in zip(paths, images, strict=True) if i.shape[:2] != common
    ]
    if odd:
        raise InputError(
            _listed(
                f"{len(odd)} of {len(images)} images are not {common[1]}x{common[0]} (WxH) like the others",
                odd,
            )
            + "\nall images must have the same size: convert them with `capc data import --resize` "
            "(--fit pad|crop keeps their aspect ratio)"
        )
    if any(image.shape[2] == 3 for image in images):
        images = [np.repeat(image, 3, axis=2) if image.shape[2] == 1 else image for image in images]
    return np.stack(images)


def _brought_to(decoded: _Decoded, size: tuple[int, int, int], *, fit: Fit) -> tuple[_Decoded, list[str]]:
    """``decoded`` at ``size`` (``fit`` for another aspect ratio; a deep image resampled at its own depth, as
    floats, and padded with NaN so that its padding is black however it is mapped), and what was changed:
    ``resized``, ``reshaped`` (another aspect ratio), ``recoloured``."""
    from PIL import Image

    height, width, channels = size
    h, w = decoded.pixels.shape[:2]
    changed = []
    if decoded.deep:
        picture = Image.fromarray(decoded.pixels.astype(np.float32))
        colour = False
    else:
        picture = Image.fromarray(decoded.pixels)
        colour = decoded.colour
    if colour != (channels == 3):
        changed.append("recoloured")
        if not decoded.deep:  # a deep grey image is replicated into RGB once mapped
            picture = picture.convert("L" if channels == 1 else "RGB")
    if (h, w) != (height, width):
        changed += ["resized", "reshaped"] if h * width != w * height else ["resized"]
        picture = _fitted(picture, height=height, width=width, fit=fit)
    return replace(decoded, pixels=np.asarray(picture)), changed


def _fitted(picture: Image.Image, *, height: int, width: int, fit: Fit) -> Image.Image:
    """``picture`` at ``width`` x ``height``: padded, centre-cropped or stretched (Lanczos resampling)."""
    from PIL import Image

    w, h = picture.size
    if fit == "stretch" or w * height == h * width:
        return picture.resize((width, height), Image.Resampling.LANCZOS)
    scale = (min if fit == "pad" else max)(width / w, height / h)
    inner = (max(1, round(w * scale)), max(1, round(h * scale)))
    scaled = picture.resize(inner, Image.Resampling.LANCZOS)
    if fit == "pad":
        canvas = Image.new(picture.mode, (width, height), math.nan if picture.mode == "F" else 0)
        canvas.paste(scaled, ((width - inner[0]) // 2, (height - inner[1]) // 2))
        return canvas
    left, top = (inner[0] - width) // 2, (inner[1] - height) // 2
    return scaled.crop((left, top, left + width, top + height))


def _decode(path: Path) -> _Decoded:
    """One file at its own depth (DICOM by its suffix, everything else through Pillow)."""
    if path.suffix.lower() in DICOM_SUFFIXES:
        return _decode_dicom(path)
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as handle:
            frames = int(getattr(handle, "n_frames", 1))
            if frames > 1:
                raise _Unreadable(
                    f"holds {frames} frames (a multi-page TIFF or an animation); save one image per file"
                )
            handle.load()
            picture = handle.copy()
            kind = f"{handle.format or path.suffix.lstrip('.').upper()}"
    except (OSError, UnidentifiedImageError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        raise _Unreadable(f"cannot be decoded ({exc}); replace or remove the file") from None
    return _from_pillow(picture, kind)


def _from_pillow(picture: Image.Image, fmt: str) -> _Decoded:
    """A decoded Pillow image as grey or RGB pixels at its own depth."""
    mode = picture.mode
    if mode in _DEEP_MODES:
        values = np.asarray(picture)
        if values.size and int(values.min()) < 0:
            raise _Unreadable(f"holds negative values ({int(values.min())}); export unsigned pixel values")
        bits = 16 if mode.startswith("I;16") or fmt == "PNG" else 32  # a PNG holds at most 16
        return _deep(values, f"{bits}-bit grey {fmt}")
    if mode == "F":
        values = np.asarray(picture, dtype=np.float64)
        lo, hi = (float(values.min()), float(values.max())) if values.size else (0.0, 0.0)
        if not (np.isfinite([lo, hi]).all() and lo >= 0.0 and hi <= 1.0):
            raise _Unreadable(
                f"holds 32-bit floats in [{lo:g}, {hi:g}]; float pixels must lie in [0, 1] (or export "
                "integers)"
            )
        return _Decoded(np.rint(values * 255.0).astype(np.uint8), f"float grey {fmt}")
    if mode in ("1", "L"):
        return _Decoded(np.asarray(picture.convert("L"), dtype=np.uint8), f"8-bit grey {fmt}")
    if mode == "P":
        has_alpha = "transparency" in picture.info
        pixels = _over_black(picture.convert("RGBA")) if has_alpha else np.asarray(picture.convert("RGB"))
        grey = bool((pixels[..., 0] == pixels[..., 1]).all() and (pixels[..., 1] == pixels[..., 2]).all())
        return _Decoded(pixels[..., 0].copy() if grey else pixels, f"palette {fmt}")
    if mode in _ALPHA_MODES:
        if mode in ("LA", "La"):
            return _Decoded(_over_black(picture.convert("LA")), f"grey+alpha {fmt} (alpha over black)")
        return _Decoded(_over_black(picture.convert("RGBA")), f"RGBA {fmt} (alpha over black)")
    try:
        return _Decoded(np.asarray(picture.convert("RGB"), dtype=np.uint8), f"{mode} {fmt}")
    except (OSError, ValueError) as exc:
        raise _Unreadable(f"has image mode {mode}, which cannot be converted to RGB ({exc})") from None


def _deep(values: npt.NDArray[Any], kind: str, *, signed: bool = False, inverted: bool = False) -> _Decoded:
    """A deeper grey image, kept in the integer type it was read in until the import's depth is known."""
    low, high = (int(values.min()), int(values.max())) if values.size else (0, 0)
    return _Decoded(values, kind, deep=True, signed=signed, inverted=inverted, low=low, high=high)


def _over_black(picture: Image.Image) -> npt.NDArray[np.uint8]:
    """An ``LA`` or ``RGBA`` image composited over black: ``colour · alpha / 255`` (alpha dropped)."""
    values = np.asarray(picture, dtype=np.float64)
    colour, alpha = values[..., :-1], values[..., -1:] / 255.0
    out = np.rint(colour * alpha).astype(np.uint8)
    return out[..., 0] if out.shape[-1] == 1 else out


def _check_pixel_count(rows: int, columns: int) -> None:
    """Refuse a DICOM image larger than Pillow decodes of any file (``2 · Image.MAX_IMAGE_PIXELS``): its
    header is all a compressed or deflated file needs to make the import allocate gigabytes."""
    from PIL import Image

    limit = Image.MAX_IMAGE_PIXELS
    if limit is not None and rows * columns > 2 * limit:
        raise _Unreadable(
            f"declares {columns}x{rows} pixels, more than the {2 * limit} of any image the import decodes (a "
            "decompression bomb?); export it at a smaller size"
        )


def _decode_dicom(path: Path) -> _Decoded:
    """A DICOM file's single frame: grey at its stored depth (signed shifted, MONOCHROME1 inverted) or RGB."""
    try:
        import pydicom
        from pydicom.errors import InvalidDicomError
    except ImportError:
        raise _Unreadable(
            "is a DICOM file; reading DICOM needs pydicom: pip install 'diet-capc[dicom]'"
        ) from None
    try:
        ds = pydicom.dcmread(path, defer_size="1 MB")  # the pixel data is read once its size is checked
        frames = int(ds.get("NumberOfFrames", 1) or 1)
        if frames > 1:
            raise _Unreadable(f"holds {frames} frames; export one image per file")
        _check_pixel_count(int(ds.Rows), int(ds.Columns))
        pixels = np.asarray(ds.pixel_array)
        photometric = str(ds.PhotometricInterpretation)
        stored = int(ds.BitsStored)
        signed = int(ds.PixelRepresentation) == 1
    except _Unreadable:
        raise
    except (InvalidDicomError, AttributeError, KeyError) as exc:
        raise _Unreadable(f"is not a DICOM image ({exc})") from None
    except (OSError, ValueError, NotImplementedError, RuntimeError) as exc:
        raise _Unreadable(
            f"cannot be decoded ({exc}); compressed DICOM needs its decoder plug-in (see pydicom's docs)"
        ) from None
    if photometric in ("MONOCHROME1", "MONOCHROME2") and pixels.ndim == 2:
        low, high = (-(2 ** (stored - 1)), 2 ** (stored - 1)) if signed else (0, 2**stored)
        least, most = (int(pixels.min()), int(pixels.max())) if pixels.size else (0, 0)
        if not low <= least <= most < high:
            raise _Unreadable(
                f"holds values in [{least}, {most}], outside the {stored} bits its BitsStored declares "
                "(overlay bits?); export the image again"
            )
        inverted = photometric == "MONOCHROME1"  # 0 is white: inverted so that higher is brighter
        kind = f"{stored}-bit {'signed ' * signed}grey DICOM" + " (MONOCHROME1)" * inverted
        if stored <= 8:  # as an 8-bit image: its own container's range
            values = pixels.astype(np.int16) - low
            values = (2**stored - 1) - values if inverted else values
            return _Decoded(np.rint(values * (255.0 / (2**stored - 1))).astype(np.uint8), kind)
        return _deep(pixels, kind, signed=signed, inverted=inverted)
    if pixels.ndim == 3 and pixels.shape[-1] == 3 and pixels.dtype == np.uint8:
        return _Decoded(pixels, f"{photometric} DICOM")
    raise _Unreadable(
        f"is a {photometric} DICOM image of shape {pixels.shape} and dtype {pixels.dtype}; import reads "
        "single-frame grey (MONOCHROME1/2) or 8-bit RGB images"
    )
