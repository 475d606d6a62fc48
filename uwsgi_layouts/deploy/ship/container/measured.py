"""The measurements a Kubernetes bundle takes its figures from, read from the files the lab
writes (JSON only: deploy never imports bench, which wrote them):

    tune_pod(DIR)       tune --cpus N [--memory MB]'s results.json: the pod's limits it ran under, the
                        layout it recommends and its memory request (PSS after load + 25%), what its
                        POD line says (``arguments.tune.pod``)
    capacity_plan(FILE) plan's plan.json: the replicas that carry the target rate, the CPU utilisation
                        of the limit at the design rate (the autoscaler's target) and the busy ratio

A file that is missing, of another kind, unfinished, without the figure asked for or from a run
that measured nothing is a ``LayoutError`` naming the option (``from_tune``, ``plan``): one line,
exit 2, before anything is written.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from uwsgi_layouts.deploy.model import LayoutError

RESULTS_NAME = "results.json"
MB = 10**6  # the lab's *_mb figures (PSS) are in MB of 10^6 bytes
MIB = 2**20  # a layout's @memory and tune's --memory are in MiB


def _read_json(field_name: str, path: Path, what: str) -> dict:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise LayoutError(field_name, f"{path} does not exist: give {what}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise LayoutError(field_name, f"cannot read {path} ({getattr(exc, 'strerror', None) or exc})") from None
    except json.JSONDecodeError as exc:
        raise LayoutError(field_name, f"{path} is not JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, dict):
        raise LayoutError(field_name, f"{path} is not {what}")
    return data


def spec_shape(spec: str) -> str:
    """PxT-STRATEGY of a layout spec, its variants (``@cpus=1,...``) aside."""
    return spec.strip().partition("@")[0]


@dataclass(frozen=True)
class TunePod:
    """What ``tune --cpus N [--memory MB]`` measured for a pod of that size."""

    path: Path
    layout: str  # the recommended PxT-STRATEGY
    cpus: float
    memory_mib: int | None  # the memory limit every candidate ran under (None: tune ran without one)
    pss_mb: float | None  # the recommended layout's PSS after load
    memory_request_mb: float | None  # that + the margin

    def __post_init__(self):
        if not self.cpus > 0:
            raise LayoutError("from_tune", f"{self.path}: the pod's CPUs must be above 0, got {self.cpus!r}")
        if self.memory_request_mb is not None and not self.memory_request_mb > 0:
            raise LayoutError("from_tune", f"{self.path}: a memory request must be above 0, got "
                                           f"{self.memory_request_mb!r}")

    @property
    def memory_request_bytes(self) -> int | None:
        return None if self.memory_request_mb is None else math.ceil(self.memory_request_mb * MB)

    def words(self) -> str:
        memory = f", memory limit {self.memory_mib} MiB" if self.memory_mib else ""
        request = (f", memory request {self.memory_request_mb:g} MB (PSS after load {self.pss_mb:g} MB + 25%)"
                   if self.memory_request_mb is not None and self.pss_mb is not None else "")
        return f"tune results {self.path.parent} ({self.layout} for {self.cpus:g} CPU{memory}{request})"


def tune_pod(raw: str) -> TunePod:
    """tune's results directory (or its results.json) -> its pod figures."""
    given = Path(raw)
    path = given / RESULTS_NAME if given.is_dir() else given
    data = _read_json("from_tune", path, "a tune results directory (tune --cpus N --out DIR)")
    arguments = data.get("arguments") if isinstance(data.get("arguments"), dict) else {}
    if data.get("kind") != "tune":
        raise LayoutError("from_tune", f"{path} holds a {data.get('kind') or 'unknown'} run, not tune's")
    if not arguments.get("complete"):
        raise LayoutError("from_tune", f"{path}: the tune run did not finish (no recommendation): run it to the end")
    record = arguments.get("tune") if isinstance(arguments.get("tune"), dict) else {}
    recommended = record.get("recommended") if isinstance(record.get("recommended"), dict) else None
    if recommended is None:
        raise LayoutError("from_tune", f"{path}: tune recommended no layout (none met the objective)")
    if arguments.get("cpus") is None:
        raise LayoutError("from_tune", f"{path}: tune ran without --cpus, so it sized no pod: run `uwsgi-layouts "
                                       "tune --cpus N --memory MB`")
    pod = record.get("pod")
    if not isinstance(pod, dict):
        raise LayoutError("from_tune", f"{path} has no pod record (written by an older uwsgi-layouts): replay it with "
                                       f"`uwsgi-layouts tune --replay {path} --out NEW_DIR` and give NEW_DIR")
    try:
        return TunePod(path=path, layout=spec_shape(str(pod["layout"])), cpus=float(pod["cpus"]),
                       memory_mib=None if pod.get("memory_mb") is None else int(pod["memory_mb"]),
                       pss_mb=None if pod.get("pss_mb") is None else float(pod["pss_mb"]),
                       memory_request_mb=(None if pod.get("memory_request_mb") is None
                                          else float(pod["memory_request_mb"])))
    except (KeyError, TypeError, ValueError) as exc:
        raise LayoutError("from_tune", f"{path}: its pod record is malformed ({exc})") from None


@dataclass(frozen=True)
class CapacityPlan:
    """What ``plan`` computed for a target rate within a p99."""

    path: Path
    layout: str  # the layout spec planned, with its @cpus
    cpus: float | None
    replicas: int
    cpu_target: float  # CPU used / limit at the design rate, 0..1
    busy_target: float | None  # busy threads / threads at the design rate
    target_rate: float
    target_p99_ms: float
    per_replica_rate: float

    def __post_init__(self):
        if self.replicas < 1:
            raise LayoutError("plan", f"{self.path}: a plan of {self.replicas} replicas")
        if not 0 < self.cpu_target <= 1:
            raise LayoutError("plan", f"{self.path}: a CPU target must be in (0, 1], got {self.cpu_target!r}")

    @property
    def cpu_percent(self) -> int:
        """The HorizontalPodAutoscaler's averageUtilization: of the request, which equals the limit."""
        return max(1, round(self.cpu_target * 100))

    def words(self) -> str:
        return (f"plan {self.path} ({self.replicas} replicas of {self.layout} for {self.target_rate:g} req/s within "
                f"p99 {self.target_p99_ms:g} ms, {self.per_replica_rate:g} req/s each; CPU target {self.cpu_percent}% "
                "of the limit at the design rate)")


def capacity_plan(raw: str) -> CapacityPlan:
    """plan's plan.json (or the directory holding it) -> the plan's figures."""
    given = Path(raw)
    path = given / "plan.json" if given.is_dir() else given
    data = _read_json("plan", path, "plan.json (uwsgi-layouts plan --layout L --rate R --p99-ms X)")
    if data.get("kind") != "plan":
        raise LayoutError("plan", f"{path} holds a {data.get('kind') or 'unknown'} run, not plan's")
    plan = data.get("plan")
    if not isinstance(plan, dict):
        raise LayoutError("plan", f"{path} holds no plan ({data.get('error') or 'the run did not finish'})")
    if plan.get("cpus") is None or plan.get("cpu_target") is None:
        raise LayoutError("plan", f"{path}: its layout {plan.get('layout')} had no @cpus, so the plan has no pod size "
                                  "and no CPU target: plan with e.g. @cpus=1")
    try:
        return CapacityPlan(path=path, layout=str(plan["layout"]), cpus=float(plan["cpus"]),
                            replicas=int(plan["replicas"]), cpu_target=float(plan["cpu_target"]),
                            busy_target=None if plan.get("busy_target") is None else float(plan["busy_target"]),
                            target_rate=float(plan["target_rate"]), target_p99_ms=float(plan["target_p99_ms"]),
                            per_replica_rate=float(plan["per_replica_rate"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise LayoutError("plan", f"{path}: its plan is malformed ({exc})") from None
