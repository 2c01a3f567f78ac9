"""Verdicts of the reproduction report, computed: every claim declares its criterion over named
measured numbers, and its verdict is what the criterion says of the numbers.

A :class:`Criterion` reads the numbers it names (``names``) and answers three-valued:

- ``holds(values)``: True (the claim holds as stated), False (it does not), None (the
  measurement cannot decide: too few seeds, spreads that overlap, a run too short);
- ``another_axis(values)`` (optional): the same for the claim measured differently (per float
  instead of per round, ...).

:meth:`Criterion.judge` turns the answers into one of :data:`OUTCOMES`: **reproduced** when it
holds; else **reproduced on another axis** when that holds; else **inconclusive** when either
could not decide (**inconclusive (quick)** in a ``--quick`` report, whose sizes are toys); else
**not reproduced**. The :class:`Verdict` keeps the criterion's statement and the numbers, and the
report prints them beside the outcome. A claim's verdict argument is always such a judgement
(:class:`Claim` refuses anything else, and tests/test_report.py reads the report's source to
make sure no call site passes a literal); every criterion is registered in :data:`CRITERIA`, and
a test feeds each numbers on both sides of it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from ..errors import FocusflError

# The sources a claim names, by title and venue (a number such as "seed 002", the papers' file
# names in the project's library, read as a random seed): one definition for every report section.
FOCUS = "FOCUS paper (Ying, Li, Yang, NeurIPS 2025)"
REVIEWS = "FOCUS paper's reviews and the authors' answers (OpenReview)"
FEDSUM = "FedSUM paper (\"FedSUM Family\")"

REPRODUCED = "reproduced"
ANOTHER_AXIS = "reproduced on another axis"
NOT_REPRODUCED = "not reproduced"
INCONCLUSIVE = "inconclusive"
INCONCLUSIVE_QUICK = "inconclusive (quick)"
OUTCOMES = (REPRODUCED, ANOTHER_AXIS, NOT_REPRODUCED, INCONCLUSIVE, INCONCLUSIVE_QUICK)
MIN_SEEDS = 3  # a comparison over seeds separates two methods only with at least this many

Decision = "bool | None"
CRITERIA: dict[str, "Criterion"] = {}  # every criterion of the report, by name


def show(value: Any) -> str:
    """A measured number as the report prints it: never Python's None or nan."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple)):
        return "/".join(show(v) for v in value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "—"
        if math.isinf(value):
            return "∞" if value > 0 else "-∞"
        return f"{value:.3g}"
    return str(value)


@dataclass(frozen=True)
class Verdict:
    """A judged claim: its outcome, the criterion in words, the numbers it read and the reason."""

    outcome: str
    criterion: str
    values: dict
    reason: str = ""
    name: str = ""  # the criterion's name (CRITERIA)

    def measured(self) -> str:
        return ", ".join(f"{name} = {show(value)}" for name, value in self.values.items())

    def markdown(self) -> str:
        text = f"**{self.outcome}** (criterion: {self.criterion}; measured: {self.measured()})"
        return text + (f": {self.reason}" if self.reason else "")


@dataclass(frozen=True)
class Criterion:
    """A claim's test over named numbers (module docstring). ``reasons[outcome]``: the explanation
    printed with that outcome (an outcome without one prints none)."""

    name: str
    statement: str
    names: tuple[str, ...]
    holds: Callable[[Mapping[str, Any]], "bool | None"]
    another_axis: Callable[[Mapping[str, Any]], "bool | None"] | None = None
    reasons: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.name in CRITERIA:
            raise FocusflError(f"two criteria are named {self.name!r}")
        unknown = set(self.reasons) - set(OUTCOMES)
        if unknown:
            raise FocusflError(f"criterion {self.name!r} explains unknown outcomes {sorted(unknown)}")
        CRITERIA[self.name] = self

    def outcome(self, values: Mapping[str, Any], *, quick: bool = False) -> str:
        missing = [name for name in self.names if name not in values]
        if missing:
            raise FocusflError(f"criterion {self.name!r} needs {', '.join(missing)}, which the report did not measure")
        stated = self.holds(values)
        if stated is True:
            return REPRODUCED
        other = self.another_axis(values) if self.another_axis is not None else False
        if other is True:
            return ANOTHER_AXIS
        if stated is None or other is None:
            return INCONCLUSIVE_QUICK if quick else INCONCLUSIVE
        return NOT_REPRODUCED

    def judge(self, values: Mapping[str, Any], *, quick: bool = False, reason: str = "") -> Verdict:
        """The verdict on ``values`` (``quick``: a toy-size report); ``reason`` adds to the
        criterion's own explanation of the outcome."""
        outcome = self.outcome(values, quick=quick)
        parts = [p for p in (self.reasons.get(outcome, ""), reason) if p]
        if outcome == INCONCLUSIVE_QUICK:
            parts.insert(0, "the quick report's sizes cannot decide this")
        shown = {name: values[name] for name in self.names}
        return Verdict(outcome, self.statement, shown, "; ".join(parts), self.name)


# -- helpers the criteria share ------------------------------------------------------------------
def finite(value: Any) -> bool:
    """A measured number that exists (a run reached it): not None, not nan, not inf."""
    return value is not None and isinstance(value, (int, float)) and math.isfinite(value)


def measured(value: Any) -> bool:
    """A number a comparison can use: not None, not nan (+inf is one: "never reached")."""
    return value is not None and isinstance(value, (int, float)) and not math.isnan(value)


def ahead(first: Sequence[float], second: Sequence[float], min_seeds: int = MIN_SEEDS) -> "bool | None":
    """Whether the values of ``first`` lie above those of ``second`` over the seeds: True when
    every one of first exceeds every one of second, False when every one of second exceeds every
    one of first, None when the spreads overlap or either has fewer than ``min_seeds`` values (or
    a missing one: None or nan; +inf counts, as "never")."""
    if len(first) < min_seeds or len(second) < min_seeds or not all(map(measured, [*first, *second])):
        return None
    if min(first) > max(second):
        return True
    if max(first) < min(second):
        return False
    return None


def all_of(decisions: Sequence["bool | None"]) -> "bool | None":
    """Three-valued AND: False if any is False, None if any is undecided, else True."""
    if any(d is False for d in decisions):
        return False
    if any(d is None for d in decisions):
        return None
    return True


def any_of(decisions: Sequence["bool | None"]) -> "bool | None":
    """Three-valued OR: True if any is True, None if any is undecided, else False."""
    if any(d is True for d in decisions):
        return True
    if any(d is None for d in decisions):
        return None
    return False


@dataclass
class Claim:
    """One row of the report: which paper and where, the claim, what we ran, our number and the
    verdict, a :class:`Verdict` (computed by a criterion; a string is refused)."""

    paper: str
    where: str
    claim: str
    ran: str
    number: str
    verdict: Verdict

    def __post_init__(self) -> None:
        if not isinstance(self.verdict, Verdict):
            raise TypeError(f"a claim's verdict is computed by a Criterion, got {self.verdict!r}")


@dataclass
class Section:
    title: str
    claims: list[Claim] = field(default_factory=list)
    text: list[str] = field(default_factory=list)  # markdown paragraphs, tables, figures
    seconds: float = 0.0
    # Of ``seconds``, those the section spent on its neural-network part (the runs on --data's
    # digits), measured by the section itself: the report's header splits its time on it.
    nn_seconds: float = 0.0


def claims_table(sections: Sequence[Section]) -> list[str]:
    """The markdown table of every claim of ``sections``, numbered in order."""
    lines = ["| # | paper | where | claim | what we ran | our number | verdict |", "|---|---|---|---|---|---|---|"]
    k = 0
    for section in sections:
        for claim in section.claims:
            k += 1
            cells = [str(k), claim.paper, claim.where, claim.claim, claim.ran, claim.number, claim.verdict.markdown()]
            lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return lines


def claims_rows(sections: Sequence[Section]) -> list[dict]:
    """summary.csv's rows: one per claim, its verdict with the criterion and the numbers it read."""
    return [{"paper": c.paper, "where": c.where, "claim": c.claim, "number": c.number, "verdict": c.verdict.outcome,
             "criterion": c.verdict.criterion, "measured": c.verdict.measured(), "reason": c.verdict.reason}
            for s in sections for c in s.claims]
