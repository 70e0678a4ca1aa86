"""arl-bench: the async-vs-colocated comparison app and the simulator at scale (see README.md)."""
