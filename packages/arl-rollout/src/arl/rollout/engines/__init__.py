"""Inference engines behind arl-rollout's `Engine` seam (imported lazily: vLLM is an optional extra)."""
