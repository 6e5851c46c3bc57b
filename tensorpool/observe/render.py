"""Tensor -> image for the browser viewer (#19.3): a pure function of the array, no I/O.

The rule a person expects: a 2-D array is a picture (grayscale stretched to its own 1st-99th
percentile, so a 12-bit camera in a uint16 container is not black; or a colormap), ``H×W×3``
(or ``×4``) is RGB(A), and anything else (1-D, 3-D stacks, 4-D ...) is not a picture, so its
first row is plotted as a line with a histogram of all values beside it. Pillow encodes.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from PIL import Image as PILImage

#: Anchor colours of the colormaps (interpolated to 256 entries): perceptually ordered ramps.
_ANCHORS: dict[str, tuple[tuple[int, int, int], ...]] = {
    "gray": ((0, 0, 0), (255, 255, 255)),
    "viridis": ((68, 1, 84), (59, 82, 139), (33, 145, 140), (94, 201, 98), (253, 231, 37)),
    "inferno": ((0, 0, 4), (87, 16, 110), (188, 55, 84), (249, 142, 9), (252, 255, 164)),
}
COLORMAPS = tuple(_ANCHORS)
FORMATS = ("jpeg", "png")
#: Frames are downscaled (nearest) so the longer side is at most this: bounds encode cost.
MAX_SIDE = 1024
_PLOT_W, _PLOT_H = 640, 240


def _lut(name: str) -> np.ndarray:
    anchors = np.array(_ANCHORS[name], dtype=np.float64)
    x = np.linspace(0, len(anchors) - 1, 256)
    return np.stack(
        [np.interp(x, np.arange(len(anchors)), anchors[:, c]) for c in range(3)], axis=1
    ).astype(np.uint8)


_LUTS = {name: _lut(name) for name in _ANCHORS}


def _stretch(a: np.ndarray) -> np.ndarray:
    """Auto-contrast to uint8: the 1st-99th percentile range maps to 0-255."""
    if a.dtype == np.bool_:
        return a.astype(np.uint8) * 255
    f = a.astype(np.float32, copy=False)
    if a.dtype.kind in "fc":
        finite = np.isfinite(f)
        if not finite.all():
            f = np.where(finite, f, 0.0)
    sample = f[:: max(f.shape[0] // 64, 1), :: max(f.shape[1] // 64, 1)]
    lo, hi = np.percentile(sample, (1.0, 99.0))
    if hi <= lo:
        lo, hi = float(f.min()), float(f.max())
    if hi <= lo:
        return np.zeros(f.shape, np.uint8)
    out = (f - lo) * (255.0 / (hi - lo))
    np.clip(out, 0, 255, out=out)
    return out.astype(np.uint8)


def _downscale(a: np.ndarray) -> np.ndarray:
    step = -(-max(a.shape[0], a.shape[1]) // MAX_SIDE)
    return a[::step, ::step] if step > 1 else a


def to_image(array: np.ndarray, colormap: str = "gray") -> PILImage.Image:
    """The picture of one tensor (see the module docstring for the rule)."""
    from PIL import Image

    a = np.asarray(array)
    if a.ndim == 2 and a.size:
        g = _stretch(_downscale(a))
        if colormap == "gray":
            return Image.fromarray(g, "L")
        return Image.fromarray(_LUTS[colormap][g], "RGB")
    if a.ndim == 3 and a.shape[2] in (3, 4) and a.shape[0] > 1 and a.shape[1] > 1:
        rgb = _downscale(a)[:, :, :3]
        if rgb.dtype != np.uint8:
            rgb = _stretch(rgb.reshape(rgb.shape[0], -1)).reshape(rgb.shape)
        return Image.fromarray(np.ascontiguousarray(rgb), "RGB")
    return _plot(a)


def _plot(a: np.ndarray) -> PILImage.Image:
    """First row as a line (left) and a 64-bin histogram of every value (right)."""
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (_PLOT_W, _PLOT_H), (16, 16, 24))
    draw = ImageDraw.Draw(img)
    if a.size == 0:
        draw.text((10, 10), f"empty tensor {a.shape}", fill=(200, 200, 200))
        return img
    flat = a.reshape(-1).astype(np.float64)
    flat = flat[np.isfinite(flat)] if flat.dtype.kind == "f" else flat
    row = a.reshape(-1, a.shape[-1])[0].astype(np.float64) if a.ndim else flat[:1]
    half = _PLOT_W // 2 - 10
    lo, hi = (float(flat.min()), float(flat.max())) if flat.size else (0.0, 1.0)
    span = hi - lo or 1.0
    n = len(row)
    pts = [
        (5 + i * (half - 5) / max(n - 1, 1), _PLOT_H - 20 - (v - lo) / span * (_PLOT_H - 40))
        for i, v in enumerate(row[:: max(n // half, 1)] if n > half else row)
    ]
    if len(pts) > 1:
        step = (half - 5) / max(len(pts) - 1, 1)
        pts = [(5 + i * step, y) for i, (_, y) in enumerate(pts)]
        draw.line(pts, fill=(94, 201, 98), width=2)
    counts, _ = np.histogram(flat, bins=64, range=(lo, hi if hi > lo else lo + 1))
    top = counts.max() or 1
    bw = (half - 5) / 64
    for i, c in enumerate(counts.tolist()):
        x0 = half + 15 + i * bw
        draw.rectangle(
            (x0, _PLOT_H - 20 - c / top * (_PLOT_H - 40), x0 + bw - 1, _PLOT_H - 20),
            fill=(59, 82, 139),
        )
    draw.text((5, 2), f"row 0 of {tuple(a.shape)}", fill=(200, 200, 200))
    draw.text((half + 15, 2), f"histogram {lo:.4g} .. {hi:.4g}", fill=(200, 200, 200))
    return img


def encode(array: np.ndarray, fmt: str = "jpeg", colormap: str = "gray") -> bytes:
    """PNG or JPEG bytes of :func:`to_image`. JPEG is ~5x cheaper to encode for camera frames."""
    img = to_image(array, colormap)
    buf = io.BytesIO()
    if fmt == "png":
        img.save(buf, "PNG", compress_level=1)
    else:
        img.save(buf, "JPEG", quality=85)
    return buf.getvalue()
