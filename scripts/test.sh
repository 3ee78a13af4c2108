#!/usr/bin/env bash
# The tests on a fresh machine: installs what they need, then runs pytest.
#
#   scripts/test.sh                   # the whole suite (what CI runs)
#   scripts/test.sh -m "not slow"     # the quick subset: no kernel interpreter runs, corpus,
#                                     # screenshots or profiling sessions (under a minute)
#   scripts/test.sh --lint …          # first ruff check, ruff format --check, mypy and the
#                                     # manual's site with mkdocs build --strict (CI)
#
# Other arguments go to pytest. It installs into the active virtual environment, else into
# .venv in the checkout (made with python3 -m venv on first use): never into the system's
# Python. Needs Python >= 3.10; on Debian/Ubuntu it installs Chromium (screenshot tests) with
# apt when it is missing. Tests that read the corpus of third-party traces
# ($KERNELTRIAGE_CORPUS, else ../shared beside the checkout) are skipped, with the reason, when
# it is absent.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -n "${VIRTUAL_ENV:-}" ]; then
  PYTHON="$VIRTUAL_ENV/bin/python"
else
  if [ ! -x .venv/bin/python ]; then
    echo "scripts/test.sh: no active virtual environment: making one in .venv" >&2
    python3 -m venv .venv || {
      echo "scripts/test.sh: python3 -m venv failed (Debian/Ubuntu: apt install python3-venv)" >&2
      exit 2
    }
  fi
  PYTHON=.venv/bin/python
fi
if ! "$PYTHON" -c 'import sys; sys.exit(sys.prefix == sys.base_prefix)'; then
  echo "scripts/test.sh: $PYTHON is not a virtual environment's Python; activate one or unset VIRTUAL_ENV" >&2
  exit 2
fi
if [ "${1:-}" = "--print-python" ]; then  # which Python it would use, for checking this logic
  echo "$PYTHON"
  exit 0
fi

lint=0
if [ "${1:-}" = "--lint" ]; then
  lint=1
  shift
fi

# Headless Chromium and a font for the screenshot tests (Debian packages).
if [ -z "${KERNELTRIAGE_CHROMIUM:-}" ] && ! command -v chromium >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1; then
    sudo=""
    if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then sudo="sudo"; fi
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -qq
    $sudo apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
  else
    echo "scripts/test.sh: no chromium and no apt-get: the screenshot tests will fail;" \
      "install Chromium or set KERNELTRIAGE_CHROMIUM to its binary" >&2
  fi
fi

# The package with its test extras. torch==2.13.0 takes the local CPU build where one is
# provided (a bare "torch" would pull the CUDA wheels). Skipped when all of it is importable
# from this checkout already.
if ! "$PYTHON" - <<'PY' >/dev/null 2>&1
import importlib.util, pathlib
for name in ("dask", "distributed", "fsspec", "hypothesis", "mkdocs", "mypy", "ninja", "pyarrow", "pydantic", "pytest", "pytest_timeout", "ruff", "scipy", "torch", "transformers", "triton"):
    assert importlib.util.find_spec(name) is not None, name
here = importlib.util.find_spec("kerneltriage")
assert here and pathlib.Path(here.origin).resolve().parents[1] == pathlib.Path.cwd().resolve()
PY
then
  "$PYTHON" -m pip install -q torch==2.13.0 triton==3.6.0 pyarrow -e ".[dev,gpu,dask]"
fi

if [ "$lint" = 1 ]; then
  "$PYTHON" -m ruff check .
  "$PYTHON" -m ruff format --check .
  "$PYTHON" -m mypy  # the package, as [tool.mypy] in pyproject.toml sets it
  # The manual in docs/: a broken link, a page missing from the nav or a bad anchor fails.
  site=$(mktemp -d)
  trap 'rm -rf "$site"' EXIT
  "$PYTHON" -m mkdocs build --strict --site-dir "$site"  # not --quiet: it hides the warnings strict counts
  rm -rf "$site"
fi
exec "$PYTHON" -m pytest -q "$@"
