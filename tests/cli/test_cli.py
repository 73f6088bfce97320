import csv
import os
import subprocess
import sys

import jax
import keras
import pytest

from tests.plotting._png import png_size
from zoo.cli.main import build_parser, main
from zoo.models import SmallCNN

SMALL_TRAIN = ["--image-size", "16", "--epochs", "2", "--train-examples", "256", "--batch-size", "32"]


def test_train_end_to_end_in_process(tmp_path, capsys):
    output = tmp_path / "model" / "cnn.keras"
    assert (
        main(["train", "cnn", "--layout", "model", "--mesh", "data=2,model=4", *SMALL_TRAIN, "--output", str(output)])
        == 0
    )
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "Using 8 simulated CPU devices from XLA_FLAGS."
    assert "distribution: CheckedModelParallel on mesh data=2,model=4" in out
    assert "block1_conv/kernel" in out and "(-, -, -, model)" in out
    assert "epoch 2:" in out and "images/s" in out
    accuracy = float(out.split("held-out test accuracy: ")[1].split()[0])
    assert 0.0 <= accuracy <= 1.0
    loaded = keras.saving.load_model(output, safe_mode=True)
    assert isinstance(loaded, SmallCNN) and loaded.image_size == (16, 16)
    assert not [p for p in os.listdir(output.parent) if p.startswith(".partial-")]
    run_folder = output.parent / "cnn.run"  # the run's own folder, not the output's (another run's output may share it)
    assert not (output.parent / "metrics.csv").exists()
    metrics = list(csv.DictReader((run_folder / "metrics.csv").open()))  # the run's epochs, as Keras' logs had them
    assert len(metrics) == 2 and {"epoch", "step", "loss", "val_accuracy", "images_per_second"} <= set(metrics[0])
    steps = list(csv.DictReader((run_folder / "steps.csv").open()))  # one row per optimizer step, with its own time
    assert [int(row["step"]) for row in steps] == list(range(1, int(metrics[-1]["step"]) + 1))
    assert all(float(row["step_time_s"]) > 0 and float(row["images_per_second"]) > 0 and row["loss"] for row in steps)
    assert main(["plot", str(output)]) == 0  # zoo plot on the finished run, given the job's --output
    assert png_size(run_folder / "metrics.png")[0] > 0


def test_train_gpt_with_remat_in_process(tmp_path, capsys):
    """``--remat`` alone is "full": the blocks run under jax.checkpoint with dropout on
    (every strategy is covered by tests/models/test_gpt_remat.py), here under tp, whose
    attention runs in one shard_map (gpt_tiny's 2 KV heads replicated over model=4); the
    job names the attention implementation it runs."""
    output = tmp_path / "gpt.keras"
    tiny = [
        "--config-name",
        "gpt_tiny",
        "--num-layers",
        "1",
        "--epochs",
        "1",
        "--steps-per-epoch",
        "1",
        "--sequence-length",
        "16",
        "--batch-size",
        "64",
    ]
    assert main(["train", "gpt", "--layout", "tp", "--remat", "--dropout", "0.1", *tiny, "--output", str(output)]) == 0
    out = capsys.readouterr().out
    assert "model: gpt_tiny, 25,696 parameters, remat full" in out and "epoch 1: validation loss" in out
    assert "attention: one shard_map over 'model' (M=4: 1 of 4 heads per device), then blockwise (tile 16)" in out
    assert keras.saving.load_model(output, safe_mode=True).backbone.remat == "full"
    assert (tmp_path / "gpt.run" / "metrics.csv").is_file() and not (
        tmp_path / "metrics.csv"
    ).exists()  # its own run folder


def test_remat_flag_values():
    parser = build_parser()
    gpt = ["train", "gpt"]
    assert [
        parser.parse_args(gpt + flags).remat
        for flags in ([], ["--remat"], ["--remat", "dots_saveable"], ["--remat", "none"], ["--remat", "auto"])
    ] == ["auto", "full", "dots_saveable", "none", "auto"]


def test_verify_passes_and_fails_by_tolerance(capsys):
    args = [
        "verify",
        "cnn",
        "--layout",
        "data",
        "--mesh",
        "data=8",
        "--image-size",
        "16",
        "--batch-size",
        "16",
        "--steps",
        "2",
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "PASS" in out and "per-step loss, distributed:" in out
    assert main(args + ["--rtol", "0", "--atol", "0"]) == 1
    assert "FAIL: differences beyond tolerance" in capsys.readouterr().out


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["train", "cnn", "--mesh", "data=3,model=4"],
            "mesh data=3,model=4 has 12 devices (product of axis sizes) but 8 devices are available",
        ),
        (["train", "cnn", "--layout", "single", "--mesh", "data=8"], "layout 'single' runs on one device"),
        (["train", "cnn", "--layout", "model", "--mesh", "data=8"], "has no ['model']"),
        (
            ["verify", "cnn", "--layout", "data", "--mesh", "data=8", "--batch-size", "12"],
            "batch size 12 is not divisible by the data-parallel size 8",
        ),
        (["train", "cnn", "--output", "model.h5"], "model path must end in .keras"),
    ],
)
def test_bad_input_exits_2_with_named_numbers(args, message, capsys):
    assert main(args) == 2
    assert message in capsys.readouterr().err


def test_devices_that_cannot_change_any_more_are_a_runtime_failure(capsys):
    """Only in-process (a fresh ``zoo`` simulates the devices before JAX starts): exit 1."""
    jax.devices()  # JAX runs (with the session's 8 devices) whichever test came first
    assert main(["train", "cnn", "--simulate-devices", "4"]) == 1
    assert "already started with 8 CPU device(s); cannot switch to 4" in capsys.readouterr().err


def test_failed_run_keeps_the_previous_model(tmp_path, capsys):
    output = tmp_path / "cnn.keras"
    output.write_bytes(b"previous good model")
    assert main(["train", "cnn", "--mesh", "data=5,model=-1", "--output", str(output)]) == 2
    assert output.read_bytes() == b"previous good model"


def test_command_line_simulates_8_devices_on_a_cpu_host(tmp_path):
    """The installed entry point, in a fresh process with no device count in XLA_FLAGS:
    first line says so. (The session's other XLA flags stay, so its programs compile as
    the suite's do and come from the session's compilation cache.)"""
    env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
    env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split() if "device_count" not in f)
    env["JAX_PLATFORMS"] = "cpu"
    command = [
        sys.executable,
        "-m",
        "zoo",
        "train",
        "cnn",
        "--layout",
        "data",
        *SMALL_TRAIN,
        "--epochs",
        "1",
        "--output",
        str(tmp_path / "m.keras"),
    ]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert lines[0] == "No GPU/TPU backend found: simulating 8 CPU devices (change with --simulate-devices N)."
    assert "devices: 8 x cpu (cpu)" in lines[1]
    assert "distribution: DataParallel on mesh data=8" in result.stdout
    assert (tmp_path / "m.keras").exists()


def test_train_gpt_pipeline_flags_reach_the_model(tmp_path, capsys, monkeypatch):
    """``zoo train gpt --layout pipeline`` wires --micro-batches, --schedule, --repeats and
    --num-layers into the model and its layout, and reports the schedule, without compiling
    a step (fit is stubbed: the pipelined fit is run end to end in tests/models/test_gpt_pipeline.py
    and by hand in docs/cli.md; one here would cost ~15 s of compiling on two cores)."""
    from zoo.training import gpt

    fitted = []
    monkeypatch.setattr(gpt, "checkpointed_fit", lambda model, *args, **kwargs: fitted.append(model))
    flags = [
        "--config-name",
        "gpt_tiny",
        "--num-layers",
        "8",
        "--layout",
        "pipeline",
        "--mesh",
        "data=2,stage=4",
        "--micro-batches",
        "8",
        "--schedule",
        "circular",
        "--repeats",
        "2",
        "--batch-size",
        "16",
        "--sequence-length",
        "16",
        "--epochs",
        "1",
        "--steps-per-epoch",
        "1",
    ]
    assert main(["train", "gpt", *flags, "--output", str(tmp_path / "gpt.keras")]) == 0
    out = capsys.readouterr().out
    backbone = fitted[0].backbone
    assert (backbone.schedule, backbone.micro_batches, backbone.repeats, backbone.num_layers) == ("circular", 8, 2, 8)
    kernel = backbone.pipelined_blocks.stacked["attention/query/kernel"]
    assert kernel.shape == (2, 4, 32, 4, 8) and tuple(kernel.value.sharding.spec) == (None, "stage", None, None, None)
    assert "distribution: CheckedModelParallel on mesh data=2,stage=4" in out
    assert (
        "pipeline: schedule circular, 4 stages x 2 repeat(s) of 1 block(s), 8 micro-batches of 1 row(s) per data shard; 19 ticks, useful 16/19 = 84%"
        in out
    )


def test_moe_settings_on_a_dense_config_are_refused_naming_them(capsys):
    assert main(["train", "gpt", "--config-name", "gpt_tiny", "--capacity-factor", "1.25", "--epochs", "1"]) == 2
    assert (
        "--capacity-factor 1.25: settings of a Mixture-of-Experts model, but --config-name gpt_tiny has no experts"
        in capsys.readouterr().err
    )
