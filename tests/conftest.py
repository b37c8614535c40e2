"""Test-wide settings. One BLAS thread: on 2 shared cores multi-threaded OpenBLAS is many times
slower for the matrix sizes here (set before any test module imports numpy)."""

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
