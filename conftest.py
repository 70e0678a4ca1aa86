"""Repository-wide pytest setup: `gpu`-marked tests are skipped where torch sees no CUDA device."""

import pytest


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the device machine)")
    for item in gpu_items:
        item.add_marker(skip)
