"""An embedded, offline, deterministic image classification dataset of shapes.

Each image shows one filled shape on a plain background. The class is the kind
of shape (see ``SHAPE_CLASSES``); everything else is a nuisance the model has to
learn to ignore:

- position: the shape's centre is uniform over every spot where it fits whole;
- size: its half-size ``r`` is uniform in [0.18, 0.38] x ``image_size``;
- colour: foreground and background are uniform RGB colours, redrawn until they
  are at least ``MIN_COLOUR_DISTANCE`` apart (Euclidean, RGB in [0, 1]), so the
  shape is always visible but light-on-dark and dark-on-light both occur;
- pixel noise: uniform in [-NOISE, NOISE] (256 levels, from random bytes),
  added per pixel and channel, then the image is clipped to [0, 1].

How an image is drawn (vectorised over a chunk of images, no Python per-pixel
loops):

1. Pixel centres ``(i + 0.5)`` are mapped to each image's unit box
   ``u = (col - cx) / r``, ``v = (row - cy) / r``, so the shape lives in
   ``[-1, 1]^2`` and a mask test such as ``u^2 + v^2 <= 1`` draws a disk of any
   size anywhere. ``v`` grows downwards, as image rows do.
2. Each class is one boolean mask function of ``(u, v)``.
3. ``image = clip(where(mask, foreground, background) + noise, 0, 1)``.

Determinism: a split is generated from its own random stream,
``np.random.default_rng([seed, split_index, image_size])``, so equal
``(split, seed, image_size, num_examples)`` always give identical arrays, and
the train / validation / test splits come from disjoint streams. Labels are
balanced: ``arange(N) % num_classes``, then shuffled.

All sizes scale with ``image_size``; any size >= 16 works, though at 16 pixels
the thin classes (ring, bars) are only one or two pixels wide.
"""

import numpy as np

SHAPE_CLASSES = (
    "circle",
    "square",
    "triangle",
    "diamond",
    "cross",
    "ring",
    "horizontal_bars",
    "vertical_bars",
)

SPLIT_SIZES = {"train": 2048, "validation": 512, "test": 512}  # default N per split
SPLIT_INDEX = {"train": 0, "validation": 1, "test": 2}  # stream id per split
MIN_IMAGE_SIZE = 16  # below this the thin shapes vanish
MIN_HALF_SIZE, MAX_HALF_SIZE = 0.18, 0.38  # shape half-size, fraction of image
MIN_COLOUR_DISTANCE = 0.5  # RGB distance between foreground and background
NOISE = 0.08  # pixel noise amplitude, uniform in [-NOISE, NOISE]
CHUNK = 256  # images drawn at once; bounds the temporary (CHUNK, S, S) masks


def load_shapes(split="train", image_size=128, num_examples=None, seed=0):
    """Generate one split of the shapes dataset.

    Args:
        split: "train", "validation" or "test".
        image_size: height and width in pixels, at least 16.
        num_examples: number of images; defaults to 2048 for "train" and 512
            for "validation" and "test".
        seed: non-negative integer; with split and image_size it fixes the data.

    Returns:
        ``(x, y)``: x float32 (N, image_size, image_size, 3) in [0, 1], y int32
        (N,) indexing ``SHAPE_CLASSES``.
    """
    num_examples = _check_args(split, image_size, num_examples, seed)
    rng = np.random.default_rng([seed, SPLIT_INDEX[split], image_size])
    y = _balanced_labels(rng, num_examples)  # (N,)
    centres, half_sizes = _placements(rng, num_examples, image_size)
    foreground, background = _colours(rng, num_examples)  # (N, 3) each
    x = np.empty((num_examples, image_size, image_size, 3), np.float32)
    for start in range(0, num_examples, CHUNK):
        rows = slice(start, start + CHUNK)
        masks = _draw_masks(y[rows], centres[rows], half_sizes[rows], image_size)
        _paint(rng, masks, foreground[rows], background[rows], out=x[rows])
    return x, y


def _check_args(split, image_size, num_examples, seed):
    if split not in SPLIT_SIZES:
        raise ValueError(f"Unknown split {split!r}; valid splits are {sorted(SPLIT_SIZES)}.")
    if not isinstance(image_size, (int, np.integer)) or image_size < MIN_IMAGE_SIZE:
        raise ValueError(f"image_size must be an integer >= {MIN_IMAGE_SIZE}, got {image_size!r}.")
    if num_examples is None:
        num_examples = SPLIT_SIZES[split]
    if not isinstance(num_examples, (int, np.integer)) or num_examples < 1:
        raise ValueError(f"num_examples must be a positive integer, got {num_examples!r}.")
    if not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}.")
    return int(num_examples)


def _balanced_labels(rng, n):
    labels = np.arange(n) % len(SHAPE_CLASSES)  # (N,)
    return rng.permutation(labels).astype(np.int32)


def _placements(rng, n, size):
    """Centres (N, 2) as (cx, cy) and half-sizes (N,), in pixels, shape inside."""
    half = rng.uniform(MIN_HALF_SIZE, MAX_HALF_SIZE, n) * size  # (N,)
    room = size - 2 * half  # (N,) free span for the centre
    centres = half[:, None] + rng.uniform(0.0, 1.0, (n, 2)) * room[:, None]
    return centres, half


def _colours(rng, n):
    """Foreground and background RGB (N, 3), at least MIN_COLOUR_DISTANCE apart."""
    foreground = rng.uniform(0.0, 1.0, (n, 3))
    background = rng.uniform(0.0, 1.0, (n, 3))
    redo = _too_close(foreground, background)  # (N,) bool
    while redo.any():
        foreground[redo] = rng.uniform(0.0, 1.0, (redo.sum(), 3))
        redo = _too_close(foreground, background)
    return foreground.astype(np.float32), background.astype(np.float32)


def _too_close(a, b):
    return np.linalg.norm(a - b, axis=1) < MIN_COLOUR_DISTANCE


def _draw_masks(labels, centres, half_sizes, size):
    """Boolean masks (n, S, S), one shape per image, in each image's unit box."""
    pixels = np.arange(size, dtype=np.float32) + 0.5  # (S,) pixel centres
    r = half_sizes[:, None, None].astype(np.float32)  # (n, 1, 1)
    u = (pixels[None, None, :] - centres[:, 0, None, None]) / r  # (n, 1, S) columns
    v = (pixels[None, :, None] - centres[:, 1, None, None]) / r  # (n, S, 1) rows
    masks = np.zeros((len(labels), size, size), dtype=bool)
    for k, draw in enumerate(_MASKS):
        which = labels == k
        if which.any():
            masks[which] = draw(u[which], v[which])
    return masks


def _paint(rng, masks, foreground, background, out):
    """Fill out (n, S, S, 3) with images in [0, 1]; masks (n, S, S), colours (n, 3).

    Works in place on ``out`` and avoids broadcasting over the 3-wide channel
    axis, which numpy runs slowly; at 128 pixels this is 3x faster than
    ``bg + mask * (fg - bg) + noise`` written plainly.
    """
    n = len(masks)
    palette = np.stack([background, foreground], axis=1).reshape(2 * n, 3)  # (2n, 3)
    colour_index = masks.astype(np.intp)  # (n, S, S): 0 background, 1 shape
    colour_index += 2 * np.arange(n)[:, None, None]  # row of this image's colour
    np.take(palette, colour_index, axis=0, out=out)  # (n, S, S, 3)
    noise_bytes = np.frombuffer(rng.bytes(out.size), np.uint8).reshape(out.shape)
    out += noise_bytes * np.float32(2.0 * NOISE / 255.0)  # noise in [0, 2 NOISE]
    out -= np.float32(NOISE)  # noise in [-NOISE, NOISE]
    np.clip(out, 0.0, 1.0, out=out)


# Mask functions: u (n, 1, S) and v (n, S, 1) in the unit box -> bool (n, S, S).


def _circle(u, v):
    return u * u + v * v <= 1.0


def _square(u, v):
    return np.maximum(np.abs(u), np.abs(v)) <= 0.85


def _triangle(u, v):
    # Apex at (0, -1), flat base at v = 0.85 spanning u in [-1, 1].
    return (v <= 0.85) & (np.abs(u) <= (v + 1.0) / 1.85)


def _diamond(u, v):
    return np.abs(u) + np.abs(v) <= 1.0


def _cross(u, v):
    arm = np.minimum(np.abs(u), np.abs(v)) <= 0.3
    return arm & (np.maximum(np.abs(u), np.abs(v)) <= 1.0)


def _ring(u, v):
    rr = u * u + v * v
    return (rr <= 1.0) & (rr >= 0.55**2)


def _bars(t):
    # Five equal stripes across [-1, 1]; the 1st, 3rd and 5th are filled.
    return np.floor((t + 1.0) * 2.5) % 2 == 0


def _horizontal_bars(u, v):
    inside = np.maximum(np.abs(u), np.abs(v)) <= 1.0
    return inside & _bars(v)


def _vertical_bars(u, v):
    inside = np.maximum(np.abs(u), np.abs(v)) <= 1.0
    return inside & _bars(u)


_MASKS = (  # same order as SHAPE_CLASSES
    _circle,
    _square,
    _triangle,
    _diamond,
    _cross,
    _ring,
    _horizontal_bars,
    _vertical_bars,
)
