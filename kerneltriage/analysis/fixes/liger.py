"""Liger-Kernel's Hugging Face patches, as data (``kerneltriage/data/liger.yaml``): the
architecture a model class names and the kernel switches of its ``apply_liger_kernel_to_<arch>``,
so a fix switches on the candidate's kernel only. Pinned to the Liger-Kernel version the file
names; validated as it is read.
"""

from __future__ import annotations

import functools
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr, model_validator

from kerneltriage.validation import load_shipped


class _Architecture(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    prefix: StrictStr = Field(min_length=1)
    arch: StrictStr = Field(pattern=r"^[a-z0-9_]+$")


class _LigerFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    schema_: Literal["kerneltriage.liger/1"] = Field(alias="schema")
    liger_kernel: StrictStr
    variants: tuple[StrictStr, ...] = ()
    architectures: tuple[_Architecture, ...]
    switches: dict[StrictStr, tuple[StrictStr, ...]]

    @model_validator(mode="after")
    def _every_arch_has_switches(self) -> _LigerFile:
        missing = sorted({a.arch for a in self.architectures} - set(self.switches))
        if missing:
            raise ValueError(f"architectures name arch(s) with no switches: {', '.join(missing)}")
        return self


@functools.cache
def _liger() -> _LigerFile:
    return load_shipped(_LigerFile, "liger.yaml")


def hf_arch(module_class: str) -> str | None:
    """The ``<arch>`` of ``apply_liger_kernel_to_<arch>`` for a Hugging Face model class
    (``Qwen2Attention`` → ``qwen2``), or None when Liger patches no architecture it names
    (``Qwen2MoeSparseMoeBlock``: a variant's class, which ``apply_liger_kernel_to_qwen2``
    leaves as it is)."""
    liger = _liger()
    for a in liger.architectures:
        if module_class.startswith(a.prefix):
            rest = module_class[len(a.prefix) :]
            if (rest and not rest[0].isupper()) or rest.startswith(liger.variants):
                continue
            return a.arch
    return None


def liger_switches(arch: str, kernel: str) -> str:
    """The keyword arguments of ``apply_liger_kernel_to_<arch>`` that switch on ``kernel`` alone."""
    switches = _liger().switches.get(arch)
    if not switches:
        return f"{kernel}=True"
    return ", ".join(f"{s}={s == kernel}" for s in switches)
