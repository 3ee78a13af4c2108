"""Shared loaders for tests: the real H200 capture, read once per session; where the corpus of
third-party traces lies."""

from __future__ import annotations

import functools
import gzip
import json
import os
import textwrap
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parent / "data"
GPT = DATA / "gpt-naive-h200"
TRACE = GPT / "trace.json.gz"
NCU_ALL = GPT / "ncu_all_launches_raw.csv.gz"
NCU_PER_CONFIG = GPT / "ncu_per_config_raw.csv.gz"
NCU_SECTIONS = GPT / "ncu_sections_raw.csv.gz"
EXAMPLE_RUN = DATA.parents[1] / "examples" / "runs" / "gpt-naive-h200"

# --- the corpus: real third-party traces, not in the repository ------------------------------
# $KERNELTRIAGE_CORPUS, else ../shared beside the checkout; its external-traces/ holds them.
# Tests that read it carry the `corpus` marker (or request the `external_traces` fixture):
# tests/conftest.py skips them, with CORPUS_SKIP as the reason, when the folder is absent.
CORPUS_ENV = "KERNELTRIAGE_CORPUS"
CORPUS = Path(os.environ.get(CORPUS_ENV) or DATA.parents[2] / "shared")
EXTERNAL = CORPUS / "external-traces"
CORPUS_SKIP = (
    f"needs the trace corpus: no {EXTERNAL} (set {CORPUS_ENV} to the folder holding external-traces/)"
)
corpus = pytest.mark.corpus


def corpus_present() -> bool:
    return EXTERNAL.is_dir()


@functools.cache
def timeline():
    from kerneltriage.ingest.kineto import read_trace

    return read_trace(TRACE)


@functools.cache
def counters(path: Path = NCU_ALL):
    from kerneltriage.ingest.ncu_csv import read_counters

    return read_counters(path)


@functools.cache
def raw_trace() -> dict:
    return json.loads(gzip.decompress(TRACE.read_bytes()))


@functools.cache
def report(ncu: Path | None = NCU_ALL):
    from kerneltriage.analysis.gpus import resolve_gpu
    from kerneltriage.analysis.rules import load_rules
    from kerneltriage.analysis.triage import triage

    tl = timeline()
    return triage(tl, resolve_gpu(tl.gpu_name), load_rules(), counters(ncu) if ncu else None)


def write_trace(path: Path, data: dict, *, compress: bool = True, indent: int | None = None) -> Path:
    text = json.dumps(data, indent=indent).encode()
    path.write_bytes(gzip.compress(text) if compress else text)
    return path


def tiny_llama():
    """A two-layer Hugging Face Llama from a config (no download), seeded: for fixes applied to
    a real model class on the CPU."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def nvtx_shim(path: Path, log: str) -> Path:
    """A script at ``path`` that records NVTX ranges (the CPU build of torch has none) to the
    file the Python expression ``log`` names, then runs examples/train_gpt.py with its own
    arguments."""
    script = DATA.parents[1] / "examples" / "train_gpt.py"
    path.write_text(
        textwrap.dedent(f"""
        import os, runpy, sys, torch
        log = {log}
        def start(name):
            open(log, "a").write("start " + name + "\\n")
            return 1
        torch.cuda.nvtx.range_start = start
        torch.cuda.nvtx.range_end = lambda _r: open(log, "a").write("end\\n")
        sys.argv = [{str(script)!r}, *sys.argv[1:]]
        runpy.run_path({str(script)!r}, run_name="__main__")
        """)
    )
    return path


def ncu_runner_config(out: Path, **settings) -> Path:
    """``out/logs/config.ncu.json``: the runner's settings for an ncu process that profiles the
    third step on the CPU (two warm-up steps), with ``settings`` on top."""
    (out / "logs").mkdir(parents=True, exist_ok=True)
    config = out / "logs" / "config.ncu.json"
    base = {"mode": "ncu", "out": str(out), "warmup": 2, "steps": 3, "cpu": True, "distributed": False}
    base |= {"ncu_rank": 0, "run_to_end": False, "whole_run": False}
    config.write_text(json.dumps(base | settings))
    return config


def mangled_spelling(name: str) -> str:
    """What of a demangled kernel name a mangled one spells out for ``-k`` to match: its base
    name and its template arguments' identifiers as ``<length><identifier>``, in order (the
    stand-in ncu filters its export by this; real ncu matches the mangled name)."""
    from kerneltriage.ingest.kernel_names import base_name, template_identifiers

    base = base_name(name)
    return f"{len(base)}{base}" + "".join(f"_{len(w)}{w}" for w in template_identifiers(name))
