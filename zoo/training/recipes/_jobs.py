"""The jobs a recipe can drive: each a registered object holding its settings class and
its job module, and how to build its distribution and model for an abstract check.

Nothing here re-implements a job: every adapter calls the job module's own functions
(``resolve_distribution``, ``build_gpt``/``build_for_training``, ``compile_gpt``,
``zoo.training.cnn.build_cnn``, ...). A recipe key is the settings field of the same
name (``[train] batch_size`` -> ``batch_size``); a key another job has but this job's
settings lack is reported, never dropped (``UnsupportedKeyError``).
"""

from zoo.config.choices import AUTO
from zoo.config.schema import recipe_fields
from zoo.training.recipes._schema import JOB_SETTINGS, SECTIONS, RecipeError

RECIPE_ONLY_SECTIONS = ("recipe", "target", "multihost")  # read by the recipe runner, not by the job


def _schema_order(dotted):
    section, _, key = dotted.partition(".")
    return list(SECTIONS).index(section), key


class JobUnavailableError(RecipeError):
    """The job's module cannot be imported here."""


class UnsupportedKeyError(RecipeError):
    """The recipe sets keys its job's settings have no field for (another job's keys).

    ``keys``: the offending ``"section.key"`` names; ``plan``: the abstract plan when
    ``check_recipe`` got that far (the other checks passed), else None.
    """

    def __init__(self, message, keys, plan=None):
        super().__init__(message)
        self.keys, self.plan = tuple(keys), plan


class Job:
    """A recipe job: its name, its settings class and its job module (``module()``)."""

    name = None

    @property
    def settings_class(self):
        return JOB_SETTINGS[self.name]

    def module(self):
        """The job module (imported when first needed: it brings Keras)."""
        raise NotImplementedError

    def load(self):
        """``(module, settings class, job function)``; ``JobUnavailableError`` if the module cannot be imported."""
        try:
            module = self.module()
        except ImportError as error:
            raise JobUnavailableError(f"job {self.name!r} cannot be imported: {error}") from None
        return module, self.settings_class, self.function(module)

    def function(self, module):
        return module.train

    def fields(self):
        """``{"section.key": settings field}`` for this job: each key is the field's own name."""
        return {
            f"{section}.{name}": name
            for section, fields in recipe_fields(self.settings_class).items()
            for name in fields
        }

    def config_values(self, given, values):
        """``({field: value}, [problems])`` for the given keys; ``values``: {"section.key": value}."""
        fields = self.fields()
        passed, problems = {}, []
        for dotted in sorted(given, key=_schema_order):
            section, _, key = dotted.partition(".")
            if section in RECIPE_ONLY_SECTIONS:
                continue
            if dotted in fields:
                passed[fields[dotted]] = values[dotted]
            else:
                problems.append((dotted, f"{key} (not a setting of this job)"))
        return passed, problems

    # --- the abstract plan: overridden per job ---------------------------------------

    def describe_model(self, settings):
        return str(getattr(settings, "config_name", "?"))

    def layout(self, settings):
        return settings.layout

    def mesh_spec(self, settings):
        return settings.mesh

    def sequence_length(self, settings):
        return getattr(settings, "sequence_length", None)

    def accumulation(self, settings):
        return getattr(settings, "gradient_accumulation_steps", 1)

    def flops_per_step(self, settings, model):
        """Model FLOPs of one training step, or None where zoo.measure.mfu has no formula."""
        return

    def num_layers(self, module, settings):
        """The model's depth where it can be compiled at reduced depth (None: it cannot)."""
        return

    def batch_shapes(self, module, settings, model, batch):
        """``((x shape, dtype), (y shape, dtype))`` of one global batch of ``batch`` examples."""
        raise RecipeError(f"compiling the step of job {self.name!r} is not supported")

    def check_paths(self, module, settings):
        """Refuse what the job's run refuses of its paths, with the run's own check
        (``zoo.training.paths.PathError``, ``PresetError``)."""
        from zoo.training.paths import check_job_paths

        check_job_paths(settings)


class PretrainGPT(Job):
    name = "pretrain_gpt"

    def module(self):
        from zoo.training import gpt

        return gpt

    def distribution(self, module, settings, mesh):
        return module.resolve_distribution(settings, mesh)

    def build(self, module, settings, **model_overrides):
        # The job's own builder: precision policy, rematerialisation, layout overrides;
        # model_overrides (e.g. num_layers) for compile-only checks at reduced depth.
        return module.build_for_training(settings, **model_overrides)

    def num_layers(self, module, settings):
        """The depth of the recipe's model (``[model] num_layers``, else its named config's)."""
        from zoo.models.gpt.gpt_configs import config_by_name

        return settings.num_layers or config_by_name(settings.config_name)["num_layers"]

    def batch_shapes(self, module, settings, model, batch):
        tokens = (batch, settings.sequence_length)  # next-token targets: same shape as the inputs
        return (tokens, "int32"), (tokens, "int32")

    def compile(self, module, model, settings):
        from zoo.training.loss_chunk_choice import resolve_loss_chunk
        from zoo.training.optimizers import state_options

        module.compile_gpt(
            model,
            settings.learning_rate,
            1,
            settings.weight_decay,
            settings.gradient_accumulation_steps,
            resolve_loss_chunk(settings.loss_chunk_size, model, settings.batch_size, settings.sequence_length),
            **state_options(settings),
        )

    def flops_per_step(self, settings, model):
        from zoo.measure.mfu import gpt_flops_per_token

        return (
            gpt_flops_per_token(model.get_config(), settings.sequence_length)
            * settings.batch_size
            * settings.sequence_length
        )

    def check_inputs(self, settings, model):
        if settings.sequence_length > model.backbone.max_sequence_length:
            raise RecipeError(
                f"[train] sequence_length {settings.sequence_length} exceeds the max_sequence_length "
                f"{model.backbone.max_sequence_length} of {settings.config_name}"
            )


class TrainCNN(Job):
    name = "train_cnn"
    INPUT_CHANNELS = 3  # the abstract build assumes RGB: the channel count is known only once data loads

    def module(self):
        from zoo.training import cnn

        return cnn

    def describe_model(self, settings):
        return "small_cnn"

    def distribution(self, module, settings, mesh):
        return module.resolve_distribution(settings, mesh)

    def build(self, module, settings):
        from zoo.data import get_spec

        spec = get_spec(settings.dataset)
        size = settings.image_size or spec.default_image_size
        return module.build_cnn(size, settings.seed, num_classes=len(spec.classes), channels=self.INPUT_CHANNELS)

    def compile(self, module, model, settings):
        module.compile_cnn(model, "adam", settings.learning_rate)

    def batch_shapes(self, module, settings, model, batch):
        from zoo.data import get_spec

        size = settings.image_size or get_spec(settings.dataset).default_image_size
        return ((batch, size, size, self.INPUT_CHANNELS), "float32"), ((batch,), "int32")

    def check_inputs(self, settings, model):
        pass


class Finetune(Job):
    """``zoo.training.finetune.finetune``: a classifier preset, trained frozen / LoRA / full;
    or a causal LM (a zoo GPT preset, a Hugging Face folder, ``hf://``) trained with LoRA or
    fully on its data file or dataset, as ``zoo finetune`` dispatches (``_CausalLM`` does
    those steps)."""

    name = "finetune"

    def module(self):
        from zoo.training import finetune

        return finetune

    def function(self, module):
        return module.finetune

    def describe_model(self, settings):
        return f"preset {settings.preset}"

    def check_paths(self, module, settings):
        module.check_paths(settings)

    @staticmethod
    def _causal(settings):
        from zoo.training import lm_finetune

        return lm_finetune.is_causal_lm(lm_finetune.local_preset(settings.preset))

    def _class_name(self, settings):
        from zoo.presets import load_preset_metadata

        return load_preset_metadata(settings.preset)["class_name"]

    def distribution(self, module, settings, mesh):
        if self._causal(settings):
            return _CausalLM.distribution(settings, mesh)
        # The job's own resolver, handed the abstract mesh in place of the spec string.
        return module.resolve_distribution(self._class_name(settings), settings, mesh)

    def build(self, module, settings):
        """The preset's architecture with the dataset's head and the method applied
        (what ``finetune`` trains), without loading the preset's weights."""
        from zoo.data import get_spec
        from zoo.presets import from_preset

        if self._causal(settings):
            return _CausalLM.build(settings)
        head, size_key = module.head_of(self._class_name(settings))
        model = from_preset(settings.preset, load_weights=False, **{size_key: len(get_spec(settings.dataset).classes)})
        module.prepare_finetuning(
            model, settings.method, head=head, lora_rank=settings.lora_rank, lora_alpha=settings.lora_alpha
        )
        return model

    def compile(self, module, model, settings):
        import keras

        if self._causal(settings):
            return _CausalLM.compile(model, settings)
        # As finetune() compiles: Adam (the optimizer state the memory estimate counts).
        model.compile(
            optimizer=keras.optimizers.Adam(learning_rate=settings.learning_rate),
            loss="sparse_categorical_crossentropy",
        )

    def batch_shapes(self, module, settings, model, batch):
        from zoo.presets import load_preset_metadata

        if self._causal(settings):
            return _CausalLM.batch_shapes(settings, model, batch)
        shape = module.example_shape(model, load_preset_metadata(settings.preset))
        return ((batch, *shape), "int32" if len(shape) == 1 else "float32"), ((batch,), "int32")

    def check_inputs(self, settings, model):
        pass


class _CausalLM:
    """The finetune job's steps for a causal LM, as ``lm_finetune.finetune_lm`` takes them:
    its distribution (the layout map fitted to the preset's config), the architecture with
    the method applied (no weights read), its compile (loss chunks, the method's
    optimizer), and batches of T tokens (``--sequence-length``, else what the preset's
    preprocessor would give)."""

    @staticmethod
    def distribution(settings, mesh):
        from zoo.models import GPTCausalLM
        from zoo.training.job_setup import job_distribution
        from zoo.training.lm_finetune import causal_lm_config, local_preset

        config = causal_lm_config(local_preset(settings.preset), settings.layout, scan_layers=settings.scan_layers)
        return job_distribution(GPTCausalLM, settings, mesh, model_config=config)

    @staticmethod
    def build(settings):
        from zoo.models import GPTBackbone, GPTCausalLM
        from zoo.models.dtype_policy import dtype_policy_scope
        from zoo.training.lm_finetune import base_policy, causal_lm_config, local_preset, prepare_causal_lm

        config = causal_lm_config(local_preset(settings.preset), settings.layout, scan_layers=settings.scan_layers)
        with dtype_policy_scope(base_policy(settings)):  # as finetune_lm loads it
            model = GPTCausalLM(backbone=GPTBackbone(**config))
        prepare_causal_lm(
            model,
            settings.method,
            lora_rank=settings.lora_rank,
            lora_alpha=settings.lora_alpha,
            quantize=settings.quantize,
        )
        if settings.remat != AUTO:  # as finetune_causal_lm sets it (auto: the planner compiles each policy)
            model.backbone.set_remat(settings.remat)
        return model

    @staticmethod
    def compile(model, settings):
        from zoo.training.lm_finetune import compile_causal_lm, make_optimizer
        from zoo.training.loss_chunk_choice import resolve_loss_chunk
        from zoo.training.optimizers import state_options

        optimizer = make_optimizer(
            settings.optimizer, settings.learning_rate, settings.method, **state_options(settings)
        )
        length = _CausalLM.length(settings, model)
        compile_causal_lm(
            model, optimizer, resolve_loss_chunk(settings.loss_chunk_size, model, settings.batch_size, length)
        )

    @staticmethod
    def length(settings, model):
        """T: ``--sequence-length``, else what the preset's preprocessor would give."""
        from zoo.models.gpt.hf_checkpoints import PREPROCESSOR_LENGTH

        return settings.sequence_length or min(PREPROCESSOR_LENGTH, model.backbone.max_sequence_length)

    @staticmethod
    def batch_shapes(settings, model, batch):
        tokens = (batch, _CausalLM.length(settings, model))  # next-token targets: the inputs' shape
        return (tokens, "int32"), (tokens, "int32")


JOBS = {job.name: job for job in (TrainCNN(), PretrainGPT(), Finetune())}
