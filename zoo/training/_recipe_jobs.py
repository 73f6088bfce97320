"""The jobs a recipe can drive: where each lives, how recipe keys map onto its config
dataclass, and how to build its distribution and model for an abstract check.

Nothing here re-implements a job: every adapter calls the job module's own functions
(``resolve_transformer_distribution``, ``build_gpt``/``build_for_training``,
``compile_gpt``, ``zoo.training.cnn.build_cnn``, ...). A recipe key maps onto a job
config field by name; a key whose field the job's config lacks is reported, never
dropped (``UnsupportedKeyError``).
"""

import dataclasses
import importlib

from zoo.training._recipe_schema import SECTIONS, RecipeError

RECIPE_ONLY_SECTIONS = ("recipe", "target", "multihost")  # read by the recipe runner, not by the job

# "section.key" -> job config field, for every job unless a job renames or drops the key.
COMMON_FIELDS = {
    "model.name": "config_name",
    "model.dropout": "dropout",
    "parallel.strategy": "strategy",
    "parallel.mesh": "mesh",
    "parallel.attention": "attention",
    "parallel.balance": "balance",
    "data.dataset": "dataset",
    "data.data_dir": "data_dir",
    "data.image_size": "image_size",
    "data.train_examples": "train_examples",
    "data.test_examples": "test_examples",
    "train.global_batch": "batch_size",
    "train.sequence_length": "sequence_length",
    "train.precision": "precision",
    "train.remat": "remat",
    "train.gradient_accumulation_steps": "gradient_accumulation_steps",
    "train.epochs": "epochs",
    "train.steps_per_epoch": "steps_per_epoch",
    "train.learning_rate": "learning_rate",
    "train.weight_decay": "weight_decay",
    "train.seed": "seed",
    "train.output": "output",
    "checkpoint.dir": "checkpoint_dir",
    "checkpoint.every": "checkpoint_every",
    "checkpoint.keep": "keep",
    "checkpoint.resume": "resume",
    "logging.every_steps": "report_every",
    "logging.profile_dir": "profile_dir",
    "logging.profile_steps": "profile_steps",
    "logging.peak_tflops": "peak_tflops",
}


def _schema_order(dotted):
    section, _, key = dotted.partition(".")
    return list(SECTIONS).index(section), key


class JobUnavailableError(RecipeError):
    """The job's module, config class or function cannot be found (yet)."""


class UnsupportedKeyError(RecipeError):
    """The recipe sets keys its job's config has no field for.

    ``keys``: the offending ``"section.key"`` names; ``plan``: the abstract plan when
    ``check_recipe`` got that far (the other checks passed), else None.
    """

    def __init__(self, message, keys, plan=None):
        super().__init__(message)
        self.keys, self.plan = tuple(keys), plan


class Job:
    """A job function and its config dataclass, named by module and attribute."""

    name = module_name = config_class_name = function_name = None
    renames = {}  # "section.key" -> this job's field name, where it differs from COMMON_FIELDS
    fixed = {}  # "section.key" -> the only value allowed; checked, not passed to the job

    def fields(self):
        """``{"section.key": job config field}`` for this job."""
        fields = {**COMMON_FIELDS, **self.renames}
        return {k: v for k, v in fields.items() if k not in self.fixed}

    def load(self):
        """``(module, config class, job function)``; ``JobUnavailableError`` names what is missing."""
        try:
            module = importlib.import_module(self.module_name)
        except ImportError as error:
            raise JobUnavailableError(f"job {self.name!r} needs {self.module_name}, which cannot be imported: {error}") from None
        missing = [n for n in (self.config_class_name, self.function_name) if not hasattr(module, n)]
        if missing:
            raise JobUnavailableError(f"job {self.name!r}: {self.module_name} has no {' or '.join(missing)}")
        return module, getattr(module, self.config_class_name), getattr(module, self.function_name)

    def config_values(self, given, values, config_class):
        """``({field: value}, [problems])`` for the given keys; ``values``: {"section.key": value}."""
        fields = self.fields()
        known = {f.name for f in dataclasses.fields(config_class)}
        passed, problems = {}, []
        for dotted in sorted(given, key=_schema_order):
            section, _, key = dotted.partition(".")
            if section in RECIPE_ONLY_SECTIONS:
                continue
            if dotted in self.fixed:
                if values[dotted] != self.fixed[dotted]:
                    raise RecipeError(f"[{section}] {key}: job {self.name!r} has only {self.fixed[dotted]!r}, got {values[dotted]!r}")
                continue
            field = fields.get(dotted)
            if field is None:
                problems.append((dotted, f"{key} (not a setting of this job)"))
            elif field not in known:
                problems.append((dotted, f"{key} (no field {field!r})"))
            else:
                passed[field] = values[dotted]
        return passed, problems

    # --- the abstract plan: overridden per job ---------------------------------------

    def describe_model(self, config):
        return str(getattr(config, "config_name", "?"))

    def strategy(self, config):
        return config.strategy

    def mesh_spec(self, config):
        return config.mesh

    def sequence_length(self, config):
        return getattr(config, "sequence_length", None)

    def accumulation(self, config):
        return getattr(config, "gradient_accumulation_steps", 1)

    def flops_per_step(self, config, model):
        """Model FLOPs of one training step, or None where zoo.training.mfu has no formula."""
        return None

    def num_layers(self, module, config):
        """The model's depth where it can be compiled at reduced depth (None: it cannot)."""
        return None

    def batch_shapes(self, module, config, model, batch):
        """``((x shape, dtype), (y shape, dtype))`` of one global batch of ``batch`` examples."""
        raise RecipeError(f"compiling the step of job {self.name!r} is not supported")


class PretrainGPT(Job):
    name, module_name, config_class_name, function_name = "pretrain_gpt", "zoo.training.gpt", "GPTTrainConfig", "train"

    def distribution(self, module, config, mesh):
        return module.resolve_distribution(config, mesh)

    def build(self, module, config, **model_overrides):
        # The job's own builder: precision policy, rematerialisation, strategy overrides;
        # model_overrides (e.g. num_layers) for compile-only checks at reduced depth.
        return module.build_for_training(config, **model_overrides)

    def num_layers(self, module, config):
        """The depth of the recipe's model (its named config's ``num_layers``)."""
        from zoo.models.gpt.gpt_configs import config_by_name

        return config_by_name(config.config_name)["num_layers"]

    def batch_shapes(self, module, config, model, batch):
        tokens = (batch, config.sequence_length)  # next-token targets: same shape as the inputs
        return (tokens, "int32"), (tokens, "int32")

    def compile(self, module, model, config):
        module.compile_gpt(model, config.learning_rate, 1, config.weight_decay, config.gradient_accumulation_steps)

    def flops_per_step(self, config, model):
        from zoo.training.mfu import gpt_flops_per_token

        return gpt_flops_per_token(model.get_config(), config.sequence_length) * config.batch_size * config.sequence_length

    def check_inputs(self, config, model):
        if config.sequence_length > model.max_sequence_length:
            raise RecipeError(
                f"[train] sequence_length {config.sequence_length} exceeds the max_sequence_length "
                f"{model.max_sequence_length} of {config.config_name}"
            )


class TrainCNN(Job):
    name, module_name, config_class_name, function_name = "train_cnn", "zoo.training.cnn", "TrainConfig", "train"
    renames = {"parallel.strategy": "distribution"}
    fixed = {"model.name": "small_cnn"}
    INPUT_CHANNELS = 3  # the abstract build assumes RGB: the channel count is known only once data loads

    def describe_model(self, config):
        return "small_cnn"

    def strategy(self, config):
        return config.distribution

    def distribution(self, module, config, mesh):
        return module.resolve_distribution(config.distribution, mesh)

    def build(self, module, config):
        from zoo.data import get_spec

        spec = get_spec(config.dataset)
        size = config.image_size or spec.default_image_size
        return module.build_cnn(size, config.seed, num_classes=len(spec.classes), channels=self.INPUT_CHANNELS)

    def compile(self, module, model, config):
        module.compile_cnn(model, "adam", config.learning_rate)

    def batch_shapes(self, module, config, model, batch):
        from zoo.data import get_spec

        size = config.image_size or get_spec(config.dataset).default_image_size
        return ((batch, size, size, self.INPUT_CHANNELS), "float32"), ((batch,), "int32")

    def check_inputs(self, config, model):
        pass


class Finetune(Job):
    """``zoo.training.finetune.finetune``: a classifier preset, trained frozen / LoRA / full."""

    name, module_name, config_class_name, function_name = "finetune", "zoo.training.finetune", "FinetuneConfig", "finetune"
    renames = {
        "model.name": "preset",
        "parallel.strategy": "distribution",
        "finetune.method": "strategy",
        "finetune.lora_rank": "lora_rank",
        "finetune.lora_alpha": "lora_alpha",
    }

    def describe_model(self, config):
        return f"preset {config.preset}"

    def strategy(self, config):
        return config.distribution

    def _class_name(self, config):
        from zoo.presets import load_preset_metadata

        return load_preset_metadata(config.preset)["class_name"]

    def distribution(self, module, config, mesh):
        # The job's own resolver, handed the abstract mesh in place of the spec string.
        return module._distribution(self._class_name(config), dataclasses.replace(config, mesh=mesh))

    def build(self, module, config):
        """The preset's architecture with the dataset's head and the method applied
        (what ``finetune`` trains), without loading the preset's weights."""
        from zoo.data import get_spec
        from zoo.presets import from_preset

        head, size_key = module.head_of(self._class_name(config))
        model = from_preset(config.preset, load_weights=False, **{size_key: len(get_spec(config.dataset).classes)})
        module.prepare_finetuning(model, config.strategy, head=head, lora_rank=config.lora_rank, lora_alpha=config.lora_alpha)
        return model

    def compile(self, module, model, config):
        import keras

        # As finetune() compiles: Adam (the optimizer state the memory estimate counts).
        model.compile(optimizer=keras.optimizers.Adam(learning_rate=config.learning_rate), loss="sparse_categorical_crossentropy")

    def batch_shapes(self, module, config, model, batch):
        from zoo.presets import load_preset_metadata

        shape = module.example_shape(model, load_preset_metadata(config.preset))
        return ((batch, *shape), "int32" if len(shape) == 1 else "float32"), ((batch,), "int32")

    def check_inputs(self, config, model):
        pass


JOBS = {job.name: job for job in (TrainCNN(), PretrainGPT(), Finetune())}
