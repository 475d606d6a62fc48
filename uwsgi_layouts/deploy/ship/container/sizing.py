"""The app container's resources and the pod count of a Kubernetes bundle, and where each came
from. Three sources, each optional, which must agree where they overlap:

- the layout's own limits (``2x4-mapped@cpus=1,memory=300,replicas=2``): the pod it was measured
  or run as (``run``, ``compare``, ``plan`` take the same spec);
- tune's results (``--from-tune DIR``): the pod size it ran under and the memory request it
  measured (the recommended layout's PSS after load + 25%);
- the options (``--cpus``, ``--memory``, ``--replicas``, ``--cpu-target``): a size nobody measured,
  said as such in every file's header.

The HorizontalPodAutoscaler's figures come from a capacity plan (``--plan plan.json``) when one is
given: its replicas are the minimum, its CPU utilisation at the design rate the target. An option
that says otherwise than a measurement is refused (one line naming both, exit 2): the files would
claim a measurement they do not follow.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from uwsgi_layouts.deploy.model import LayoutError, parse_variant
from uwsgi_layouts.deploy.ship.container.measured import MIB, CapacityPlan, TunePod, spec_shape

DEFAULT_REPLICAS = 2
DEFAULT_MAX_REPLICAS = 4
DEFAULT_CPU_TARGET = 70  # per cent of the CPU request, the HorizontalPodAutoscaler's target without a plan
# With a plan, the most pods: room for twice the planned rate. A choice, not a measurement (the
# plan measured the rate it was given); --max-replicas overrides it.
PLAN_MAX_FACTOR = 2
# A floor, not a measurement: an interpreter with uWSGI and a small app (Flask) takes about this
# much resident memory per process; a limit below (P + 1) of these cannot hold P workers and the
# master. A limit tune measured is checked against its measurement instead.
MIN_PROCESS_MEMORY = 24 * 2**20
# The variants a container bundle takes from a layout spec: the pod's size and count.
POD_VARIANTS = ("cpus", "memory", "replicas")
NOT_MEASURED = " (no measurement)"

CPU_RE = re.compile(r"^(?:(?P<milli>[1-9][0-9]{0,6})m|(?P<cores>[0-9]{1,3}(?:\.[0-9]{1,3})?))$")
MEMORY_RE = re.compile(r"^(?P<number>[1-9][0-9]{0,6})(?P<unit>Ki|Mi|Gi|Ti|k|M|G|T)?$")
MEMORY_UNITS = {None: 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9,
                "T": 10**12}


def parse_cpus(raw) -> int:
    """A Kubernetes CPU quantity (``2``, ``1.5``, ``750m``) in millicores, at least 100m."""
    text = str(raw).strip()
    match = CPU_RE.match(text)
    milli = (int(match["milli"]) if match["milli"] else round(float(match["cores"]) * 1000)) if match else 0
    if not 100 <= milli <= 256_000:
        raise LayoutError("cpus", f"expected a CPU limit such as 2, 1.5 or 750m (100m to 256), got {text!r}")
    return milli


def parse_memory(raw) -> int:
    """A Kubernetes memory quantity (``512Mi``, ``1Gi``, ``800M``) in bytes."""
    text = str(raw).strip()
    match = MEMORY_RE.match(text)
    if not match:
        raise LayoutError("memory", f"expected a memory limit such as 512Mi, 1Gi or 800M, got {text!r}")
    return int(match["number"]) * MEMORY_UNITS[match["unit"]]


def cpu_quantity(milli: int) -> str:
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


def memory_quantity(size: int) -> str:
    for unit in ("Gi", "Mi", "Ki"):
        if size % MEMORY_UNITS[unit] == 0:
            return f"{size // MEMORY_UNITS[unit]}{unit}"
    return str(size)


def whole(field_name: str, raw, default: int, low: int, high: int) -> int:
    if raw is None:
        return default
    text = str(raw).strip()
    if not text.isdigit() or not low <= int(text) <= high:
        raise LayoutError(field_name, f"expected a whole number in {low}..{high}, got {text!r}")
    return int(text)


@dataclass(frozen=True)
class PodVariant:
    """The pod a layout spec names: its shape (PxT-STRATEGY) and its @cpus, @memory, @replicas."""

    shape: str
    cpus: float | None = None
    memory_mib: int | None = None
    replicas: int | None = None

    @property
    def text(self) -> str:
        parts = [f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                 for k, v in (("cpus", self.cpus), ("memory", self.memory_mib), ("replicas", self.replicas)) if v]
        return f"@{','.join(parts)}" if parts else ""


def pod_variant(spec: str) -> PodVariant:
    """Split ``2x4-mapped@cpus=1,memory=300`` into the shape and the pod's figures (validated as
    ``run`` validates them); any other variant is refused: a bundle takes settings as options."""
    shape, sep, extra = str(spec).strip().partition("@")
    if not sep:
        return PodVariant(shape)
    keys = [item.partition("=")[0].strip().replace("-", "_") for item in extra.split(",")]
    other = [k for k in keys if k not in POD_VARIANTS]
    if other:
        raise LayoutError("layout", f"a container bundle takes @{', @'.join(POD_VARIANTS)} from the layout (the pod), "
                                    f"not @{other[0]}: give it as an option (--{other[0].replace('_', '-')})")
    layout = parse_variant(spec, run_dir="/nonexistent")  # validates the figures, touches nothing
    return PodVariant(shape, layout.cpus, layout.memory, layout.replicas if "replicas" in keys else None)


@dataclass(frozen=True)
class Limits:
    """The app container's resources and the pod count (Kubernetes). CPU: the request equals the
    limit, so the pod gets the CPUs the layout was measured with, never more workers. Memory: the
    request is tune's measurement where there is one (else the limit)."""

    cpu_milli: int
    memory: int  # the limit, bytes
    replicas: int = DEFAULT_REPLICAS
    max_replicas: int = DEFAULT_MAX_REPLICAS
    cpu_target: int = DEFAULT_CPU_TARGET
    memory_request: int | None = None  # bytes; None: the limit
    busy_target: float | None = None  # the plan's busy-thread ratio at its design rate (docs: a custom metric)
    resources_from: str = "options (no measurement)"
    scaling_from: str = "options (no plan)"

    def __post_init__(self):
        if not 1 <= self.replicas <= self.max_replicas:
            raise LayoutError("max_replicas", f"must be at least the replicas ({self.replicas}), got "
                                              f"{self.max_replicas}")
        if self.memory_request is not None and not 0 < self.memory_request <= self.memory:
            raise LayoutError("memory", f"the memory request ({memory_quantity(self.memory_request)}) must be within "
                                        f"the limit ({memory_quantity(self.memory)})")

    @property
    def cpu(self) -> str:
        return cpu_quantity(self.cpu_milli)

    @property
    def memory_text(self) -> str:
        return memory_quantity(self.memory)

    @property
    def memory_request_text(self) -> str:
        return memory_quantity(self.memory_request if self.memory_request is not None else self.memory)


def _agree(field_name: str, figures: list[tuple[str, object]], shown) -> tuple[object | None, str]:
    """(the one value ``figures`` (source, value) hold, its first source), or LayoutError naming
    the two that differ."""
    known = [(source, value) for source, value in figures if value is not None]
    for source, value in known[1:]:
        if value != known[0][1]:
            first = known[0][0].removesuffix(NOT_MEASURED)
            raise LayoutError(field_name, f"{first} says {shown(known[0][1])} but {source.removesuffix(NOT_MEASURED)} "
                                          f"says {shown(value)}: drop one (the manifests follow one measurement)")
    return (known[0][1], known[0][0]) if known else (None, "")


def limits_for(variant: PodVariant, processes: int, *, cpus=None, memory=None, replicas=None, max_replicas=None,
               cpu_target=None, tune: TunePod | None = None, plan: CapacityPlan | None = None) -> Limits | None:
    """The Kubernetes limits from the layout's variant, tune, the plan and the options; None when
    nothing gives a size (a build context only)."""
    if tune is not None and tune.layout != variant.shape:
        raise LayoutError("from_tune", f"tune in {tune.path.parent} recommended {tune.layout}, not {variant.shape}: "
                                       f"bundle {tune.layout}, or tune again")
    if plan is not None and spec_shape(plan.layout) != variant.shape:
        raise LayoutError("plan", f"{plan.path} plans {plan.layout}, not {variant.shape}")
    cpu_milli, cpu_from = _agree("cpus", [
        (f"--cpus {cpus}{NOT_MEASURED}", parse_cpus(cpus) if cpus is not None else None),
        (f"the layout's @cpus={variant.cpus:g}" if variant.cpus else "", round(variant.cpus * 1000) if variant.cpus
         else None),
        (f"tune in {tune.path.parent}" if tune else "", round(tune.cpus * 1000) if tune else None),
        (f"plan {plan.path}" if plan else "", round(plan.cpus * 1000) if plan and plan.cpus else None),
    ], lambda milli: f"{cpu_quantity(milli)} CPU")
    limit, memory_from = _agree("memory", [
        (f"--memory {memory}{NOT_MEASURED}", parse_memory(memory) if memory is not None else None),
        (f"the layout's @memory={variant.memory_mib}" if variant.memory_mib else "",
         variant.memory_mib * MIB if variant.memory_mib else None),
        (f"tune in {tune.path.parent} (--memory)" if tune else "",
         tune.memory_mib * MIB if tune and tune.memory_mib else None),
    ], memory_quantity)
    # Kubernetes takes bytes, but a whole MiB reads better and differs by less than one.
    request = _rounded_mib(tune.memory_request_bytes) if tune and tune.memory_request_bytes else None
    if limit is None and request is not None:
        limit = request  # tune ran without a memory limit: the measured request is the limit
    if cpu_milli is None and limit is None:
        if any(x is not None for x in (replicas, max_replicas, cpu_target, plan)):
            raise LayoutError("cpus", "a pod count needs a pod size: give the layout's @cpus and @memory, --from-tune "
                                      "DIR, or --cpus and --memory")
        return None
    if cpu_milli is None or limit is None:
        missing = "cpus" if cpu_milli is None else "memory"
        raise LayoutError(missing, f"a pod needs a CPU and a memory limit: add @{missing}= to the layout or give "
                                   f"--{missing}")
    floor = (processes + 1) * MIN_PROCESS_MEMORY
    if request is None and limit < floor:
        raise LayoutError("memory", f"{memory_quantity(limit)} cannot hold {processes} workers and the master: at "
                                    f"least {memory_quantity(floor)} ({memory_quantity(MIN_PROCESS_MEMORY)} a process)")
    if request is not None and tune.pss_mb is not None and limit < tune.pss_mb * 10**6:
        raise LayoutError("memory", f"{memory_quantity(limit)} is below the PSS tune measured ({tune.pss_mb:g} MB)")
    count, _ = _agree("replicas", [
        (f"--replicas {replicas}", whole("replicas", replicas, 0, 1, 1000) if replicas is not None else None),
        (f"the layout's @replicas={variant.replicas}" if variant.replicas else "", variant.replicas),
        (f"plan {plan.path}" if plan else "", plan.replicas if plan else None),
    ], str)
    target, _ = _agree("cpu_target", [
        (f"--cpu-target {cpu_target}", whole("cpu_target", cpu_target, 0, 10, 100) if cpu_target is not None
         else None),
        (f"plan {plan.path}" if plan else "", plan.cpu_percent if plan else None),
    ], lambda pct: f"{pct}%")
    count = count or DEFAULT_REPLICAS
    default_max = count * PLAN_MAX_FACTOR if plan else max(count, DEFAULT_MAX_REPLICAS)
    if tune is not None:
        resources_from = tune.words()
    elif cpu_from.endswith(NOT_MEASURED) and memory_from.endswith(NOT_MEASURED):
        resources_from = f"{cpu_from.removesuffix(NOT_MEASURED)} and {memory_from}"
    else:
        resources_from = f"CPU from {cpu_from}, memory from {memory_from}"
    return Limits(cpu_milli=cpu_milli, memory=limit, replicas=count,
                  max_replicas=whole("max_replicas", max_replicas, default_max, 1, 1000),
                  cpu_target=target or DEFAULT_CPU_TARGET,
                  # tune's PSS + 25% at or above the limit: the request is the limit (said so in the
                  # manifest), never a clamped figure passed off as the measurement
                  memory_request=request if request is not None and request < limit else None,
                  busy_target=plan.busy_target if plan else None, resources_from=resources_from,
                  scaling_from=plan.words() if plan else _unplanned(variant, replicas, max_replicas, cpu_target))


def _unplanned(variant: PodVariant, *options) -> str:
    said = "the layout's @replicas" if variant.replicas else ""
    said += (" and " if said else "") + "options" if any(o is not None for o in options) else ""
    return f"{said or 'defaults'} (no plan)"


def _rounded_mib(size: int) -> int:
    return -(-size // MIB) * MIB
