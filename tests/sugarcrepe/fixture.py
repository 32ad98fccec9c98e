"""A tiny SugarCrepe in the real format, written by the tests: COCO-like JPEGs and seven JSON files.

Image ``i`` is one flat colour whose red channel codes ``i`` (``RED0 + RED_STEP * i``), of its own
non-square size, named like a COCO val2017 file. Its caption names two objects, an attribute and
a relation; each category's negative edits the caption the way that SugarCrepe category does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image

from repdiag.sugarcrepe.data import CATEGORIES

RED0, RED_STEP = 20, 40
OBJECTS = ("dog", "cat", "horse", "bus", "kite", "pizza")
ATTRIBUTES = ("red", "small", "wooden", "striped", "old", "shiny")


def image_name(index: int) -> str:
    return f"{139 + 1000 * index:012d}.jpg"


def colour(index: int) -> tuple[int, int, int]:
    return (RED0 + RED_STEP * index, 200 - 25 * index, 90)


def caption(i: int) -> str:
    n = len(OBJECTS)
    return f"a {ATTRIBUTES[i]} {OBJECTS[i]} next to a {OBJECTS[(i + 1) % n]}"


def negative(category: str, i: int) -> str:
    n = len(OBJECTS)
    first, second, attribute = OBJECTS[i], OBJECTS[(i + 1) % n], ATTRIBUTES[i]
    return {
        "replace_obj": f"a {attribute} {OBJECTS[(i + 2) % n]} next to a {second}",
        "replace_att": f"a {ATTRIBUTES[(i + 1) % n]} {first} next to a {second}",
        "replace_rel": f"a {attribute} {first} on top of a {second}",
        "swap_obj": f"a {attribute} {second} next to a {first}",
        "swap_att": f"a {first} next to a {attribute} {second}",
        "add_obj": f"a {attribute} {first} next to a {second} and a tree",
        "add_att": f"a {attribute} {first} next to a {ATTRIBUTES[(i + 2) % n]} {second}",
    }[category]


@dataclass
class SugarCrepeFixture:
    root: Path
    images: Path
    per_category: int
    examples: dict[str, list[dict[str, str]]] = field(default_factory=dict)
    image_index: dict[str, int] = field(default_factory=dict)

    @property
    def n_examples(self) -> int:
        return sum(len(v) for v in self.examples.values())


def make_sugarcrepe(directory: Path, n_images: int = 6, per_category: int = 2) -> SugarCrepeFixture:
    """``directory/sugarcrepe/<category>.json`` and ``directory/val2017/<coco name>.jpg``."""
    root, images = directory / "sugarcrepe", directory / "val2017"
    root.mkdir(parents=True)
    images.mkdir(parents=True)
    fixture = SugarCrepeFixture(root, images, per_category)
    for i in range(n_images):
        size = (48 + 8 * i, 36 + 6 * (i % 3))  # (width, height): landscape, never square
        Image.new("RGB", size, colour(i)).save(images / image_name(i), quality=95)
        fixture.image_index[image_name(i)] = i
    for c, category in enumerate(CATEGORIES):
        records = {}
        for k in range(per_category):
            i = (c + k) % n_images
            records[str(3 * k + 1)] = {
                "filename": image_name(i),
                "caption": caption(i),
                "negative_caption": negative(category, i),
            }
        (root / f"{category}.json").write_text(json.dumps(records, indent=1))
        fixture.examples[category] = list(records.values())
    return fixture


def make_labelled_folder(directory: Path, classes: dict[str, int], per_class: int = 2) -> Path:
    """``directory/<class dir>/<n>.png``: every image of a class has the colour of code ``classes[dir]``."""
    for name, code in classes.items():
        (directory / name).mkdir(parents=True)
        for n in range(per_class):
            Image.new("RGB", (40 + 4 * n, 32), colour(code)).save(directory / name / f"{n}.png")
    return directory
