"""Uploaded image bytes -> the model's input tensor, refusing bad input with a 4xx.

Pure library code: no HTTP, no onnxruntime. The route hands over the raw file
bytes; `ImagePipeline` checks them against `[limits]`, decodes them with Pillow
and writes the batch described by `[task.preprocess]` into a per-thread
buffer that is reused from request to request.

Decisions a reader should know about:
- Only JPEG (incl. camera MPO), PNG, WebP, BMP, GIF (first frame) and TIFF
  (first page) reach a Pillow parser; anything else is named from its magic
  bytes and refused with 415, so rarely used parsers are no attack surface.
- Decompression bombs are refused from the header size (`Image.open` is lazy)
  before a single pixel is decoded.
- Transparent images are composited onto WHITE, not stripped of alpha: the
  colour under transparent pixels is undefined (often black or leftovers) and
  white is how such images (logos, product shots) are shown.
- Geometry follows torchvision (`Resize(resize)` + `CenterCrop(crop)`), so a
  model trained with it sees the same framing. For speed only the part of the
  image that survives the crop is resampled (Pillow's `resize(box=...)`); this
  differs from resize-then-crop by at most 1 grey level in ~0.1% of pixels.
- Large JPEGs are decoded at 1/2, 1/4 or 1/8 scale (`draft`), never below the
  resize target, so the final resize still downsamples.
- EXIF orientation is applied to the small crop (as a numpy view), not to the
  full-size image: the framing is symmetric, so the result is the same.
"""

from __future__ import annotations

import io
import re
import struct
import threading
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from PIL import ExifTags, Image

from onnxpool.config.settings import LimitsSettings
from onnxpool.tasks.errors import PayloadTooLarge, Unprocessable, UnsupportedMediaType
from onnxpool.tasks.image.settings import PreprocessSettings

# Pillow plugin names tried by Image.open; JPEG's factory also yields MPO.
PILLOW_FORMATS = ("JPEG", "PNG", "WEBP", "BMP", "GIF", "TIFF")
ACCEPTED = "JPEG, PNG, WebP, BMP, GIF or TIFF"

# Magic bytes, to name a format in a 415/422 without giving it to a parser.
# Each entry: (name, accepted?, (offset, bytes) pairs that must all match).
_SIGNATURES: tuple[tuple[str, bool, tuple[tuple[int, bytes], ...]], ...] = (
    ("JPEG", True, ((0, b"\xff\xd8\xff"),)),
    ("PNG", True, ((0, b"\x89PNG\r\n\x1a\n"),)),
    ("GIF", True, ((0, b"GIF87a"),)),
    ("GIF", True, ((0, b"GIF89a"),)),
    ("WebP", True, ((0, b"RIFF"), (8, b"WEBP"))),
    ("BMP", True, ((0, b"BM"),)),
    ("TIFF", True, ((0, b"II*\x00"),)),
    ("TIFF", True, ((0, b"MM\x00*"),)),
    ("BigTIFF", False, ((0, b"II+\x00"),)),
    ("BigTIFF", False, ((0, b"MM\x00+"),)),
    ("AVIF", False, ((4, b"ftypavi"),)),
    ("HEIC", False, ((4, b"ftyphei"),)),
    ("HEIC", False, ((4, b"ftypmif1"),)),
    ("HEIC", False, ((4, b"ftypmsf1"),)),
    ("HEIC", False, ((4, b"ftyphev"),)),
    ("JPEG 2000", False, ((0, b"\x00\x00\x00\x0cjP  "),)),
    ("JPEG 2000", False, ((0, b"\xff\x4f\xff\x51"),)),
    ("JPEG XL", False, ((0, b"\xff\x0a"),)),
    ("JPEG XL", False, ((0, b"\x00\x00\x00\x0cJXL "),)),
    ("ICO", False, ((0, b"\x00\x00\x01\x00"),)),
    ("PSD", False, ((0, b"8BPS"),)),
    ("PDF", False, ((0, b"%PDF-"),)),
    ("PostScript", False, ((0, b"%!PS"),)),
    ("ZIP", False, ((0, b"PK\x03\x04"),)),
    ("gzip", False, ((0, b"\x1f\x8b"),)),
)

# What Pillow raises on malformed files besides OSError: its parsers were not
# written to one exception contract. Warning: where warnings are errors (pytest,
# `-W error`), Pillow's "corrupt EXIF"/"truncated" warnings arrive as exceptions.
# Kept to the `open`/`load`/`getexif` calls only, so our own bugs still surface.
_DECODE_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    SyntaxError,
    ValueError,
    EOFError,
    IndexError,
    KeyError,
    TypeError,
    struct.error,
    zlib.error,
    Warning,
)

_RESAMPLE = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
}
# Pillow's advice: a gap of 3 is indistinguishable from a full resample and
# makes large non-JPEG sources (a 4000 px PNG) several times faster to shrink.
_REDUCING_GAP = 3.0

# Modes the resize works on directly; everything else is converted first.
_WORKING_MODES = frozenset({"RGB", "RGBA", "L", "LA"})
_CONVERT_TO = {"1": "L", "PA": "RGBA", "La": "LA", "RGBa": "RGBA"}  # default: "RGB"

Pixels = npt.NDArray[np.uint8]

# EXIF orientation -> the array view that shows the image upright; the same
# table as ImageOps.exif_transpose, written as numpy views (no copy).
_ORIENT: dict[int, Callable[[Pixels], Pixels]] = {
    2: lambda a: a[:, ::-1],  # FLIP_LEFT_RIGHT
    3: lambda a: a[::-1, ::-1],  # ROTATE_180
    4: lambda a: a[::-1],  # FLIP_TOP_BOTTOM
    5: lambda a: a.swapaxes(0, 1),  # TRANSPOSE
    6: lambda a: a.swapaxes(0, 1)[:, ::-1],  # ROTATE_270 (clockwise)
    7: lambda a: a[::-1, ::-1].swapaxes(0, 1),  # TRANSVERSE
    8: lambda a: a.swapaxes(0, 1)[::-1],  # ROTATE_90 (counter-clockwise)
}


def sniff_format(head: bytes) -> tuple[str, bool] | None:
    """(format name, accepted?) from the first bytes, or None if unrecognised."""
    for name, accepted, parts in _SIGNATURES:
        if all(head[off : off + len(magic)] == magic for off, magic in parts):
            return name, accepted
    text = head[:1024].lstrip().lower()
    if b"<svg" in text or (text.startswith(b"<?xml") and b"svg" in text):
        return "SVG", False
    if text.startswith((b"<!doctype html", b"<html")):
        return "HTML", False
    return None


def resized_size(width: int, height: int, shorter: int) -> tuple[int, int]:
    """Size after scaling the shorter side to `shorter` (torchvision: long side truncated)."""
    if width <= height:
        return shorter, max(shorter, int(shorter * height / width))
    return max(shorter, int(shorter * width / height)), shorter


def exif_orientation(im: Image.Image) -> int:
    """The EXIF Orientation (1..8); 1 when absent or when the EXIF block is broken."""
    try:
        value = im.getexif().get(ExifTags.Base.Orientation, 1)
    except _DECODE_ERRORS:
        return 1  # a broken EXIF block is no reason to refuse the photo
    return value if isinstance(value, int) and value in _ORIENT else 1


def orient(pixels: Pixels, orientation: int) -> Pixels:
    """View of an (H, W[, C]) array turned upright for an EXIF orientation."""
    transform = _ORIENT.get(orientation)
    return pixels if transform is None else transform(pixels)


def to_working_mode(im: Image.Image, what: str) -> Image.Image:
    """Convert any decoded mode to RGB, RGBA, L or LA with 8 bits per channel."""
    mode = im.mode
    if mode in _WORKING_MODES:
        return im
    if mode == "P":
        return im.convert("RGBA" if "transparency" in im.info else "RGB")
    if mode.startswith("I"):
        # 16-bit grey (PNG/TIFF "I;16*", or "I"): keep the high byte. Pillow's own
        # convert("L") clips at 255 instead, which turns most photos white.
        wide = np.clip(np.asarray(im), 0, 65535).astype(np.uint16, copy=False)
        return Image.fromarray((wide >> 8).astype(np.uint8))
    if mode == "F":
        # Float TIFF: samples in 0..1 are scaled to 0..255, otherwise taken as 0..255.
        floats = np.nan_to_num(np.asarray(im, dtype=np.float32))
        if floats.size and float(floats.max()) <= 1.0:
            floats = floats * 255.0
        return Image.fromarray(np.clip(floats + 0.5, 0, 255).astype(np.uint8))
    try:
        # CMYK: Pillow's formula (Adobe's inverted CMYK JPEGs are undone by the decoder).
        return im.convert(_CONVERT_TO.get(mode, "RGB"))
    except ValueError:
        raise Unprocessable(f"{what} uses pixel mode {mode}, which cannot be converted to RGB") from None


def flatten_alpha(im: Image.Image) -> Image.Image:
    """Composite RGBA/LA onto white; other modes are returned as they are."""
    if im.mode not in ("RGBA", "LA"):
        return im
    base = Image.new(im.mode[:-1], im.size, 255 if im.mode == "LA" else (255, 255, 255))
    base.paste(im.convert(base.mode), mask=im.getchannel("A"))
    return base


class _ThreadBuffers(threading.local):
    """Per-thread batch buffer: gthread workers run several requests in one process."""

    batch: np.ndarray[Any, Any] | None = None


Size = tuple[int, int]
"""(width, height) in pixels."""
_TRANSPOSING = (5, 6, 7, 8)
"""EXIF orientations that turn the image a quarter: its upright width is the stored height."""


@dataclass(frozen=True)
class Framing:
    """How a point of the model's input maps back to the original image (resize, then centre crop)."""

    scale_x: float
    scale_y: float
    """Original pixels per resized pixel, across and down."""
    left: int
    top: int
    """The crop's corner in the resized image."""

    def to_original(self, x: float, y: float) -> tuple[float, float]:
        """A point in input pixels (0..crop) as a point in the original image's pixels."""
        return (x + self.left) * self.scale_x, (y + self.top) * self.scale_y


class ImagePipeline:
    """Decode and preprocess uploaded images for one model's `[task.preprocess]` spec.

    Thread-safe: configuration is read-only after construction and each thread
    writes into its own buffer.
    """

    def __init__(self, spec: PreprocessSettings, limits: LimitsSettings, channels: int = 3) -> None:
        """`channels`: 3 (colour) or 1 (grey: photos are converted with Pillow's "L", ITU-R 601 luma).
        A `layout` of "auto" is NCHW here: the task settles it from the model first (tasks/image/fit.py)."""
        if channels not in (1, 3):
            raise ValueError(f"an image has 1 or 3 channels, not {channels}")
        self.spec = spec
        self.limits = limits
        self.channels = channels
        self._grey = channels == 1
        self._resample = _RESAMPLE[spec.resample]
        self._dtype = np.dtype(spec.dtype)
        self._bgr = spec.channel_order == "BGR" and not self._grey
        self._nchw = spec.layout != "NHWC"
        crop = spec.crop
        self._shape: tuple[int, int, int] = (channels, crop, crop) if self._nchw else (crop, crop, channels)
        # normalised = (x*scale - mean)/std = x*a + b, one multiply and one add per
        # element. mean/std are already in channel_order, so no reordering here.
        # (uint8 models take raw pixels: scale/mean/std are not applied.)
        per_mean, per_std = spec.per_channel(channels)
        mean = np.asarray(per_mean, np.float64)
        std = np.asarray(per_std, np.float64)
        a = (spec.scale / std).astype(np.float32)
        b = (-mean / std).astype(np.float32)
        if self._nchw:
            self._a, self._b = a[:, None, None], b[:, None, None]
        else:
            # Coefficients tiled to (crop, 3): numpy then runs one contiguous inner
            # loop over each row instead of 3-element loops (7x faster).
            self._a, self._b = np.tile(a, (crop, 1)), np.tile(b, (crop, 1))
        # float16: a 256-entry table per channel rounds each value once, exactly,
        # and is 3x faster than computing in float32 and converting.
        levels = np.arange(256, dtype=np.float64)
        self._lut = ((levels[None, :] * spec.scale - mean[:, None]) / std[:, None]).astype(np.float16)
        self._local = _ThreadBuffers()
        # Register every Pillow plugin now (in the master, before forking and before
        # request threads exist) rather than lazily inside the first request.
        Image.init()

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """Shape of one preprocessed image: (channels, crop, crop) or (crop, crop, channels)."""
        return self._shape

    # -- decoding -------------------------------------------------------------

    def open(self, data: bytes | memoryview, what: str = "image") -> Image.Image:
        """Identify the image and check its size from the header; no pixel is decoded yet."""
        nbytes = memoryview(data).nbytes
        if nbytes == 0:
            raise Unprocessable(f"{what} is empty (0 bytes)")
        if nbytes > self.limits.max_image_bytes:
            raise PayloadTooLarge(
                f"{what} is {nbytes} bytes; the limit is {self.limits.max_image_bytes} bytes per image"
            )
        try:
            im = Image.open(io.BytesIO(data), formats=PILLOW_FORMATS)
        except Image.DecompressionBombError as exc:
            raise self._bomb(what, exc, 2) from None
        except Image.DecompressionBombWarning as exc:  # only raised when warnings are errors
            raise self._bomb(what, exc, 1) from None
        except _DECODE_ERRORS:
            raise self._unreadable(bytes(memoryview(data)[:1024]), what) from None
        width, height = im.size
        if width * height > self.limits.max_image_pixels:
            raise PayloadTooLarge(
                f"{what} is {width}x{height} = {width * height} pixels; "
                f"the limit is {self.limits.max_image_pixels} pixels (width x height)"
            )
        return im

    def decode(self, data: bytes | memoryview, what: str = "image") -> Image.Image:
        """The full-size, upright RGB image (alpha composited onto white)."""
        im = self.open(data, what)
        _load(im, what)
        orientation = exif_orientation(im)
        rgb = flatten_alpha(to_working_mode(im, what)).convert("RGB")
        return Image.fromarray(np.ascontiguousarray(orient(np.asarray(rgb), orientation)))

    def crop_pixels(self, data: bytes | memoryview, what: str = "image", sizes: list[Size] | None = None) -> Pixels:
        """The upright crop x crop uint8 pixels, (H, W, 3) RGB or (H, W) grey; the upright image's
        (width, height) appended to `sizes` when given."""
        spec = self.spec
        im = self.open(data, what)
        width, height = im.size
        new_w, new_h = resized_size(width, height, spec.resize)
        scale = 1.0
        if im.format in ("JPEG", "MPO"):
            # Decode at 1/2, 1/4 or 1/8 scale while still >= the resize target.
            drafted = im.draft("L" if self._grey else "RGB", (new_w, new_h))
            if drafted is not None:
                scale = width / drafted[1][2]
        _load(im, what)
        orientation = exif_orientation(im)
        if sizes is not None:
            sizes.append((height, width) if orientation in _TRANSPOSING else (width, height))
        im = to_working_mode(im, what)
        # The crop box in resized coordinates, mapped back to the (drafted) source:
        # only what survives the crop is resampled.
        left = round((new_w - spec.crop) / 2.0)
        top = round((new_h - spec.crop) / 2.0)
        fx, fy = width / new_w / scale, height / new_h / scale
        box = (left * fx, top * fy, (left + spec.crop) * fx, (top + spec.crop) * fy)
        small = flatten_alpha(im.resize((spec.crop, spec.crop), self._resample, box=box, reducing_gap=_REDUCING_GAP))
        if self._grey and small.mode != "L":
            small = small.convert("L")  # after the resize: a third of the pixels to mix
        return orient(np.asarray(small), orientation)

    # -- batching -------------------------------------------------------------

    def preprocess_batch(
        self, images: Sequence[bytes | memoryview], what: Sequence[str] | None = None, sizes: list[Size] | None = None
    ) -> np.ndarray[Any, Any]:
        """The model input for `images`, (n, *input_shape) in spec.dtype; each upright image's
        original (width, height) appended to `sizes` when given (a detector rescales boxes with
        `framing`).

        The array is this thread's reused buffer: valid until this thread's next call.
        `limits.max_images` is enforced here; running it in chunks of
        `limits.max_batch` is the caller's business.
        """
        n = len(images)
        if n == 0:
            raise Unprocessable("no image was sent")
        if n > self.limits.max_images:
            raise PayloadTooLarge(f"{n} images sent; the limit is {self.limits.max_images} per request")
        names = [f"image[{i}]" for i in range(n)] if what is None else list(what)
        if len(names) != n:
            raise ValueError(f"{len(names)} names given for {n} images")
        batch = self._batch_buffer(n)
        for i, (data, name) in enumerate(zip(images, names, strict=True)):
            self._write(self.crop_pixels(data, name, sizes), batch[i])
        return batch[:n]

    def framing(self, size: Size) -> Framing:
        """Where the model's crop x crop input lies in an upright image of `size` (width, height)."""
        width, height = size
        new_w, new_h = resized_size(width, height, self.spec.resize)
        left = round((new_w - self.spec.crop) / 2.0)
        top = round((new_h - self.spec.crop) / 2.0)
        return Framing(scale_x=width / new_w, scale_y=height / new_h, left=left, top=top)

    def _batch_buffer(self, n: int) -> np.ndarray[Any, Any]:
        """This thread's buffer with room for at least n images (doubling, up to max_images)."""
        batch = self._local.batch
        if batch is None or batch.shape[0] < n:
            capacity = n if batch is None else min(max(n, 2 * batch.shape[0]), self.limits.max_images)
            batch = np.empty((capacity, *self._shape), dtype=self._dtype)
            self._local.batch = batch
        return batch

    def _write(self, pixels: Pixels, out: np.ndarray[Any, Any]) -> None:
        """Normalise one (H, W, 3) or (H, W) uint8 crop into `out` in a single pass."""
        if pixels.ndim == 3 and self._bgr:
            pixels = pixels[:, :, ::-1]
        grey = pixels.ndim == 2
        if self._nchw:
            src = pixels[None] if grey else pixels.transpose(2, 0, 1)
        else:
            src = pixels[:, :, None] if grey else np.ascontiguousarray(pixels)
        if self._dtype == np.uint8:
            np.copyto(out, src)
        elif self._dtype == np.float32:
            np.multiply(src, self._a, out=out)
            np.add(out, self._b, out=out)
        else:
            for c in range(self.channels):
                plane = src[0 if grey else c] if self._nchw else src[:, :, 0 if grey else c]
                np.take(self._lut[c], plane, out=out[c] if self._nchw else out[:, :, c])

    # -- errors ---------------------------------------------------------------

    def _bomb(self, what: str, exc: Exception, factor: int) -> PayloadTooLarge:
        """413 for Pillow's own decompression-bomb check, with the numbers."""
        found = re.search(r"\((\d+) pixels\)", str(exc))
        pixels = f"{int(found.group(1))} pixels" if found else "too many pixels"
        limit = self.limits.max_image_pixels
        if Image.MAX_IMAGE_PIXELS is not None:
            limit = min(limit, factor * Image.MAX_IMAGE_PIXELS)
        return PayloadTooLarge(f"{what} is {pixels}; the limit is {limit} pixels (width x height)")

    @staticmethod
    def _unreadable(head: bytes, what: str) -> UnsupportedMediaType | Unprocessable:
        """415 for a format we do not take or not an image; 422 for a damaged one we do."""
        sniffed = sniff_format(head)
        if sniffed is None:
            return UnsupportedMediaType(f"{what} is not an image this server can read; send {ACCEPTED}")
        name, accepted = sniffed
        if accepted:
            return Unprocessable(f"{what} is a corrupt {name} file: its header cannot be read")
        return UnsupportedMediaType(f"{what} is {name}, which is not supported; send {ACCEPTED}")


def _load(im: Image.Image, what: str) -> None:
    """Decode the pixels; a truncated or corrupt file becomes a 422 naming the format."""
    try:
        im.load()
    except Image.DecompressionBombError:
        raise PayloadTooLarge(f"{what} expands to too many pixels to decode") from None
    except _DECODE_ERRORS as exc:
        kind = {"MPO": "JPEG", None: "image"}.get(im.format, im.format)
        raise Unprocessable(f"{what} is a truncated or corrupt {kind} file ({exc})") from None
