"""The command line's error contract (docs/cli.md#exit-status-and-errors), over a table of
bad inputs to every ``zoo`` subcommand, run in-process through ``zoo.cli.main.main``.

Every case must exit 2 (a usage error) or 1 (a runtime failure) with exactly one line on
stderr, ``zoo: error: ...``, naming the bad value, and no traceback anywhere; and it must
fail before any model is compiled or trained (``Model.compile`` and ``Model.fit`` are
forbidden here), so the whole table runs in about a second.
"""

import pathlib
import signal
import time
import zipfile

import keras
import pytest

import zoo.cli.devices
import zoo.presets
from zoo.cli import main as cli
from zoo.training.interrupts import TrainingInterrupted

USAGE, RUNTIME = 2, 1

# (argv, exit status, text the error line must contain). In argv, {file} is a regular
# file, {dir} an empty folder, {folder} a folder holding two recipes, {empty}/{junk} an
# empty / random-bytes .keras file, {h5} an existing file named .h5, {latin1} a recipe
# file in Latin-1, {badtoml} one that is not TOML, {missing} a path that does not exist.
CASES = [
    # zoo train cnn
    (["train", "cnn", "--epochs", "-1"], USAGE, "argument --epochs: expected an integer >= 1, got '-1'"),
    (["train", "cnn", "--epochs", "0"], USAGE, "argument --epochs: expected an integer >= 1, got '0'"),
    (["train", "cnn", "--image-size", "0"], USAGE, "argument --image-size: expected an integer >= 1, got '0'"),
    (
        ["train", "cnn", "--image-size", "17"],
        USAGE,
        "argument --image-size: shapes is prepared at image sizes 16, 32, 64, 128, got 17",
    ),
    (
        ["train", "cnn", "--learning-rate", "nan"],
        USAGE,
        "argument --learning-rate: expected a finite number > 0, got 'nan'",
    ),
    (
        ["train", "cnn", "--learning-rate", "inf"],
        USAGE,
        "argument --learning-rate: expected a finite number > 0, got 'inf'",
    ),
    (
        ["train", "cnn", "--learning-rate", "0"],
        USAGE,
        "argument --learning-rate: expected a finite number > 0, got '0'",
    ),
    (["train", "cnn", "--dropout", "1"], USAGE, "argument --dropout: expected a number in [0, 1), got '1'"),
    (["train", "cnn", "--batch-size", "0"], USAGE, "argument --batch-size: expected an integer >= 1, got '0'"),
    (["train", "cnn", "--seed", "-3"], USAGE, "argument --seed: expected an integer >= 0, got '-3'"),
    (["train", "cnn", "--keep", "0"], USAGE, "argument --keep: expected an integer >= 1, got '0'"),
    (
        ["train", "cnn", "--simulate-devices", "0"],
        USAGE,
        "argument --simulate-devices: expected an integer >= 1, got '0'",
    ),
    (  # past zoo.config.types.MAX_DEVICES, refused before XLA starts (issue 27: 100,000 segfaulted XLA:CPU)
        ["train", "cnn", "--simulate-devices", "100000"],
        USAGE,
        "argument --simulate-devices: expected an integer <= 4,096, got '100000'",
    ),
    (
        ["train", "gpt", "--simulate-devices", "1" + "0" * 30],
        USAGE,
        "argument --simulate-devices: expected an integer <= 4,096, got '1" + "0" * 30 + "'",
    ),
    (["train", "cnn", "--layout", "bogus"], USAGE, "argument --layout: invalid choice: 'bogus'"),
    (["train", "cnn", "--output", "model.h5"], USAGE, "'model.h5': a model path must end in .keras"),
    (["train", "cnn", "--output", "{file}/m.keras"], USAGE, "{file} is a file, not a folder"),
    (["train", "cnn", "--output", "/sys/m.keras"], USAGE, "--output '/sys/m.keras': cannot be written"),
    (["train", "cnn", "--checkpoint-dir", "{file}"], USAGE, "--checkpoint-dir '{file}': cannot be written"),
    (["train", "cnn", "--data-dir", "{file}"], USAGE, "--data-dir '{file}': cannot be a data folder"),
    (["train", "cnn", "--dataset", "nope"], USAGE, "unknown dataset 'nope'"),
    (["train", "cnn", "--dataset", "python_docs"], USAGE, "'python_docs' is language modelling"),
    (["train", "cnn", "--mesh", "data=3,model=4"], USAGE, "mesh data=3,model=4 has 12 devices"),
    (["train", "cnn", "--mesh", "data=x"], USAGE, "size 'x' of axis 'data' is not an integer"),
    (["train"], USAGE, "the following arguments are required: model"),
    # zoo train gpt / encoder / vit
    (
        ["train", "gpt", "--dataset", "shapes"],
        USAGE,
        "--dataset 'shapes' is image classification data; zoo train gpt needs language modelling data",
    ),
    (
        ["train", "gpt", "--sequence-length", "1"],
        USAGE,
        "argument --sequence-length: expected an integer >= 2, got '1'",
    ),
    (
        ["train", "gpt", "--gradient-accumulation-steps", "0"],
        USAGE,
        "argument --gradient-accumulation-steps: expected an integer >= 1, got '0'",
    ),
    (
        ["train", "gpt", "--learning-rate", "-1"],
        USAGE,
        "argument --learning-rate: expected a finite number > 0, got '-1'",
    ),
    (
        ["train", "gpt", "--steps-per-epoch", "0"],
        USAGE,
        "argument --steps-per-epoch: expected an integer >= 1, got '0'",
    ),
    (["train", "gpt", "--checkpoint-dir", "{file}/ckpt"], USAGE, "--checkpoint-dir '{file}/ckpt': cannot be written"),
    (
        ["train", "gpt", "--sequence-length", "100000"],
        USAGE,
        "bytes; the sequence length must be below that, got 100,000",
    ),
    (["train", "gpt", "--layout", "everything"], USAGE, "argument --layout: invalid choice: 'everything'"),
    (
        ["train", "gpt", "--micro-batches", "4"],
        USAGE,
        "micro_batches (--micro-batches) = 4 is a setting of layout 'pipeline', not of layout 'data'",
    ),
    (
        ["train", "gpt", "--layout", "tp", "--schedule", "circular"],
        USAGE,
        "schedule (--schedule) = 'circular' is a setting of layout 'pipeline', not of layout 'tp'",
    ),
    (
        ["train", "gpt", "--layout", "tp", "--context-attention", "ulysses"],
        USAGE,
        "context_attention (--context-attention) = 'ulysses' is a setting of layout 'context', not of layout 'tp'",
    ),
    (
        ["train", "vit", "--context-attention", "gather"],
        USAGE,
        "context_attention (--context-attention) = 'gather' is a setting of layout 'context', not of layout 'data'",
    ),
    (
        ["finetune", "small_cnn_shapes", "--balance", "zigzag"],
        USAGE,
        "balance (--balance) = 'zigzag' is a setting of layout 'context', not of layout 'single'",
    ),
    (
        ["train", "gpt", "--layout", "pipeline", "--schedule", "circular"],
        USAGE,
        "schedule 'circular' needs repeats >= 2 (repeats=1 is 'gpipe'), got repeats=1",
    ),
    (
        ["train", "gpt", "--layout", "pipeline", "--repeats", "2"],
        USAGE,
        "schedule 'gpipe' runs each stage's blocks once per micro-batch, so repeats must be 1, got repeats=2",
    ),
    (
        ["train", "gpt", "--layout", "pipeline", "--micro-batches", "0"],
        USAGE,
        "argument --micro-batches: expected an integer >= 1, got '0'",
    ),
    (
        [
            "train",
            "gpt",
            "--layout",
            "pipeline",
            "--mesh",
            "data=2,stage=4",
            "--config-name",
            "gpt_tiny",
            "--schedule",
            "circular",
            "--repeats",
            "2",
        ],
        USAGE,
        "--config-name gpt_tiny has 2 layers, which do not split into --repeats 2 x 4 stages = 8 equal groups of blocks; give --num-layers a multiple of 8",
    ),
    (
        [
            "train",
            "gpt",
            "--layout",
            "pipeline",
            "--mesh",
            "data=2,stage=4",
            "--batch-size",
            "12",
            "--micro-batches",
            "4",
        ],
        USAGE,
        "--batch-size 12 is 6 rows per data shard (2 data shards), which do not divide into --micro-batches 4; use a batch that is a multiple of 8",
    ),
    (
        [
            "train",
            "gpt",
            "--layout",
            "pipeline",
            "--mesh",
            "data=2,stage=4",
            "--micro-batches",
            "2",
            "--schedule",
            "circular",
            "--repeats",
            "2",
            "--num-layers",
            "8",
        ],
        USAGE,
        "micro_batches=2 < 4 stages",
    ),
    (
        ["train", "encoder", "--sequence-length", "0"],
        USAGE,
        "argument --sequence-length: expected an integer >= 2, got '0'",
    ),
    (
        ["train", "vit", "--image-size", "12"],
        USAGE,
        "argument --image-size: shapes is prepared at image sizes 16, 32, 64, 128, got 12",
    ),
    (["train", "vit", "--epochs", "many"], USAGE, "argument --epochs: expected an integer >= 1, got 'many'"),
    # zoo verify
    (["verify", "cnn", "--steps", "0"], USAGE, "argument --steps: expected an integer >= 1, got '0'"),
    (["verify", "cnn", "--image-size", "8"], USAGE, "argument --image-size: expected an integer >= 16, got '8'"),
    (["verify", "cnn", "--rtol", "-1"], USAGE, "argument --rtol: expected a finite number >= 0, got '-1'"),
    (["verify", "gpt"], USAGE, "argument model: invalid choice: 'gpt'"),
    # zoo generate
    (["generate", "--model", "{missing}"], RUNTIME, "no saved model at '{missing}'"),
    (["generate", "--model", "{empty}"], USAGE, "'{empty}' is not a valid .keras file: the file is empty"),
    (
        ["generate", "--model", "{junk}"],
        USAGE,
        "'{junk}' is not a valid .keras file: 4,096 bytes that are not a zip archive",
    ),
    (["generate", "--model", "{h5}"], USAGE, "model path must end in .keras, got '{h5}'"),
    (["generate", "--prompt", "caf\udce9"], USAGE, "argument --prompt: not valid UTF-8 text: 'caf\\udce9'"),
    (["generate", "--prompt", ""], USAGE, "argument --prompt: expected at least one character"),
    (["generate", "--temperature", "0"], USAGE, "argument --temperature: expected a finite number > 0, got '0'"),
    (["generate", "--top-p", "1.5"], USAGE, "argument --top-p: expected a number in (0, 1], got '1.5'"),
    (["generate", "--top-k", "0"], USAGE, "argument --top-k: expected an integer >= 1, got '0'"),
    (["generate", "--max-new-tokens", "-5"], USAGE, "argument --max-new-tokens: expected an integer >= 1, got '-5'"),
    # zoo finetune
    (
        ["finetune", "small_cnn_shapes", "--dataset", "python_docs_topics"],
        USAGE,
        "preset 'small_cnn_shapes' (SmallCNN) takes image classification input; --dataset 'python_docs_topics' is text classification data",
    ),
    (
        ["finetune", "small_cnn_shapes", "--dataset", "python_docs"],
        USAGE,
        "fine-tuning needs a classification dataset; 'python_docs' is language modelling",
    ),
    (["finetune", "no_such_preset"], USAGE, "unknown preset 'no_such_preset'"),
    (
        ["finetune", "small_cnn_shapes", "--lora-rank", "0"],
        USAGE,
        "argument --lora-rank: expected an integer >= 1, got '0'",
    ),
    (["finetune", "small_cnn_shapes", "--method", "half"], USAGE, "argument --method: invalid choice: 'half'"),
    (
        ["finetune", "encoder_tiny_topics", "--dataset", "python_docs_topics", "--layout", "context"],
        USAGE,
        "--layout context: a classifier preset fine-tunes under single, data, model, fsdp, tp; context is for causal LMs",
    ),
    (["finetune", "small_cnn_shapes", "--output", "{file}"], USAGE, "--output '{file}': cannot be written"),
    (
        ["finetune", "small_cnn_shapes", "--output", "{folder}"],
        USAGE,
        "refusing to replace '{folder}': it is not empty and holds no metadata.json",
    ),
    # zoo recipe check / run
    (
        ["recipe", "check", "{folder}"],
        USAGE,
        "{folder}: is a folder; give a recipe file in it: {folder}/a.toml, {folder}/b.toml",
    ),
    (["recipe", "check", "{latin1}"], USAGE, "{latin1}: not UTF-8 text (byte b'\\xe9' at offset"),
    (["recipe", "check", "{badtoml}"], USAGE, "{badtoml}: not valid TOML"),
    (["recipe", "check", "{missing}"], USAGE, "{missing}: no such recipe file"),
    (["recipe", "check", "x.toml", "--devices", "0"], USAGE, "argument --devices: expected an integer >= 1, got '0'"),
    (
        ["recipe", "check", "x.toml", "--devices", "100000"],
        USAGE,
        "argument --devices: expected an integer <= 4,096, got '100000'",
    ),
    (
        ["recipe", "check", "x.toml", "--depth", "deep"],
        USAGE,
        "argument --depth: expected auto, full or an integer >= 1, got 'deep'",
    ),
    (["recipe", "run", "{folder}"], USAGE, "{folder}: is a folder"),
    (
        ["recipe", "run", "x.toml", "--process-id", "-1"],
        USAGE,
        "argument --process-id: expected an integer >= 0, got '-1'",
    ),
    # zoo plan
    (["plan", "--batch-size", "0"], USAGE, "argument --batch-size: expected an integer >= 1, got '0'"),
    (["plan", "--devices", "100000"], USAGE, "argument --devices: expected an integer <= 4,096, got '100000'"),
    (["plan", "--depth", "0"], USAGE, "argument --depth: expected auto, full or an integer >= 1, got '0'"),
    (
        ["plan", "--device-memory-gib", "-2"],
        USAGE,
        "argument --device-memory-gib: expected a finite number > 0, got '-2'",
    ),
    (["plan", "--config-name", "gpt_tiny", "--device", "h300"], USAGE, "unknown device 'h300'"),
    (["plan", "{latin1}"], USAGE, "{latin1}: not UTF-8 text"),
    (
        ["plan", "--config-name", "gpt_tiny", "--layout", "fsdp", "--balance", "zigzag"],
        USAGE,
        "balance (--balance) = 'zigzag' is a setting of layout 'context', not of layout 'fsdp'",
    ),
    (["plan", "--layout", "auto"], USAGE, "--layout auto is zoo train gpt's planning: zoo plan --auto searches"),
    # zoo bench *
    (["bench", "cnn", "--repeats", "0"], USAGE, "argument --repeats: expected an integer >= 1, got '0'"),
    (
        ["bench", "gpt", "--layouts", "data,bogus"],
        USAGE,
        "argument --layouts: unknown layout(s) ['bogus']; choose from data,tp,context",
    ),
    (
        ["bench", "attention", "--lengths", "4096,-1"],
        USAGE,
        "argument --lengths: expected comma-separated integers >= 1",
    ),
    (["bench", "tp", "--variants", "mlp,huge"], USAGE, "argument --variants: unknown variant(s) ['huge']"),
    (
        ["bench", "context", "--sequence-length", "1"],
        USAGE,
        "argument --sequence-length: expected an integer >= 2, got '1'",
    ),
    (["bench", "lora-context", "--remats", "full,some"], USAGE, "argument --remats: unknown remat(s) ['some']"),
    (["bench", "lm-head", "--heads", "tied,shared"], USAGE, "argument --heads: unknown head(s) ['shared']"),
    (["bench", "peers", "--layouts", "fsdp,pipeline"], USAGE, "argument --layouts: unknown layout(s) ['pipeline']"),
    (["bench", "hf-load", "--runs", "fsdp"], USAGE, "argument --runs: expected ';'-separated '<layout>:<mesh>' runs"),
    (["bench", "scale", "--sections", "speed"], USAGE, "argument --sections: unknown section(s) ['speed']"),
    (
        ["bench", "pipeline", "--sections", "speed"],
        USAGE,
        "argument --sections: unknown section(s) ['speed']; choose from bubble,memory",
    ),
    (["bench", "plan", "--top", "0"], USAGE, "argument --top: expected an integer >= 1, got '0'"),
    (
        ["bench", "step", "--quantize", "int8"],
        USAGE,
        "quantize (--quantize) = 'int8' is a setting of method qlora, not of method 'train'",
    ),
    (
        ["bench", "step", "--method", "lora", "--precision", "bfloat16"],
        USAGE,
        "precision (--precision) = 'bfloat16' trains bfloat16 weights with the zoo's AdamW (method train); method "
        "'lora' takes float32 or mixed_bfloat16",
    ),
    (
        ["bench", "moe", "--sections", "speed"],
        USAGE,
        "argument --sections: unknown section(s) ['speed']; choose from exchange,memory,time",
    ),
    (
        ["bench", "window", "--sections", "speed"],
        USAGE,
        "argument --sections: unknown section(s) ['speed']; choose from blockwise,context",
    ),
    # zoo comms
    (["comms", "mlp", "--dim", "0"], USAGE, "argument --dim: expected an integer >= 1, got '0'"),
    (["comms", "cnn", "--image-size", "4"], USAGE, "argument --image-size: expected an integer >= 8, got '4'"),
    (["comms", "cnn", "--layout", "model", "--mesh", "data=3,model=4"], USAGE, "mesh data=3,model=4 has 12 devices"),
    # zoo data list / show / prepare
    (["data", "list", "--data-dir", "{file}"], USAGE, "--data-dir '{file}': cannot be a data folder: {file} is a file"),
    (["data", "show", "digits", "--count", "-1"], USAGE, "argument --count: expected an integer >= 1, got '-1'"),
    (["data", "show", "digits", "--count", "0"], USAGE, "argument --count: expected an integer >= 1, got '0'"),
    (
        ["data", "show", "digits", "--output", "{file}/grid.png"],
        USAGE,
        "--output '{file}/grid.png': cannot be written: {file} is a file",
    ),
    (["data", "show", "digits", "--output", "/sys/grid.png"], USAGE, "--output '/sys/grid.png': cannot be written"),
    (["data", "show", "digits", "--output", "{dir}"], USAGE, "--output '{dir}': is a folder"),
    (["data", "show", "digits", "--split", "bogus"], USAGE, "dataset 'digits' has no split 'bogus'"),
    (["data", "show", "nope"], USAGE, "unknown dataset 'nope'"),
    (["data", "show", "mnist", "--data-dir", "{dir}"], RUNTIME, "zoo data prepare mnist --data-dir {dir}"),
    (["data", "prepare", "nope"], USAGE, "unknown dataset 'nope'"),
    (["data", "erase"], USAGE, "argument action: invalid choice: 'erase'"),
]


def _forbidden(*args, **kwargs):
    raise AssertionError("a bad input reached Model.compile or Model.fit")


@pytest.fixture
def paths(tmp_path, monkeypatch, capsys):
    """The files the table refers to, in a fresh working folder (a job's default output
    folder, runs/, must not appear in the repository). The embedded corpus is prepared
    first: TFDS's progress bars on first use are not part of an error."""
    from zoo.data import tfds_source

    tfds_source.prepare("zoo_python_docs")
    capsys.readouterr()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(keras.Model, "compile", _forbidden)
    monkeypatch.setattr(keras.Model, "fit", _forbidden)
    (tmp_path / "a_file").write_text("not a folder")
    (tmp_path / "empty_dir").mkdir()
    (tmp_path / "recipes").mkdir()
    for name in ("a.toml", "b.toml"):
        (tmp_path / "recipes" / name).write_text('[recipe]\njob = "train_cnn"\n')
    (tmp_path / "empty.keras").write_bytes(b"")
    (tmp_path / "junk.keras").write_bytes(bytes(range(256)) * 16)
    (tmp_path / "model.h5").write_bytes(b"h5")
    (tmp_path / "latin1.toml").write_bytes('[recipe]\njob = "train_cnn"\n# café\n'.encode("latin-1"))
    (tmp_path / "bad.toml").write_text("[recipe\n")
    names = {
        "file": "a_file",
        "dir": "empty_dir",
        "folder": "recipes",
        "empty": "empty.keras",
        "junk": "junk.keras",
        "h5": "model.h5",
        "latin1": "latin1.toml",
        "badtoml": "bad.toml",
        "missing": "missing.keras",
    }
    return {key: str(tmp_path / name) for key, name in names.items()}


def _run(argv, capsys):
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def _assert_one_error_line(code, out, err, expected_code, expected_text):
    assert "Traceback" not in out + err
    lines = err.splitlines()
    assert code == expected_code, err
    assert len(lines) == 1 and lines[0].startswith("zoo: error: "), err
    assert expected_text in lines[0], lines[0]


@pytest.mark.parametrize("argv, expected_code, expected_text", CASES, ids=[" ".join(case[0]) for case in CASES])
def test_bad_input_is_one_line_and_the_right_exit_status(argv, expected_code, expected_text, paths, capsys):
    argv = [word.format(**paths) for word in argv]
    code, out, err = _run(argv, capsys)
    _assert_one_error_line(code, out, err, expected_code, expected_text.format(**paths))


def test_the_table_covers_every_subcommand():
    assert len(CASES) >= 45
    covered = {
        " ".join(argv[:2]) if argv[0] in ("train", "bench", "recipe", "data") else argv[0] for argv, _, _ in CASES
    }
    for action in (
        cli.build_parser()._subparsers._group_actions[0].choices["bench"]._subparsers._group_actions[0].choices
    ):
        assert f"bench {action}" in covered
    assert {
        "train cnn",
        "train gpt",
        "train encoder",
        "train vit",
        "verify",
        "generate",
        "finetune",
        "recipe check",
        "recipe run",
        "plan",
        "comms",
        "data list",
        "data show",
        "data prepare",
    } <= covered


def test_ZOO_DATA_DIR_that_is_a_file(paths, monkeypatch, capsys):
    monkeypatch.setenv("ZOO_DATA_DIR", paths["file"])
    for argv in (["data", "list"], ["train", "cnn"]):
        _assert_one_error_line(*_run(argv, capsys), USAGE, f"$ZOO_DATA_DIR '{paths['file']}': cannot be a data folder")


def test_data_prepare_offline_fails_fast_saying_how_to_prepare_elsewhere(paths, monkeypatch, capsys):
    """The download host does not answer (192.0.2.1 is TEST-NET-1, never routed): one line
    within the timeout, not TFDS's minutes of retries."""
    from zoo.data import tfds_source

    for name in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setitem(tfds_source.DOWNLOAD_HOSTS, "mnist", "http://192.0.2.1:9")
    monkeypatch.setattr(tfds_source, "REACH_TIMEOUT_S", 0.3)
    start = time.monotonic()
    code, out, err = _run(["data", "prepare", "mnist", "--data-dir", paths["dir"]], capsys)
    assert time.monotonic() - start < 10
    _assert_one_error_line(code, out, err, RUNTIME, "Dataset 'mnist' is not reachable: 192.0.2.1:9 did not answer")
    assert (
        f"Prepare it on a machine with internet (`zoo data prepare mnist --data-dir DIR`), then copy DIR/mnist to {paths['dir']}/mnist here"
        in err
    )


def test_debug_shows_the_traceback(paths, monkeypatch, capsys):
    argv = ["train", "gpt", "--dataset", "shapes"]
    code, _, err = _run(["--debug", *argv], capsys)
    assert code == USAGE and "Traceback (most recent call last)" in err and "in _check_dataset" in err
    assert err.splitlines()[-1].startswith("zoo: error: --dataset 'shapes' is image classification data")
    monkeypatch.setenv("ZOO_DEBUG", "1")
    code, _, err = _run(argv, capsys)
    assert code == USAGE and "Traceback (most recent call last)" in err
    monkeypatch.setenv("ZOO_DEBUG", "0")
    assert "Traceback" not in _run(argv, capsys)[2]


def test_an_unexpected_error_is_one_line_exit_1_naming_its_type(paths, monkeypatch, capsys):
    def broken(config):
        raise TypeError("unsupported operand type(s)\nfor +: 'int' and 'str'")

    monkeypatch.setattr("zoo.training.cnn.train", broken)
    code, out, err = _run(["train", "cnn"], capsys)
    _assert_one_error_line(
        code, out, err, RUNTIME, "TypeError: unsupported operand type(s) for +: 'int' and 'str' (zoo --debug"
    )


@pytest.mark.parametrize(
    "argv, number, resume",
    [
        (["train", "cnn", "--checkpoint-dir", "ck"], signal.SIGINT, "zoo train cnn --checkpoint-dir ck --resume"),
        (
            ["train", "cnn", "--checkpoint-dir", "ck", "--resume"],
            signal.SIGTERM,
            "zoo train cnn --checkpoint-dir ck --resume",
        ),
        (
            ["recipe", "run", "my recipe.toml"],
            signal.SIGTERM,
            "zoo recipe run 'my recipe.toml' --set checkpoint.resume=true",
        ),
    ],
)
def test_an_interrupted_run_says_how_to_resume_and_exits_128_plus_the_signal(
    argv, number, resume, paths, monkeypatch, capsys
):
    def interrupted(*args, **kwargs):
        raise TrainingInterrupted(number, 7, "ck/7")

    monkeypatch.setattr("zoo.training.cnn.train", interrupted)
    monkeypatch.setattr("zoo.cli.recipe.run", interrupted)
    code, _, err = _run(argv, capsys)
    assert code == 128 + number and "Traceback" not in err
    assert err.splitlines() == [
        f"zoo: interrupted by {signal.Signals(number).name} at step 7; checkpoint saved to ck/7; resume with: {resume}"
    ]


def test_ctrl_c_elsewhere_exits_130(paths, monkeypatch, capsys):
    def pressed(config):
        raise KeyboardInterrupt

    monkeypatch.setattr("zoo.training.cnn.train", pressed)
    code, _, err = _run(["train", "cnn"], capsys)
    assert (code, err) == (130, "zoo: interrupted\n")


def test_a_default_mesh_that_does_not_fit_simulated_devices_hints_at_mesh(paths, monkeypatch, capsys):
    """``--simulate-devices 3`` (this process keeps its 8 devices; the job sees 3): the
    default mesh data=1,model=3 cannot split the CNN's 16 filters."""
    import jax

    three = jax.devices()[:3]
    monkeypatch.setattr(zoo.cli.devices, "prepare_devices", lambda count: None)
    monkeypatch.setattr(jax, "devices", lambda *args, **kwargs: three)
    code, out, err = _run(["comms", "cnn", "--simulate-devices", "3"], capsys)
    _assert_one_error_line(
        code,
        out,
        err,
        USAGE,
        "not divisible by mesh axis 'model' of size 3; the default mesh for 3 devices was used: give --mesh SPEC, or --simulate-devices 8",
    )


HF_FOLDER = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "hf" / "llama_mha_tied"


@pytest.mark.parametrize(
    "model, max_new_tokens, message",
    [
        ("gpt_tiny_python_docs", "100", "prompt length 20 + max_new_tokens 100 = 120 exceeds max_sequence_length 64"),
        ("{keras_file}", "100", "prompt length 20 + max_new_tokens 100 = 120 exceeds max_sequence_length 64"),
        (
            str(HF_FOLDER),
            "200",
            "prompt length 19 + max_new_tokens 200 = 219 exceeds max_sequence_length 128",
        ),  # the loaded model's figure
    ],
    ids=["preset", "keras-file", "hf-folder"],
)
def test_generate_refuses_a_prompt_that_does_not_fit_before_loading_the_model(
    model, max_new_tokens, message, paths, tmp_path, monkeypatch, capsys
):
    """Told from the saved config and the tokenizer (zoo.training.saving.check_prompt_fits),
    before the model is built or a weight read: in milliseconds, not after the load."""
    keras_file = tmp_path / "config_only.keras"  # a .keras archive is read for its config.json alone
    with zipfile.ZipFile(keras_file, "w") as archive:
        archive.write(pathlib.Path(zoo.presets.preset_directory("gpt_tiny_python_docs")) / "config.json", "config.json")
    monkeypatch.setattr("zoo.training.gpt.load_causal_lm", _forbidden)
    argv = [
        "generate",
        "--model",
        model.format(keras_file=keras_file),
        "--prompt",
        "def read_file(path):",
        "--max-new-tokens",
        max_new_tokens,
    ]
    start = time.perf_counter()
    code, out, err = _run(argv, capsys)
    assert time.perf_counter() - start < 0.5
    _assert_one_error_line(code, out, err, USAGE, message)
    assert "read_file" not in out  # checked before anything is printed
