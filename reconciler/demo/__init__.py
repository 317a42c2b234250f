"""The demos: a local run under chaos, a simulated week, and the small training script they use."""
