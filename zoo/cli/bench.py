"""``zoo bench X``: every benchmark's flags and how it runs, in one module.

``add_arguments(parser)`` adds one subcommand per benchmark to the ``zoo bench`` parser,
its flags generated from its settings (``zoo.config.bench_settings``), and sets
``func`` to run it; the benchmark itself (``zoo.bench.<module>.run_benchmark``) is
imported only then, so ``zoo bench X --help`` loads neither JAX nor Keras.
``python -m zoo.cli.bench X ...`` does the same on its own.
"""

import dataclasses
import importlib
import sys

from zoo.cli.devices import add_simulate_flag
from zoo.config import bench_moe_settings, bench_peers_settings, bench_settings, bench_step_settings, schema
from zoo.config.layouts import PIPELINE


@dataclasses.dataclass(frozen=True)
class Bench:
    """One ``zoo bench`` subcommand."""

    help: str
    settings: type  # its settings dataclass (zoo.config.bench_settings)
    module: str  # zoo.bench.<module>: run_benchmark(settings) -> results
    simulate: bool = True  # takes --simulate-devices (the others start their own processes)


BENCHES = {
    "cnn": Bench(
        "images/s of model.fit vs a hand-written jax.jit step (SmallCNN)", bench_settings.CNNBenchSettings, "cnn_fit"
    ),
    "gpt": Bench(
        "tokens/s of model.fit vs a hand-written jax.jit step (GPT)", bench_settings.GPTBenchSettings, "gpt_fit"
    ),
    "attention": Bench(
        "per-device memory and time of sequence-parallel attention",
        bench_settings.AttentionBenchSettings,
        "attention_memory",
    ),
    "tp": Bench(
        "bytes moved and memory of tensor-parallel MLPs: explicit kernels vs GSPMD",
        bench_settings.TPBenchSettings,
        "tensor_parallel",
    ),
    "context": Bench(
        "per-device memory of a GPT training step: data- vs context-parallel",
        bench_settings.ContextBenchSettings,
        "context_parallel_memory",
    ),
    "lora-context": Bench(
        "per-device memory of LoRA fine-tuning a Llama-3.2-1B-sized GPT at 8k-128k: context vs fsdp, compile-only",
        bench_settings.LoraContextBenchSettings,
        "lora_context_memory",
    ),
    "lm-head": Bench(
        "under fsdp, what the LM head gathers (its weight or the batch's activations) chosen by size vs each forced, "
        "Llama-3.2-1B sizes at 8 and 64 devices, compile-only",
        bench_settings.LMHeadBenchSettings,
        "lm_head",
    ),
    "hf-load": Bench(
        "per-device and host memory while a Llama-3.2-1B-sized Hugging Face checkpoint loads under fsdp / tp",
        bench_settings.HFLoadBenchSettings,
        "hf_load",
    ),
    PIPELINE: Bench(  # the pipeline layout's bench
        "the pipeline's bubble measured through the kernel (S=4, M=4..32, GPipe and circular) and per-device memory of a "
        "pipelined Llama-3.2-1B-sized GPT, compile-only",
        bench_settings.PipelineBenchSettings,
        PIPELINE,  # its module, zoo.bench.pipeline, is named after the layout
    ),
    "moe": Bench(
        "Mixture-of-Experts: all-to-all bytes vs the minimum, expert weights per device, tokens dropped, Mixtral-8x7B "
        "LoRA / full steps compile-only, sparse vs dense-masked time",
        bench_moe_settings.MoEBenchSettings,
        "moe",
    ),
    "window": Bench(
        "sliding-window attention: blockwise tiles and memory at T=32k, W=4k; ring hops and bytes, all-gather and Ulysses "
        "at T=128k on 8 devices, vs full causal, compile-only",
        bench_settings.WindowBenchSettings,
        "sliding_window",
    ),
    "scale": Bench(
        "gpt_1b at real size, compile-only: recipe steps, attention, fsdp+tp weights, TP bytes",
        bench_settings.ScaleBenchSettings,
        "scale",
        simulate=False,
    ),
    "peers": Bench(
        "the zoo and MaxText 0.2.5 side by side on one Llama-style model (each in its own process and environment): "
        "parameters checked equal, memory, bytes per mesh axis, FLOPs (Llama-3.2-1B, compile-only), interleaved "
        "step-time ratio",
        bench_peers_settings.PeersBenchSettings,
        "peers",
        simulate=False,
    ),
    "step": Bench(
        "the training step of a named GPT on this host's devices (TPU, GPU or CPU): step time, tokens/s, MFU, "
        "compile time, peak memory, where the time goes, zoo plan and keras-hub beside it",
        bench_step_settings.StepBenchSettings,
        "step",
    ),
    "plan": Bench(
        "zoo plan on every recipe, gpt_1b at 64/256 devices, the planner's three scenarios",
        bench_settings.PlanBenchSettings,
        "plan",
        simulate=False,
    ),
}


def add_arguments(parser):
    """One subparser per benchmark on ``parser`` (the ``zoo bench`` parser), each with
    ``func`` set to run it."""
    benches = parser.add_subparsers(dest="bench", required=True, metavar="BENCH")
    for name, bench in BENCHES.items():
        sub = benches.add_parser(name, help=bench.help, description=bench.settings.__doc__.splitlines()[0])
        schema.add_flags(sub, bench.settings)
        if bench.simulate:
            add_simulate_flag(sub)
        sub.set_defaults(func=_runner(name))


def _runner(name):
    def run(args):
        return run_bench(name, args)

    run.__name__ = f"run_{name}"
    return run


def settings_from_args(name, args):
    """The benchmark's settings from parsed flags."""
    return schema.from_args(BENCHES[name].settings, args)


def run_bench(name, args):
    """Runs benchmark ``name`` from parsed flags; returns the exit status (1: some
    measurement failed; a goal missed is still 0, the report says so)."""
    module = importlib.import_module(f"zoo.bench.{BENCHES[name].module}")
    results = module.run_benchmark(settings_from_args(name, args))
    return 1 if _has_errors(results) else 0


def _has_errors(results):
    """Rows carrying an ``error`` (scale: a list of rows; plan: a dict of lists of rows)."""
    groups = results.values() if isinstance(results, dict) else [results]
    return any(isinstance(row, dict) and "error" in row for rows in groups if isinstance(rows, list) for row in rows)


def main(argv=None):
    """``python -m zoo.cli.bench X ...``: the same commands, devices prepared as ``zoo``
    prepares them, the same error contract; returns the exit status."""
    from zoo.cli._errors import ArgumentParser, parse, run_guarded

    parser = ArgumentParser(prog="python -m zoo.cli.bench", description=__doc__.splitlines()[0])
    add_arguments(parser)
    argv = sys.argv[1:] if argv is None else list(argv)
    args, status = parse(parser, argv)
    return status if args is None else run_guarded(lambda: _prepare_and_run(args), ["python -m zoo.cli.bench", *argv])


def _prepare_and_run(args):
    from zoo.cli.devices import prepare_devices

    message = prepare_devices(getattr(args, "simulate_devices", None))
    if message:
        print(message, flush=True)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
