"""``python -m dask_rpm.cli ...``: the same as ``dask-rpm ...``."""

import sys

from . import main

sys.exit(main())
