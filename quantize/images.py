"""Step 1, images: every file of a folder through the server's OWN preprocessing.

`onnxpool.tasks.image.imaging.ImagePipeline` with `[task.preprocess]` of the active settings, so the
INT8 model is calibrated and judged on exactly what it will see in production. Files that are
not images are skipped and counted. `views` > 1 adds the mirror and random crops of each photo
(seeded by its name, so runs repeat). Labels come from a labels file or class folders.
"""

from __future__ import annotations

import hashlib
import io
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from onnxpool.measure.progress import Progress, bar
from onnxpool.quantize.errors import QuantizeError
from onnxpool.tasks.errors import OnnxpoolError
from onnxpool.tasks.image.imaging import ImagePipeline

FloatArray = npt.NDArray[np.float32]


@dataclass(frozen=True)
class ImageSet:
    """Preprocessed images of one folder, with what was skipped and a digest of the files."""

    folder: Path
    arrays: FloatArray
    names: tuple[str, ...]
    files: int
    skipped: int
    digest: str
    labels: tuple[int, ...] | None = None

    def describe(self) -> dict[str, Any]:
        return {
            "folder": str(self.folder),
            "files": self.files,
            "skipped_not_images": self.skipped,
            "images": len(self.names),
            "sha256": self.digest,
            "labelled": self.labels is not None,
        }


def list_files(folder: Path, what: str) -> list[Path]:
    """Every regular, non-hidden file below `folder`, sorted; QuantizeError if none or unreadable."""
    if not folder.exists():
        raise QuantizeError(f"{what} folder {folder} does not exist")
    if not folder.is_dir():
        raise QuantizeError(f"{what} folder {folder} is not a folder")
    if not os.access(folder, os.R_OK | os.X_OK):
        raise QuantizeError(f"{what} folder {folder} cannot be read: permission denied")
    try:
        files = sorted(
            p
            for p in folder.rglob("*")
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts)
        )
    except OSError as exc:
        raise QuantizeError(f"{what} folder {folder} cannot be read: {exc.strerror or exc}") from None
    if not files:
        raise QuantizeError(f"{what} folder {folder} is empty")
    return files


def views(data: bytes, n: int, seed_key: str) -> list[bytes]:
    """The photo, then its mirror, then n-2 random crops (35-90 % of the area, aspect 3:4..4:3,
    random flip), seeded by `seed_key`; each encoded as PNG so it is preprocessed like an upload."""
    from PIL import Image, ImageOps

    out = [data]
    if n <= 1:
        return out
    im = ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB")
    rng = np.random.default_rng(int(hashlib.sha256(seed_key.encode()).hexdigest()[:8], 16))

    def png(x: Image.Image) -> bytes:
        buffer = io.BytesIO()
        x.save(buffer, "PNG")
        return buffer.getvalue()

    out.append(png(ImageOps.mirror(im)))
    width, height = im.size
    attempts = 0
    while len(out) < n and attempts < 100 * n:
        attempts += 1
        area = rng.uniform(0.35, 0.9) * width * height
        aspect = float(np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3))))
        cw, ch = round(math.sqrt(area * aspect)), round(math.sqrt(area / aspect))
        if cw > width or ch > height or min(cw, ch) < 16:
            continue
        x0, y0 = int(rng.integers(0, width - cw + 1)), int(rng.integers(0, height - ch + 1))
        crop = im.crop((x0, y0, x0 + cw, y0 + ch))
        out.append(png(ImageOps.mirror(crop) if rng.random() < 0.5 else crop))
    return out


def read_label_file(path: Path) -> dict[str, str]:
    """`file<TAB or comma>class` per line (file relative to the eval folder); # comments."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise QuantizeError(f"labels file {path} cannot be read: {exc}") from None
    out: dict[str, str] = {}
    for number, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        sep = "\t" if "\t" in line else ","
        name, _, label = line.partition(sep)
        if not label.strip():
            raise QuantizeError(f"labels file {path} line {number}: expected 'file<TAB>class'")
        out[name.strip()] = label.strip()
    return out


def class_index(label: str, class_names: Sequence[str]) -> int:
    """A class given by name (as in the model's labels file, case-insensitive) or by index."""
    lowered = [c.lower() for c in class_names]
    if label.lower() in lowered:
        return lowered.index(label.lower())
    if label.isdigit() and (not class_names or int(label) < len(class_names)):
        return int(label)
    raise QuantizeError(f"class {label!r} is neither a class name of the model's labels nor an index")


def load_images(
    folder: Path,
    pipeline: ImagePipeline,
    what: str,
    n_views: int = 1,
    progress: Progress | None = None,
    label_file: Path | None = None,
    class_names: Sequence[str] = (),
) -> ImageSet:
    """Preprocess every image of `folder` (and `n_views` views of each) with the server's pipeline.

    Labels: from `label_file`, else from class folders when every image sits in a subfolder.
    """
    files = list_files(folder, what)
    digest = hashlib.sha256()
    arrays: list[FloatArray] = []
    names: list[str] = []
    owners: list[Path] = []
    skipped = 0
    for i, path in enumerate(files):
        if progress is not None:
            progress.status(f"{what}: {bar(i / len(files))} {i}/{len(files)} files")
        rel = path.relative_to(folder).as_posix()
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise QuantizeError(f"{what} file {path} cannot be read: {exc.strerror or exc}") from None
        try:
            first = pipeline.preprocess_batch([data], [rel])
        except OnnxpoolError:
            skipped += 1
            continue
        digest.update(rel.encode() + b"\0" + hashlib.sha256(data).digest())
        arrays.append(np.array(first[0], dtype=np.float32))
        names.append(rel)
        owners.append(path)
        for k, view in enumerate(views(data, n_views, rel)[1:], 1):
            arrays.append(np.array(pipeline.preprocess_batch([view], [rel])[0], dtype=np.float32))
            names.append(f"{rel}#{k}")
            owners.append(path)
    if not arrays:
        raise QuantizeError(f"{what} folder {folder} has no readable image ({skipped} files skipped: not images)")
    if progress is not None:
        progress.done(f"{what}: {len(owners)} images from {len(files) - skipped} files ({skipped} skipped)")
    labels = _labels_for(folder, owners, label_file, class_names, what)
    return ImageSet(folder, np.stack(arrays), tuple(names), len(files), skipped, digest.hexdigest(), labels)


def _labels_for(
    folder: Path, owners: Sequence[Path], label_file: Path | None, class_names: Sequence[str], what: str
) -> tuple[int, ...] | None:
    if label_file is not None:
        table = read_label_file(label_file)
        out = []
        for path in owners:
            rel = path.relative_to(folder).as_posix()
            label = table.get(rel, table.get(path.name))
            out.append(-1 if label is None else class_index(label, class_names))
        return tuple(out)
    parents = {path.relative_to(folder).parent for path in owners}
    if any(p == Path(".") for p in parents) or not all(len(p.parts) == 1 for p in parents):
        return None
    return tuple(class_index(path.parent.name, class_names) for path in owners)
