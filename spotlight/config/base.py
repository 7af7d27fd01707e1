"""The machinery of typed configs: documented fields, validation, and building from YAML data.

Every field is declared with :func:`spec` (default, help text, allowed range or choices, and
whether it names a file); :class:`Validated` checks each field's type and rule after
construction, then the class's own cross-field ``validate()``. Configs are frozen: a checked
config cannot drift afterwards; :func:`replaced` makes a changed, re-validated copy.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from dataclasses import field
from typing import Any


class ConfigError(ValueError):
    """A configuration file or value is invalid; the message says what to change."""


# What a path field requires of its file: "exists" must be there when the run starts (and is
# parsed then); "optional" is resolved like the others but may not exist yet (a notice file).
PATH_KINDS = ("exists", "optional")


def spec(default: Any, help: str, *, range: tuple[float, float] | None = None,
         choices: tuple[Any, ...] | None = None, path: str | None = None) -> Any:
    """A dataclass field with its documentation and validation rule.

    ``path`` marks a field that names a file ("exists" or "optional"): a config file's paths
    are resolved against the folder of that file, and must exist before anything is written.
    """
    if path is not None and path not in PATH_KINDS:
        raise ValueError(f"spec(path={path!r}): choose one of {PATH_KINDS}")
    meta = {"help": help, "range": range, "choices": choices, "path": path}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def type_name(hint: Any) -> str:
    """A type hint as a user reads it: ``int``, ``list[int]``, ``float``."""
    if typing.get_origin(hint) is list:
        (item,) = typing.get_args(hint) or (Any,)
        return f"list[{type_name(item)}]"
    return getattr(hint, "__name__", str(hint))


def check_type(hint: Any, value: Any) -> bool:
    """Whether ``value`` is of the declared type (bool is not a number; int is a float)."""
    if typing.get_origin(hint) is list:
        (item,) = typing.get_args(hint) or (Any,)
        return isinstance(value, list) and all(check_type(item, v) for v in value)
    if hint is Any or dataclasses.is_dataclass(hint):
        return True
    if hint is bool:
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if hint is float:
        return isinstance(value, (int, float))
    if hint in (int, str):
        return isinstance(value, hint)
    return True


class Validated:
    """Mixin: checks every field's type and range/choices after construction, then ``validate``."""

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            where = f"{type(self).__name__}.{f.name}"
            hint = hints.get(f.name, Any)
            if not check_type(hint, value):
                raise ConfigError(f"{where} = {value!r} must be of type {type_name(hint)}"
                                  + (", e.g. [16, 24, 32]" if type_name(hint) == "list[int]"
                                     else ""))
            rng, choices = f.metadata.get("range"), f.metadata.get("choices")
            items = value if isinstance(value, list) else [value]
            for item in items:
                if choices is not None and item not in choices:
                    raise ConfigError(f"{where} = {value!r} is not allowed; choose from "
                                      f"{list(choices)}")
                if rng is not None and (not math.isfinite(item) or not rng[0] <= item <= rng[1]):
                    raise ConfigError(f"{where} = {value!r} is out of range; allowed range is "
                                      f"[{rng[0]}, {rng[1]}]")
        self.validate()

    def validate(self) -> None:
        """Cross-field checks; override where fields constrain each other."""


def field_names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls) if f.name != "source"]


def nearest(key: str, names: list[str]) -> str:
    """``; did you mean 'x'?`` for the closest valid name, or nothing."""
    near = difflib.get_close_matches(str(key), names, n=1, cutoff=0.0)
    return f"; did you mean '{near[0]}'?" if near else ""


# Keys a config once had: a run store that recorded one still resumes (``without_retired``),
# a config file that sets one is told why it went.
RETIRED = {
    "preemption.dispatch": "spot requests are always pulled by workers with a free slot (Dask's "
                           "assign-all-at-once 'push' was a comparison, now made by bench "
                           "preemption itself)",
}


def without_retired(data: dict) -> dict:
    """A recorded config's data without its retired keys."""
    out = dict(data)
    for dotted in RETIRED:
        section, _, key = dotted.rpartition(".")
        if isinstance(out.get(section), dict) and key in out[section]:
            out[section] = {k: v for k, v in out[section].items() if k != key}
    return out


def build(cls: type, data: Any, path: str, source: str) -> Any:
    """Build dataclass ``cls`` from a mapping, refusing unknown keys and wrong types."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: '{path or '<top level>'}' must be a mapping of keys to "
                          f"values, got {type(data).__name__} ({data!r:.60})")
    hints = typing.get_type_hints(cls)
    names = field_names(cls)
    kwargs = {}
    for key, value in data.items():
        dotted = f"{path}.{key}" if path else str(key)
        if key not in names and dotted in RETIRED:
            raise ConfigError(f"{source}: '{dotted}' was retired: {RETIRED[dotted]}; delete it")
        if key not in names:
            raise ConfigError(f"{source}: unknown key '{dotted}'{nearest(key, names)} "
                              f"(valid here: {', '.join(names)})")
        kwargs[key] = coerce(hints[key], value, dotted, source)
    try:
        return cls(**kwargs)
    except ConfigError as err:
        raise ConfigError(f"{source}: {err}") from None


def coerce(hint: Any, value: Any, dotted: str, source: str) -> Any:
    """``value`` read from YAML as type ``hint``, or a ConfigError naming the key."""
    if dataclasses.is_dataclass(hint):
        return build(hint, value, dotted, source)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return value
    if typing.get_origin(hint) is list:
        (item,) = typing.get_args(hint) or (Any,)
        if not isinstance(value, list):
            raise ConfigError(f"{source}: '{dotted}' = {value!r} must be a list of "
                              f"{type_name(item)}, e.g. [{_example(item)}]")
        return [coerce(item, v, f"{dotted}[{i}]", source) for i, v in enumerate(value)]
    if hint is float and isinstance(value, str):
        # PyYAML reads "3e-4" (no dot) as a string; accept what a user plainly meant as a number.
        try:
            value = float(value)
        except ValueError:
            pass
    if not check_type(hint, value):
        raise ConfigError(f"{source}: '{dotted}' = {value!r} must be of type {type_name(hint)}")
    return float(value) if hint is float else value


def _example(item: Any) -> str:
    return {int: "16, 24, 32", float: "0.5, 1.0", str: "'a', 'b'"}.get(item, "...")


def replaced(config: Any, values: dict[str, Any]) -> Any:
    """A copy of a (nested) frozen config with dotted keys replaced, validated again as a whole
    (so fields that must change together, such as TLS files, can)."""
    data = dataclasses.asdict(config)
    source = data.pop("source", None)
    for dotted, value in values.items():
        node = data
        *parents, leaf = dotted.split(".")
        for depth, part in enumerate(parents):
            child = node.get(part)
            if not isinstance(child, dict):
                where = ".".join(parents[:depth + 1])
                if part in node:
                    raise ConfigError(f"override '{dotted}': '{where}' is a value, not a section")
                raise ConfigError(f"override '{dotted}': unknown key '{where}'"
                                  f"{nearest(part, list(node))} (valid here: {', '.join(node)})")
            node = child
        node[leaf] = value
    out = build(type(config), data, "", "override")
    return dataclasses.replace(out, source=source) if source is not None else out
