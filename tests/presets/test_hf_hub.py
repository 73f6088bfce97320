"""hf://org/name: a cached snapshot is used with no network; with neither, a one-line
error says how to place the files (huggingface-hub, the [hf] extra)."""

import shutil

import pytest

from zoo.presets import hf_hub

huggingface_hub = pytest.importorskip("huggingface_hub")
constants = pytest.importorskip("huggingface_hub.constants")


@pytest.fixture
def offline_cache(tmp_path, monkeypatch):
    """An empty Hugging Face cache in tmp_path, and no network (HF_HUB_OFFLINE)."""
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return tmp_path / "hub"


def test_offline_without_a_copy_says_how_to_place_the_files(offline_cache):
    with pytest.raises(OSError) as error:
        hf_hub.local_directory("hf://meta-llama/Llama-3.2-1B")
    message = str(error.value)
    assert (
        "cannot download 'meta-llama/Llama-3.2-1B'" in message
        and "huggingface-cli download meta-llama/Llama-3.2-1B --local-dir DIR" in message
    )
    assert "\n" not in message


def test_offline_with_a_cached_snapshot_loads_it(offline_cache):
    from tests.models.test_hf_checkpoints import FIXTURES

    revision = "0123456789abcdef0123456789abcdef01234567"
    repository = offline_cache / "models--org--tiny"
    shutil.copytree(FIXTURES / "llama_mha_tied", repository / "snapshots" / revision)
    (repository / "refs").mkdir()
    (repository / "refs" / "main").write_text(revision)
    folder = hf_hub.local_directory("hf://org/tiny")
    assert folder.endswith(revision)
    from zoo.models import GPTCausalLM

    assert GPTCausalLM.from_preset("hf://org/tiny", load_weights=False).backbone.vocabulary_size == 320


@pytest.mark.parametrize("name", ["hf://nope", "hf://a/b/c", "hf:///x"])
def test_a_malformed_name_is_named(name):
    with pytest.raises(ValueError, match="is not hf://org/name"):
        hf_hub.local_directory(name)


def test_the_generic_from_preset_points_a_hugging_face_folder_to_gpt_causal_lm():
    from tests.models.test_hf_checkpoints import FIXTURES
    from zoo.presets import PresetError, from_preset

    with pytest.raises(PresetError, match=r"is a Hugging Face folder .* load it with GPTCausalLM.from_preset"):
        from_preset(FIXTURES / "qwen2")
