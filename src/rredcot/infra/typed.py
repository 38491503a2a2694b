"""Typed settings: dataclasses as the one home of every default, its type and its documentation.

A settings class is a plain dataclass whose fields carry their defaults and, in the docstring right
below each field (the style of the method's own configs), their meaning. This module turns such a
class tree into what the rest of the project needs, so none of it is written twice:

- :func:`build`: a nested dict (merged YAML) into validated instances, naming the bad key
  (``rl.max_steps: expected an integer, got 'ten'``); unknown keys are errors;
- :func:`to_dict`: instances back into plain dicts (lists, not tuples), what the stages read;
- :func:`json_schema`: the JSON schema (types, enums, defaults, descriptions, bounds);
- :func:`field_docs`: the attribute docstrings, for generated documentation.

Bounds that a type cannot say go in the field's metadata (``field(default=4, metadata=at_least(1))``,
:func:`within`, :func:`not_blank`, :func:`not_empty`) and are checked here and written into the
schema; cross-field rules stay in ``__post_init__``.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import textwrap
import types
import typing
from collections.abc import Mapping
from functools import cache
from typing import Any, Literal, get_args, get_origin

_NOT_BLANK = r"\S"
# The metadata keys that are JSON-schema keywords, written into the schema as they are.
_SCHEMA_KEYS = ("minimum", "exclusiveMinimum", "maximum", "pattern", "minItems", "uniqueItems")


class SettingsError(ValueError):
    """A value that does not fit its setting; ``path`` names the key (``rl.max_steps``)."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path or '<top level>'}: {message}")
        self.path, self.message = path, message


def at_least(minimum: float, exclusive: bool = False) -> dict[str, Any]:
    """Field metadata: a lower bound."""
    return {"exclusiveMinimum" if exclusive else "minimum": minimum}


def within(minimum: float, maximum: float, exclusive_minimum: bool = False) -> dict[str, Any]:
    """Field metadata: a closed range (optionally open at the bottom)."""
    return {**at_least(minimum, exclusive_minimum), "maximum": maximum}


def not_blank() -> dict[str, Any]:
    """Field metadata: a string with at least one character that is not whitespace."""
    return {"pattern": _NOT_BLANK}


def not_empty(unique: bool = False) -> dict[str, Any]:
    """Field metadata: a list with at least one item (and, if ``unique``, no item twice)."""
    return {"minItems": 1, **({"uniqueItems": True} if unique else {})}


@cache
def field_docs(cls: type) -> dict[str, str]:
    """The docstring written right below each field of a dataclass (and of its bases), whitespace
    collapsed."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass) or klass is object:
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, after in zip(body, body[1:], strict=False):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[node.target.id] = " ".join(after.value.value.split())
    return docs


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if tp in (int, float, str, bool):
        return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}[tp]
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    if origin in (list, tuple):
        return "a list"
    if origin is dict:
        return "a mapping"
    return str(tp)


def _convert(tp: Any, value: Any, path: str) -> Any:
    """``value`` checked against type ``tp`` (nested dataclasses built); raises SettingsError."""
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin in (types.UnionType, typing.Union):
        options = get_args(tp)
        if value is None and type(None) in options:
            return None
        for option in (o for o in options if o is not type(None)):
            try:
                return _convert(option, value, path)
            except SettingsError:
                continue
        names = " or ".join(_type_name(o) for o in options if o is not type(None))
        nullable = " or null" if type(None) in options else ""
        raise SettingsError(path, f"expected {names}{nullable}, got {value!r}")
    if origin is Literal:
        if value not in get_args(tp):
            raise SettingsError(path, f"expected {_type_name(tp)}, got {value!r}")
        return value
    if dataclasses.is_dataclass(tp):
        return build(tp, value, path)
    if tp is bool:
        if not isinstance(value, bool):
            raise SettingsError(path, f"expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise SettingsError(path, f"expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            hint = ""
            if isinstance(value, str) and _is_number(value):
                # YAML 1.1 (PyYAML) reads 3e-4 as text: its floats need a dot before the exponent.
                hint = f" (YAML reads {value} as text: write it with a dot, e.g. {float(value)!r})"
            raise SettingsError(path, f"expected a number, got {value!r}{hint}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise SettingsError(path, f"expected a string, got {value!r}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            raise SettingsError(path, f"expected a list, got {value!r}")
        (item,) = get_args(tp)[:1]
        items = [_convert(item, v, f"{path}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, Mapping):
            raise SettingsError(path, f"expected a mapping, got {value!r}")
        key_tp, value_tp = get_args(tp)
        return {_convert(key_tp, k, path): _convert(value_tp, v, f"{path}.{k}") for k, v in value.items()}
    raise TypeError(f"{path}: unsupported settings type {tp!r}")


def _check_meta(value: Any, meta: Mapping[str, Any], path: str) -> None:
    """What a field's metadata sets: choices (``enum``), a pattern a string must match (``not_blank``),
    a least length and distinct items of a list (``not_empty``), numeric bounds."""
    if "enum" in meta and value is not None and value not in meta["enum"]:
        raise SettingsError(path, f"expected one of {', '.join(map(repr, meta['enum']))}, got {value!r}")
    if "pattern" in meta and isinstance(value, str) and not re.search(meta["pattern"], value):
        if meta["pattern"] == _NOT_BLANK:
            raise SettingsError(path, f"must not be empty or only whitespace, got {value!r}")
        raise SettingsError(path, f"must match {meta['pattern']!r}, got {value!r}")
    if isinstance(value, list | tuple):
        if len(value) < meta.get("minItems", 0):
            raise SettingsError(path, f"must hold at least {meta['minItems']} item(s), got {list(value)!r}")
        if meta.get("uniqueItems") and len(set(map(repr, value))) < len(value):
            raise SettingsError(path, f"must not hold an item twice, got {list(value)!r}")
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        return
    if "minimum" in meta and value < meta["minimum"]:
        raise SettingsError(path, f"must be at least {meta['minimum']}, got {value}")
    if "exclusiveMinimum" in meta and value <= meta["exclusiveMinimum"]:
        raise SettingsError(path, f"must be greater than {meta['exclusiveMinimum']}, got {value}")
    if "maximum" in meta and value > meta["maximum"]:
        raise SettingsError(path, f"must be at most {meta['maximum']}, got {value}")


def build(cls: type, data: Any, path: str = "") -> Any:
    """An instance of dataclass ``cls`` from a mapping (absent keys take their defaults)."""
    if isinstance(data, cls):
        return data
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise SettingsError(path, f"expected a mapping, got {data!r}")
    known = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(known))
    if unknown:
        where = f"{path}." if path else ""
        raise SettingsError(f"{where}{unknown[0]}", f"unknown key (known: {', '.join(known)})")
    hints = _hints(cls)
    values = {}
    for name, f in known.items():
        key = f"{path}.{name}" if path else name
        if name not in data:
            if _default(f) is dataclasses.MISSING:
                raise SettingsError(key, "required")
            continue
        value = _convert(hints[name], data[name], key)
        _check_meta(value, f.metadata, key)
        values[name] = value
    try:
        return cls(**values)
    except SettingsError:
        raise
    except (TypeError, ValueError) as exc:
        raise SettingsError(path, str(exc)) from None


def to_dict(obj: Any) -> Any:
    """Plain nested dicts and lists of a settings instance (tuples become lists, for YAML)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.init}
    if isinstance(obj, Mapping):
        return {k: to_dict(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [to_dict(v) for v in obj]
    return obj


def _schema_of(tp: Any) -> dict[str, Any]:
    origin = get_origin(tp)
    if tp is Any:
        return {}
    if origin in (types.UnionType, typing.Union):
        options = [o for o in get_args(tp)]
        return {"anyOf": [{"type": "null"} if o is type(None) else _schema_of(o) for o in options]}
    if origin is Literal:
        return {"enum": list(get_args(tp))}
    if dataclasses.is_dataclass(tp):
        return json_schema(tp)
    simple = {bool: "boolean", int: "integer", float: "number", str: "string"}
    if tp in simple:
        return {"type": simple[tp]}
    if origin in (list, tuple):
        return {"type": "array", "items": _schema_of(get_args(tp)[0])}
    if origin is dict:
        return {"type": "object", "additionalProperties": _schema_of(get_args(tp)[1])}
    raise TypeError(f"unsupported settings type {tp!r}")


def json_schema(cls: type) -> dict[str, Any]:
    """JSON schema of a settings class: every field with its type, bounds, default and docstring."""
    docs, hints = field_docs(cls), _hints(cls)
    props: dict[str, Any] = {}
    required = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        node = _schema_of(hints[f.name])
        node.update({k: v for k, v in f.metadata.items() if k in _SCHEMA_KEYS})
        if "enum" in f.metadata:
            node = {"enum": list(f.metadata["enum"])}
        default = _default(f)
        if default is dataclasses.MISSING:
            required.append(f.name)
        elif not dataclasses.is_dataclass(default):
            node["default"] = to_dict(default)
        if f.name in docs:
            node["description"] = docs[f.name]
        props[f.name] = node
    schema: dict[str, Any] = {"type": "object", "additionalProperties": False, "properties": props}
    if cls.__doc__ and not cls.__doc__.startswith(f"{cls.__name__}("):
        schema["description"] = " ".join(cls.__doc__.split("\n\n")[0].split())
    if required:
        schema["required"] = required
    return schema


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
