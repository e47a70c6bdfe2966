"""Imported by the tokenize stage (preprocess.py) before anything loads numpy: one OpenBLAS thread.

numpy loads OpenBLAS, which starts a thread per core as it loads, and those threads spin for a while before they
sleep: 0.1 CPU-seconds of every start, measured here (2 cores), in a stage whose processes do no linear algebra
(its numpy is concatenation and casts). A user's own OPENBLAS_NUM_THREADS is kept.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
