"""Parsing of ``name:key=value,key=value`` specifications used on the command line.

A name may be code to import (an algorithm of the user's own): ``path/to/file.py:Class`` or
``package.module:Class``, its parameters after a second colon (``file.py:MyProx:mu=0.1``).

A value is converted with :func:`convert`: ints, floats, booleans (true/false, yes/no, on/off),
and lists separated by ``;`` (``p=0.1;0.5``) are recognised; anything else stays a string.
"""
from __future__ import annotations

from typing import Any

from .errors import ConfigError


def parse_spec(spec: str | dict) -> tuple[str, dict[str, Any]]:
    """Split ``"ridge:dim=50,clients=16"`` into ``("ridge", {"dim": 50, "clients": 16})``.

    A dict ``{"name": ..., **params}`` is accepted too (the form stored in config.json).
    """
    if isinstance(spec, dict):
        params = dict(spec)
        name = params.pop("name", None)
        if not name:
            raise ConfigError(f"specification {spec!r} has no 'name'")
        return str(name), params
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError("empty specification")
    name, _, rest = spec.strip().partition(":")
    name = name.strip()
    if not name:
        raise ConfigError(f"specification {spec!r} has no name before ':'")
    attribute, colon, after = rest.partition(":")
    if is_import_target(name, attribute.strip()):
        name, rest = f"{name}:{attribute.strip()}", after if colon else ""
    params: dict[str, Any] = {}
    if rest.strip():
        for item in rest.split(","):
            key, eq, value = item.partition("=")
            key = key.strip()
            if not eq or not key:
                raise ConfigError(f"in {spec!r}: expected key=value, got {item.strip()!r}")
            if key in params:
                raise ConfigError(f"in {spec!r}: key {key!r} given twice")
            params[key] = convert(value.strip())
    return name, params


def is_import_target(head: str, attribute: str) -> bool:
    """Whether ``head:attribute`` names code to import rather than ``name:key=value``: a file
    (``path/to/file.py:Class``) or a module inside a package (``package.module:Class``), then a
    bare identifier. Registered names hold neither a dot nor a slash, so no SPEC of theirs reads so."""
    return any(mark in head for mark in (".", "/", "\\")) and attribute.isidentifier()


def convert(text: str) -> Any:
    """Turn a command-line value into int, float, bool, list or str."""
    if ";" in text:
        return [convert(part) for part in text.split(";") if part.strip()]
    lowered = text.lower()
    if lowered in ("true", "yes", "on"):
        return True
    if lowered in ("false", "no", "off"):
        return False
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            continue  # not this type: try the next, else keep the string
    return text


def format_spec(name: str, params: dict[str, Any]) -> str:
    """Inverse of :func:`parse_spec` for simple values (used in labels and config files)."""
    if not params:
        return name

    def fmt(value: Any) -> str:
        if isinstance(value, (list, tuple)):
            return ";".join(fmt(v) for v in value)
        if isinstance(value, bool):
            return "true" if value else "false"  # as users type it (parse_spec reads both)
        return str(value)

    return name + ":" + ",".join(f"{k}={fmt(v)}" for k, v in params.items())


def take_params(where: str, params: dict[str, Any], allowed: dict[str, Any]) -> dict[str, Any]:
    """Merge ``params`` into the defaults ``allowed``; unknown keys are a ConfigError.

    Values are cast to the type of the default where the default is an int, float or bool.
    """
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise ConfigError(
            f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(allowed)) or 'none'})"
        )
    merged = dict(allowed)
    for key, value in params.items():
        # as given (an integer for a float key) and as cast (a float for an integer key)
        cast = _cast_like(where, key, check_magnitude(where, key, value), allowed[key])
        merged[key] = check_magnitude(where, key, cast)
    return merged


# The largest integer a key may hold: counts, periods, gaps and seeds reach numpy and torch as
# int64, and an integer beyond it (or beyond a float's range, for a probability) ended in an
# OverflowError mid-run. Non-finite floats (inf, nan, 1e400) are each process's to refuse or allow.
LARGEST_INTEGER = (1 << 63) - 1


def check_magnitude(where: str, key: str, value: Any) -> Any:
    """``value`` (a list's items too), refused in one line where it is an integer beyond
    :data:`LARGEST_INTEGER` (``gap=1e300`` is one, as the whole number a count takes)."""
    for item in value if isinstance(value, (list, tuple)) else (value,):
        if isinstance(item, int) and not isinstance(item, bool) and abs(item) > LARGEST_INTEGER:
            digits = len(str(abs(item))) if abs(item).bit_length() < 10_000 else "too many"
            raise ConfigError(f"{where}: {key} is an integer of {digits} digits, beyond the largest "
                              f"allowed ({LARGEST_INTEGER}, 2**63 - 1)")
    return value


def _cast_like(where: str, key: str, value: Any, default: Any) -> Any:
    try:
        if isinstance(default, bool):
            if isinstance(value, bool):
                return value
            if value in (0, 1):
                return bool(value)
            raise ValueError
        if isinstance(default, int) and not isinstance(default, bool):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError
            return value
        if isinstance(default, float):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError
            return float(value)
    except ValueError:
        kind = type(default).__name__
        raise ConfigError(f"{where}: {key}={value!r} is not a valid {kind}") from None
    return value
