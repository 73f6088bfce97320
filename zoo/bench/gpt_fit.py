"""``zoo bench gpt``: tokens/s of ``model.fit`` against a hand-written ``jax.jit`` step.

The same GPT (``config_name``, byte-level) trains two ways on the same mesh, from the
same host token windows of the embedded corpus, for each layout: data parallel,
tensor parallel (data=2,model=4) and context parallel (data=2,seq=4, ring attention).
How the two loops are timed and checked to do the same maths: ``zoo.bench._fit_vs_jit``.
"""

import dataclasses

import jax
import keras

from zoo import distribution as zd
from zoo.bench._fit_vs_jit import measure
from zoo.bench._output import write_text
from zoo.data import load
from zoo.models import GPTCausalLM
from zoo.training.gpt import compile_gpt
from zoo.training.transformer_setup import resolve_transformer_distribution, strategy_overrides

# strategy -> (label, mesh spec); None mesh: the strategy's default on 8 devices.
LAYOUTS = {
    "data": ("DataParallel", None),
    "tp": ("tensor parallel", "data=2,model=4"),
    "context": ("context parallel (ring)", "data=2,seq=4"),
}
SEED = 0


@dataclasses.dataclass
class GPTBenchConfig:
    """Settings of ``zoo bench gpt``; every default is the CLI's default."""

    config_name: str = "gpt_small"  # zoo.models.gpt.GPT_CONFIGS name
    sequence_length: int = 128  # tokens per example (T); must divide by the seq axis
    batch_size: int = 32  # global batch; must divide by the data axis
    steps: int = 10  # timed optimizer steps per measurement (= one fit epoch)
    repeats: int = 3  # alternating fit / jit measurements; the median of each is reported
    output: str | None = None  # also write the markdown table to this file
    strategies: tuple = tuple(LAYOUTS)  # which layouts to measure (data, tp, context)


def run_benchmark(config, report=print):
    """Measure every layout, report the markdown table, return one dict per layout."""
    x, y = load("python_docs", "train", sequence_length=config.sequence_length, num_examples=config.steps * config.batch_size)
    if len(x) < config.steps * config.batch_size:
        raise ValueError(f"the corpus has {len(x)} windows of {config.sequence_length} tokens; lower --steps or --batch-size")
    unknown = [s for s in config.strategies if s not in LAYOUTS]
    if unknown:
        raise ValueError(f"unknown layout(s) {unknown}; choose from {list(LAYOUTS)}")
    rows = []
    try:
        for strategy in config.strategies:
            label, mesh = LAYOUTS[strategy]
            distribution = resolve_transformer_distribution(GPTCausalLM, strategy, mesh)
            rows.append(
                measure(label, distribution, _builder(config, strategy), x, y, batch_size=config.batch_size,
                        repeats=config.repeats, seed=SEED, unit="tokens", per_example=config.sequence_length, report=report)
            )  # fmt: skip
    finally:
        keras.distribution.set_distribution(None)
    table = format_table(rows, config)
    report(table)
    if config.output:
        write_text(config.output, table)
    return rows


def _builder(config, strategy):
    def build_model():
        model = GPTCausalLM.from_config_name(config.config_name, seed=SEED, **strategy_overrides(strategy))
        compile_gpt(model, learning_rate=1e-3, total_steps=1000)
        return model

    return build_model


def format_table(rows, config):
    header = (
        f"devices: {zd.describe_devices()}; {config.config_name}, T={config.sequence_length}, global batch "
        f"{config.batch_size}, {config.steps} steps, median of {config.repeats}; jax {jax.__version__}, keras {keras.__version__}"
    )
    lines = [header, "", "| layout | mesh | fit tokens/s | jax.jit tokens/s | ratio fit/jit |", "| --- | --- | ---: | ---: | ---: |"]
    for row in rows:
        lines.append(f"| {row['layout']} | {row['mesh']} | {row['fit_per_s']:,.0f} | {row['jit_per_s']:,.0f} | {row['ratio']:.3f} |")
    return "\n".join(lines)
