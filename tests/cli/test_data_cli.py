import tensorflow_datasets as tfds

from zoo.cli.main import main


def test_data_list_shows_every_dataset_and_preparation(tmp_path, capsys):
    assert main(["data", "list", "--data-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == f"data dir: {tmp_path}"
    for name in (
        "shapes",
        "digits",
        "python_docs",
        "python_docs_topics",
        "mnist",
        "cifar10",
        "imdb_reviews",
        "tiny_shakespeare",
    ):
        assert f"\n{name} " in out
    assert main(["data", "prepare", "digits", "--data-dir", str(tmp_path)]) == 0
    capsys.readouterr()
    assert main(["data", "list", "--data-dir", str(tmp_path)]) == 0
    digits_row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("digits "))
    assert "train 1437, validation 180, test 180" in digits_row and "array_record" in digits_row


def test_data_show_writes_a_png_grid(tmp_path, capsys):
    output = tmp_path / "grid.png"
    assert main(["data", "show", "digits", "--split", "test", "--count", "10", "--output", str(output)]) == 0
    out = capsys.readouterr().out
    assert "digits [test]: 180 examples" in out and f"wrote 10 images to {output}" in out
    assert output.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_data_show_text(capsys):
    assert main(["data", "show", "python_docs_topics", "--split", "validation"]) == 0
    out = capsys.readouterr().out
    assert "python_docs_topics [validation]" in out and "[statements]" in out


def test_unprepared_public_dataset_says_how_to_prepare(tmp_path, capsys):
    assert (
        main(["data", "show", "mnist", "--data-dir", str(tmp_path)]) == 1
    )  # a runtime failure: the data are not there
    assert f"zoo data prepare mnist --data-dir {tmp_path}" in capsys.readouterr().err


def test_train_on_mocked_mnist(tmp_path, capsys):
    with tfds.testing.mock_data(num_examples=64):
        args = ["train", "cnn", "--dataset", "mnist", "--layout", "data", "--epochs", "1", "--data-dir", str(tmp_path)]
        assert main(args + ["--output", str(tmp_path / "m.keras")]) == 0
    out = capsys.readouterr().out
    # (the mock ignores split slicing, so train[:90%] also has 64 rows)
    assert "dataset: mnist" in out and "64 training images" in out and "held-out test accuracy" in out


def test_train_on_digits_beats_90_percent(tmp_path, capsys):
    # 2 epochs, not the default 5: 0.95 on the 180 test digits (0.96 after 5), already > 0.9
    args = ["train", "cnn", "--dataset", "digits", "--epochs", "2"]
    assert main(args + ["--output", str(tmp_path / "digits.keras")]) == 0
    out = capsys.readouterr().out
    accuracy = float(out.split("held-out test accuracy: ")[1].split()[0])
    assert accuracy > 0.9, out[-2000:]
