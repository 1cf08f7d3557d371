"""tasks.image.imaging: real photos in every format and mode, hostile files, and the tensor math.

Variants of the two CC0 photos in models/samples are built in memory; hostile
files (bombs, truncations, other formats) are built byte by byte.
"""

from __future__ import annotations

import io
import resource
import struct
import threading
import warnings
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image, ImageOps

from onnxpool.config.settings import LimitsSettings
from onnxpool.tasks.errors import PayloadTooLarge, Unprocessable, UnsupportedMediaType
from onnxpool.tasks.image.imaging import ImagePipeline, orient, resized_size, sniff_format
from onnxpool.tasks.image.settings import PreprocessSettings
from tests.harness import DATA

CAT = (DATA / "chelsea-cat.jpg").read_bytes()  # 451x300
COFFEE = (DATA / "coffee.jpg").read_bytes()  # 600x400
IMAGENET: dict[str, Any] = {"mean": (123.675, 116.28, 103.53), "std": (58.395, 57.12, 57.375)}


def make(limits: dict[str, Any] | None = None, **spec: Any) -> ImagePipeline:
    return ImagePipeline(PreprocessSettings(**spec), LimitsSettings(**(limits or {})))


def encode(im: Image.Image, fmt: str, **options: Any) -> bytes:
    out = io.BytesIO()
    im.save(out, fmt, **options)
    return out.getvalue()


def cat_rgb() -> Image.Image:
    return Image.open(io.BytesIO(CAT)).convert("RGB")


def png_file(width: int, height: int, *, depth: int = 8, colour: int = 2, rows: bytes | None = None) -> bytes:
    """A PNG written by hand: a valid IHDR declaring any size, then the given (or a tiny) IDAT."""

    def chunk(tag: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + tag + body + struct.pack(">I", zlib.crc32(tag + body))

    ihdr = struct.pack(">IIBBBBB", width, height, depth, colour, 0, 0, 0)
    idat = zlib.compress(rows if rows is not None else b"\x00" * 16)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def vm_rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS in /proc/self/status")


def one(pipeline: ImagePipeline, data: bytes | memoryview) -> np.ndarray[Any, Any]:
    """A copy of the single-image batch (the pipeline's buffer is reused)."""
    copy: np.ndarray[Any, Any] = pipeline.preprocess_batch([data])[0].copy()
    return copy


# -- shape, dtype, layout, channel order ---------------------------------------


def test_default_spec_gives_nchw_float32_in_range() -> None:
    pipeline = make()
    batch = pipeline.preprocess_batch([CAT, COFFEE])
    assert pipeline.input_shape == (3, 224, 224)
    assert batch.shape == (2, 3, 224, 224) and batch.dtype == np.float32
    assert batch.flags.c_contiguous
    assert batch.min() >= (0 - 127) / 128 and batch.max() <= (255 - 127) / 128


def test_bytes_like_inputs_are_accepted() -> None:
    expected = one(make(), CAT)
    np.testing.assert_array_equal(one(make(), memoryview(CAT)), expected)
    np.testing.assert_array_equal(make().preprocess_batch([memoryview(CAT), bytearray(CAT)])[1], expected)  # type: ignore[list-item]


def test_torchvision_geometry() -> None:
    assert resized_size(451, 300, 256) == (384, 256)  # long side truncated, as torchvision
    assert resized_size(300, 451, 256) == (256, 384)
    assert resized_size(500, 500, 256) == (256, 256)
    assert resized_size(1, 100_000, 256) == (256, 25_600_000)  # only the crop is ever resampled


@pytest.mark.parametrize(
    "spec",
    [{}, IMAGENET, {"scale": 1 / 255, "mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225)}],
    ids=["default", "imagenet-255", "imagenet-1"],
)
def test_fused_normalisation_equals_float_reference(spec: dict[str, Any]) -> None:
    """x*a + b in one pass equals (x*scale - mean)/std done plainly in float (no draft: small JPEG)."""
    pipeline = make(**spec)
    im = cat_rgb()
    new_w, new_h = resized_size(*im.size, 256)
    left, top = round((new_w - 224) / 2), round((new_h - 224) / 2)
    fx, fy = im.size[0] / new_w, im.size[1] / new_h
    # Same Pillow geometry as the pipeline (resample just the crop); see the next test for that choice.
    box = (left * fx, top * fy, (left + 224) * fx, (top + 224) * fy)
    pixels = np.asarray(im.resize((224, 224), Image.Resampling.BILINEAR, box=box), dtype=np.float32)
    settings = PreprocessSettings(**spec)
    mean, std = np.array(settings.mean, np.float32), np.array(settings.std, np.float32)
    expected = ((pixels * settings.scale - mean) / std).transpose(2, 0, 1)
    np.testing.assert_allclose(one(pipeline, CAT), expected, rtol=0, atol=1e-5)


def test_cropped_resample_matches_resize_then_crop() -> None:
    """Resampling only the crop region differs from resize-then-crop by at most one grey level, rarely."""
    im = cat_rgb()
    new_w, new_h = resized_size(*im.size, 256)
    left, top = round((new_w - 224) / 2), round((new_h - 224) / 2)
    naive = im.resize((new_w, new_h), Image.Resampling.BILINEAR).crop((left, top, left + 224, top + 224))
    ours = make().crop_pixels(CAT)
    diff = np.abs(np.asarray(naive, np.int16) - ours)
    assert diff.max() <= 1 and (diff > 0).mean() < 0.01


def test_nhwc_is_nchw_transposed() -> None:
    nchw, nhwc = one(make(), CAT), one(make(layout="NHWC"), CAT)
    assert make(layout="NHWC").input_shape == (224, 224, 3)
    np.testing.assert_allclose(nhwc, nchw.transpose(1, 2, 0), rtol=0, atol=1e-6)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_bgr_is_rgb_reversed(layout: str) -> None:
    # Asymmetric mean/std given in BGR order must line up with the reversed channels.
    rgb = one(make(layout=layout, **IMAGENET), CAT)
    bgr = one(make(layout=layout, channel_order="BGR", mean=IMAGENET["mean"][::-1], std=IMAGENET["std"][::-1]), CAT)
    axis = 0 if layout == "NCHW" else 2
    np.testing.assert_allclose(bgr, np.flip(rgb, axis=axis), rtol=0, atol=1e-6)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_uint8_dtype_gives_raw_pixels(layout: str) -> None:
    pixels = make().crop_pixels(CAT)
    batch = make(dtype="uint8", layout=layout).preprocess_batch([CAT])
    assert batch.dtype == np.uint8
    np.testing.assert_array_equal(batch[0], pixels.transpose(2, 0, 1) if layout == "NCHW" else pixels)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_float16_is_float32_rounded(layout: str) -> None:
    f32 = one(make(layout=layout, **IMAGENET), CAT)
    f16 = one(make(layout=layout, dtype="float16", **IMAGENET), CAT)
    assert f16.dtype == np.float16
    np.testing.assert_array_equal(f16, f32.astype(np.float16))


# -- formats ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fmt", "options", "tolerance"),
    [
        ("PNG", {}, 0),
        ("BMP", {}, 0),
        ("TIFF", {}, 0),
        ("TIFF", {"compression": "tiff_lzw"}, 0),
        ("WEBP", {"lossless": True}, 0),
        ("JPEG", {"quality": 95}, 0.03),
        ("WEBP", {"quality": 90}, 0.05),
        ("GIF", {}, 0.08),
    ],
    ids=["png", "bmp", "tiff", "tiff-lzw", "webp-lossless", "jpeg", "webp", "gif"],
)
def test_every_accepted_format(fmt: str, options: dict[str, Any], tolerance: float) -> None:
    pipeline = make()
    reference = one(pipeline, encode(cat_rgb(), "PNG"))
    got = one(pipeline, encode(cat_rgb(), fmt, **options))
    assert np.abs(got - reference).mean() <= tolerance


def test_gif_uses_the_first_frame() -> None:
    black = Image.new("RGB", (451, 300))
    gif = encode(cat_rgb(), "GIF", save_all=True, append_images=[black, black], duration=100)
    pipeline = make()
    reference = one(pipeline, encode(cat_rgb(), "GIF"))
    np.testing.assert_array_equal(one(pipeline, gif), reference)


def test_multipage_tiff_uses_the_first_page() -> None:
    tiff = encode(cat_rgb(), "TIFF", save_all=True, append_images=[Image.new("RGB", (50, 50))])
    np.testing.assert_array_equal(one(make(), tiff), one(make(), encode(cat_rgb(), "PNG")))


def test_camera_mpo_jpeg_is_read_as_its_first_picture() -> None:
    mpo = encode(cat_rgb(), "MPO", save_all=True, append_images=[Image.new("RGB", (451, 300))], quality=95)
    assert Image.open(io.BytesIO(mpo)).format == "MPO"
    jpeg = encode(cat_rgb(), "JPEG", quality=95)
    assert np.abs(one(make(), mpo) - one(make(), jpeg)).mean() < 0.01


def test_large_jpeg_draft_decode_stays_close_to_full_decode() -> None:
    """A 1920 px JPEG is decoded at 1/4 scale (480 px >= 256): the result stays close to full decoding."""
    big = cat_rgb().resize((1920, 1920), Image.Resampling.BICUBIC)
    jpeg = encode(big, "JPEG", quality=90)
    draft = Image.open(io.BytesIO(jpeg))
    assert draft.draft("RGB", resized_size(1920, 1920, 256)) is not None and draft.size == (480, 480)
    full = Image.open(io.BytesIO(jpeg)).convert("RGB")  # full decode, same pixels as a lossless file
    no_draft = one(make(), encode(full, "PNG"))
    assert np.abs(one(make(), jpeg) - no_draft).mean() < 0.01  # 1.3 grey levels; measured 0.4


# -- EXIF orientation -----------------------------------------------------------------

# Orientation tag -> how to store the upright picture so that a viewer shows it upright.
STORED = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_90,  # displayed after a clockwise turn
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_270,
}


def rotated_with_exif(orientation: int, fmt: str = "JPEG") -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    stored = cat_rgb().transpose(STORED[orientation])
    return encode(stored, fmt, exif=exif, **({"quality": 95} if fmt == "JPEG" else {}))


@pytest.mark.parametrize("orientation", sorted(STORED))
def test_orient_view_matches_pillow_transpose(orientation: int) -> None:
    pixels = np.random.default_rng(orientation).integers(0, 256, (5, 7, 3), dtype=np.uint8)
    expected = Image.fromarray(pixels).transpose(STORED[orientation])  # stored image...
    restored = orient(np.asarray(expected), orientation)  # ...turned back upright
    np.testing.assert_array_equal(restored, pixels)


@pytest.mark.parametrize("orientation", sorted(STORED))
def test_exif_rotated_jpeg_preprocesses_like_the_upright_one(orientation: int) -> None:
    data = rotated_with_exif(orientation)
    # Sanity: a viewer (exif_transpose) shows the upright cat.
    assert ImageOps.exif_transpose(Image.open(io.BytesIO(data))).size == (451, 300)
    upright = one(make(), encode(cat_rgb(), "JPEG", quality=95))
    assert np.abs(one(make(), data) - upright).mean() < 0.02


@pytest.mark.parametrize("orientation", [3, 6, 8])
def test_exif_rotated_png_is_exact_up_to_rounding(orientation: int) -> None:
    got = make().crop_pixels(rotated_with_exif(orientation, "PNG"))
    upright = make().crop_pixels(encode(cat_rgb(), "PNG"))
    diff = np.abs(got.astype(np.int16) - upright)
    assert diff.max() <= 1 and diff.mean() < 0.05


def test_decode_returns_the_upright_full_size_rgb_image() -> None:
    im = make().decode(rotated_with_exif(6, "PNG"), 'image[0] "phone.png"')
    assert im.mode == "RGB" and im.size == (451, 300)
    np.testing.assert_array_equal(np.asarray(im), np.asarray(cat_rgb()))


def test_broken_exif_is_ignored() -> None:
    jpeg = encode(cat_rgb(), "JPEG", quality=95)
    broken = jpeg[:2] + b"\xff\xe1\x00\x10Exif\x00\x00II*\x00\xff\xff\xff\xff" + jpeg[2:]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # as in production: Pillow's "Corrupt EXIF" is only a warning
        np.testing.assert_array_equal(one(make(), broken), one(make(), jpeg))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # -W error turns it into an exception: still a clean 4xx
        with pytest.raises(Unprocessable, match="corrupt JPEG"):
            make().preprocess_batch([broken])


# -- pixel modes --------------------------------------------------------------------


def test_grayscale_fills_all_three_channels() -> None:
    grey = cat_rgb().convert("L")
    for layout, axis in (("NCHW", 0), ("NHWC", 2)):
        for dtype in ("float32", "float16", "uint8"):
            out = one(make(layout=layout, dtype=dtype), encode(grey, "PNG"))
            channels = np.moveaxis(out, axis, 0)
            assert out.shape == make(layout=layout).input_shape
            np.testing.assert_array_equal(channels[0], channels[1])
            np.testing.assert_array_equal(channels[0], channels[2])
    # and it is the luminance of the colour picture
    colour_as_grey = one(make(), encode(cat_rgb().convert("L").convert("RGB"), "PNG"))
    np.testing.assert_array_equal(one(make(), encode(grey, "PNG")), colour_as_grey)


def test_transparent_pixels_become_white_and_opaque_ones_stay() -> None:
    rgba = cat_rgb().convert("RGBA")
    alpha = Image.new("L", rgba.size, 255)
    alpha.paste(0, (0, 0, rgba.size[0] // 2, rgba.size[1]))  # left half fully transparent
    rgba.putalpha(alpha)
    pixels = make().crop_pixels(encode(rgba, "PNG"))
    assert (pixels[:, :40] == 255).all()  # well inside the transparent half
    opaque = make().crop_pixels(encode(cat_rgb(), "PNG"))
    np.testing.assert_array_equal(pixels[:, 150:], opaque[:, 150:])


def test_la_and_palette_with_transparency_composite_onto_white() -> None:
    la = Image.new("LA", (300, 300), (0, 0))
    assert (make().crop_pixels(encode(la, "PNG")) == 255).all()
    palette = Image.new("P", (300, 300), 1)
    palette.putpalette([255, 0, 0, 0, 0, 0])
    palette.paste(0, (0, 0, 150, 300))  # left half red, right half index 1: transparent black
    pixels = make().crop_pixels(encode(palette, "PNG", transparency=1))
    assert (pixels[:, :50] == (255, 0, 0)).all() and (pixels[:, -50:] == 255).all()


def test_palette_image_matches_its_rgb_colours() -> None:
    palette = cat_rgb().quantize(256)
    assert Image.open(io.BytesIO(encode(palette, "PNG"))).mode == "P"
    expected = one(make(), encode(palette.convert("RGB"), "PNG"))
    np.testing.assert_array_equal(one(make(), encode(palette, "PNG")), expected)


def test_cmyk_jpeg_converts_to_the_right_colours() -> None:
    cmyk = encode(cat_rgb().convert("CMYK"), "JPEG", quality=95)
    assert Image.open(io.BytesIO(cmyk)).mode == "CMYK"
    rgb = encode(cat_rgb(), "JPEG", quality=95)
    assert np.abs(one(make(), cmyk) - one(make(), rgb)).mean() < 0.03


def test_16_bit_grey_png_keeps_the_high_byte_instead_of_clipping() -> None:
    grey8 = np.asarray(cat_rgb().convert("L"))
    noise = np.random.default_rng(0).integers(0, 256, grey8.shape)
    grey16 = (grey8.astype(np.uint16) << 8) | noise.astype(np.uint16)
    data = encode(Image.fromarray(grey16), "PNG")
    assert Image.open(io.BytesIO(data)).mode == "I;16"
    np.testing.assert_array_equal(one(make(), data), one(make(), encode(Image.fromarray(grey8), "PNG")))
    # A 32-bit "I" TIFF holding 16-bit samples is read the same way.
    tiff = encode(Image.fromarray(grey16.astype(np.int32)), "TIFF")
    np.testing.assert_array_equal(one(make(), tiff), one(make(), data))


def test_16_bit_rgb_png_is_reduced_to_its_high_bytes() -> None:
    high = np.random.default_rng(1).integers(0, 256, (6, 8, 3)).astype(np.uint16)
    samples = (high << 8) | 0xFF  # low bytes all set: clipping or rounding would show
    rows = b"".join(b"\x00" + row.astype(">u2").tobytes() for row in samples)
    im = make().decode(png_file(8, 6, depth=16, colour=2, rows=rows))
    np.testing.assert_array_equal(np.asarray(im), high)


def test_one_bit_and_float_images() -> None:
    bilevel = cat_rgb().convert("1")
    decoded = np.asarray(make().decode(encode(bilevel, "PNG")))
    np.testing.assert_array_equal(decoded[..., 1], np.asarray(bilevel, np.uint8) * 255)
    ramp = np.tile(np.linspace(0, 1, 300, dtype=np.float32), (300, 1))
    decoded = np.asarray(make().decode(encode(Image.fromarray(ramp, "F"), "TIFF")))
    assert decoded[0, 0, 0] == 0 and decoded[0, -1, 0] == 255 and (decoded[..., 0] == decoded[..., 2]).all()


# -- refusals -----------------------------------------------------------------------


def test_empty_is_422() -> None:
    with pytest.raises(Unprocessable, match="empty"):
        make().preprocess_batch([b""])


def test_truncated_jpeg_is_422_naming_it() -> None:
    with pytest.raises(Unprocessable, match=r'image\[1\] "cat.jpg" is a truncated or corrupt JPEG'):
        make().preprocess_batch([COFFEE, CAT[: len(CAT) // 2]], what=["image[0]", 'image[1] "cat.jpg"'])


def test_truncated_png_and_corrupt_header_are_422() -> None:
    png = encode(cat_rgb(), "PNG")
    with pytest.raises(Unprocessable, match="truncated or corrupt PNG"):
        make().preprocess_batch([png[: len(png) // 2]])
    with pytest.raises(Unprocessable, match="corrupt PNG file"):
        make().preprocess_batch([png[:8] + b"\x00" * 64])


def test_random_bytes_are_415_not_an_image() -> None:
    noise = np.random.default_rng(7).integers(0, 256, 4096, dtype=np.uint8).tobytes()
    with pytest.raises(UnsupportedMediaType, match="not an image"):
        make().preprocess_batch([noise])


@pytest.mark.parametrize(
    ("data", "name"),
    [
        (b'<?xml version="1.0"?>\n<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"/>', "SVG"),
        (b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n", "PDF"),
        (b"\x00\x00\x00\x1cftypavif\x00\x00\x00\x00avifmif1miaf", "AVIF"),
        (b"\x00\x00\x00\x18ftypheic\x00\x00\x00\x00mif1heic", "HEIC"),
        (b"<!DOCTYPE html><html><body>hi</body></html>", "HTML"),
    ],
)
def test_other_formats_are_415_naming_the_format(data: bytes, name: str) -> None:
    with pytest.raises(UnsupportedMediaType, match=f"is {name}, which is not supported; send JPEG, PNG"):
        make().preprocess_batch([data])


def test_plain_text_is_415() -> None:
    with pytest.raises(UnsupportedMediaType, match="not an image"):
        make().preprocess_batch([b"hello, this is a text file\n" * 10])


def test_pillow_formats_we_do_not_accept_are_refused_without_parsing() -> None:
    ico = encode(cat_rgb().resize((32, 32)), "ICO")
    assert sniff_format(ico) == ("ICO", False)
    with pytest.raises(UnsupportedMediaType, match="is ICO"):
        make().preprocess_batch([ico])


def test_file_over_the_byte_limit_is_413() -> None:
    with pytest.raises(PayloadTooLarge, match=f"is {len(CAT)} bytes; the limit is 4096 bytes"):
        make({"max_image_bytes": 4096}).preprocess_batch([CAT])


def test_too_many_images_and_no_image() -> None:
    with pytest.raises(PayloadTooLarge, match="3 images sent; the limit is 2"):
        make({"max_images": 2}).preprocess_batch([CAT, CAT, CAT])
    with pytest.raises(Unprocessable, match="no image"):
        make().preprocess_batch([])


def test_declared_size_over_the_pixel_limit_is_413_before_decoding() -> None:
    with pytest.raises(PayloadTooLarge, match=r"is 8000x6000 = 48000000 pixels; the limit is 40000000"):
        make().preprocess_batch([png_file(8000, 6000)])
    with pytest.raises(PayloadTooLarge, match=r"451x300 = 135300 pixels; the limit is 100000"):
        make({"max_image_pixels": 100_000}).preprocess_batch([CAT])


def test_decompression_bomb_is_refused_without_allocating() -> None:
    bomb = png_file(40_000, 40_000)  # 4.8 GB of RGB once decoded, 70 bytes on the wire
    assert len(bomb) < 100
    rss_before, peak_before = vm_rss_kib(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(PayloadTooLarge, match="is 1600000000 pixels; the limit is 40000000"):
        make().preprocess_batch([bomb])
    with pytest.raises(PayloadTooLarge):
        make().decode(bomb)
    assert vm_rss_kib() - rss_before < 50 * 1024
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before < 50 * 1024


def test_pillow_bomb_checks_become_413(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pillow's own MAX_IMAGE_PIXELS error, and its warning when warnings are errors, are 413s."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 60_000)  # cat: 135300 > 2x -> DecompressionBombError
    with pytest.raises(PayloadTooLarge, match="is 135300 pixels; the limit is 120000"):
        make().preprocess_batch([CAT])
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100_000)  # 1x < 135300 < 2x -> warning
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        with pytest.raises(PayloadTooLarge, match="is 135300 pixels; the limit is 100000"):
            make().preprocess_batch([CAT])


# -- buffers and threads ------------------------------------------------------------


def test_buffer_is_reused_and_grows() -> None:
    pipeline = make({"max_images": 16})
    first = pipeline.preprocess_batch([CAT])
    second = pipeline.preprocess_batch([COFFEE])
    assert np.shares_memory(first, second)
    three = pipeline.preprocess_batch([CAT, COFFEE, CAT])
    assert three.shape[0] == 3 and not np.shares_memory(first, three)
    two = pipeline.preprocess_batch([COFFEE, CAT])
    assert np.shares_memory(two, three)
    np.testing.assert_array_equal(two[1], one(make(), CAT))


def test_threads_get_their_own_buffers_and_correct_results() -> None:
    pipeline = make()
    expected = {"cat": one(make(), CAT), "coffee": one(make(), COFFEE)}
    start = threading.Barrier(2)
    errors: list[str] = []
    buffers: dict[str, int] = {}

    def work(name: str, data: bytes) -> None:
        start.wait()
        for _ in range(25):
            batch = pipeline.preprocess_batch([data])
            buffers[name] = batch.__array_interface__["data"][0]
            if not np.array_equal(batch[0], expected[name]):
                errors.append(name)

    threads = [threading.Thread(target=work, args=item) for item in (("cat", CAT), ("coffee", COFFEE))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and buffers["cat"] != buffers["coffee"]
