"""Judging controllers on fresh hosts: evaluation, its statistics and its report."""
