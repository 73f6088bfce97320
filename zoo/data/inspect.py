"""What ``zoo data list`` and ``zoo data show`` print."""

import numpy as np

from zoo.data import catalog, tfds_source
from zoo.data.load import load
from zoo.data.png import image_grid, write_png
from zoo.tokenizers import ByteTokenizer

VIEW_SIZE = 64  # pixels per image side in PNG grids, at least


def dataset_rows(data_dir=None):
    """One row per dataset: name, task, source, examples per split, prepared format."""
    rows = []
    for spec in catalog.DATASETS.values():
        builder = "zoo_shapes/32" if spec.name == "shapes" else spec.builder
        prepared = tfds_source.prepared_file_format(builder, data_dir)
        rows.append(
            {
                "name": spec.name,
                "task": spec.task,
                "source": "embedded" if spec.embedded else "TFDS",
                "splits": _split_sizes(builder, spec, data_dir, prepared),
                "prepared": prepared or ("on first use" if spec.embedded else "no"),
            }
        )
    return rows


def _split_sizes(builder, spec, data_dir, prepared):
    if not prepared:
        return ", ".join(spec.splits)
    info = tfds_source.get_builder(builder, data_dir).info
    return ", ".join(f"{name} {info.splits[name].num_examples}" for name in spec.splits if name in info.splits)


def format_rows(rows):
    """Rows as an aligned text table."""
    columns = ["name", "task", "source", "splits", "prepared"]
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in columns}
    lines = ["  ".join(c.ljust(widths[c]) for c in columns)]
    lines += ["  ".join(str(r[c]).ljust(widths[c]) for c in columns) for r in rows]
    return lines


def show(name, split="train", count=16, output=None, data_dir=None):
    """Lines describing a few examples; for images, also a PNG grid at ``output``."""
    spec = catalog.get_spec(name)
    x, y = load(name, split, data_dir=data_dir)
    count = min(count, len(x))
    lines = [f"{name} [{split}]: {len(x)} examples; x {x.dtype}{x.shape[1:]}, y {y.dtype}{y.shape[1:]}"]
    if spec.task == catalog.IMAGE_CLASSIFICATION:
        path = output or f"{name}-{split}.png"
        images = x[:count] if x.shape[-1] != 1 else np.repeat(x[:count], 3, axis=-1)  # (n, S, S, 3)
        zoom = max(1, VIEW_SIZE // images.shape[1])  # small images are enlarged to be seen
        write_png(path, image_grid(images.repeat(zoom, axis=1).repeat(zoom, axis=2)))
        labels = ", ".join(spec.classes[label] for label in y[:count])
        return lines + [f"labels, row by row: {labels}", f"wrote {count} images to {path}"]
    tokenizer = ByteTokenizer()
    for row in range(min(count, 4)):
        label = spec.classes[y[row]] if spec.classes else "next bytes"
        lines.append(f"[{label}] {tokenizer.decode(x[row])!r}")
    return lines
