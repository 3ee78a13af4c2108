"""What a validation error says: one line for a pydantic ``ValidationError``, naming the first
failing field, the type expected and the value given.

Every file kerneltriage validates with pydantic words its errors through ``describe`` (a run's
``manifest.json`` and ``verify.json``, ``regions.jsonl``, a trace's metadata, a rules file, the
shipped data files, through ``load_shipped``), so a user reads the same kind of line whatever
the file. It sits below every layer: ingest, analysis and the run folder all borrow it.
"""

from __future__ import annotations

from typing import TypeVar

from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)

_EXPECTED = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "finite_number": "a finite number",
    "string_type": "a string",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "dict_type": "a mapping (JSON object)",
    "model_type": "a mapping (JSON object)",
    "model_attributes_type": "a mapping (JSON object)",
    "list_type": "a list",
    "tuple_type": "a list",
    "frozen_set_type": "a list",
    "missing": "present",
}


#: Error types whose message is a whole sentence of kerneltriage's (a pattern's, a rule's).
OWN_MESSAGES = frozenset({"pattern", "rules"})


def describe(error: ValidationError, what: str = "") -> str:
    """One line for a pydantic error: the first failing field, the type expected, the value."""
    first = error.errors(include_url=False)[0]
    loc = ".".join(str(p) for p in first["loc"] if not str(p).startswith(("function-", "union[")))
    field = ".".join(p for p in (what, loc) if p)
    expected = _EXPECTED.get(first["type"])
    if first["type"] == "missing":
        return f"{field} is missing"
    if first["type"] in OWN_MESSAGES:  # a validator's own sentence: it says what was wrong
        return f"{field}: {first['msg']}" if field else first["msg"]
    got = repr(first.get("input"))
    got = got if len(got) <= 40 else got[:37] + "..."
    text = f"expected {expected}" if expected else first["msg"][0].lower() + first["msg"][1:]
    return f"{field}: {text}, got {got}"


def load_shipped(model: type[M], *parts: str) -> M:
    """A shipped data file (``kerneltriage/data/<parts>``, read once per process) validated
    against ``model``; a file that does not fit is a broken install, said in one line naming
    the file (``RulesError``), never a crash halfway through a report."""
    from kerneltriage.errors import RulesError
    from kerneltriage.resources import data_path, load_yaml

    try:
        return model.model_validate(load_yaml(*parts))
    except ValidationError as exc:
        raise RulesError(describe(exc), path=str(data_path(*parts))) from None
