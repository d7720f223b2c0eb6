#!/usr/bin/env bash
# The whole test suite, the way CI runs it (and the README's test command).
#
#  1. as root with apt-get: installs the Debian packages the tests need
#     (slurm-wlm + munge for the real-SLURM tests, chromium + chromium-driver
#     for the dashboard screenshot test, netcdf-bin for ncdump reading our files);
#  2. installs dask_rpm with its test and bench extras (pip; torch 2.13 CPU
#     for the DDP peer of dask-rpm bench);
#  3. starts the private single-node SLURM on loopback (slurm/local-cluster.sh);
#  4. runs the gates: ruff (format and lint), mypy on the package, import-linter
#     (layers, the pure layer without distributed, no import cycles; pyproject.toml);
#  5. runs pytest over every test, including those marked slow, slurm, browser
#     (`-m ""` replaces pyproject.toml's default selection, the quick tier that a
#     plain `python3 -m pytest` runs: README, "Tests").
#
# Extra arguments go to pytest, e.g. `bash tests/run.sh -k engine -x`.
# .ci/run runs this, then the distributed-facing tests on the newest Dask releases.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    need=""
    for pkg in slurm-wlm munge chromium chromium-driver netcdf-bin; do
        dpkg -s "$pkg" >/dev/null 2>&1 || need="$need $pkg"
    done
    if [ -n "$need" ]; then
        echo "tests/run.sh: installing Debian packages:$need"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $need >/dev/null
    fi
else
    echo "tests/run.sh: not root or no apt-get: SLURM and browser tests will skip (they fail under CI=true)"
fi

# bench: torch==2.13.0 (CPU build) for the DistributedDataParallel peer of dask-rpm bench
"$PY" -m pip install -q --disable-pip-version-check -e ".[test,bench]"

if [ "$(id -u)" = 0 ]; then
    # The slurm_cluster fixture (tests/conftest.py) sets SLURM_CONF; a failed
    # start here is reported by those tests (as failures under CI=true).
    bash slurm/local-cluster.sh start || echo "tests/run.sh: local SLURM did not start; SLURM tests will report it"
fi

# Gates first: they take seconds and name the file and line of what they refuse.
echo "tests/run.sh: gates: ruff format, ruff check, mypy, import-linter"
"$PY" -m ruff format --check --quiet .
"$PY" -m ruff check --quiet .
"$PY" -m mypy --no-error-summary
"$PY" -c "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"

exec "$PY" -m pytest -m "" "$@"
