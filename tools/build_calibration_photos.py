"""Rebuild the photo set the INT8 demo model was calibrated and judged with.

One downsized JPEG per source photograph (EXIF applied, shorter side 384 px, quality 90),
split by photograph (sorted within each source, alternating calib/eval), plus
MANIFEST.tsv (id, split, source, original, licence, author, bytes). The per-file table
of models/efficientnet-lite0-int8/MODEL_CARD.md is this manifest. Needs, in a throw-away
venv and folder::

    python3 -m venv /tmp/photos && /tmp/photos/bin/pip install scikit-image==0.26 \
        scikit-learn==1.9 matplotlib==3.11 pillow
    mkdir -p /tmp/debs && cd /tmp/debs && apt-get download mate-backgrounds \
        lomiri-wallpapers-16.04 lomiri-wallpapers-20.04 plasma-workspace-wallpapers
    for f in *.deb; do dpkg -x "$f" "x/${f%%_*}"; done
    /tmp/photos/bin/python tools/build_calibration_photos.py --debs /tmp/debs/x --out /tmp/photos-set

then `onnxpool quantize ... --calibration /tmp/photos-set/calib --eval /tmp/photos-set/eval`.
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

from PIL import Image, ImageOps

SHORT = 384
SKIMAGE = [
    ("astronaut", "Public domain (NASA)", "NASA"),
    ("chelsea", "CC0-1.0", "Stefan van der Walt"),
    ("coffee", "CC0-1.0", "Rachel Michetti"),
    ("rocket", "Public domain (SpaceX release)", "SpaceX"),
    ("camera", "CC0-1.0", "Lav Varshney"),
    ("clock_motion", "Public domain (dedicated by photographer)", "Stefan van der Walt"),
    ("coins", "No known copyright restrictions (Brooklyn Museum)", "Brooklyn Museum"),
    ("retina", "CC0-1.0", "Mikael Haggstrom"),
    ("hubble_deep_field", "Public domain (NASA)", "NASA/ESA"),
    ("brick", "CC0-1.0", "CC0Textures"),
    ("grass", "CC0-1.0", "linolafett (DeviantArt)"),
    ("gravel", "CC0-1.0", "CC0Textures"),
]
MATE = "Aqua Blinds Dune FreshFlower Garden GreenMeadow LadyBird RainDrops Storm TwoWings Wood YellowFlower".split()
LOMIRI = {
    "Bridge_by_Sander_Klootwijk": "CC-BY-SA-4.0",
    "Dragonfly_by_Bolly": "CC-BY-SA-4.0",
    "Picture_0B_by_freespace": "CC-BY-4.0",
    "Picture_1A_by_freespace": "CC-BY-4.0",
    "Wine_by_Jakkub_Mede": "CC-BY-4.0",
    "aitzgorri_by_Aitzol_Berasategi": "CC-BY-4.0",
    "free_by_Peter_Nerlich": "CC-BY-SA-4.0",
    "friends_by_Aitzol_Berasategi": "CC-BY-4.0",
    "greentock_by_Peter_Nerlich": "CC-BY-SA-4.0",
    "life_by_Aitzol_Berasategi": "CC-BY-4.0",
    "picosdeeuropa_by_Aitzol_Berasategi": "CC-BY-4.0",
    "seeding_by_Clements_Engelhardt": "CC0-1.0",
    "sunset_by_Aitzol_Berasategi": "CC-BY-4.0",
}
PLASMA = {
    "BytheWater": "Maciej Wiklo",
    "ColdRipple": "Risto Saukonpaa",
    "ColorfulCups": "Dmitri Popov",
    "DarkestHour": "Risto Saukonpaa",
    "EveningGlow": "Ian Hex",
    "FallenLeaf": "Martin Klapetek",
    "Grey": "Sigi Sagi",
    "Kite": "Risto Saukonpaa",
    "OneStandsOut": "Risto Saukonpaa",
    "Path": "Risto Saukonpaa",
    "summer_1am": "Risto Saukonpaa",
}

Source = tuple[str, str, Path, str, str]  # id, source, file, licence, author


def sources(debs: Path) -> list[Source]:
    import matplotlib
    import skimage
    import sklearn

    sk = Path(skimage.__file__).parent / "data"
    out: list[Source] = []
    for name, licence, author in SKIMAGE:
        path = sk / f"{name}.jpg" if (sk / f"{name}.jpg").exists() else sk / f"{name}.png"
        out.append((f"skimage-{name}", "scikit-image 0.26 skimage/data", path, licence, author))
    skl = Path(sklearn.__file__).parent / "datasets" / "images"
    out.append(
        (
            "sklearn-china",
            "scikit-learn 1.9 sklearn/datasets/images",
            skl / "china.jpg",
            "CC-BY-2.0",
            "danielbuechele (Flickr)",
        )
    )
    out.append(
        (
            "sklearn-flower",
            "scikit-learn 1.9 sklearn/datasets/images",
            skl / "flower.jpg",
            "CC-BY-2.0",
            "vultilion (Flickr; README also names danielbuechele)",
        )
    )
    mpl = Path(matplotlib.__file__).parent / "mpl-data" / "sample_data"
    out.append(
        (
            "mpl-grace_hopper",
            "matplotlib 3.11 mpl-data/sample_data",
            mpl / "grace_hopper.jpg",
            "Public domain (US Navy official photograph; not stated in matplotlib's README)",
            "US Navy",
        )
    )
    mate = debs / "mate-backgrounds" / "usr/share/backgrounds/mate/nature"
    for name in MATE:
        out.append(
            (
                f"mate-{name}",
                "Debian mate-backgrounds 1.26.0-1",
                mate / f"{name}.jpg",
                "GPL-2+",
                "see debian/copyright (AUTHORS)",
            )
        )
    lomiri = debs / "lomiri-wallpapers-16.04" / "usr/share/backgrounds"
    for name, licence in LOMIRI.items():
        author = name.split("_by_")[1].replace("_", " ")
        out.append(
            (f"lomiri-{name}", "Debian lomiri-wallpapers-16.04 20.04.0-2", lomiri / f"{name}.jpg", licence, author)
        )
    out.append(
        (
            "lomiri-Kleiber_by_Lukas_Baubkus",
            "Debian lomiri-wallpapers-20.04 20.04.0-2",
            debs / "lomiri-wallpapers-20.04/usr/share/backgrounds/Kleiber_by_Lukas_Baubkus.jpg",
            "CC-BY-SA-3.0",
            "Lukas Baubkus",
        )
    )
    plasma = debs / "plasma-workspace-wallpapers" / "usr/share/wallpapers"
    for name, author in PLASMA.items():
        images = [p for p in (plasma / name / "contents" / "images").iterdir() if not p.is_symlink()]
        out.append(
            (
                f"plasma-{name}",
                "Debian plasma-workspace-wallpapers 4:5.27.5-2",
                max(images, key=lambda p: p.stat().st_size),
                "LGPL-3 (metadata.json; debian/copyright: GPL-2+)",
                author,
            )
        )
    return out


def save_downsized(im: Image.Image, target: Path) -> int:
    """`im` with its shorter side at most SHORT px, as JPEG quality 90 at `target`; its size in bytes."""
    scale = SHORT / min(im.size)
    if scale < 1:
        im = im.resize((round(im.width * scale), round(im.height * scale)), Image.Resampling.LANCZOS)
    im.save(target, "JPEG", quality=90, optimize=True)
    return target.stat().st_size


def write_manifest(out: Path, rows: list[tuple[object, ...]]) -> None:
    """MANIFEST.tsv: one row per photo (id, split, source, original, licence, author, bytes)."""
    with (out / "MANIFEST.tsv").open("w", encoding="utf-8") as f:
        f.write("id\tsplit\tsource\toriginal\tlicence\tauthor\tbytes\n")
        for row in rows:
            f.write("\t".join(map(str, row)) + "\n")


def build(debs: Path, out: Path) -> None:
    Image.MAX_IMAGE_PIXELS = None  # trusted wallpapers, some very large
    shutil.rmtree(out, ignore_errors=True)
    for split in ("calib", "eval"):
        (out / split).mkdir(parents=True)
    by_source: dict[str, list[Source]] = {}
    for item in sources(debs):
        by_source.setdefault(item[1], []).append(item)
    rows = []
    for items in by_source.values():
        for i, (pid, source, path, licence, author) in enumerate(sorted(items)):
            split = "calib" if i % 2 == 0 else "eval"
            im = ImageOps.exif_transpose(Image.open(path)).convert("RGB")
            size = save_downsized(im, out / split / f"{pid}.jpg")
            original = (
                os.path.relpath(path, debs) if path.is_relative_to(debs) else str(path).split("site-packages/")[-1]
            )
            rows.append((pid, split, source, original, licence, author, size))
    write_manifest(out, rows)
    for split in ("calib", "eval"):
        chosen = [r for r in rows if r[1] == split]
        print(split, len(chosen), "photos", sum(r[6] for r in chosen), "bytes")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--debs", type=Path, required=True, help="folder of the dpkg -x extracted packages")
    parser.add_argument("--out", type=Path, required=True, help="folder to (re)create")
    args = parser.parse_args()
    build(args.debs, args.out)
