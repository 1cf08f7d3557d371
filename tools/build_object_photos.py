"""Rebuild the object-photo set of issue 13: real photographs of ImageNet-like things.

Unlike tools/build_calibration_photos.py (wallpapers and textures, where FP32 itself is
undecided), these are photos of what an ImageNet classifier is for: animals, fruit and
vegetables, instruments, tools, household objects, vehicles, plus a few scenes.

Sources (both Debian packages; licences from each package's debian/copyright):

- tuxpaint-stamps-default 2022.06.04-1: photo cut-outs (PNG with alpha) below
  usr/share/tuxpaint/stamps. GPL-2+ ("Files: *", Bill Kendrick and the Tux Paint stamp
  contributors). Taken: every PNG outside `symbols/` and `*/cartoon/`, less the drawings,
  renders, mirrored duplicates and sign graphics listed in TUX_SKIP (chosen by looking at
  each one), less cut-outs whose object is under TUX_MIN_SIDE px on its longer side.
  Each is composited onto a plain neutral background (white, light or mid grey, picked
  from the id's digest) with a margin of 1/8 of the object's longer side, and padded to
  an aspect ratio within 4:3..3:4, like a product photo.
- opencv-doc 4.6.0+dfsg-12: the photographs in OPENCV (usr/share/doc/opencv-doc/examples).
  Apache-2.0 AND BSD-3-Clause ("Files: *", OpenCV contributors). Of stereo pairs and
  sequences (aloeL/R, left/right, aero1/3, basketball1/2, graf1/3, leuvenA/B,
  rubberwhale1/2, ela_original/modified, box/box_in_scene) only one is taken.

One JPEG per source photograph (EXIF applied, shorter side at most 384 px, LANCZOS,
quality 90), split by photograph: within each source, stamps are grouped by name less a
trailing number or letter (guineafowl1/guineafowl2, grave-a/grave-b: the same series may
be one photo shoot), groups sorted and alternated calib/eval; so no photo, nor any crop or
sibling of it, is in both. MANIFEST.tsv lists id, split, source, original, licence,
author, bytes. Needs, in a throw-away folder (no system-wide install)::

    mkdir -p /tmp/q13/debs && cd /tmp/q13/debs && apt-get update && \\
        apt-get download tuxpaint-stamps-default opencv-doc
    mkdir -p x && for f in *.deb; do dpkg -x "$f" "x/${f%%_*}"; done
    .venv/bin/python tools/build_object_photos.py --debs /tmp/q13/debs/x --out /tmp/q13/objects

(Pillow 13.0 as in onnxpool's venv; the same Pillow gives the same bytes.) Then
`onnxpool quantize ... --calibration /tmp/q13/objects/calib --eval /tmp/q13/objects/eval`.
The photos are not part of the repository.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import shutil
from pathlib import Path

from build_calibration_photos import save_downsized, write_manifest  # the sibling script (tools/ is on sys.path)
from PIL import Image, ImageOps

TUX_MIN_SIDE = 96
TUX_DIR = "tuxpaint-stamps-default/usr/share/tuxpaint/stamps"
TUX_SOURCE = "Debian tuxpaint-stamps-default 2022.06.04-1"
TUX_LICENCE = "GPL-2+"
TUX_AUTHOR = "Bill Kendrick and Tux Paint stamp contributors (debian/copyright)"
BACKGROUNDS = ((255, 255, 255), (235, 235, 235), (200, 200, 200))
# Drawings, renders, mirrored copies, sign/flag graphics and effects (looked at one by one).
TUX_SKIP = frozenset(
    """
animals/fish/butterflyfish.png animals/fish/clownfish.png animals/insects/bee.png
animals/mammals/aquatic/whale.png animals/mammals/echidna.png animals/mammals/hedgehog.png
clothes/button.png clothes/hats/blue_fedora.png clothes/hats/feathered_hat.png
clothes/hats/green_fedora.png clothes/hats/propeller_hat.png clothes/hats/sombrero.png
clothes/hats/tophat.png clothes/t_baseballcap.png clothes/t_glove.png clothes/t_jacket.png
clothes/t_pants.png clothes/t_poloshirt.png clothes/t_scarf.png clothes/t_shirt.png
clothes/t_sock.png clothes/t_tshirt.png food/pizza.png household/arttools/highlighter.png
household/arttools/pen_dryerase.png household/dishes/glass.png household/dishes/mug.png
household/tools/measuring_tape_mirror.png medical/tooth.png military/ammunition/old_naval_shell.png
military/vehicles/bradley_mirror.png naturalforces/explosion.png naturalforces/fire.png
naturalforces/lightningbolt.png people/body_parts/eye.png people/fireman200b.png
people/fireman240a.png seasonal/christmas/Santa.png seasonal/christmas/bow.png
seasonal/christmas/candy_cane.png seasonal/christmas/hard_candy.png seasonal/christmas/lamp.png
seasonal/christmas/santahat.png seasonal/christmas/star.png seasonal/christmas/stocking.png
seasonal/christmas/tree.png seasonal/christmas/xmas_tp_bulb.png seasonal/easter/bluebird.png
seasonal/easter/bunny-egg.png seasonal/easter/bunny-head.png seasonal/easter/bunny.png
seasonal/easter/butterfly.png seasonal/easter/chick-hatched.png seasonal/easter/chick-in-egg.png
seasonal/easter/chick.png seasonal/easter/daffodil.png seasonal/easter/wrapped_chocolate_easter_egg.png
seasonal/easter/wrapped_chocolate_easter_egg_2.png seasonal/halloween/bat_left.png
seasonal/halloween/blackcat.png seasonal/halloween/ghost.png seasonal/halloween/jackolantern_mean.png
seasonal/halloween/skull.png seasonal/halloween/spider.png seasonal/hanukkah/dreydl-gimmel.png
seasonal/hanukkah/dreydl-gimmel_mirror.png seasonal/hanukkah/dreydl-hay.png
seasonal/hanukkah/dreydl-hay_mirror.png seasonal/hanukkah/dreydl-nun.png
seasonal/hanukkah/dreydl-nun_mirror.png seasonal/hanukkah/dreydl-shin.png
seasonal/hanukkah/dreydl-shin_mirror.png seasonal/hanukkah/dreydl.png
seasonal/hanukkah/holiday_candle.png seasonal/hanukkah/menorah.png seasonal/newyears/confetti.png
seasonal/newyears/fireworks.png seasonal/newyears/fireworks2.png seasonal/newyears/party-hat.png
seasonal/newyears/party-horn-in.png seasonal/newyears/party-horn-out.png space/planets/0_sun.png
space/planets/1_mercury.png space/planets/2_venus.png space/planets/3_earth.png
space/planets/4_mars.png space/planets/5_jupiter.png space/planets/6_saturn.png
space/planets/7_uranus.png space/planets/8_neptune.png space/planets/9_pluto.png
space/voyager2.png sports/basketball.png sports/rugby_goal_posts.png
town/flags/blue-and-yellowflag.png town/flags/checkeredflag.png town/flags/greenflag.png
town/flags/redflag.png town/flags/whiteflag.png town/flags/yellowflag.png
town/monuments/inukshuk-outline.png town/roadsigns/arrow.png town/roadsigns/crossroads.png
town/roadsigns/dead_end_sign.png town/roadsigns/give_way_sign.png town/roadsigns/hospital.png
town/roadsigns/no_entry_sign.png town/roadsigns/roundabout.png town/roadsigns/school_sign.png
town/roadsigns/stop.png town/roadsigns/stoplight_01_red.png town/roadsigns/stoplight_02_yellow.png
town/roadsigns/stoplight_03_green.png town/roadsigns/t-junction.png town/roadsigns/toilets.png
town/roadsigns/xing_ped.png town/roadsigns/xing_school.png town/roadsigns/xing_school_mirror.png
town/roadsigns/yield.png vehicles/7spoke256.png vehicles/construction/dumper_mirror.png
vehicles/emergency/sedan_police.png vehicles/emergency/sedan_police_mirror.png
vehicles/ship/chineseJunk.png
""".split()
)
OPENCV_DIR = "opencv-doc/usr/share/doc/opencv-doc/examples"
OPENCV_SOURCE = "Debian opencv-doc 4.6.0+dfsg-12"
OPENCV_LICENCE = "Apache-2.0 AND BSD-3-Clause"
OPENCV_AUTHOR = "OpenCV contributors (debian/copyright)"
OPENCV = """
alphamat/input_images/plant.jpg data/aero1.jpg data/aloeL.jpg data/apple.jpg data/baboon.jpg
data/basketball1.png data/board.jpg data/box.png data/building.jpg data/butterfly.jpg
data/chicky_512.png data/ela_original.jpg data/fruits.jpg data/graf1.png data/home.jpg
data/left.jpg data/leuvenA.jpg data/licenseplate_motion.jpg data/messi5.jpg data/orange.jpg
data/rubberwhale1.png data/squirrel_cls.jpg data/stuff.jpg data/sudoku.png
dnn_superres/butterfly.png hfs/data/000.jpg hfs/data/001.jpg hfs/data/002.jpg reg/home.png
""".split()

# id, source, file, licence, author, group (photos of one group share a split)
Source = tuple[str, str, Path, str, str, str]


def slug(rel: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", rel.rsplit(".", 1)[0]).strip("_")


def series(rel: str) -> str:
    """The stamp's folder and name less a trailing number or single letter."""
    folder, _, name = rel.rpartition("/")
    stem = name.rsplit(".", 1)[0]
    return folder + "/" + re.sub(r"([-_ ]?\d+|[-_ ][A-Za-z])$", "", stem)


def is_cartoon_or_symbol(rel: str) -> bool:
    parts = rel.split("/")
    return parts[0] == "symbols" or "cartoon" in parts


def sources(debs: Path) -> list[Source]:
    out: list[Source] = []
    tux = debs / TUX_DIR
    for path in sorted(tux.rglob("*.png")):
        rel = path.relative_to(tux).as_posix()
        if is_cartoon_or_symbol(rel) or rel in TUX_SKIP:
            continue
        box = Image.open(path).convert("RGBA").getchannel("A").getbbox()
        if box is None or max(box[2] - box[0], box[3] - box[1]) < TUX_MIN_SIDE:
            continue
        out.append((f"tux-{slug(rel)}", TUX_SOURCE, path, TUX_LICENCE, TUX_AUTHOR, series(rel)))
    cv = debs / OPENCV_DIR
    for rel in OPENCV:
        out.append((f"opencv-{slug(rel)}", OPENCV_SOURCE, cv / rel, OPENCV_LICENCE, OPENCV_AUTHOR, rel))
    return out


def on_background(im: Image.Image, key: str) -> Image.Image:
    """A cut-out (RGBA) on a plain neutral background, with a margin, aspect within 4:3..3:4."""
    rgba = im.convert("RGBA")
    box = rgba.getchannel("A").getbbox()
    assert box is not None
    obj = rgba.crop(box)
    margin = max(obj.size) // 8
    width, height = obj.width + 2 * margin, obj.height + 2 * margin
    width, height = max(width, (3 * height + 3) // 4), max(height, (3 * width + 3) // 4)
    colour = BACKGROUNDS[hashlib.sha256(key.encode()).digest()[0] % len(BACKGROUNDS)]
    canvas = Image.new("RGBA", (width, height), (*colour, 255))
    canvas.alpha_composite(obj, ((width - obj.width) // 2, (height - obj.height) // 2))
    return canvas.convert("RGB")


def build(debs: Path, out: Path) -> None:
    shutil.rmtree(out, ignore_errors=True)
    for split in ("calib", "eval"):
        (out / split).mkdir(parents=True)
    by_source: dict[str, dict[str, list[Source]]] = {}
    for item in sources(debs):
        by_source.setdefault(item[1], {}).setdefault(item[5], []).append(item)
    rows = []
    for groups in by_source.values():
        for i, group in enumerate(sorted(groups)):
            split = "calib" if i % 2 == 0 else "eval"
            for pid, source, path, licence, author, _ in sorted(groups[group]):
                im = ImageOps.exif_transpose(Image.open(path))
                im = on_background(im, pid) if source == TUX_SOURCE else im.convert("RGB")
                size = save_downsized(im, out / split / f"{pid}.jpg")
                rows.append((pid, split, source, path.relative_to(debs).as_posix(), licence, author, size))
    write_manifest(out, rows)
    for split in ("calib", "eval"):
        chosen = [r for r in rows if r[1] == split]
        per = {s: sum(1 for r in chosen if r[2] == s) for s in (TUX_SOURCE, OPENCV_SOURCE)}
        print(split, len(chosen), "photos", sum(r[6] for r in chosen), "bytes", per)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--debs", type=Path, required=True, help="folder of the dpkg -x extracted packages")
    parser.add_argument("--out", type=Path, required=True, help="folder to (re)create")
    args = parser.parse_args()
    build(args.debs, args.out)
