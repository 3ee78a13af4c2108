"""Names and values that go from a trace into generated Python: identifiers, dtypes, shapes,
scalars. Everything here is defensive: trace strings are data, never code."""

from __future__ import annotations

import json
import keyword
import math
import re

from kerneltriage.errors import InputError

# Trace ``Input type`` strings → torch dtype names (``torch.<name>``).
TRACE_DTYPES = {
    "float": "float32",
    "double": "float64",
    "c10::Half": "float16",
    "c10::BFloat16": "bfloat16",
    "long int": "int64",
    "long": "int64",
    "int": "int32",
    "short int": "int16",
    "bool": "bool",
    "unsigned char": "uint8",
    "signed char": "int8",
}
FLOAT_DTYPES = ("float32", "bfloat16", "float16")
# ``--dtype`` spellings.
DTYPE_ALIASES = {
    "fp32": "float32",
    "float32": "float32",
    "float": "float32",
    "f32": "float32",
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp16": "float16",
    "float16": "float16",
    "half": "float16",
    "f16": "float16",
}
SHORT_DTYPE = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "float64": "fp64"}
MAX_IDENTIFIER = 48


def identifier(text: str, default: str = "op") -> str:
    """A safe, lower-case Python identifier from any trace name (``aten::_fused_adamw_`` →
    ``fused_adamw``; ``../../x`` → ``x``; ``1x`` → ``op_1x``; ``class`` → ``class_``)."""
    text = str(text or "")
    if "::" in text:
        text = text.rsplit("::", 1)[-1]
    text = re.sub(r"[^0-9a-zA-Z]+", "_", text).strip("_").lower()
    text = re.sub(r"_+", "_", text)[:MAX_IDENTIFIER].strip("_")
    if not text:
        return default
    if text[0].isdigit():
        text = f"{default}_{text}"
    if keyword.iskeyword(text) or keyword.issoftkeyword(text) or text in _RESERVED:
        text += "_"
    return text


# Names the generated modules define or import: an op must not shadow them.
_RESERVED = {"torch", "triton", "tl", "nn", "math", "os", "reference", "kernel", "pytest", "main"}


def class_name(ident: str) -> str:
    """CamelCase class name from an identifier (``add_rms_norm`` → ``AddRmsNorm``)."""
    parts = [p for p in ident.split("_") if p]
    name = "".join(p[:1].upper() + p[1:] for p in parts) or "Op"
    return name if name[0].isalpha() else f"Op{name}"


def trace_dtype(type_name: str | None, default: str | None = None) -> str | None:
    return TRACE_DTYPES.get(type_name or "", default)


def parse_dtype(text: str) -> str:
    name = DTYPE_ALIASES.get(str(text).strip().lower())
    if name is None:
        raise InputError(f"unknown --dtype {text!r}; expected one of bf16, fp16, fp32")
    return name


#: The most dimensions and elements a ``--shape`` may have: a tensor of more elements than this
#: (2**40, a TiB of bytes) fits no GPU, so such a shape is a typo.
MAX_DIMS = 8
MAX_ELEMENTS = 2**40


def parse_shape(text: str) -> list[int]:
    """``16384x4096`` (also ``16384,4096`` or ``16384×4096``) → [16384, 4096]."""
    compact = re.sub(r"\s+", "", str(text).lower())
    if not re.fullmatch(r"\d{1,13}(?:[x×,*]\d{1,13})*", compact):
        raise InputError(f"bad --shape {text!r}; expected positive sizes joined by x, e.g. 16384x4096")
    dims = [int(p) for p in re.split(r"[x×,*]", compact)]
    if any(d <= 0 for d in dims):
        raise InputError(f"bad --shape {text!r}; every size must be at least 1")
    if len(dims) > MAX_DIMS or math.prod(dims) > MAX_ELEMENTS:
        raise InputError(
            f"--shape {text!r} has {math.prod(dims):.3g} elements in {len(dims)} dimensions; "
            f"a GPU tensor has at most {MAX_ELEMENTS:.3g} elements in {MAX_DIMS} dimensions here"
        )
    return dims


def parse_signature(text: str) -> dict[str, list[int]]:
    """A report shape signature (``q=4x16x2048x64 k=…`` or ``arg0=8192x32000 arg1=8192``)."""
    out: dict[str, list[int]] = {}
    for item in str(text or "").split():
        name, _, dims = item.partition("=")
        if not dims:
            continue
        try:
            out[name] = [int(d) for d in dims.split("x") if d]
        except ValueError:
            continue
    return out


def number(text) -> float | None:
    """A finite number from a ``Concrete Inputs`` string, else None."""
    try:
        value = float(str(text).strip())
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def int_list(text) -> list[int] | None:
    """``[-1]`` / ``[2048, 2048]`` from a ``Concrete Inputs`` string."""
    m = re.fullmatch(r"\s*\[([-\d,\s]*)\]\s*", str(text or ""))
    if not m:
        return None
    try:
        return [int(p) for p in m.group(1).split(",") if p.strip()]
    except ValueError:
        return None


def literal(value) -> str:
    """A Python literal for a number/bool/str/None/list that goes into generated code."""
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isinf(value):
            return 'float("inf")' if value > 0 else 'float("-inf")'
        if math.isnan(value):
            return 'float("nan")'
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a double-quoted Python literal
    if isinstance(value, dict):
        return "{" + ", ".join(f"{literal(k)}: {literal(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        inner = ", ".join(literal(v) for v in value)
        if isinstance(value, tuple):
            return f"({inner},)" if len(value) == 1 else f"({inner})"
        return f"[{inner}]"
    raise TypeError(f"no literal for {type(value).__name__}")


def comment_text(text, limit: int = 200) -> str:
    """Trace text made safe for a ``#`` comment or a docstring line: printable, one line, no
    quotes that could end a docstring, bounded length."""
    text = "".join(ch if ch.isprintable() else " " for ch in str(text))
    text = text.replace('"', "'").replace("\\", "/")  # no docstring can end inside it
    text = re.sub(r"\s+", " ", text).strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def dims_text(dims) -> str:
    return "x".join(str(int(d)) for d in dims) if dims else "scalar"
