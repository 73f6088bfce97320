"""Flags of ``zoo train gpt|encoder|vit``, ``zoo generate`` and ``zoo bench gpt``.

Each ``add_*`` function adds a job's flags (defaults from its config dataclass) to a
parser; each ``run_*`` function turns parsed flags into that config and runs the job.
"""

import dataclasses

from zoo.cli import _types as types
from zoo.cli import checkpoint_flags

STRATEGY_HELP = "layout strategy: single | data | fsdp | tp | tp+sp | fsdp+tp | context (see docs/models.md)"


def _none_or(text):
    return None if text in ("none", "None", "") else text


def _add_layout_flags(parser, defaults, extra=()):
    from zoo.training.transformer_setup import TRANSFORMER_STRATEGIES

    help_text = STRATEGY_HELP + ("; auto: the best that fits, by zoo plan --auto (docs/planning.md)" if "auto" in extra else "")
    parser.add_argument("--strategy", "--distribution", dest="strategy", choices=TRANSFORMER_STRATEGIES + tuple(extra), default=defaults.strategy, help=f"{help_text} (default {defaults.strategy})")
    parser.add_argument("--mesh", default=None, help="mesh spec such as data=2,model=4 or data=2,seq=4 (one axis may be -1); default per strategy")
    parser.add_argument("--attention", choices=["gather", "ring", "ulysses"], default=defaults.attention, help="context strategy: the sequence-parallel attention kernel")


def add_gpt_train(parser):
    from zoo.layers.transformer_block import REMATS
    from zoo.training.gpt import GPTTrainConfig

    d = GPTTrainConfig()
    _add_layout_flags(parser, d, extra=("auto",))
    parser.add_argument("--balance", type=_none_or, choices=[None, "zigzag", "striped"], default=d.balance, help="context strategy: causal load balancing (default none)")
    parser.add_argument("--config", dest="config_name", default=d.config_name, help=f"named size (zoo.models.GPT_CONFIGS; default {d.config_name})")
    parser.add_argument("--dataset", default=d.dataset)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--sequence-length", type=types.sequence_length, default=d.sequence_length)
    parser.add_argument("--batch-size", type=types.positive_int, default=d.batch_size, help="global batch size")
    parser.add_argument("--epochs", type=types.positive_int, default=d.epochs)
    parser.add_argument("--steps-per-epoch", type=types.positive_int, default=d.steps_per_epoch)
    parser.add_argument("--learning-rate", type=types.positive_float, default=d.learning_rate)
    parser.add_argument("--dropout", type=types.dropout, default=d.dropout)
    parser.add_argument("--seed", type=types.non_negative_int, default=d.seed)
    parser.add_argument("--output", default=d.output, help="path of the saved .keras model")
    parser.add_argument("--precision", choices=["float32", "mixed_bfloat16"], default=d.precision, help="mixed_bfloat16: bf16 compute, float32 weights")
    parser.add_argument(
        "--remat", nargs="?", const="full", choices=REMATS, default=d.remat,
        help="what each block keeps for the backward pass: none (everything), full (only its input: recompute the rest), "
        f"dots_saveable (matmul outputs); --remat alone means full (default {d.remat})",
    )  # fmt: skip
    parser.add_argument("--gradient-accumulation-steps", type=types.positive_int, default=d.gradient_accumulation_steps)
    parser.add_argument("--report-every", type=types.positive_int, default=d.report_every, help="print step time, tokens/s and MFU every N steps")
    parser.add_argument("--peak-tflops", type=types.positive_float, default=d.peak_tflops, help="device peak for MFU (default: looked up from the device kind)")
    parser.add_argument("--profile-dir", default=d.profile_dir, help="write a jax.profiler trace of a few steps here")
    parser.add_argument("--profile-steps", type=types.positive_int, default=d.profile_steps)
    checkpoint_flags.add_arguments(parser)


def add_classifier_train(parser, model):
    from zoo.training.classifiers import ClassifierTrainConfig

    d = ClassifierTrainConfig(model=model)
    _add_layout_flags(parser, d)
    parser.add_argument("--config", dest="config_name", default=d.config_name, help=f"named size (default {d.config_name})")
    parser.add_argument("--dataset", default=d.dataset)
    parser.add_argument("--data-dir", default=None)
    if model == "encoder":
        parser.add_argument("--sequence-length", type=types.sequence_length, default=d.sequence_length)
    else:
        parser.add_argument("--image-size", type=types.image_size, default=d.image_size, help="default: the dataset's own (shapes: 16, 32, 64 or 128)")
    parser.add_argument("--batch-size", type=types.positive_int, default=d.batch_size, help="global batch size")
    parser.add_argument("--epochs", type=types.positive_int, default=d.epochs)
    parser.add_argument("--learning-rate", type=types.positive_float, default=d.learning_rate)
    parser.add_argument("--dropout", type=types.dropout, default=d.dropout)
    parser.add_argument("--seed", type=types.non_negative_int, default=d.seed)
    parser.add_argument("--output", default=d.output, help="path of the saved .keras model")


def add_generate(parser):
    from zoo.training.gpt import GenerateConfig

    d = GenerateConfig()
    parser.add_argument("--model", default=d.model, help=f"a .keras file saved by zoo train gpt (default {d.model})")
    parser.add_argument("--prompt", type=types.text, default=d.prompt, help="UTF-8 text, at least one character")
    parser.add_argument("--max-new-tokens", type=types.positive_int, default=d.max_new_tokens)
    parser.add_argument("--sampler", choices=["greedy", "top_k", "top_p"], default=d.sampler)
    parser.add_argument("--temperature", type=types.positive_float, default=d.temperature)
    parser.add_argument("--top-k", type=types.positive_int, default=d.top_k)
    parser.add_argument("--top-p", type=types.probability, default=d.top_p, help="in (0, 1]")
    parser.add_argument("--seed", type=types.non_negative_int, default=d.seed)


def add_gpt_bench(parser):
    from zoo.bench.gpt_fit import LAYOUTS, GPTBenchConfig

    d = GPTBenchConfig()
    parser.add_argument("--config", dest="config_name", default=d.config_name)
    parser.add_argument("--sequence-length", type=types.sequence_length, default=d.sequence_length)
    parser.add_argument("--batch-size", type=types.positive_int, default=d.batch_size)
    parser.add_argument("--steps", type=types.positive_int, default=d.steps, help="timed steps per measurement")
    parser.add_argument("--repeats", type=types.positive_int, default=d.repeats)
    parser.add_argument("--output", default=d.output, help="write the markdown table here too")
    parser.add_argument("--strategies", type=types.comma_separated(tuple(LAYOUTS), "strategy"), default=d.strategies, help=f"layouts measured (default {','.join(d.strategies)})")


def _config_from(args, config_class):
    fields = {f.name for f in dataclasses.fields(config_class)}
    return config_class(**{k: v for k, v in vars(args).items() if k in fields})


def run_train(args):
    if args.model == "gpt":
        from zoo.training import gpt

        config = _config_from(args, gpt.GPTTrainConfig)
        if config.strategy == "auto":
            from zoo.planning.search import choose_layout

            config = choose_layout(config)
        gpt.train(config)
    else:
        from zoo.training import classifiers

        classifiers.train(_config_from(args, classifiers.ClassifierTrainConfig))  # args.model: encoder | vit
    return 0


def run_generate(args):
    from zoo.training import gpt

    gpt.generate(_config_from(args, gpt.GenerateConfig))
    return 0


def run_bench(args):
    from zoo.bench.gpt_fit import GPTBenchConfig, run_benchmark

    run_benchmark(_config_from(args, GPTBenchConfig))
    return 0
