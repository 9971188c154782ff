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
* **DICOM** (``.dcm``, read with pydicom, the optional extra ``diet-capc[dicom]``): the stored values
  (signed ones shifted to start at 0, MONOCHROME1 inverted so that higher is brighter), then as a deeper grey
  image. The modality rescale is linear and changes nothing here; the VOI window is not applied (it clips).

Resizing (``size``) keeps the aspect ratio: ``pad`` fits the image inside the target and fills the rest
with black, ``crop`` fills the target and cuts the centre out; ``stretch`` ignores the ratio. The report
counts what was changed. Every file that cannot be read is listed in one error, not only the first.
"""

from __future__ import annotations

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
    grey image an unsigned integer array scaled later by the import's depth."""

    pixels: npt.NDArray[Any]
    kind: str
    deep: bool = False

    @property
    def colour(self) -> bool:
        return self.pixels.ndim == 3


@dataclass(frozen=True)
class PixelReport:
    """What the import did to the pixels (printed by ``capc data import``).

    Attributes:
        kinds: files per kind read (``8-bit grey``, ``16-bit grey``, ``RGBA (alpha over black)``, …).
        bit_depth: the bits deep grey images were scaled by (None: there were none).
        max_value: the largest value of those images.
        resized: images whose height or width was changed.
        reshaped: of those, images of another aspect ratio (padded, cropped or stretched, per ``fit``).
        fit: how a different aspect ratio was handled.
        recoloured: images converted between grey and RGB.
    """

    kinds: dict[str, int] = field(default_factory=dict)
    bit_depth: int | None = None
    max_value: int | None = None
    resized: int = 0
    reshaped: int = 0
    fit: Fit = "pad"
    recoloured: int = 0

    def lines(self, *, size: tuple[int, int, int] | None) -> list[str]:
        """One sentence per thing done, for the import's output."""
        read = ", ".join(f"{n} {kind}" for kind, n in sorted(self.kinds.items()))
        out = [f"read {read}"]
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
    decoded: list[_Decoded] = []
    bad: list[str] = []
    for path in paths:
        try:
            decoded.append(_decode(path))
        except _Unreadable as exc:
            bad.append(f"{path}: {exc}")
    if bad:
        raise InputError(_listed(f"{len(bad)} of {len(paths)} image file(s) cannot be read", bad))
    deep = [(p, d) for p, d in zip(paths, decoded, strict=True) if d.deep]
    top = max((int(d.pixels.max(initial=0)) for _, d in deep), default=None)
    bits = None if top is None else (bit_depth or max(8, top.bit_length()))
    if bits is not None and bit_depth is not None:
        over = [f"{p}: values up to {int(d.pixels.max())}" for p, d in deep if d.pixels.max() >= 2**bits]
        if over:
            raise InputError(
                _listed(f"{len(over)} image(s) hold values above --bit-depth {bits} ({2**bits - 1})", over)
                + "\nraise --bit-depth, or leave it out to scale by the bits the images use"
            )
    eight = [_to_eight(d, bits) for d in decoded]
    report = PixelReport(kinds=dict(Counter(d.kind for d in decoded)), bit_depth=bits, max_value=top, fit=fit)
    if size is not None:
        return _sized(eight, size, fit=fit, report=report)
    return _same_size(paths, eight), report


def _listed(head: str, items: Sequence[str]) -> str:
    return head + ":\n" + "\n".join(f"  {item}" for item in items)


def _to_eight(decoded: _Decoded, bits: int | None) -> npt.NDArray[np.uint8]:
    """``(H, W, C)`` uint8 pixels of one image (a deep one scaled by ``bits``)."""
    pixels = decoded.pixels
    if decoded.deep:
        assert bits is not None
        scaled = np.rint(pixels.astype(np.float64) * (255.0 / (2**bits - 1)))
        pixels = scaled.astype(np.uint8)
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


def _sized(
    images: list[npt.NDArray[np.uint8]], size: tuple[int, int, int], *, fit: Fit, report: PixelReport
) -> tuple[npt.NDArray[np.uint8], PixelReport]:
    """Every image brought to ``size`` (``fit`` for another aspect ratio), with the counts of what changed."""
    from PIL import Image

    height, width, channels = size
    out = np.empty((len(images), height, width, channels), dtype=np.uint8)
    resized = reshaped = recoloured = 0
    for i, pixels in enumerate(images):
        h, w, c = pixels.shape
        picture = Image.fromarray(pixels[..., 0] if c == 1 else pixels, "L" if c == 1 else "RGB")
        if c != channels:
            picture = picture.convert("L" if channels == 1 else "RGB")
            recoloured += 1
        if (h, w) != (height, width):
            resized += 1
            reshaped += h * width != w * height
            picture = _fitted(picture, height=height, width=width, fit=fit)
        array = np.asarray(picture, dtype=np.uint8)
        out[i] = array.reshape(height, width, channels)
    return out, replace(report, resized=resized, reshaped=reshaped, recoloured=recoloured)


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
        canvas = Image.new(picture.mode, (width, height), 0)
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
        return _Decoded(values.astype(np.uint32), f"{bits}-bit grey {fmt}", deep=True)
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


def _over_black(picture: Image.Image) -> npt.NDArray[np.uint8]:
    """An ``LA`` or ``RGBA`` image composited over black: ``colour · alpha / 255`` (alpha dropped)."""
    values = np.asarray(picture, dtype=np.float64)
    colour, alpha = values[..., :-1], values[..., -1:] / 255.0
    out = np.rint(colour * alpha).astype(np.uint8)
    return out[..., 0] if out.shape[-1] == 1 else out


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
        ds = pydicom.dcmread(path)
        frames = int(ds.get("NumberOfFrames", 1) or 1)
        if frames > 1:
            raise _Unreadable(f"holds {frames} frames; export one image per file")
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
        values = pixels.astype(np.int64)
        if signed:
            values = values + 2 ** (stored - 1)
        if values.size and not 0 <= int(values.min()) <= int(values.max()) < 2**stored:
            raise _Unreadable(
                f"holds values in [{int(values.min())}, {int(values.max())}], outside the {stored} bits its "
                "BitsStored declares (overlay bits?); export the image again"
            )
        if photometric == "MONOCHROME1":  # 0 is white: invert so that higher is brighter
            values = (2**stored - 1) - values
        if stored <= 8:
            scaled = np.rint(values * (255.0 / (2**stored - 1))).astype(np.uint8)
            return _Decoded(scaled, f"{stored}-bit grey DICOM")
        return _Decoded(values.astype(np.uint32), f"{stored}-bit grey DICOM", deep=True)
    if pixels.ndim == 3 and pixels.shape[-1] == 3 and pixels.dtype == np.uint8:
        return _Decoded(pixels, f"{photometric} DICOM")
    raise _Unreadable(
        f"is a {photometric} DICOM image of shape {pixels.shape} and dtype {pixels.dtype}; import reads "
        "single-frame grey (MONOCHROME1/2) or 8-bit RGB images"
    )
