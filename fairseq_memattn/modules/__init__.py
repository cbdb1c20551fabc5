"""The attention family (memory attention and its baselines) and the beam-search row sharing."""
