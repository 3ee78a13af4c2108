"""Where shipped data lives: one folder, ``kerneltriage/data/``, found through this module.

``rules/default.yaml``     thresholds, op classes, region patterns, recommendations
``gpus.yaml``              GPU ceilings (datasheet rows with their sources)
``attention_perf.yaml``    measured attention rates per GPU, head dim and causality
``kernel_classes.yaml``    kernel name → class and library
``hf_norms.yaml``          Hugging Face norm classes → the math the built-in drop-ins match
``measurement.yaml``       steady-state, interval and verify budget settings
``fixes.yaml``             fix recipes: the ``fix`` line, its preconditions, what verify applies
``verdicts.yaml``          the decision ladders' steps and words, the advice steps
``liger.yaml``             Liger-Kernel's architectures and kernel switches (its version pinned)
``idle_causes.yaml``       what keeps the GPU idle between kernels, by the host's activity
``templates/``             Jinja2 templates of ``kerneltriage scaffold``
``html/``                  the HTML report's template

Everything here is data users may read and override (``--rules``); nothing is evaluated.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

DATA_DIR = Path(__file__).resolve().parent / "data"


def data_path(*parts: str) -> Path:
    """A file or folder under the shipped data folder."""
    return DATA_DIR.joinpath(*parts)


@cache
def load_yaml(*parts: str) -> Any:
    """A shipped YAML file, parsed once per process. Raises ``RulesError`` on a broken install."""
    import yaml

    from kerneltriage.errors import RulesError

    path = data_path(*parts)
    try:
        return yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:  # a broken install, not a user mistake
        raise RulesError(f"cannot read shipped data ({exc})", path=str(path)) from None
