"""Kernel-name normalization shared by the trace and counter readers.

Nsight Compute and the PyTorch profiler demangle the same symbol differently
(``at::native::`` vs ``at::``, ``{lambda()#3}`` vs ``[lambda() (instance 3)]``, ``2ul`` vs ``2``,
``false`` vs ``0``, ``char*`` vs ``char *``, elided parameter lists). ``base_name`` keeps only
the function's own identifier; ``canonical_name`` rewrites the rest into one spelling so
that names from the two tools compare equal.
"""

from __future__ import annotations

import re
from difflib import SequenceMatcher
from functools import lru_cache

# ncu's export may cut a qualifier off with the "<" of "<unnamed>": "void unnamed>::CatArrayBatchedCopy<
# unnamed>::OpaqueType<8>, …>" (a per-configuration pass of a Qwen2-class LM on an H200, ncu 2025.3.1).
# There the "<" right after an identifier opens its template: "X<unnamed>::T" is X<anon::T>.
_ANON = re.compile(r"\(anonymous namespace\)|(?<=\w)<unnamed>|<unnamed>|(?<![<\w])unnamed>|\{anonymous\}")


def _anon(match: re.Match[str]) -> str:
    return (
        "<anon"
        if match.group(0) == "<unnamed>" and match.start() and match.string[match.start() - 1].isalnum()
        else "anon"
    )


_LAMBDA_KINETO = re.compile(r"\{lambda\(([^()]*)\)#(\d+)\}")
_LAMBDA_NCU = re.compile(r"\[lambda\(([^()]*)\) \(instance (\d+)\)\]")
_INT_SUFFIX = re.compile(r"\b(\d+)(?:ull|ul|ll|u|l)\b", re.IGNORECASE)
_SPACE = re.compile(r"\s+")
_TRUE = re.compile(r"\btrue\b")
_FALSE = re.compile(r"\bfalse\b")
_QUALIFIER = re.compile(r"\b[A-Za-z_]\w*::")
_TOKEN = re.compile(r"[A-Za-z_]\w*|\d+")
# Tokens one demangler prints and the other elides or spells differently.
_NOISE = {"void", "const", "unsigned", "int", "long", "struct", "class", "typename"}
_PLACEHOLDER = re.compile(r"T\d+$")


@lru_cache(maxsize=65536)
def base_name(name: str) -> str:
    """The kernel function's identifier: ``void at::native::foo<8, …>(…)`` → ``foo``."""
    text = _ANON.sub(_anon, name.strip())
    cut = len(text)
    for ch in "<(":
        pos = text.find(ch)
        if 0 <= pos < cut:
            cut = pos
    head = text[:cut].strip()
    head = head.rsplit("::", 1)[-1]
    head = head.rsplit(" ", 1)[-1]
    return head or name.strip()


@lru_cache(maxsize=65536)
def canonical_name(name: str) -> str:
    """One spelling for a demangled kernel name, without its parameter list."""
    text = _ANON.sub(_anon, name.strip())
    text = _LAMBDA_KINETO.sub(lambda m: f"lambda({m.group(1)})#{m.group(2)}", text)
    text = _LAMBDA_NCU.sub(lambda m: f"lambda({m.group(1)})#{m.group(2)}", text)
    text = text.replace("at::native::", "at::").replace("native::", "")
    text = _INT_SUFFIX.sub(r"\1", text)
    text = _TRUE.sub("1", _FALSE.sub("0", text))
    text = _SPACE.sub("", text)
    if text.startswith("void"):
        text = text[4:]
    return _strip_parameters(text)


def _strip_parameters(text: str) -> str:
    """Drop a trailing top-level ``(...)`` parameter list (ncu elides it to ``(int, T2, T3)``)."""
    if not text.endswith(")"):
        return text
    depth = 0
    for i in range(len(text) - 1, -1, -1):
        ch = text[i]
        if ch == ")":
            depth += 1
        elif ch == "(":
            depth -= 1
            if depth == 0:
                return text[:i]
    return text


@lru_cache(maxsize=65536)
def name_tokens(name: str) -> tuple[str, ...]:
    """Identifier and number tokens of ``canonical_name`` without namespace qualifiers."""
    text = _QUALIFIER.sub("", canonical_name(name))
    return tuple(t for t in _TOKEN.findall(text) if t not in _NOISE and not _PLACEHOLDER.match(t))


def name_similarity(a: str, b: str) -> float:
    """0..1: how alike two demangled names are once both are canonical (1.0: same)."""
    ta, tb = name_tokens(a), name_tokens(b)
    if ta == tb:
        return 1.0
    return SequenceMatcher(None, ta, tb, autojunk=False).ratio()


#: Identifiers a mangled name may not spell out: built-in types and keywords (one-letter codes),
#: the std:: names with abbreviations of their own (``Sa``, ``Sb``, ``Ss``…), the lambda and
#: anonymous-namespace words of the demangled text.
_NOT_SPELLED = frozenset(
    {
        *[
            "void",
            "bool",
            "char",
            "wchar_t",
            "char8_t",
            "char16_t",
            "char32_t",
            "short",
            "int",
            "long",
            "signed",
            "unsigned",
            "float",
            "double",
        ],
        *[
            "const",
            "volatile",
            "struct",
            "class",
            "typename",
            "true",
            "false",
            "operator",
            "decltype",
            "sizeof",
        ],
        *[
            "lambda",
            "instance",
            "anonymous",
            "namespace",
            "unnamed",
            "anon",
            "std",
            "allocator",
            "basic_string",
            "string",
        ],
        *["basic_istream", "basic_ostream", "basic_iostream", "istream", "ostream", "iostream"],
    }
)
_IDENT = re.compile(r"(?<!\w)[A-Za-z_]\w*")


def template_identifiers(name: str, limit: int = 4) -> list[str]:
    """Up to ``limit`` identifiers that tell apart instantiations of one kernel template, in
    the order a mangled name spells them: ``void at::native::vectorized_elementwise_kernel<4,
    at::native::AUnaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float>>,
    std::array<char*, 2ul>>(int, …)`` → ``["AUnaryFunctor", "MulFunctor", "array"]``.

    Taken from the template arguments only, first occurrences only (a mangled name spells an
    identifier once, then refers back to it), and never a qualifier (``at::``), which the name
    before it may already have spelled. Each appears in the mangled name as
    ``<length><identifier>`` (``13AUnaryFunctor``)."""
    text = _ANON.sub(" ", name.strip())
    base = base_name(name)
    start = text.find(base + "<")
    if start < 0:
        return []
    depth, end = 0, None
    for i in range(start + len(base), len(text)):
        ch = text[i]
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
            if depth == 0:
                end = i
                break
    if end is None:
        return []
    args = text[start + len(base) + 1 : end]
    found: list[str] = []
    for m in _IDENT.finditer(args):
        word = m.group()
        if word in _NOT_SPELLED or word in found or word == base or _PLACEHOLDER.match(word):
            continue  # a placeholder (T1) is a back-reference (T_) in the mangled name
        if args[m.end() : m.end() + 2] == "::" or (
            m.start() >= 5 and args[m.start() - 5 : m.start()] == "std::"
        ):
            continue
        found.append(word)
        if len(found) >= limit:
            break
    return found
