"""The capacity plan's report (``uwsgi-layouts plan``), judged once, as data: which of one
replica's steps met the target (passed, p99 within it), the lowest rate above the plan's that did
not, and whether the plan's rate per replica is within ``TARGET_DIFFERENCE`` of every replica
count the validation searched. The plan stores it in plan.json (``judgement``) beside what it
judged, and the report (``bench.report.plan``) only words it; a plan.json written before it was
stored is judged again from its steps and rows (``plan_judgement``), as it was then.
"""

from __future__ import annotations

from dataclasses import dataclass

from uwsgi_layouts.bench.capacity import Plan, RateStep

TARGET_DIFFERENCE = 0.10  # the target: the plan's rate per replica within 10% of each count's


@dataclass(frozen=True)
class Validation:
    """The validation's largest difference (the plan's rate per replica over a count's own, less
    1), the count it was measured at, and whether it is within ``target``."""

    target: float
    difference: float
    replicas: int
    within: bool

    def __post_init__(self):
        for name in ("target", "difference"):
            if not isinstance(getattr(self, name), (int, float)) or isinstance(getattr(self, name), bool):
                raise ValueError(f"validation.{name}: must be a number, got {getattr(self, name)!r}")
        if not isinstance(self.within, bool):
            raise ValueError(f"validation.within: must be true or false, got {self.within!r}")
        if self.within != (abs(self.difference) <= self.target):
            raise ValueError(f"validation.within: {str(self.within).lower()}, but the largest difference "
                             f"{self.difference:+.1%} is {'' if abs(self.difference) <= self.target else 'not '}"
                             f"within {self.target:.0%}")


@dataclass(frozen=True)
class PlanJudgement:
    """What the plan's report states of its steps and its validation (None: no count's own
    capacity was measured)."""

    met: tuple[float, ...]  # the rates of one replica's steps that met the target
    next_miss: float | None  # the lowest rate above the plan's per replica that did not (None: none tried)
    validation: Validation | None

    def __post_init__(self):
        if self.next_miss is not None and (isinstance(self.next_miss, bool)
                                           or not isinstance(self.next_miss, (int, float))):
            raise ValueError(f"judgement.next_miss: must be a rate or null, got {self.next_miss!r}")

    def to_dict(self) -> dict:
        v = self.validation
        return {"met": list(self.met), "next_miss": self.next_miss,
                "validation": None if v is None else {"target": v.target, "difference": v.difference,
                                                      "replicas": v.replicas, "within": v.within}}

    @classmethod
    def from_dict(cls, data: dict) -> "PlanJudgement":
        """A stored judgement; ValueError (or KeyError, TypeError) names a bad field."""
        if not isinstance(data, dict):
            raise ValueError(f"judgement: must be an object, got {type(data).__name__}")
        v = data["validation"]
        if v is not None and not isinstance(v, dict):
            raise ValueError(f"judgement.validation: must be an object or null, got {type(v).__name__}")
        met = data["met"]
        if not isinstance(met, list) or any(isinstance(r, bool) or not isinstance(r, (int, float)) for r in met):
            raise ValueError(f"judgement.met: must be a list of rates, got {met!r}")
        return cls(tuple(float(r) for r in met), data["next_miss"],
                   None if v is None else Validation(v["target"], v["difference"], v["replicas"], v["within"]))


def met_rates(steps, target_p99_ms: float) -> tuple[float, ...]:
    """The rates of ``steps`` that met ``target_p99_ms`` (``RateStep.meets``), in the steps' order."""
    return tuple(s.rate for s in steps if s.meets(target_p99_ms))


def next_miss(plan: Plan) -> float | None:
    """The lowest rate of the plan's steps above its rate per replica that did not meet its target."""
    above = [s.rate for s in plan.steps if s.rate > plan.per_replica_rate and not s.meets(plan.target_p99_ms)]
    return min(above) if above else None


def validation_of(rows: list[dict]) -> Validation | None:
    """The validation rows' largest difference against ``TARGET_DIFFERENCE`` (None: no count was resolved)."""
    within = [r for r in rows if r["difference"] is not None]
    if not within:
        return None
    worst = max(within, key=lambda r: abs(r["difference"]))
    return Validation(TARGET_DIFFERENCE, worst["difference"], worst["replicas"],
                      abs(worst["difference"]) <= TARGET_DIFFERENCE)


def judge_plan(data: dict) -> PlanJudgement:
    """The judgement of a plan's data (as plan.json holds it)."""
    steps = [RateStep.from_dict(s) for s in data.get("steps") or ()]
    plan = Plan.from_dict(data["plan"]) if data.get("plan") else None
    return PlanJudgement(met_rates(steps, data["arguments"]["p99_ms"]), next_miss(plan) if plan is not None else None,
                         validation_of(data["validation"]) if data.get("validation") else None)


def plan_judgement(data: dict) -> PlanJudgement:
    """The judgement plan.json stores, or, for a file written before it was stored, judged again. A
    stored one that the plan's own steps and rows contradict (edited, or damaged) is a ValueError
    naming the field, as a stored compare summary's readings are checked against their intervals."""
    stored = data.get("judgement")
    if stored is None:
        return judge_plan(data)
    judged, again = PlanJudgement.from_dict(stored), judge_plan(data)
    for field in ("met", "next_miss", "validation"):
        if getattr(judged, field) != getattr(again, field):
            raise ValueError(f"judgement.{field}: {getattr(judged, field)!r}, but the plan's own steps and rows "
                             f"say {getattr(again, field)!r}")
    return judged
