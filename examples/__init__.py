"""Triton's tutorials ported to ``kernels.autotune`` (the decorator is the only change), and one kernel tuned over a
space. ``scripts/bench_autotune.py`` times them against ``triton.autotune``; tests/autotune_tests runs them on the
interpreter."""
