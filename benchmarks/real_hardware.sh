#!/usr/bin/env bash
# REAL figures on a many-core machine that reaches no network: benchmarks/real_hardware.py.
#
# Installs nothing from the network. Python packages the machine lacks travel with the tree as
# wheels in .whl/ (dask, distributed, numpy, xarray, h5netcdf, h5py, pyyaml, threadpoolctl, torch
# and their needs, for the machine's Python); they are unpacked to /tmp/site. dask_rpm itself runs
# from the tree (PYTHONPATH), not installed. Output goes to $OUT (or ./real-hw).
# Ends within 480 s: the script's own parts are sized for 16 cores (about 7 min), and a run
# cut at the limit still leaves the parts it finished in real.json.
set -euo pipefail
cd "$(dirname "$0")/.."
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl
    export PYTHONPATH="/tmp/site:$PWD"
else
    export PYTHONPATH="$PWD"
fi
export PYTHONUNBUFFERED=1
out="${OUT:-real-hw}"
nproc; python3 -c "import numpy, threadpoolctl; print(threadpoolctl.threadpool_info())"
timeout 470 python3 benchmarks/real_hardware.py --out "$out" "$@"
