"""Datasets, grading, the batch runner, metrics, speed comparisons and reports."""
