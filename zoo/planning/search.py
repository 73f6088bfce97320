"""``zoo plan --auto``: search layouts x meshes x remat x micro-batch, compile the best few, rank.

1. **Candidates** for a GPT job on N devices with a global batch G per optimizer update:
   every layout (data, fsdp, tp, tp+sp, fsdp+tp, context, pipeline; single on one device)
   on every mesh that factorises N and divides the model (heads, widths, layers) and the
   sequence; remat none, dots_saveable, full; G split into a micro-batch b and a
   accumulation steps (b x a = G, b a multiple of the data axis); under pipeline
   (``data=N/S,stage=S``) also M micro-batches (S, 2S, 4S dividing the rows per data
   shard) and the schedule: GPipe (R = 1) and circular (R = 2 where S x 2 divides L).
   A Mixture-of-Experts model (``num_experts``) also gets the expert layouts (expert,
   fsdp+expert, expert+tp) on ``data=N_data,expert=E_p[,model=N_model]`` with E_p dividing the
   experts, the batch split over data x expert; not tp+sp or pipeline, which its
   blocks refuse.
2. **Pruning** with an analytic model (``estimate``): state bytes from the parameter
   count and how the layout splits it; activations per block from the remat policy
   (``remat_elements_per_token``); step time from model FLOPs (plus recomputation) and
   each layout's collectives (bytes per axis over that axis' links, as the roofline does).
   Pipeline: the blocks' state split S ways, the activations of every micro-batch the
   loop runs (R*M + S - 1 ticks of L/(S*R) blocks on B/(N_data*M) rows, the bubble's ticks
   included: autodiff keeps them all), compute divided by the useful fraction
   R*M / (R*M + S - 1), and the ppermute of one micro-batch's activations per tick,
   forward and backward. Expert layouts (``expert_figures``): the experts' state split
   E_p ways (and over data or model as the layout says), four all-to-alls per sparse
   block of the kernel's fixed-size buffers, the other weights' gradients all-reduced
   over data and expert.
3. **Compiling** the ``top`` candidates that fit by that model, fastest first (one
   subprocess: one device count), and ranking them by the compiled plans: fits first,
   then estimated time per optimizer update, then peak memory, then candidate order
   (so the ranking is deterministic).
"""

import dataclasses

from zoo.config.choices import (
    DATA_AXIS_LAYOUTS,
    DEFAULT_CONTEXT_ATTENTION,
    EXPERT_LAYOUTS,
    PLANNED_LAYOUTS,
    REMATS,
)
from zoo.config.layouts import layout_record, pipelined
from zoo.config.settings import CONTEXT_DEFAULTS, PIPELINE_DEFAULTS
from zoo.planning.analytic import RECOMPUTE, REMATS_CHEAPEST_FIRST, axis_sizes, estimate, named_model
from zoo.planning.plan import (
    PlanRequest,
    make_plans,
    target_spec,
)
from zoo.planning.report import size_text
from zoo.units import GIB

__all__ = [
    "Candidate",
    "Ranking",
    "candidates",
    "choose_layout",
    "format_ranking",
    "planned_layouts",
    "search",
]

assert set(RECOMPUTE) == set(REMATS), "a recompute factor per remat policy"
ANALYTIC_HEADROOM = 0.9  # a candidate fits the analytic model below this share of device memory


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One point of the search: a layout, its mesh, remat and the batch split."""

    layout: str
    mesh: str | None  # "data=2,model=4"; None: one device
    remat: str
    micro_batch: int  # global batch per fit step
    accumulation: int  # fit steps per optimizer update
    micro_batches: int | None = None  # layout pipeline: M
    repeats: int = 1  # layout pipeline: R (1: gpipe, >= 2: circular)

    @property
    def schedule(self):
        """Layout pipeline's schedule (None for the other layouts)."""
        if not pipelined(self.layout):
            return None
        return "gpipe" if self.repeats == 1 else "circular"

    def settings(self):
        """The job settings this candidate sets (``GPTTrainSettings`` fields)."""
        chosen = dict(
            layout=self.layout,
            mesh=self.mesh,
            remat=self.remat,
            batch_size=self.micro_batch,
            gradient_accumulation_steps=self.accumulation,
        )
        if pipelined(self.layout):
            chosen.update(micro_batches=self.micro_batches, schedule=self.schedule, repeats=self.repeats)
        else:
            chosen.update(PIPELINE_DEFAULTS)
        if self.layout != "context":  # the request's kernel and balance stand under context only
            chosen.update(CONTEXT_DEFAULTS)
        return chosen

    def describe(self):
        pipeline = (
            f" M={self.micro_batches} {self.schedule}" + (f" R={self.repeats}" if self.repeats > 1 else "")
            if pipelined(self.layout)
            else ""
        )
        return f"{self.layout} {self.mesh or '(one device)'}{pipeline} remat={self.remat} batch {self.micro_batch}x{self.accumulation}"


@dataclasses.dataclass
class Row:
    candidate: Candidate
    memory: float  # analytic peak bytes per device
    update_s: float  # analytic seconds per optimizer update
    plan: object = None  # the compiled Plan, for the candidates compiled

    @property
    def fits(self):
        return self.plan.fits if self.plan else None

    @property
    def compiled_update_s(self):
        return self.plan.time.step_s * self.candidate.accumulation if self.plan else None


@dataclasses.dataclass
class Ranking:
    """The compiled candidates, best first, and how many were considered."""

    request: PlanRequest
    rows: list  # compiled Rows, best first
    considered: int
    analytic_fits: int

    @property
    def best(self):
        return self.rows[0] if self.rows else None

    def why_none(self):
        if not self.rows:
            return f"none of {self.considered} candidates fits {self.request.devices} x {self.request.device} by the analytic model"
        best = self.rows[0]
        return f"the smallest compiled peak is {best.plan.peak / GIB:.2f} GiB ({best.candidate.describe()}) of {best.plan.device_memory / GIB:.2f} GiB"

    def command(self, row=None):
        """The ``zoo train gpt`` command line that runs ``row`` (default the best)."""
        row = row or self.best
        c, config = row.candidate, self.request.config
        parts = ["zoo train gpt", f"--config-name {config['config_name']}", f"--layout {c.layout}"]
        parts += [f"--mesh {c.mesh}"] if c.mesh else []
        parts += (
            [f"--context-attention {config.get('context_attention') or DEFAULT_CONTEXT_ATTENTION}"]
            if c.layout == "context"
            else []
        )
        if pipelined(c.layout):
            parts += [f"--micro-batches {c.micro_batches}", f"--schedule {c.schedule}"] + (
                [f"--repeats {c.repeats}"] if c.repeats > 1 else []
            )
        parts += [
            f"--remat {c.remat}",
            f"--batch-size {c.micro_batch}",
            f"--gradient-accumulation-steps {c.accumulation}",
        ]
        parts += [f"--sequence-length {config['sequence_length']}", f"--precision {config.get('precision', 'float32')}"]
        parts += [
            f"--{key.replace('_', '-')} {config[key]}"
            for key in ("capacity_factor", "expert_exchange")
            if config.get(key) is not None
        ]
        return " ".join(parts)


def _divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def _meshes(layout, devices, model, length, spec):
    """Mesh specs ``layout`` can use on ``devices`` devices for this model and length."""
    if layout == "single":
        return [None] if devices == 1 else []
    if layout in DATA_AXIS_LAYOUTS:
        return [f"data={devices}"]
    domain = spec.link_domain or devices
    if layout == "context":
        return [f"data={devices // s},seq={s}" for s in _divisors(devices) if s > 1 and length % s == 0]
    if pipelined(layout):
        return [f"data={devices // s},stage={s}" for s in _divisors(devices) if s > 1 and model["num_layers"] % s == 0]
    if layout in EXPERT_LAYOUTS:
        return _expert_meshes(layout, devices, model, domain)
    sizes = _modelaxis_sizes(devices, model, domain)
    if layout_record(layout).sequence_over_model:  # tp+sp: the tokens split over model too
        sizes = [m for m in sizes if length % m == 0]
    return [f"data={devices // m},model={m}" for m in sizes]


def _modelaxis_sizes(devices, model, domain):
    """Sizes N_model > 1 of a ``model`` axis within the fast-link domain that divide the heads and widths."""
    widths = (model["num_query_heads"], model["hidden_dim"], model["intermediate_dim"], model["vocabulary_size"])
    widths += (model.get("moe_intermediate_dim") or model["intermediate_dim"],) if model.get("num_experts") else ()
    return [m for m in _divisors(devices) if 1 < m <= domain and all(w % m == 0 for w in widths)]


def _expert_meshes(layout, devices, model, domain):
    """``data=N_data,expert=E_p`` (``expert+tp``: ``,model=N_model``) with E_p > 1 dividing the experts."""
    meshes = []
    for tp in _modelaxis_sizes(devices, model, domain) if layout_record(layout).model_axis else [1]:
        rest = devices // tp
        for e in (e for e in _divisors(rest) if e > 1 and model["num_experts"] % e == 0):
            meshes.append(f"data={rest // e},expert={e}" + (f",model={tp}" if tp > 1 else ""))
    return meshes


def _batch_split(layout, sizes):
    """How many ways the batch is split: data, and data x expert under an expert layout."""
    return sizes.get("data", 1) * (sizes.get("expert", 1) if layout in EXPERT_LAYOUTS else 1)


def planned_layouts(model):
    """The layouts ``--auto`` tries for ``model``: a Mixture-of-Experts model also the
    expert layouts, and not tp+sp or pipeline (which an MoE block refuses); a model with
    windowed and global blocks (Gemma) not pipeline, whose stacked blocks are all alike."""
    if not model.get("num_experts"):
        mixed = model.get("sliding_window_layers") is not None  # some blocks windowed, not all
        return tuple(layout for layout in PLANNED_LAYOUTS if not (mixed and pipelined(layout)))
    dense = (
        layout for layout in PLANNED_LAYOUTS if not (layout_record(layout).sequence_over_model or pipelined(layout))
    )
    return (*dense, *EXPERT_LAYOUTS)


def candidates(request, *, keep_batch_split=False):
    """Every ``Candidate`` for a GPT ``request`` (see the module docstring), in a fixed
    order; with ``keep_batch_split`` only those of its own gradient_accumulation_steps."""
    config, devices = request.config, request.devices
    model, spec = named_model(request), target_spec(request)
    length = config["sequence_length"]
    per_update = config["batch_size"] * config.get("gradient_accumulation_steps", 1)
    layouts = ("single",) if devices == 1 else planned_layouts(model)
    found = []
    for layout in layouts:
        for mesh in _meshes(layout, devices, model, length, spec):
            data = _batch_split(layout, axis_sizes(mesh))
            accumulations = (
                [config.get("gradient_accumulation_steps", 1)] if keep_batch_split else _divisors(per_update)
            )
            for accumulation in (a for a in accumulations if (per_update // a) % data == 0):
                for remat in REMATS_CHEAPEST_FIRST:
                    for pipeline in _pipelines(
                        layout, mesh, per_update // accumulation // data, model["num_layers"], config.get("precision")
                    ):
                        found.append(
                            Candidate(layout, mesh, remat, per_update // accumulation, accumulation, **pipeline)
                        )
    return found


def _pipelines(layout, mesh, rows, layers, precision):
    """The ``{micro_batches, repeats}`` to try under layout pipeline ([{}] for the others):
    M = S, 2S, 4S dividing the ``rows`` per data shard; R = 1 (gpipe), and 2 (circular)
    where 2S divides the ``layers``."""
    if not pipelined(layout):
        return [{}]
    stages = axis_sizes(mesh)["stage"]
    repeats = [1] + ([2] if layers % (2 * stages) == 0 else [])
    return [
        {"micro_batches": m, "repeats": r} for m in (stages, 2 * stages, 4 * stages) if rows % m == 0 for r in repeats
    ]


# --- the search --------------------------------------------------------------------------


def _request_for(request, candidate):
    config = {**request.config, **candidate.settings()}
    return dataclasses.replace(
        request, config=config, label=f"{request.label or config['config_name']}: {candidate.describe()}"
    )


def _rank_key(row, order):
    return (not row.fits, row.compiled_update_s, row.plan.peak, order[row.candidate])


def search(request, *, top=3, report=None, keep_batch_split=False):
    """``Ranking`` of the best candidates for a GPT ``request`` (its layout, mesh, remat
    and batch split are searched; its batch_size x gradient_accumulation_steps is kept).
    ``keep_batch_split``: its batch_size and gradient_accumulation_steps are kept as they
    are too (a resumed run: its checkpoint's position counts batches of that size)."""
    if request.job != "pretrain_gpt":
        raise ValueError(f"zoo plan --auto searches GPT layouts (job pretrain_gpt), not {request.job!r}")
    found = candidates(request, keep_batch_split=keep_batch_split)
    if not found:
        kept = f" x {request.config.get('gradient_accumulation_steps', 1)} accumulated (kept: --resume)"
        raise ValueError(
            f"no layout divides {request.devices} devices for {request.config['config_name']} at batch "
            f"{request.config['batch_size']}{kept if keep_batch_split else ''}"
        )
    memory = request.device_memory_gib * GIB if request.device_memory_gib else target_spec(request).memory_bytes
    rows = [Row(c, *estimate(c, request)) for c in found]
    order = {c: i for i, c in enumerate(found)}
    fitting = [r for r in rows if r.memory <= ANALYTIC_HEADROOM * memory]
    chosen = (
        sorted(fitting, key=lambda r: (r.update_s, order[r.candidate]))[:top]
        or sorted(rows, key=lambda r: r.memory)[:top]
    )
    if report:
        report(f"{len(rows)} candidates, {len(fitting)} fit by the analytic model; compiling {len(chosen)} ...")
    _compile_rows(request, chosen)
    if not any(row.fits for row in chosen):  # the analytic model was optimistic: try the smallest instead
        smallest = [r for r in sorted(rows, key=lambda r: (r.memory, order[r.candidate])) if r not in chosen][:top]
        if report and smallest:
            report(f"none of them fits once compiled; compiling the {len(smallest)} smallest by the analytic model ...")
        _compile_rows(request, smallest)
        chosen += smallest
    return Ranking(request, sorted(chosen, key=lambda r: _rank_key(r, order)), len(rows), len(fitting))


def _compile_rows(request, rows):
    if rows:
        for row, plan in zip(rows, make_plans([_request_for(request, r.candidate) for r in rows])):
            row.plan = plan


def format_ranking(ranking):
    """The ranked table and the command line that runs the best."""
    lines = [
        f"searched {ranking.considered} candidates ({ranking.analytic_fits} fit by the analytic model); compiled the best {len(ranking.rows)}:",
        "| rank | layout | mesh | remat | batch x steps | fits | peak / device | est. per update | MFU | sent per device per step |",
        "| ---: | --- | --- | --- | --- | --- | ---: | ---: | ---: | --- |",
    ]
    for rank, row in enumerate(ranking.rows, 1):
        c, plan = row.candidate, row.plan
        sent = ", ".join(f"{axes} {size_text(sent)}" for axes, sent in plan.sent_per_axis().items()) or "-"
        mfu = f"{100 * plan.mfu:.1f}%" if plan.mfu is not None else "-"
        lines.append(
            f"| {rank} | {c.layout} | {c.mesh or '-'}{_pipeline_text(c)} | {c.remat} | {c.micro_batch} x {c.accumulation} | {'yes' if plan.fits else 'NO'} | "
            f"{size_text(plan.peak)} | {row.compiled_update_s * 1e3:,.1f} ms | {mfu} | {sent} |"
        )
    if ranking.best is not None and ranking.best.fits:
        lines.append(f"run the best: {ranking.command()}")
    return lines


def _pipeline_text(candidate):
    if not pipelined(candidate.layout):
        return ""
    return f" M={candidate.micro_batches} {candidate.schedule}" + (
        f" R={candidate.repeats}" if candidate.repeats > 1 else ""
    )


def choose_layout(settings, *, top=3, report=print):
    """``settings`` (a ``GPTTrainSettings`` with ``layout="auto"``) with the best fitting
    layout, mesh, remat and batch split for this process' devices; raises ``ValueError``
    naming the smallest peak when none fits. The batch per optimizer update
    (``batch_size x gradient_accumulation_steps``) is kept; with ``settings.resume`` the
    batch split too, so the run resumes its checkpoint on any device count (the position
    counts batches of ``batch_size``; layout, mesh and remat are free, docs/checkpoints.md)."""
    import jax

    from zoo.measure.hardware import local_device

    name, memory_gib = local_device()
    fields = {f.name: getattr(settings, f.name) for f in dataclasses.fields(settings)}
    request = PlanRequest(
        "pretrain_gpt",
        {**fields, "layout": "data", "mesh": None},
        devices=len(jax.devices()),
        device=name,
        device_memory_gib=memory_gib,
        label=settings.config_name,
    )
    ranking = search(request, top=top, report=report, keep_batch_split=settings.resume)
    if ranking.best is None or not ranking.best.fits:
        raise ValueError(f"--layout auto: no layout fits: {ranking.why_none()}")
    for line in format_ranking(ranking)[:-1]:
        report(line)
    best = ranking.best.candidate
    report(f"layout auto: {best.describe()} (peak {size_text(ranking.best.plan.peak)} per device)")
    for key, value in fields.items():
        if key in CONTEXT_DEFAULTS and value is not None and best.layout != "context":
            report(f"layout auto: {key} = {value!r} left out (a setting of layout context, not of {best.layout})")
    return dataclasses.replace(settings, **best.settings())
