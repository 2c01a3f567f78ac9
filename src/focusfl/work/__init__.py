"""Work processes: how many local steps each active client takes in each round.

Build one with :func:`make_work` from a spec such as ``"uniform"``, ``"rates:r=0.25;1"`` or
``"markov:p=0.3,rho=0.8,slow=0.25"`` (or the dict that :meth:`WorkProcess.describe` returns).
``fixed`` (the default) is the classical setting: every active client does the algorithm's
``local_steps``. ``trace:path=PATH`` replays recorded counts (work/trace.py; a federation's
``work.csv``).
"""
from __future__ import annotations

from ..errors import ConfigError
from ..spec import parse_spec, take_params
from .base import WorkProcess
from .processes import FixedWork, MarkovWork, RatesWork, UniformWork
from .statistics import StepLaw, step_law
from .trace import TraceWork

WORK: dict[str, type[WorkProcess]] = {cls.name: cls for cls in (FixedWork, UniformWork, RatesWork, MarkovWork,
                                                                 TraceWork)}


def available_work() -> list[str]:
    """Registered work-process names, in registry order."""
    return list(WORK)


def make_work(spec: str | dict, num_clients: int, local_steps: int, seed: int = 0) -> WorkProcess:
    """Build a work process; unknown names and keys and invalid values raise ConfigError."""
    name, params = parse_spec(spec)
    cls = WORK.get(name)
    if cls is None:
        raise ConfigError(f"unknown work {name!r} (known: {', '.join(WORK)})")
    params = take_params(f"work {name}", params, cls.DEFAULTS)
    return cls(num_clients, local_steps, seed, **params)


__all__ = ["WORK", "StepLaw", "WorkProcess", "available_work", "make_work", "step_law", *(cls.__name__ for cls in WORK.values())]
