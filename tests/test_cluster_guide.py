"""The cluster guide's launch files (docs/guide/cluster/) parse and say what the app expects: the three
node roles by the names `[cluster]` defaults to, the shared folder at one path on every node, Ray's
head port, the app started with `ray.address` and `storage.shared_dir`. No cluster needed."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from arl_train.sections import ClusterSection

GUIDE = Path(__file__).resolve().parent.parent / "docs" / "guide"
ROLES = {
    ClusterSection().trainer_resource,
    ClusterSection().rollout_resource,
    ClusterSection().sandbox_resource,
}


def _resources(start_params: dict) -> dict[str, float]:
    """KubeRay's `resources` start parameter: a JSON object quoted for the shell it is passed through
    (`ray start --resources=<it>`)."""
    [word] = shlex.split(start_params["resources"])
    return json.loads(word)


def test_the_kuberay_manifest_places_every_role_and_mounts_one_shared_folder():
    docs = list(yaml.safe_load_all((GUIDE / "cluster" / "raycluster.yaml").read_text()))
    [cluster] = [d for d in docs if d["kind"] == "RayCluster"]
    claims = {d["metadata"]["name"]: d for d in docs if d["kind"] == "PersistentVolumeClaim"}
    assert cluster["apiVersion"] == "ray.io/v1"
    spec = cluster["spec"]
    groups = [spec["headGroupSpec"], *spec["workerGroupSpecs"]]
    roles = [set(_resources(g["rayStartParams"])) for g in groups]
    assert set().union(*roles) == ROLES and all(len(r) == 1 for r in roles)
    mounts = set()
    for group in groups:
        pod = group["template"]["spec"]
        shared = [v for v in pod["volumes"] if "persistentVolumeClaim" in v]
        assert len(shared) == 1 and shared[0]["persistentVolumeClaim"]["claimName"] in claims
        assert (
            "ReadWriteMany" in claims[shared[0]["persistentVolumeClaim"]["claimName"]]["spec"]["accessModes"]
        )
        for container in pod["containers"]:
            mounts |= {m["mountPath"] for m in container["volumeMounts"] if m["name"] == shared[0]["name"]}
    assert mounts == {"/shared"}  # one path on every node: storage.shared_dir
    head_ports = {
        p["containerPort"]
        for c in spec["headGroupSpec"]["template"]["spec"]["containers"]
        for p in c["ports"]
    }
    assert 6379 in head_ports
    assert "storage.shared_dir=/shared" in (GUIDE / "cluster" / "raycluster.yaml").read_text()


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_the_slurm_script_parses_and_starts_one_ray_node_per_role():
    path = GUIDE / "cluster" / "arl.sbatch"
    text = path.read_text()
    subprocess.run(["bash", "-n", str(path)], check=True)
    directives = dict(re.findall(r"^#SBATCH --([\w-]+)(?:=(\S+))?", text, re.M))
    roles = re.search(r"^ROLES=\(([^)]*)\)", text, re.M).group(1).split()
    assert int(directives["nodes"]) == len(roles) and set(roles) == ROLES
    assert "ray start --head --block" in text and 'ray start --block --address="$HEAD_IP:$PORT"' in text
    assert '--resources="{\\"${ROLES[' in text  # each node declares its role as a Ray resource
    assert 'uv run apps/train ray.address="$HEAD_IP:$PORT" storage.shared_dir="$SHARED"' in text


def test_the_guide_links_both_files():
    guide = (GUIDE / "cluster.md").read_text()
    assert "(cluster/raycluster.yaml)" in guide and "(cluster/arl.sbatch)" in guide
