"""The layout table: one frozen record per layout, the only place a layout's meaning is written.

A layout says how a job's weights and inputs are split over a device mesh. Its record
names the mesh axes it needs and the mesh used when none is given, which axis each kind
of split uses (the batch is always over ``data``; FSDP's weight split, Megatron's tensor
split, the activations' sequence split, the experts, the pipeline's stages), the model
options it sets, and the sets of jobs it belongs to. The distributions, the layout maps,
the planner, the recipes and the benchmarks read these fields; ``zoo.config.choices``
derives its closed sets of names from them. docs/architecture.md ("Adding a layout")
walks through adding one.

Pure Python: the ``zoo`` command reads it before JAX starts.
"""

import dataclasses

# Mesh axis names (zoo.distribution.axes re-exports them).
DATA = "data"  # splits the batch: data parallelism
MODEL = "model"  # splits features / channels / heads: model (tensor) parallelism
SEQ = "seq"  # splits the sequence: context parallelism
STAGE = "stage"  # splits the stack of blocks: pipeline parallelism
EXPERT = "expert"  # splits the experts of Mixture-of-Experts layers (and the batch): expert parallelism

# The sets of jobs a layout can belong to (Layout.groups):
BASIC = "basic"  # every model: zoo train cnn too ("model" uses the model's own layout map)
TRANSFORMER = "transformer"  # the Transformer models' layouts (zoo train gpt | encoder | vit)
WEIGHT_MAP = "weight_map"  # a Transformer's layout map describes its weights (get_layout_map(mesh, layout=...))
PLANNED = "planned"  # what zoo plan --auto searches
SCANNED = "scanned"  # a scan_layers GPT runs under it (layout rules on the stack; split tokens: the layers' kernels)
CLASSIFIER_FINETUNE = "classifier_finetune"  # zoo finetune of a classifier preset
PEERS = "peers"  # zoo bench peers: both peers build it


@dataclasses.dataclass(frozen=True)
class Layout:
    """One layout: its mesh and what it splits over which axis (None: not split that way)."""

    name: str
    axes: tuple  # the mesh axes it needs
    default_mesh: str | None  # the mesh when none is named (-1: the rest of the devices; None: one device)
    fsdp_axis: str | None = None  # weights and optimizer state split over it, gathered block by block
    model_axis: str | None = None  # Megatron's split of heads and MLP (the zoo's tensor-parallel layers)
    sequence_axis: str | None = None  # the activations' sequence split over it outside attention
    expert_axis: str | None = None  # the experts split over it (and the batch over data x expert)
    stage_axis: str | None = None  # the blocks split into pipeline stages over it
    model_options: tuple = ()  # (key, value) pairs of the model-config entries it needs
    groups: frozenset = frozenset()

    @property
    def sequence_over_model(self):
        """Megatron sequence parallelism (tp+sp): outside attention the blocks split the
        tokens over the model axis (the model built with ``megatron_sp=True``)."""
        return self.model_axis is not None and self.sequence_axis == self.model_axis

    @property
    def heads_split(self):
        """The attention heads and MLP width split over the model axis in every block (not
        tp+sp, whose blocks split the tokens over it outside attention instead)."""
        return self.model_axis is not None and not self.sequence_over_model

    @property
    def gradients_all_reduced(self):
        """Whole weights on every data replica: the gradients all-reduced over data."""
        return self.fsdp_axis is None and self.expert_axis is None and self.stage_axis is None

    def batch_split(self, sizes):
        """How many pieces the batch is cut into on a mesh of ``sizes``: the data axis, times
        the expert axis under the expert layouts."""
        return self.split(sizes, DATA, self.expert_axis)

    def split(self, sizes, *axes):
        """The product of the mesh sizes (``{axis: size}``) of the named axes (None: 1)."""
        product = 1
        for axis in axes:
            product *= sizes.get(axis, 1) if axis is not None else 1
        return product


def _layout(name, axes, default_mesh, *groups, options=None, **splits):
    return Layout(
        name,
        tuple(axes),
        default_mesh,
        model_options=tuple((options or {}).items()),
        groups=frozenset(groups),
        **splits,
    )


# The names code outside this table writes (every other module imports them from here, never
# spells them: tests/test_architecture.py checks)
FSDP = "fsdp"
TP = "tp"
TP_SP = "tp+sp"
FSDP_TP = "fsdp+tp"
PIPELINE = "pipeline"
CONTEXT = "context"

_TP = (DATA, MODEL)
LAYOUT_TABLE = {
    layout.name: layout
    for layout in (
        _layout("single", (), None, BASIC, CLASSIFIER_FINETUNE),
        _layout("data", (DATA,), "data=-1", BASIC, WEIGHT_MAP, PLANNED, SCANNED, CLASSIFIER_FINETUNE),
        _layout("model", _TP, "data=2,model=-1", BASIC, CLASSIFIER_FINETUNE),
        _layout(FSDP, (DATA,), "data=-1", TRANSFORMER, WEIGHT_MAP, PLANNED, SCANNED, CLASSIFIER_FINETUNE, PEERS,
                fsdp_axis=DATA),
        _layout(TP, _TP, "data=2,model=-1", TRANSFORMER, WEIGHT_MAP, PLANNED, SCANNED, CLASSIFIER_FINETUNE,
                PEERS, model_axis=MODEL),
        _layout(TP_SP, _TP, "data=2,model=-1", TRANSFORMER, WEIGHT_MAP, PLANNED, SCANNED,
                model_axis=MODEL, sequence_axis=MODEL, options={"megatron_sp": True}),
        _layout(FSDP_TP, _TP, "data=2,model=-1", TRANSFORMER, WEIGHT_MAP, PLANNED, SCANNED, PEERS,
                fsdp_axis=DATA, model_axis=MODEL),
        _layout(CONTEXT, (DATA, SEQ), "data=2,seq=-1", TRANSFORMER, PLANNED, SCANNED, fsdp_axis=SEQ,
                sequence_axis=SEQ),
        _layout(PIPELINE, (DATA, STAGE), "data=2,stage=-1", TRANSFORMER, PLANNED,
                stage_axis=STAGE, options={"schedule": "gpipe"}),
        _layout("expert", (DATA, EXPERT), "data=1,expert=-1", TRANSFORMER, SCANNED, expert_axis=EXPERT),
        _layout("fsdp+expert", (DATA, EXPERT), "data=2,expert=-1", TRANSFORMER, SCANNED, fsdp_axis=DATA,
                expert_axis=EXPERT),
        _layout("expert+tp", (DATA, EXPERT, MODEL), "data=1,expert=2,model=-1", TRANSFORMER, SCANNED,
                model_axis=MODEL, expert_axis=EXPERT),
    )
}  # fmt: skip


def layout_record(name):
    """The record of layout ``name``; ValueError naming the layouts for any other name."""
    try:
        return LAYOUT_TABLE[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown layout {name!r}; choose one of {list(LAYOUT_TABLE)}") from None


def pipelined(name):
    """Layout ``name`` runs the blocks as pipeline stages (False for a name outside the
    table, such as ``"auto"``)."""
    layout = LAYOUT_TABLE.get(name)
    return layout is not None and layout.stage_axis is not None


def layouts_in(group):
    """The names of the layouts of ``group``, in the table's order."""
    return tuple(name for name, layout in LAYOUT_TABLE.items() if group in layout.groups)


def layouts_where(predicate):
    """The names of the layouts whose record satisfies ``predicate``, in the table's order."""
    return tuple(name for name, layout in LAYOUT_TABLE.items() if predicate(layout))
