"""One-off diagnostics, each with its result, run from the repository root: python -m experiments.NAME.run."""
