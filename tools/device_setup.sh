#!/usr/bin/env bash
# Set up the lent GPU machine (no network) to run dask_rpm from this checkout.
# Needs the wheels in .whl/ (carry: [".whl"]; see /work/.library/device/README.md, Notes).
# Use:  source tools/device_setup.sh    (the exports stay in the calling shell)
#  or:  bash tools/device_setup.sh      (a check only)
# Installs the wheels into /tmp/site, exports PYTHONPATH=/tmp/site:<repo>, prints versions, and
# fails (non-zero) if dask_rpm, distributed or dask_jobqueue cannot be imported.

_device_setup() {
    local root
    root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd) || return 1
    if ! compgen -G "$root/.whl/*.whl" >/dev/null; then
        echo "device_setup: no wheels in $root/.whl (name .whl in the run's carry)" >&2
        return 1
    fi
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site "$root"/.whl/*.whl || {
        echo "device_setup: pip install of $root/.whl/*.whl failed" >&2
        return 1
    }
    export PYTHONPATH="/tmp/site:$root${PYTHONPATH:+:$PYTHONPATH}"
    export PATH="/tmp/site/bin:$PATH"
    echo "nproc: $(nproc)"
    python3 - <<'PY' || { echo "device_setup: an import failed (see above)" >&2; return 1; }
import platform, sys
print("python", platform.python_version(), sys.executable)
for name in ("numpy", "dask", "distributed", "array_api_compat", "dask_rpm"):
    try:
        mod = __import__(name)
        print(name, mod.__version__, mod.__file__)
    except Exception as e:
        print(name, "NOT IMPORTABLE:", e)
try:
    import torch
    cuda = torch.cuda.is_available()
    print("torch", torch.__version__, "cuda", cuda, torch.cuda.get_device_name(0) if cuda else "-")
except Exception as e:  # a GPU check, not a requirement of dask_rpm
    print("torch: not usable:", e)
failed = []
for stmt in ("import dask_rpm", "from dask_rpm import fit", "import distributed",
             "import dask_jobqueue"):
    try:
        exec(stmt, {})
    except Exception as e:
        failed.append(f"{stmt}: {type(e).__name__}: {e}")
if failed:
    print("IMPORT FAILED:", *failed, sep="\n  ", file=sys.stderr)
    sys.exit(1)
PY
}

_device_setup
_rc=$?
unset -f _device_setup
if [[ "${BASH_SOURCE[0]}" != "$0" ]]; then return $_rc; else exit $_rc; fi
