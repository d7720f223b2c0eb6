"""Process-level leaves: BLAS threads, GPU visibility, hooks and closing of resources.

Pure: nothing here imports ``distributed``; the engine, the probe and the clusters use them.
"""
