"""``dask-rpm train``: the demo job on EMULATED heterogeneous workers and the evidence it prints."""
