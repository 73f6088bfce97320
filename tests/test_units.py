"""zoo.units.format_bytes writes each report's sizes as the formatter it replaced did."""

import pytest

from zoo.units import GIB, KIB, MIB, format_bytes


@pytest.mark.parametrize(
    "count, expected",
    [
        (None, "-"),
        (0, "0 B"),
        (1023, "1023 B"),
        (KIB, "1.0 KiB"),
        (12288, "12.0 KiB"),
        (1.5 * MIB, "1.5 MiB"),
        (3 * GIB, "3.0 GiB"),
        (2048 * GIB, "2048.0 GiB"),
        (-2048, "-2.0 KiB"),
    ],
)
def test_collective_tables_one_decimal(count, expected):  # zoo comms, CommsReport.format
    assert format_bytes(count) == expected


@pytest.mark.parametrize(
    "count, expected",
    [
        (512, "512 B"),
        (1536, "1.50 KiB"),
        (1000 * MIB, "1,000.00 MiB"),
        (2048 * GIB, "2,048.00 GiB"),
        (-3 * MIB, "-3.00 MiB"),
    ],
)
def test_plan_tables_two_decimals_grouped(count, expected):  # zoo plan
    assert format_bytes(count, 2, grouping=True) == expected


@pytest.mark.parametrize("count, expected", [(512, "512 B"), (1000 * MIB, "1000.00 MiB"), (80 * GIB, "80.00 GiB")])
def test_recipe_check_two_decimals(count, expected):  # zoo recipe check's memory line
    assert format_bytes(count, 2) == expected
