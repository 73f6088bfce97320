"""``zoo bench scale`` in-process at tiny sizes: the whole-GPT tensor-parallel bytes stay
at Megatron's minimum, fsdp+tp weights at the analytic split, the report and the flags.

Compile only (never run), 8 simulated devices; the full-size tables are in
docs/performance.md and the recipes' steps in tests/recipes/test_fit.py.
"""

import argparse

import pytest

from zoo.bench import scale
from zoo.cli import bench as bench_cli
from zoo.config.bench_settings import ScaleBenchSettings

# T = 256: activations, not the (V = 256) embedding and head weights, dominate what
# moves, as at real size (at T = 64 GSPMD's gathers of those weights under tp+sp exceed
# the activations' bytes)
TINY_TP = {"tp_mesh": "data=2,model=4", "tp_layers": 1, "tp_width": 64, "tp_length": 256, "tp_batch": 4}


@pytest.mark.parametrize("layout", ["tp", "tp+sp"])
def test_gpt_step_sends_megatrons_minimum_over_model(layout):
    row = scale.tp_bytes_row({"kind": "tp", "layout": layout, **TINY_TP})
    # (4L + 2) all-reduces of (B/dp, T, C) f32, 2 (M-1)/M of each sent: 6 x 1.5 x 2 x 256 x 64 x 4
    assert row["minimum"] == 6 * 1.5 * 2 * 256 * 64 * 4
    assert row["sent"] <= 1.05 * row["minimum"], row
    if layout == "tp":
        assert set(row["collectives"]) == {"all-reduce"}, row  # no all-gather of activations or weights
    else:
        assert {"all-gather", "reduce-scatter"} <= set(row["collectives"]), row


def test_fsdp_tp_weights_are_split_over_every_device():
    row = scale.fsdp_tp_row("data=2,model=4")  # gpt_1b, built abstractly: nothing allocated
    assert row["devices"] == 8 and row["analytic"] > 500 * 2**20
    assert row["analytic"] <= row["weights"] <= 1.1 * row["analytic"], row


def test_report_has_a_table_per_section_and_names_errors():
    rows = [
        {"kind": "fsdp+tp", "mesh": "data=2,model=4", "devices": 8, "weights": 110, "analytic": 100},
        {
            "kind": "tp",
            "layout": "tp",
            "mesh": "data=2,model=4",
            "sent": 216,
            "minimum": 216,
            "collectives": {"all-reduce": 21},
            "layers": 4,
        },
        {"kind": "recipe", "task": {"kind": "recipe", "path": "x.toml"}, "error": "boom"},
    ]
    text = "\n".join(scale.format_report(rows, ScaleBenchSettings(sections=("fsdp+tp", "tp"))))
    assert "| data=2,model=4 | 8 | 0.0 | 0.0 | 1.10x |" in text
    assert "| tp | 21 all-reduce | 0.0 | 0.0 | 1.00x |" in text
    assert "error in {'kind': 'recipe', 'path': 'x.toml'}: boom" in text and "### Recipes" not in text


def test_report_tables_write_sizes_in_the_units_their_headers_name():
    gib, mib = 2**30, 2**20
    recipe = {"kind": "recipe", "path": "r.toml", "layout": "fsdp", "mesh": "data=8", "precision": "bfloat16"}
    recipe |= {"remat": "full", "batch_per_device": 4, "weights": 1.5 * gib, "gradients": gib / 2, "optimizer": 5 * gib}
    recipe |= {"temp": 12 * mib, "peak": 70 * gib, "target": 80 * gib}
    rows = [
        recipe,
        {"kind": "attention", "path": "ring", "temp": 1234.4 * mib},
        {"kind": "fsdp+tp", "mesh": "data=2,model=4", "devices": 8, "weights": 1234567890, "analytic": 1200000000},
        {
            "kind": "tp",
            "layout": "tp",
            "mesh": "m",
            "sent": 1.5 * mib,
            "minimum": mib,
            "collectives": {"all-reduce": 6},
        },
    ]
    text = "\n".join(scale.format_report(rows, ScaleBenchSettings(sections=("recipes", "attention", "fsdp+tp", "tp"))))
    assert "| r.toml | fsdp, data=8 | bfloat16, full | 4 | 1.50 | 0.50 | 5.00 | 0.01 | 70.00 | 80.00 | yes |" in text
    assert "| ring | 1,234 |" in text
    assert "| data=2,model=4 | 8 | 1,177.4 | 1,144.4 | 1.03x |" in text
    assert "| tp | 6 all-reduce | 1.5 | 1.0 | 1.50x |" in text


def test_tasks_run_each_measurement_on_its_device_count():
    settings = ScaleBenchSettings(
        recipes=("recipes/gpu-8/pretrain_gpt.toml", "recipes/tpu-multihost/pretrain_gpt.toml")
    )
    devices = [(count, task["kind"]) for count, task in scale.tasks(settings)]
    assert devices == [
        (8, "recipe"),
        (64, "recipe"),
        (4, "attention"),
        (64, "fsdp+tp"),
        (256, "fsdp+tp"),
        (8, "tp"),
        (8, "tp"),
    ]


def test_flags():
    parser = argparse.ArgumentParser()
    bench_cli.add_arguments(parser)
    args = parser.parse_args(["scale", "--sections", "tp,fsdp+tp", "--fsdp-tp-meshes", "data=2,model=4;data=4,model=2"])
    assert args.sections == ("tp", "fsdp+tp") and args.fsdp_tp_meshes == ("data=2,model=4", "data=4,model=2")
    assert bench_cli.settings_from_args("scale", parser.parse_args(["scale"])) == ScaleBenchSettings()
    with pytest.raises(SystemExit):
        parser.parse_args(["scale", "--sections", "speed"])
