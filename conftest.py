"""Repository-wide pytest setup: the test tiers (marks by what a test starts) and the GPU skip.

Tiers, by what a test starts (the marks are declared in the root pyproject.toml):

- `e2e`: a full app run (arl_train.run, the app's command line, the fault chain, the bench's runs);
- `ray`: a Ray cluster of its own, without an app run;
- `container`: docker containers (arl-harbor's docker environment);
- `packaging`: wheels built and installed into fresh environments;
- `gpu`: a CUDA GPU (skipped here where torch sees none);
- `unit`: none of these (nor `slow`): the quick pass, `-m unit`.

App runs on the CPU placement, and tests that only need a Ray to connect to, share one Ray head per
pytest process (`app_ray_head`, one per xdist worker) instead of starting Ray each;
tests/test_train_e2e.py keeps the app's own local start and shutdown, which is what `uv run apps/train`
does.

A test file marks `e2e`/`packaging` itself (`pytestmark`); `ray` and `container` follow from the fixtures
a test uses (FIXTURE_TIERS), so a new test taking `docker_ready` is a container test without saying so.
Every tiered test except `gpu` is also `slow`, so `-m "not slow"` stays the quick pass it always was.

`exhaustive(reason=...)` marks a test that repeats, at a cost, what the default run checks elsewhere (a
combination of modes each checked on its own, a tool's end-to-end run whose parts have their own tests):
it runs only in the exhaustive run (`ARL_TEST_EXHAUSTIVE=1`, `scripts/test.py --exhaustive`), and the
default run skips it saying where its subject is checked instead.
"""

import os

import pytest

# Fixtures that start something heavy, and the tier a test using them belongs to.
FIXTURE_TIERS = {
    "ray_local": "ray",  # arl-queue, arl-rollout
    "ray1": "ray",  # apps/train test_engine_actor
    "ray4": "ray",  # apps/train test_reservation
    "docker_ready": "container",  # arl-harbor
    "agent_image": "container",  # arl-harbor
    "app_ray_head": "ray",  # app runs (tests/, apps/bench): `ray.address=<it>`
}
SLOW_TIERS = ("e2e", "ray", "container", "packaging")
# CPU-seconds of the heaviest modules, each run alone on the 2-core CI machine (with the processes it
# starts: Ray, engines, trainer ranks, sandboxes): the order the workers take them in. A module not
# listed counts as 0 (after the listed ones of its tier); the figures need only be roughly right.
MODULE_CPU_S = {
    "tests/test_multihost.py": 199,
    "tests/test_train_colocated.py": 100,
    "tests/test_faults.py": 113,
    "tests/test_agent_preset.py": 73,
    "tests/test_train_e2e.py": 53,
    "tests/test_train_resume.py": 53,
    "tests/test_release_check.py": 44,
    "apps/train/tests/test_reservation.py": 12,
    "apps/train/tests/test_tiny_model.py": 7,
    "apps/train/tests/test_trainer_group.py": 16,
    "tests/test_train_failures.py": 19,
}
TIERS = (*SLOW_TIERS, "gpu")
EXHAUSTIVE_ENV = "ARL_TEST_EXHAUSTIVE"


@pytest.fixture(scope="session")
def app_ray_head():
    """The address of a Ray head for app runs with the CPU placement, started once per pytest process
    (arl_train.testing.ray_head): each run connects with `ray.address=<it>` as a job of its own."""
    from arl_train.testing import ray_head

    with ray_head() as address:
        yield address


def pytest_collection_modifyitems(config, items):
    exhaustive = os.environ.get(EXHAUSTIVE_ENV) == "1"
    for item in items:
        marker = item.get_closest_marker("exhaustive")
        if marker is not None and not exhaustive:
            why = marker.kwargs.get("reason") or (marker.args[0] if marker.args else "")
            if not why:
                raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.exhaustive needs reason=...")
            item.add_marker(pytest.mark.skip(reason=f"exhaustive run only ({EXHAUSTIVE_ENV}=1): {why}"))
        fixtures = getattr(item, "fixturenames", ())
        for name, tier in FIXTURE_TIERS.items():
            if name in fixtures and tier not in item.keywords:
                item.add_marker(tier)
        if any(t in item.keywords for t in SLOW_TIERS) and "slow" not in item.keywords:
            item.add_marker("slow")
        if not any(t in item.keywords for t in (*TIERS, "slow")):
            item.add_marker("unit")
    # Modules with a full app run first, heaviest first (MODULE_CPU_S), then those with another slow test,
    # then the quick ones (a stable sort: order within a module is kept). Side by side (scripts/test.py's
    # xdist workers take whole modules in this order, `--no-loadscope-reorder`) the long modules start
    # early and the quick ones fill in at the end, instead of a long one running alone last while the
    # other worker has nothing left to take.
    with_app_run = {item.nodeid.split("::")[0] for item in items if "e2e" in item.keywords}
    with_slow = {item.nodeid.split("::")[0] for item in items if "slow" in item.keywords}

    def rank(item) -> tuple[int, float]:
        module = item.nodeid.split("::")[0]
        tier = 0 if module in with_app_run else 1 if module in with_slow else 2
        return tier, -MODULE_CPU_S.get(module, 0.0)

    items.sort(key=rank)

    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in gpu_items:
        item.add_marker(skip)
