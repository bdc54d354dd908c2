"""JSON Schema keywords the grammar cannot enforce: refused up front instead of silently ignored.

xgrammar (0.2.x) turns a schema into a grammar. A few keywords have no grammar form there and are dropped (some
with a warning on stderr, some silently), so a reply could break them; a client asking for them gets a clear error
naming the keyword and where it sits. Found by generating constrained replies and validating them (the cases are
in tests/test_structured_errors.py):
  not, if/then/else, allOf with more than one schema (becomes unconstrained JSON), uniqueItems: true,
  contains/minContains/maxContains, dependentRequired/dependentSchemas/dependencies, multipleOf on non-integers.
oneOf is served as anyOf (exact when the branches are disjoint, as pydantic's discriminated unions are).
"""

from __future__ import annotations

from typing import Any

from .params import StructuredOutputsError

REFUSED = ("not", "if", "then", "else", "contains", "minContains", "maxContains", "dependentRequired",
           "dependentSchemas", "dependencies")
# where subschemas sit: keyword -> how its value holds them
_MAPS = ("properties", "patternProperties", "$defs", "definitions")
_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SINGLE = ("additionalProperties", "propertyNames", "unevaluatedProperties", "unevaluatedItems", "additionalItems")


def check_schema(schema: Any, field: str = "json") -> None:
    """Raise StructuredOutputsError for the first keyword of `schema` that the grammar would not enforce."""
    problem = _first_problem(schema, "#")
    if problem is not None:
        where, why = problem
        raise StructuredOutputsError(f"structured_outputs.{field}: {why} at {where}, which constrained decoding "
                                     "cannot enforce; remove it or check the reply after generation")


def _first_problem(schema: Any, path: str) -> tuple[str, str] | None:
    if not isinstance(schema, dict):
        return None
    for key in REFUSED:
        if key in schema:
            return path, f"the keyword {key!r}"
    if schema.get("uniqueItems") is True:
        return path, "the keyword 'uniqueItems': true"
    if isinstance(schema.get("allOf"), list) and len(schema["allOf"]) > 1:
        return path, f"'allOf' with {len(schema['allOf'])} schemas (merge them into one)"
    if "multipleOf" in schema and not (schema.get("type") == "integer" and isinstance(schema["multipleOf"], int)):
        return path, "'multipleOf' on a non-integer"
    children: list[tuple[str, Any]] = []
    for key in _MAPS:
        if isinstance(schema.get(key), dict):
            children += [(f"{path}/{key}/{name}", sub) for name, sub in schema[key].items()]
    for key in _LISTS:
        if isinstance(schema.get(key), list):
            children += [(f"{path}/{key}/{i}", sub) for i, sub in enumerate(schema[key])]
    items = schema.get("items")
    if isinstance(items, list):
        children += [(f"{path}/items/{i}", sub) for i, sub in enumerate(items)]
    elif isinstance(items, dict):
        children.append((f"{path}/items", items))
    children += [(f"{path}/{key}", schema[key]) for key in _SINGLE if isinstance(schema.get(key), dict)]
    for where, sub in children:
        found = _first_problem(sub, where)
        if found is not None:
            return found
    return None
