"""The tests are a package, as each of their folders is, so that modules in different folders may share a basename
(tests/backends/bcp/test_check.py, tests/backends/slurm/test_check.py): pytest imports each by its dotted name
(tests.backends.slurm.test_check), not by its basename alone."""
