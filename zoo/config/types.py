"""Argparse ``type=`` functions: every number range-checked at parse time, in one place.

A value out of range is a usage error named by its flag and value, before any work:
``zoo: error: argument --epochs: expected an integer >= 1, got '0'``. The ranges
(docs/cli.md lists them):

==============================  ====================================================
``positive_int``                counts, sizes, steps, epochs, batch sizes: 1 .. 2**31 - 1
``device_count``                simulated and planned devices: 1 .. 4096
``non_negative_int``            seeds, process ids: >= 0
``sequence_length``             tokens per example: >= 2
``image_size``                  >= 1; for shapes one of the prepared sizes (``check_image_size``)
``generated_image_size``        images drawn in memory (``load_shapes``): >= 16
``positive_float``              learning rates, temperatures, peaks, memory: finite and > 0
``non_negative_float``          tolerances: finite and >= 0
``dropout``                     in [0, 1)
``probability``                 top-p: in (0, 1]
``depth``                       auto, full or an integer >= 1
``loss_chunk``                  auto, whole or an integer >= 1
``text``                        UTF-8 text (a prompt): not empty, no undecodable bytes
==============================  ====================================================
"""

import argparse
import math

from zoo.config.choices import AUTO, WHOLE

MAX_INTEGER = 2**31 - 1  # every count is an int32 somewhere (XLA shapes, loop bounds, step counters)
MAX_DEVICES = 4096  # simulated CPU devices and planned targets: XLA:CPU starts 4096, and no pod is larger per mesh here


def at_least(minimum, maximum=MAX_INTEGER):
    """An integer in ``[minimum, maximum]``."""

    def parse(text):
        try:
            value = int(text)
        except (TypeError, ValueError, OverflowError):
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}")
        if value > maximum:
            raise argparse.ArgumentTypeError(f"expected an integer <= {maximum:,}, got {text!r}")
        return value

    parse.__name__ = f"integer >= {minimum}"
    parse.kind, parse.maximum = int, maximum
    parse.expected = f"an integer >= {minimum}" if maximum == MAX_INTEGER else f"an integer in [{minimum}, {maximum:,}]"
    return parse


positive_int = at_least(1)
device_count = at_least(1, MAX_DEVICES)
non_negative_int = at_least(0)
sequence_length = at_least(2)
generated_image_size = at_least(16)  # zoo.data.shapes.MIN_IMAGE_SIZE: below it the thin shapes vanish
image_size = at_least(1)  # the dataset's sizes are checked after parsing (check_image_size)


def _number(text):
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _float_in(test, expected):
    def parse(text):
        value = _number(text)
        if value is None or not test(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value

    parse.__name__ = expected
    parse.kind, parse.expected = float, expected
    return parse


positive_float = _float_in(lambda v: v > 0, "a finite number > 0")
at_least_one_second = _float_in(lambda v: v >= 1, "a finite number >= 1")
non_negative_float = _float_in(lambda v: v >= 0, "a finite number >= 0")
dropout = _float_in(lambda v: 0 <= v < 1, "a number in [0, 1)")
probability = _float_in(lambda v: 0 < v <= 1, "a number in (0, 1]")


def depth(text):
    """``auto``, ``full`` or a block count >= 1 (``zoo plan --depth``); returned as given."""
    if text in ("auto", "full") or (text.isdigit() and int(text) >= 1):
        return text
    raise argparse.ArgumentTypeError(f"expected auto, full or an integer >= 1, got {text!r}")


def int_or_words(words, minimum=1):
    """One of ``words`` (returned as given) or an integer >= ``minimum``."""
    number = at_least(minimum)
    expected = f"{', '.join(words)} or an integer >= {minimum}"

    def parse(text):
        if text in words:
            return text
        try:
            return number(text)
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None

    parse.__name__ = expected
    parse.kind, parse.words, parse.maximum, parse.expected = int, tuple(words), MAX_INTEGER, expected
    return parse


loss_chunk = int_or_words((AUTO, WHOLE))  # --loss-chunk-size


def text(value):
    """Text that encodes as UTF-8: a command line with bytes that are not UTF-8 reaches
    Python as lone surrogates, which cannot be encoded (and so never tokenised)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise argparse.ArgumentTypeError(f"not valid UTF-8 text: {value!r}; pass the text in UTF-8") from None
    if not value:
        raise argparse.ArgumentTypeError("expected at least one character, got ''")
    return value


text.kind, text.expected = str, "UTF-8 text, at least one character"


NONE_WORD = "none"  # the flag value of None in a choice that allows it (--balance none, --balances none,zigzag)


def comma_separated(choices, what="name"):
    """``"a,b"`` -> ``("a", "b")``, each one of ``choices``; a None choice is written
    ``none`` (or ``None``, as Python prints it)."""
    words = {NONE_WORD if choice is None else choice: choice for choice in choices}
    if None in choices:
        words[str(None)] = None

    def parse(value):
        names = tuple(name.strip() for name in value.split(",") if name.strip())
        unknown = [name for name in names if name not in words]
        if unknown or not names:
            known = ",".join(word for word in words if word != str(None))
            raise argparse.ArgumentTypeError(f"unknown {what}(s) {unknown or [value]}; choose from {known}")
        return tuple(words[name] for name in names)

    parse.__name__ = f"comma-separated {what}s"
    return parse


def positive_ints(value):
    """``"4096,16384"`` -> ``(4096, 16384)``, each >= 1."""
    try:
        numbers = tuple(int(part) for part in value.split(","))
    except ValueError:
        numbers = ()
    if not numbers or min(numbers) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 1 such as 4096,16384, got {value!r}")
    return numbers
