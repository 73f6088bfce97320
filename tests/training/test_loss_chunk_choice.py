"""--loss-chunk-size auto: the whole logits while they are small beside the device's memory,
chunks of 512 above 1/8 of it; whole and a number as given; on CPU the whole logits."""

import pytest

from zoo.config import schema
from zoo.config.schema import SettingError
from zoo.config.settings import GPTTrainSettings
from zoo.models import GPTCausalLM
from zoo.training.loss_chunk_choice import AUTO_CHUNK, choose_loss_chunk, resolve_loss_chunk, sized_for
from zoo.units import GIB

V5E = int(15.75 * GIB)


@pytest.mark.parametrize(
    ("setting", "vocabulary", "devices", "chunk"),
    [
        ("auto", 32_000, 1, None),  # gpt_1b b4: 0.98 GiB of logits, the whole loss measured faster
        ("auto", 128_256, 1, AUTO_CHUNK),  # llama_3_2_1b b4: 3.91 GiB, over 1/8 of 15.75
        ("auto", 128_256, 2, None),  # 1.96 GiB per device: just under 1/8 of 15.75 GiB (1.97)
        ("whole", 128_256, 1, None),
        (None, 128_256, 1, None),
        (256, 32_000, 1, 256),
    ],
)
def test_auto_weighs_the_float32_logits_per_device_against_an_eighth_of_its_memory(setting, vocabulary, devices, chunk):
    choice = choose_loss_chunk(
        setting, batch_size=4, length=2048, vocabulary=vocabulary, memory_bytes=V5E, devices=devices
    )
    assert choice.chunk == chunk
    if setting == "auto":
        assert f"{vocabulary:,} tokens x words" in choice.why and "per device" in choice.why


def test_auto_keeps_the_whole_logits_in_host_memory():
    choice = choose_loss_chunk("auto", batch_size=64, length=8192, vocabulary=152_064, memory_bytes=None, devices=1)
    assert choice.chunk is None and choice.why == "on CPU, in host memory: no device memory to weigh the logits against"


def test_a_job_resolves_auto_for_its_device_or_for_the_planned_one_and_reports_it():
    model = GPTCausalLM.from_config_name("gpt_tiny", num_layers=1)  # V = 256
    logits = 4 * 2 * 64 * 256  # float32 bytes of a 2 x 64 batch
    said = []
    assert resolve_loss_chunk("auto", model, 2, 64, report=said.append) is None  # this CPU: host memory
    with sized_for(8 * logits - 1, 1) as sizing:
        assert resolve_loss_chunk("auto", model, 2, 64, report=said.append) == AUTO_CHUNK
        assert resolve_loss_chunk(16, model, 2, 64, report=said.append) == 16  # given: not reported
    with sized_for(8 * logits, 1):
        assert resolve_loss_chunk("auto", model, 2, 64) is None
    assert [choice.chunk for choice in sizing.choices] == [AUTO_CHUNK]
    assert said[0].startswith("loss from the whole logits (--loss-chunk-size auto: on CPU, in host memory")
    assert said[1].startswith(f"loss in chunks of {AUTO_CHUNK} (--loss-chunk-size auto: float32 logits of 2 x 64")
    assert len(said) == 2


def test_the_flag_and_the_recipe_key_take_auto_whole_or_a_count():
    from zoo.cli.main import build_parser

    def parsed(*flag):
        return schema.from_args(GPTTrainSettings, build_parser().parse_args(["train", "gpt", *flag])).loss_chunk_size

    assert (parsed(), parsed("--loss-chunk-size", "whole"), parsed("--loss-chunk-size", "64")) == ("auto", "whole", 64)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "gpt", "--loss-chunk-size", "0"])
    assert GPTTrainSettings(loss_chunk_size="whole").loss_chunk_size == "whole"
    with pytest.raises(SettingError, match="expected auto, whole or an integer >= 1, got 'half'"):
        GPTTrainSettings(loss_chunk_size="half")
