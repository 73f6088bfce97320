"""zoo.units.format_bytes writes each report's sizes as the formatter it replaced did."""

import pytest

from zoo.units import GIB, KIB, MIB, format_bytes, format_bytes_in


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


@pytest.mark.parametrize(
    "count, expected",
    [
        (0, "0.0 KiB"),
        (500, "0.5 KiB"),
        (1023, "1.0 KiB"),
        (MIB - 1, "1,024.0 KiB"),
        (MIB + 52 * KIB, "1.1 MiB"),
        (GIB - MIB, "1,023.0 MiB"),
        (5.24 * GIB, "5.24 GiB"),
        (2048 * GIB, "2,048.00 GiB"),
    ],
)
def test_bench_tables_two_decimals_in_gib_kib_below(count, expected):  # zoo.bench._output.size_text
    assert format_bytes(count, 1, grouping=True, gib_decimals=2, smallest="KiB") == expected


@pytest.mark.parametrize(
    "count, gib_from, expected",
    [
        (None, None, "-"),
        (500, None, "0.5 KiB"),
        (589.5 * MIB, None, "589.5 MiB"),
        (12 * GIB, None, "12,288.0 MiB"),  # no GiB without gib_from
        (9.99 * GIB, 10 * GIB, "10,229.8 MiB"),
        (10 * GIB, 10 * GIB, "10.0 GiB"),
    ],
)
def test_memory_bench_tables_mib_up_to_gib_from(count, gib_from, expected):  # zoo.bench._output.mib_text
    assert format_bytes(count, 1, grouping=True, gib_from=gib_from, smallest="KiB") == expected


def test_smallest_unit_is_bytes_or_kib():
    with pytest.raises(ValueError, match="smallest unit 'MiB'"):
        format_bytes(5 * GIB, smallest="MiB")


@pytest.mark.parametrize(
    "count, unit, decimals, grouping, expected",
    [
        (1536 * MIB, GIB, 2, False, "1.50"),  # zoo bench scale's recipe table (GiB)
        (0, GIB, 2, False, "0.00"),
        (2048 * GIB, GIB, 2, False, "2048.00"),
        (1000 * MIB, MIB, 0, True, "1,000"),  # its attention table (MiB)
        (1234567890, MIB, 1, True, "1,177.4"),
        (-3 * MIB, MIB, 1, False, "-3.0"),
        (None, KIB, 1, True, "-"),
    ],
)
def test_columns_in_one_unit(count, unit, decimals, grouping, expected):
    assert format_bytes_in(count, unit, decimals, grouping=grouping) == expected
