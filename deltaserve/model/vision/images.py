"""Image inputs: PIL images, file paths, raw bytes and `data:` URLs decoded into RGB PIL images, or refused.

Refused with an `ImageInputError` that names the input and the problem: http(s) URLs (no network fetches), files
that do not exist, data that is not an image, truncated files, zero-sized images, images of more than
`max_input_pixels` source pixels (checked from the header, before the pixels are decoded), and inputs of another
type. Images with transparency are composited onto white (as transformers' image processors do); every other mode
is converted to RGB.
"""

from __future__ import annotations

import base64
import binascii
import io
from pathlib import Path
from typing import Any

# PIL's own decompression-bomb threshold (Image.MAX_IMAGE_PIXELS): larger inputs are refused by default.
DEFAULT_MAX_INPUT_PIXELS = 89_478_485


class ImageInputError(ValueError):
    """An image input that cannot be used; the message says which input and why."""


def describe(source: Any) -> str:
    """A short name for an input in error messages."""
    if isinstance(source, (str, Path)):
        text = str(source)
        return repr(text if len(text) <= 60 else text[:48] + "...")
    if isinstance(source, (bytes, bytearray, memoryview)):
        return f"<{len(source)} bytes>"
    return f"<{type(source).__name__}>"


def load_image(source: Any, max_input_pixels: int = DEFAULT_MAX_INPUT_PIXELS):
    """An RGB PIL image from a PIL image, a path (str or Path; `file://` URLs too), bytes, or a `data:` URL."""
    from PIL import Image

    if isinstance(source, Image.Image):
        _check_size(source.size, source, max_input_pixels)
        return _to_rgb(source)
    data = _read_bytes(source)
    try:
        image = Image.open(io.BytesIO(data))
    except Image.UnidentifiedImageError:
        raise ImageInputError(f"image {describe(source)}: not an image (no decoder recognises its "
                              f"{len(data)} bytes)") from None
    except Image.DecompressionBombError as e:
        raise ImageInputError(f"image {describe(source)}: too large ({e})") from None
    _check_size(image.size, source, max_input_pixels)
    try:
        image.load()
    except (OSError, SyntaxError, ValueError) as e:  # truncated or corrupt data
        raise ImageInputError(f"image {describe(source)}: cannot be decoded ({e}); is the file truncated?") from None
    return _to_rgb(image)


def _read_bytes(source: Any) -> bytes:
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source)
    if isinstance(source, Path):
        return _read_file(source, source)
    if not isinstance(source, str):
        raise ImageInputError(f"image {describe(source)}: unsupported input type {type(source).__name__} (give a PIL "
                              "image, a file path, bytes or a data: URL)")
    lowered = source[:16].lower()
    if lowered.startswith(("http://", "https://")):
        raise ImageInputError(f"image {describe(source)}: http(s) URLs are not fetched (deltaserve makes no network "
                              "requests); download the image and pass its bytes, a path or a data: URL")
    if lowered.startswith("data:"):
        return _decode_data_url(source)
    if lowered.startswith("file://"):
        return _read_file(Path(source[len("file://"):]), source)
    return _read_file(Path(source), source)


def _read_file(path: Path, source: Any) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise ImageInputError(f"image {describe(source)}: no such file") from None
    except OSError as e:
        raise ImageInputError(f"image {describe(source)}: cannot be read ({e.strerror or e})") from None


def _decode_data_url(url: str) -> bytes:
    """data:[<mediatype>][;base64],<data>: the bytes (base64, or percent-encoded text)."""
    header, sep, payload = url.partition(",")
    if not sep:
        raise ImageInputError(f"image {describe(url)}: malformed data: URL (no ',' before the data)")
    if header.lower().endswith(";base64"):
        try:
            return base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise ImageInputError(f"image {describe(url)}: the data: URL's base64 payload does not decode") from None
    from urllib.parse import unquote_to_bytes

    return unquote_to_bytes(payload)


def _check_size(size: tuple[int, int], source: Any, max_input_pixels: int) -> None:
    w, h = size
    if w <= 0 or h <= 0:
        raise ImageInputError(f"image {describe(source)}: zero-sized ({w}x{h} pixels)")
    if w * h > max_input_pixels:
        raise ImageInputError(f"image {describe(source)}: {w}x{h} = {w * h} pixels exceeds the limit of "
                              f"{max_input_pixels} input pixels")


def _to_rgb(image):
    from PIL import Image

    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image if image.mode == "RGB" else image.convert("RGB")
