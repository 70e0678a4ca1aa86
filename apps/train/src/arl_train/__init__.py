"""arl-train: the app that composes the arl packages into a fully asynchronous RL run."""
