"""``zoo bench gpt``: tokens/s of ``model.fit`` against a hand-written ``jax.jit`` step.

The same GPT (``config_name``, byte-level) trains two ways on the same mesh, from the
same host token windows of the embedded corpus, for each layout: data parallel,
tensor parallel (data=2,model=4) and context parallel (data=2,seq=4, ring attention).
How the two loops are timed and checked to do the same maths: ``zoo.bench._fit_vs_jit``.
"""

import jax
import keras

from zoo import distribution as zd
from zoo.bench._fit_vs_jit import measure
from zoo.bench._output import publish
from zoo.config.bench_settings import GPTBenchSettings  # noqa: F401 (the settings run_benchmark takes)
from zoo.config.choices import DEFAULT_CONTEXT_ATTENTION
from zoo.data import load
from zoo.models import GPTCausalLM
from zoo.training.gpt import compile_gpt

# layout (GPT_BENCH_LAYOUTS) -> (label, mesh spec); None mesh: the layout's default on 8 devices.
LAYOUTS = {
    "data": ("DataParallel", None),
    "tp": ("tensor parallel", "data=2,model=4"),
    "context": ("context parallel (ring)", "data=2,seq=4"),
}
SEED = 0


def run_benchmark(settings, report=print):
    """Measure every layout of ``settings`` (``zoo.config.bench_settings.GPTBenchSettings``),
    report the markdown table, return one dict per layout."""
    x, y = load(
        "python_docs",
        "train",
        sequence_length=settings.sequence_length,
        num_examples=settings.steps * settings.batch_size,
    )
    if len(x) < settings.steps * settings.batch_size:
        raise ValueError(
            f"the corpus has {len(x)} windows of {settings.sequence_length} tokens; lower --steps or --batch-size"
        )
    unknown = [layout for layout in settings.layouts if layout not in LAYOUTS]
    if unknown:
        raise ValueError(f"unknown layout(s) {unknown}; choose from {list(LAYOUTS)}")
    rows = []
    try:
        for layout in settings.layouts:
            label, mesh = LAYOUTS[layout]
            context = {"context_attention": DEFAULT_CONTEXT_ATTENTION} if layout == "context" else {}
            distribution = zd.distribution_for(GPTCausalLM, layout, mesh, **context)
            rows.append(
                measure(
                    label,
                    distribution,
                    _builder(settings, layout),
                    x,
                    y,
                    batch_size=settings.batch_size,
                    repeats=settings.repeats,
                    seed=SEED,
                    unit="tokens",
                    per_example=settings.sequence_length,
                    report=report,
                )
            )
    finally:
        keras.distribution.set_distribution(None)
    table = format_table(rows, settings)
    publish(table, settings, report)
    return rows


def _builder(settings, layout):
    def build_model():
        model = GPTCausalLM.from_config_name(settings.config_name, layout, seed=SEED)  # tp+sp: megatron_sp
        compile_gpt(model, learning_rate=1e-3, total_steps=1000)
        return model

    return build_model


def format_table(rows, settings):
    header = (
        f"devices: {zd.describe_devices()}; {settings.config_name}, T={settings.sequence_length}, global batch "
        f"{settings.batch_size}, {settings.steps} steps, median of {settings.repeats}; jax {jax.__version__}, keras {keras.__version__}"
    )
    lines = [
        header,
        "",
        "| layout | mesh | fit tokens/s | jax.jit tokens/s | ratio fit/jit |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for row in rows:
        lines.append(
            f"| {row['layout']} | {row['mesh']} | {row['fit_per_s']:,.0f} | {row['jit_per_s']:,.0f} | {row['ratio']:.3f} |"
        )
    return "\n".join(lines)
