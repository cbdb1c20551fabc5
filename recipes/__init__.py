"""Reproducible pipelines around the plugin, run from the repository root: python -m recipes.FOLDER.SCRIPT."""
