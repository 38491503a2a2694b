"""Typed settings: dataclasses as the one home of every default, its type and its documentation.

A settings class is a plain dataclass whose fields carry their defaults and, in the docstring right
below each field (the style of the method's own configs), their meaning. This module turns such a
class tree into what the rest of the project needs, so none of it is written twice:

- :func:`json_schema`: the JSON schema (types, enums, bounds, defaults, descriptions);
- :func:`build`: a nested dict (merged YAML) into instances, after validating it against that schema
  with ``jsonschema``; the first error names the bad key (``rl.max_steps: expected an integer, got
  'ten'``), and unknown keys are errors;
- :func:`to_dict`: instances back into plain dicts (lists, not tuples), what the stages read;
- :func:`field_docs`: the attribute docstrings, for generated documentation.

Bounds that a type cannot say go in the field's metadata as JSON-schema keywords
(``field(default=4, metadata=at_least(1))``, :func:`within`, :func:`not_blank`, :func:`not_empty`,
:func:`each`, :func:`each_value`): they are written into the schema and so checked by it. Rules
across fields stay in ``__post_init__``, which :func:`build` runs once the schema holds.

Written here rather than with pydantic: the method's own settings classes (``CreditSettings`` and
its parts) are plain dataclasses that the library ships without any validation package, and the
same classes are the sections of the pipeline's config.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
import types
import typing
from collections.abc import Mapping
from functools import cache
from typing import Any, Literal, get_args, get_origin

import jsonschema

_NOT_BLANK = r"\S"
# The metadata keys that are JSON-schema keywords, written into the schema as they are, and those
# that hold keywords of the items of a list or the values of a mapping, merged into that sub-schema.
_SCHEMA_KEYS = ("minimum", "exclusiveMinimum", "maximum", "pattern", "minItems", "maxItems", "uniqueItems")
_NESTED_KEYS = ("items", "additionalProperties")


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


def each(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """Field metadata: ``metadata`` (e.g. ``at_least(1)``) holds for every item of a list."""
    return {"items": dict(metadata)}


def each_value(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """Field metadata: ``metadata`` holds for every value of a mapping."""
    return {"additionalProperties": dict(metadata)}


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


def to_dict(obj: Any) -> Any:
    """Plain nested dicts and lists of a settings instance (tuples become lists, for YAML)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.init}
    if isinstance(obj, Mapping):
        return {k: to_dict(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [to_dict(v) for v in obj]
    return obj


# ---------------------------------------------------------------------------------------- schema
def _schema_of(tp: Any) -> dict[str, Any]:
    origin = get_origin(tp)
    if tp is Any:
        return {}
    if origin in (types.UnionType, typing.Union):
        return {"anyOf": [{"type": "null"} if o is type(None) else _schema_of(o) for o in get_args(tp)]}
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
        key, value = get_args(tp)
        return {"type": "object", "propertyNames": _schema_of(key), "additionalProperties": _schema_of(value)}
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
        for key in _NESTED_KEYS:
            if key in f.metadata:
                node[key] = {**node[key], **f.metadata[key]}
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


# ------------------------------------------------------------------------------------ validation
# JSON schema's integer takes 10.0; a setting typed int does not (YAML reads 10.0 as a float, and the
# stages would get it as one).
_TYPES = jsonschema.Draft202012Validator.TYPE_CHECKER.redefine(
    "integer", lambda _checker, value: isinstance(value, int) and not isinstance(value, bool)
)
Validator = jsonschema.validators.extend(jsonschema.Draft202012Validator, type_checker=_TYPES)
"""The validator of the settings schemas: draft 2020-12 (the schema file's), integers strict."""


@cache
def _validator(cls: type) -> Any:
    return Validator(json_schema(cls))


@cache
def _type_validator(tp: Any) -> Any:
    return Validator(_schema_of(tp))


def _expected(schema: Mapping[str, Any]) -> str:
    """What a schema node takes, in words: ``an integer``, ``a string or null``, ``one of 'a', 'b'``."""
    if "anyOf" in schema:
        options = [o for o in schema["anyOf"] if o.get("type") != "null"]
        nullable = len(options) < len(schema["anyOf"])
        return " or ".join(_expected(o) for o in options) + (" or null" if nullable else "")
    if "enum" in schema:
        return "one of " + ", ".join(repr(v) for v in schema["enum"])
    names = {
        "integer": "an integer",
        "number": "a number",
        "string": "a string",
        "boolean": "true or false",
        "object": "a mapping",
        "array": "a list",
        "null": "null",
    }
    return names.get(schema.get("type"), "any value")


def _takes_numbers(schema: Mapping[str, Any]) -> bool:
    return schema.get("type") == "number" or any(_takes_numbers(o) for o in schema.get("anyOf", ()))


def _yaml_hint(schema: Mapping[str, Any], value: Any) -> str:
    if _takes_numbers(schema) and isinstance(value, str) and _is_number(value):
        # YAML 1.1 (PyYAML) reads 3e-4 as text: its floats need a dot before the exponent.
        return f" (YAML reads {value} as text: write it with a dot, e.g. {float(value)!r})"
    return ""


def _key(parts: Any) -> str:
    """A key path in the config's spelling: ``rl.max_steps``, ``seeds[1]``."""
    path = ""
    for part in parts:
        path += f"[{part}]" if isinstance(part, int) else f".{part}" if path else str(part)
    return path


def _structured(option: Mapping[str, Any], value: Any) -> bool:
    kind = option.get("type")
    return kind in ("object", "array") and Validator({"type": kind}).is_valid(value)


def _explain(error: jsonschema.ValidationError) -> tuple[list[Any], str]:
    """The key path and message of a schema error, in the words of the settings."""
    kind, rule, value, node = error.validator, error.validator_value, error.instance, error.schema
    parts = list(error.absolute_path)
    if kind == "additionalProperties":  # a settings class: unknown keys
        known = list(node.get("properties", {}))
        unknown = sorted((k for k in value if k not in known), key=str)
        return [*parts, unknown[0]], f"unknown key (known: {', '.join(known)})"
    if kind == "required":
        return [*parts, next(k for k in rule if k not in value)], "required"
    if kind == "anyOf":
        # A mapping or a list where only one option takes one: what is wrong inside it.
        fitting = [i for i, option in enumerate(rule) if _structured(option, value)]
        inner = [e for e in error.context if len(fitting) == 1 and e.relative_schema_path[0] == fitting[0]]
        if inner:
            return _explain(inner[0])
    if kind in ("type", "anyOf", "enum"):
        return parts, f"expected {_expected(node)}, got {value!r}{_yaml_hint(node, value)}"
    if kind == "pattern":
        if rule == _NOT_BLANK:
            return parts, f"must not be empty or only whitespace, got {value!r}"
        return parts, f"must match {rule!r}, got {value!r}"
    if kind in ("minItems", "maxItems"):
        least = "least" if kind == "minItems" else "most"
        return parts, f"must hold at {least} {rule} item(s), got {list(value)!r}"
    if kind == "uniqueItems":
        return parts, f"must not hold an item twice, got {list(value)!r}"
    bounds = {"minimum": "at least", "exclusiveMinimum": "greater than", "maximum": "at most"}
    if kind in bounds:
        return parts, f"must be {bounds[kind]} {rule}, got {value}"
    return parts, error.message


def _sections(schema: Mapping[str, Any], data: Any) -> Any:
    """``data`` with an empty settings section read as one at its defaults: a YAML key with nothing
    under it (``rl:``) is null."""
    if not isinstance(data, dict):
        return data
    props, values = schema.get("properties", {}), schema.get("additionalProperties")
    out = {}
    for key, value in data.items():
        sub = props.get(key, values if isinstance(values, dict) else None)
        if sub is not None and value is None and "properties" in sub:
            value = {}
        out[key] = value if sub is None else _sections(sub, value)
    return out


def check(cls: type, data: Any, path: str = "") -> dict[str, Any]:
    """``data`` as plain dicts, validated against the schema of ``cls``; :class:`SettingsError` naming
    the first key that does not fit (unknown keys first, then the fields in order, depth first)."""
    validator = _validator(cls)
    data = _sections(validator.schema, to_dict({} if data is None else data))
    error = next(iter(validator.iter_errors(data)), None)
    if error is not None:
        parts, message = _explain(error)
        raise SettingsError(_key([path, *parts] if path else parts), message)
    return data


def _construct(tp: Any, value: Any, path: str) -> Any:
    """``value``, which the schema of ``tp`` takes, as ``tp``: nested classes built, ints of float
    settings made floats, lists of tuple settings made tuples."""
    origin = get_origin(tp)
    if value is None or tp is Any:
        return value
    if origin in (types.UnionType, typing.Union):
        option = next(o for o in get_args(tp) if o is not type(None) and _type_validator(o).is_valid(value))
        return _construct(option, value, path)
    if dataclasses.is_dataclass(tp):
        hints = _hints(tp)
        values = {k: _construct(hints[k], v, _key([path, k] if path else [k])) for k, v in value.items()}
        try:
            return tp(**values)
        except SettingsError:
            raise
        except (TypeError, ValueError) as exc:  # a rule of __post_init__
            raise SettingsError(path, str(exc)) from None
    if tp is float:
        return float(value)
    if origin in (list, tuple):
        items = [_construct(get_args(tp)[0], v, f"{path}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        return {k: _construct(get_args(tp)[1], v, f"{path}.{k}") for k, v in value.items()}
    return value


def build(cls: type, data: Any, path: str = "") -> Any:
    """An instance of dataclass ``cls`` from a mapping (absent keys take their defaults), validated
    by :func:`check`; a rule of a class's ``__post_init__`` that fails is a :class:`SettingsError` at
    that section's key."""
    if isinstance(data, cls):
        return data
    return _construct(cls, check(cls, data, path), path)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
