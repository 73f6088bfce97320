"""Writes go where they were asked (issue 46, item 5): every target is resolved as the OS
resolves it (a folder's symlink before ``..``), a symlink the zoo did not create is never
written through, an empty or root-like target is refused, and the success line names the
path where the files are. Nothing outside the target is touched."""

import os

import pytest

from tests.models.test_hf_checkpoints import FIXTURES
from zoo.cli.main import main
from zoo.file_kinds import write_target
from zoo.presets import write_folder_atomically
from zoo.training.job_setup import run_dir_of
from zoo.training.paths import PathError, resolve_output


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """tmp/work (the working folder), tmp/fo/lnk -> tmp/elsewhere/deep, tmp/other (a folder with a file)."""
    (tmp_path / "work").mkdir()
    (tmp_path / "elsewhere" / "deep").mkdir(parents=True)
    (tmp_path / "fo").mkdir()
    os.symlink(tmp_path / "elsewhere" / "deep", tmp_path / "fo" / "lnk")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "metrics.csv").write_text("precious\n")
    monkeypatch.chdir(tmp_path / "work")
    return tmp_path


def test_dotdot_after_a_symlink_is_resolved_as_the_os_does(tree):
    assert write_target(tree / "fo" / "lnk" / ".." / "exp1") == str(tree / "elsewhere" / "exp1")
    assert os.path.abspath(tree / "fo" / "lnk" / ".." / "exp1") == str(tree / "fo" / "exp1")  # what was used


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("", r"an empty path names no file or folder"),
        ("   ", r"an empty path names no file or folder"),
        ("/", r"the root, the working folder or a folder above it"),
        (".", r"the root, the working folder or a folder above it"),
        ("..", r"the root, the working folder or a folder above it"),
        ("{tree}/fo/lnk", r"is a symlink to '.*/elsewhere/deep'; the zoo does not write through a symlink"),
    ],
)
def test_empty_root_like_and_symlinked_targets_are_refused(tree, target, message):
    with pytest.raises(PathError, match=r"^--output '.*': .*" + message):
        resolve_output(target.format(tree=tree))
    with pytest.raises(FileExistsError, match=message):
        write_folder_atomically(target.format(tree=tree), lambda folder: None)
    assert sorted(os.listdir(tree)) == ["elsewhere", "fo", "other", "work"] and not os.listdir(tree / "work")


def test_a_run_folder_that_is_a_symlink_is_refused(tree):
    os.symlink(tree / "other", tree / "work" / "exp.run")
    with pytest.raises(PathError, match=r"its run folder .*/work/exp.run is a symlink to '.*/other'"):
        run_dir_of("exp.keras")
    assert (tree / "other" / "metrics.csv").read_text() == "precious\n"


def test_zoo_export_to_an_empty_path_is_one_line_and_writes_nothing(tree, capsys):
    assert main(["export", str(FIXTURES / "llama_mha_tied"), ""]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == ["zoo: error: --output '': an empty path names no file or folder; give a path"], lines
    assert sorted(os.listdir(tree)) == ["elsewhere", "fo", "other", "work"] and not os.listdir(tree / "work")


def test_zoo_export_says_where_it_wrote(tree, capsys):
    assert main(["export", str(FIXTURES / "llama_mha_tied"), "../fo/lnk/../exp1"]) == 0
    out = capsys.readouterr().out
    assert f"wrote {tree / 'elsewhere' / 'exp1'}: GPTCausalLM" in out, out
    assert (tree / "elsewhere" / "exp1" / "model.safetensors").is_file() and not (tree / "fo" / "exp1").exists()
