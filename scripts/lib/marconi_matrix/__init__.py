"""The policy matrix (``scripts/policy_matrix.py``): traffic shapes, cells, their runs and
the summary that judges a policy by its worst cells."""
