"""A ServeGraph manifest checked against the CRD's own schema, offline (pure).

The CRD (`config/crd/servegraph.io_servegraphs.yaml`, shipped in the wheel beside this
module) is the one source of truth for what a ServeGraph may say. This checks the part
of OpenAPI v3 the CRD uses — types, required fields, enums, patterns, bounds — and, as
`kubectl apply` does with strict field validation, refuses fields the schema does not
declare instead of letting the API server drop them. The CRD's CEL rules
(`x-kubernetes-validations`) are left to the API server.
"""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Mapping
from importlib import resources
from typing import Any

import yaml

CRD_FILE = "servegraph.io_servegraphs.yaml"
MAX_REPORTED = 50


@functools.cache
def servegraph_schema() -> Mapping[str, Any]:
    """The openAPIV3Schema of the ServeGraph CRD's served version."""
    text = resources.files("servegraph.cli").joinpath(CRD_FILE).read_text()
    crd = yaml.safe_load(text)
    (version,) = [v for v in crd["spec"]["versions"] if v.get("storage")]
    schema: Mapping[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def rayservice_schema() -> Mapping[str, Any]:
    """The schema of `spec.rayService` alone (a file may hold just that section)."""
    section: Mapping[str, Any] = servegraph_schema()["properties"]["spec"]["properties"]["rayService"]
    return section


def check(value: Any, schema: Mapping[str, Any], path: str) -> list[str]:
    """Every way `value` breaks `schema`, as `field PATH: problem` lines (at most MAX_REPORTED)."""
    problems: list[str] = []
    _check(value, schema, path, problems)
    return problems[:MAX_REPORTED]


_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "boolean": (bool,),
    "integer": (int,),
    "number": (int, float),
}


def _is(value: Any, kind: str) -> bool:
    if isinstance(value, bool) and kind != "boolean":
        return False
    return isinstance(value, _TYPES[kind])


def _check(value: Any, schema: Mapping[str, Any], path: str, problems: list[str]) -> None:
    if len(problems) >= MAX_REPORTED:
        return
    where = f"field {path}"
    if "anyOf" in schema and all(_errors(value, option, path) for option in schema["anyOf"]):
        kinds = " or ".join(str(o.get("type", "?")) for o in schema["anyOf"])
        problems.append(f"{where}: {_show(value)} is not {kinds}")
        return
    kind = schema.get("type")
    if kind and not _is(value, kind):
        problems.append(f"{where}: {_show(value)} is not {_a(kind)}")
        return
    if "enum" in schema and value not in schema["enum"]:
        choices = ", ".join(repr(c) for c in schema["enum"])
        problems.append(f"{where}: {_show(value)} is not one of {choices}")
        return
    if isinstance(value, str):
        _check_string(value, schema, where, problems)
    elif isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            problems.append(f"{where}: {value} is below the minimum {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            problems.append(f"{where}: {value} is over the maximum {schema['maximum']}")
    elif isinstance(value, list):
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            problems.append(f"{where}: {len(value)} items, over the limit of {schema['maxItems']}")
        items = schema.get("items")
        if isinstance(items, Mapping):
            for i, item in enumerate(value):
                _check(item, items, f"{path}[{i}]", problems)
    elif isinstance(value, dict):
        _check_object(value, schema, path, problems)


def _check_string(value: str, schema: Mapping[str, Any], where: str, problems: list[str]) -> None:
    if "minLength" in schema and len(value) < schema["minLength"]:
        problems.append(f"{where}: must not be empty" if not value else f"{where}: shorter than {schema['minLength']}")
    if "maxLength" in schema and len(value) > schema["maxLength"]:
        problems.append(f"{where}: {len(value)} characters, over the limit of {schema['maxLength']}")
    if "pattern" in schema and not re.search(schema["pattern"], value):
        problems.append(f"{where}: {_show(value)} does not match {schema['pattern']}")


def _check_object(value: dict[Any, Any], schema: Mapping[str, Any], path: str, problems: list[str]) -> None:
    where = f"field {path}"
    for name in schema.get("required") or ():
        if name not in value:
            problems.append(f"field {path + '.' if path else ''}{name}: required")
    if "maxProperties" in schema and len(value) > schema["maxProperties"]:
        problems.append(f"{where}: {len(value)} entries, over the limit of {schema['maxProperties']}")
    properties: Mapping[str, Any] = schema.get("properties") or {}
    extra = schema.get("additionalProperties")
    open_ended = schema.get("x-kubernetes-preserve-unknown-fields") or extra is True
    for key, item in value.items():
        sub = f"{path}.{key}" if path else str(key)
        if key in properties:
            _check(item, properties[key], sub, problems)
        elif isinstance(extra, Mapping):
            if not isinstance(key, str):
                problems.append(f"field {sub}: keys must be strings")
            else:
                _check(item, extra, sub, problems)
        elif not open_ended and (properties or extra is False or "type" in schema):
            near = difflib.get_close_matches(str(key), list(properties), n=1)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            known = f" (known: {', '.join(properties)})" if properties and not near else ""
            problems.append(f"field {sub}: unknown field{hint}{known}")


def _errors(value: Any, schema: Mapping[str, Any], path: str) -> list[str]:
    found: list[str] = []
    _check(value, schema, path, found)
    return found


def _a(kind: str) -> str:
    return {"object": "a mapping", "array": "a list", "integer": "an integer"}.get(kind, f"a {kind}")


def _show(value: Any) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
