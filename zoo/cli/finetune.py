"""``zoo finetune PRESET --dataset NAME --strategy frozen|lora|full``: flags -> ``FinetuneConfig``."""

import dataclasses

from zoo.cli import _types as types
from zoo.cli import checkpoint_flags
from zoo.training.finetune import DISTRIBUTIONS, STRATEGIES, FinetuneConfig, finetune


def add_arguments(parser):
    defaults = FinetuneConfig()
    parser.add_argument("preset", help="a shipped preset's name (e.g. small_cnn_shapes) or a preset directory (a path with '/')")
    parser.add_argument("--dataset", default=defaults.dataset, help=f"classification dataset (zoo data list); default {defaults.dataset}")
    parser.add_argument("--strategy", choices=STRATEGIES, default=defaults.strategy, help=f"what trains (default {defaults.strategy})")
    parser.add_argument("--lora-rank", type=types.positive_int, default=defaults.lora_rank, help="rank r of the LoRA factors")
    parser.add_argument("--lora-alpha", type=types.positive_float, default=defaults.lora_alpha, help="LoRA scale alpha (default: alpha = r)")
    parser.add_argument("--distribution", choices=DISTRIBUTIONS, default=defaults.distribution,
                        help="single | data | model (the preset's layout map); fsdp | tp for Transformer presets")  # fmt: skip
    parser.add_argument("--mesh", default=None, help="mesh spec such as data=2,model=4; default per distribution")
    parser.add_argument("--epochs", type=types.positive_int, default=defaults.epochs)
    parser.add_argument("--batch-size", type=types.positive_int, default=defaults.batch_size, help="global batch size")
    parser.add_argument("--learning-rate", type=types.positive_float, default=None, help="Adam; default per strategy (frozen/lora 1e-2, full 3e-3)")
    parser.add_argument("--train-examples", type=types.positive_int, default=None, help="default: the whole training split")
    parser.add_argument("--test-examples", type=types.positive_int, default=None, help="default: the whole test split")
    parser.add_argument("--data-dir", default=None, help="TFDS data folder (default $ZOO_DATA_DIR, $TFDS_DATA_DIR, ~/tensorflow_datasets)")
    parser.add_argument("--seed", type=types.non_negative_int, default=defaults.seed)
    parser.add_argument("--output", default=None, help="save the fine-tuned model here as a preset (LoRA merged, adapter in lora.weights.h5)")
    parser.add_argument("--report-every", type=types.positive_int, default=defaults.report_every, help="print step time and examples/s every N steps")
    checkpoint_flags.add_arguments(parser)


def config_from(args):
    fields = {f.name for f in dataclasses.fields(FinetuneConfig)}
    return FinetuneConfig(**{k: v for k, v in vars(args).items() if k in fields})


def run(args):
    """Fine-tune as ``args`` say; returns the exit code."""
    finetune(config_from(args))
    return 0
