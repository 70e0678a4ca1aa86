"""SWE-bench-format rows in and out, without a container (the docker round trip: test_swe_roundtrip.py).

Hand-written rows in the exact published shapes of SWE-bench Verified (every column a string, the test
lists JSON-encoded) and SWE-Gym (the test lists as lists) load, validate and convert into task dirs graded
like arl's own. Their instance images (Docker Hub's swebench/* and xingyaoww/*) cannot be pulled here, so
what is tested is everything but running them: the image names, the Dockerfile, the grader's inputs,
the refusals of rows arl cannot grade, `data.source = "swebench:..."`, and the local sandbox's refusal of
an imported task (its repository exists only in the image).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from arl.harbor.agents.checks import run_check
from arl.harbor.errors import HarborConfigError
from arl.harbor.swe import export_rows
from arl.harbor.swe.grading import grade_change_module
from arl.harbor.swe.import_rows import (
    IMAGE_PRESETS,
    ImportOptions,
    PytestCommand,
    convert_rows,
    image_name,
    imported_set,
    options_from_args,
    parse_test_cmd,
)
from arl.harbor.swe.rows import RowError, SweBenchVerifiedRow, parse_row, read_rows, validate_published
from arl.harbor.swe.writer import GRADING
from arl.harbor.tasks import load_harbor_tasks, validate_task
from arl.harbor.testing import write_swe_task

from .conftest import needs_sandbox
from .test_swe_agents import tokenizer  # noqa: F401 - the fixture

# SWE-bench Verified's shape (princeton-nlp/SWE-bench_Verified): 13 string columns.
VERIFIED_ROW = {
    "repo": "astropy/astropy",
    "instance_id": "astropy__astropy-12907",
    "base_commit": "d16bfe05a744909de4b27f5875fe0d4ed41ce607",
    "patch": (
        "diff --git a/astropy/modeling/separable.py b/astropy/modeling/separable.py\n"
        "--- a/astropy/modeling/separable.py\n+++ b/astropy/modeling/separable.py\n"
        "@@ -242,7 +242,7 @@ def _cstack(left, right):\n"
        "         cright = _coord_matrix(right, 'right', noutp)\n"
        "     else:\n"
        "         cright = np.zeros((noutp, right.shape[1]))\n"
        "-        cright[-right.shape[0]:, -right.shape[1]:] = 1\n"
        "+        cright[-right.shape[0]:, -right.shape[1]:] = right\n"
        " \n     return np.hstack([cleft, cright])\n \n"
    ),
    "test_patch": (
        "diff --git a/astropy/modeling/tests/test_separable.py b/astropy/modeling/tests/test_separable.py\n"
        "--- a/astropy/modeling/tests/test_separable.py\n+++ b/astropy/modeling/tests/test_separable.py\n"
        "@@ -28,6 +28,7 @@\n p1 = models.Polynomial1D(1, name='p1')\n \n \n"
        "+cm_4d_expected = (np.array([False, False, True, True]),)\n"
        " compound_models = {\n     'cm1': (map3 & sh1 | rot & sh1 | sh1 & sh2 & sh1,\n"
        "             (np.array([False, False, True]),\n"
    ),
    "problem_statement": "Modeling's `separability_matrix` does not compute separability correctly for nested "
    "CompoundModels\n",
    "hints_text": "",
    "created_at": "2022-03-03T15:14:54Z",
    "version": "4.3",
    "FAIL_TO_PASS": json.dumps(
        [
            "astropy/modeling/tests/test_separable.py::test_separable[compound_model6-result6]",
            "astropy/modeling/tests/test_separable.py::test_separable[compound_model9-result9]",
        ]
    ),
    "PASS_TO_PASS": json.dumps(
        [
            "astropy/modeling/tests/test_separable.py::test_coord_matrix",
            "astropy/modeling/tests/test_separable.py::test_cdot",
        ]
    ),
    "environment_setup_commit": "298ccb478e6bf092953bca67a3d29dc6c35f6752",
    "difficulty": "15 min - 1 hour",
}
# SWE-Gym's shape (SWE-Gym/SWE-Gym): 11 columns, the test lists as lists.
GYM_ROW = {
    "instance_id": "getmoto__moto-5752",
    "hints_text": "Here's the culprit: the filter compares the raw value.",
    "patch": (
        "diff --git a/moto/ssm/models.py b/moto/ssm/models.py\n--- a/moto/ssm/models.py\n+++ b/moto/ssm/models.py\n"
        "@@ -836,7 +836,7 @@ def _match_filters(self, parameter, filters=None):\n"
        '             elif key.startswith("tag:"):\n'
        "-                what = key[4:] or None\n"
        '+                what = [tag["Value"] for tag in parameter.tags if tag["Key"] == key[4:]]\n'
        "             else:\n"
    ),
    "test_patch": "",
    "created_at": "2022-12-10 20:23:01",
    "problem_statement": "describe_parameters depends on filter order, but shouldn't\n",
    "repo": "getmoto/moto",
    "base_commit": "b2300f1eae1323e3e8bc45f97e530ce129dff12e",
    "version": "4.0",
    "PASS_TO_PASS": ["tests/test_ssm/test_ssm_boto3.py::test_get_parameter"],
    "FAIL_TO_PASS": ["tests/test_ssm/test_ssm_boto3.py::test_describe_parameters__multiple_tags"],
}
# A Django row: its tests are runtests.py ids, not pytest node ids.
DJANGO_ROW = {
    **VERIFIED_ROW,
    "repo": "django/django",
    "instance_id": "django__django-11099",
    "patch": "diff --git a/django/contrib/auth/validators.py b/django/contrib/auth/validators.py\n"
    "--- a/django/contrib/auth/validators.py\n+++ b/django/contrib/auth/validators.py\n"
    "@@ -7,7 +7,7 @@\n class ASCIIUsernameValidator(validators.RegexValidator):\n"
    "-    regex = r'^[\\w.@+-]+$'\n+    regex = r'\\A[\\w.@+-]+\\Z'\n",
    "test_patch": "",
    "FAIL_TO_PASS": json.dumps(["test_ascii_validator (auth_tests.test_validators.UsernameValidatorsTests)"]),
    "PASS_TO_PASS": json.dumps([]),
}
# A fix of pytest itself adds references to `_pytest`, which the grader's default reach patterns refuse.
PYTEST_ROW = {
    **GYM_ROW,
    "repo": "pytest-dev/pytest",
    "instance_id": "pytest-dev__pytest-5103",
    "patch": "diff --git a/src/_pytest/assertion/rewrite.py b/src/_pytest/assertion/rewrite.py\n"
    "--- a/src/_pytest/assertion/rewrite.py\n+++ b/src/_pytest/assertion/rewrite.py\n"
    "@@ -1,3 +1,4 @@\n import ast\n+from _pytest.assertion import util\n import errno\n import imp\n",
    "FAIL_TO_PASS": ["testing/test_assertrewrite.py::TestAssertionRewrite::test_unroll_expression"],
    "PASS_TO_PASS": [],
}


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ----- the published shapes and the loader ------------------------------------------------------------


def test_hand_written_rows_have_the_published_shapes():
    assert isinstance(validate_published(VERIFIED_ROW, "swe-bench-verified"), SweBenchVerifiedRow)
    validate_published(GYM_ROW, "swe-gym")
    # Each shape is exact: the other dataset's test-list encoding, a missing or an extra column is named.
    with pytest.raises(
        RowError, match=r"^row 1 \(getmoto__moto-5752\): (PASS|FAIL)_TO_PASS: Expected `str`, got `array`"
    ):
        validate_published(GYM_ROW, "swe-bench-verified")
    with pytest.raises(RowError, match="difficulty"):
        validate_published({k: v for k, v in VERIFIED_ROW.items() if k != "difficulty"}, "swe-bench-verified")
    with pytest.raises(RowError, match="environment_setup_commit"):
        validate_published({**GYM_ROW, "environment_setup_commit": "x"}, "swe-gym")


def test_rows_of_both_shapes_parse_to_the_same_row():
    verified, gym = parse_row(VERIFIED_ROW, 1, "v"), parse_row(GYM_ROW, 2, "g")
    assert verified.FAIL_TO_PASS == json.loads(VERIFIED_ROW["FAIL_TO_PASS"])
    assert gym.FAIL_TO_PASS == GYM_ROW["FAIL_TO_PASS"] and gym.environment_setup_commit == ""
    smith = parse_row(
        {
            **GYM_ROW,
            "image_name": "swebench/swesmith.x86_64.getmoto_1776_moto.694ce1f4",
            "test_patch": None,
            "hints_text": None,
        },
        3,
        "s",
    )
    assert smith.image == "swebench/swesmith.x86_64.getmoto_1776_moto.694ce1f4" and smith.test_patch == ""


@pytest.mark.parametrize(
    "change, field, reason",
    [
        ({"patch": None}, "patch", "Expected `str`, got `null`"),
        ({"FAIL_TO_PASS": "[not json"}, "FAIL_TO_PASS", "JSON-encoded list"),
        ({"PASS_TO_PASS": [1, 2]}, "PASS_TO_PASS", "list of test id strings"),
        ({"FAIL_TO_PASS": "[]"}, "FAIL_TO_PASS", "nothing to fix"),
        ({"version": 3.10}, "version", "loses digits"),
        ({"problem_statement": "  "}, "problem_statement", "empty"),
        ({"instance_id": "../etc"}, "instance_id", "task dir"),
        ({"image": "a", "docker_image": "b"}, "image", "disagree"),
    ],
)
def test_bad_rows_name_row_instance_and_field(change, field, reason):
    with pytest.raises(RowError) as info:
        parse_row({**VERIFIED_ROW, **change}, 7, "rows.jsonl")
    e = info.value
    assert (e.number, e.field) == (7, field) and reason in e.reason
    assert str(e).startswith(
        f"rows.jsonl row 7 ({change.get('instance_id', 'astropy__astropy-12907')}): {field}:"
    )


def test_read_rows_jsonl_json_and_json_lines(tmp_path):
    assert read_rows(_write_jsonl(tmp_path / "r.jsonl", [VERIFIED_ROW, GYM_ROW])) == [VERIFIED_ROW, GYM_ROW]
    (tmp_path / "r.json").write_text(json.dumps([GYM_ROW]))
    assert read_rows(tmp_path / "r.json") == [GYM_ROW]
    # Hugging Face's Dataset.to_json writes JSON lines into a .json file.
    _write_jsonl(tmp_path / "hf.json", [GYM_ROW, GYM_ROW])
    assert len(read_rows(tmp_path / "hf.json")) == 2
    (tmp_path / "bad.jsonl").write_text(json.dumps(GYM_ROW) + "\n{oops\n")
    with pytest.raises(HarborConfigError, match="bad.jsonl line 2: invalid JSON"):
        read_rows(tmp_path / "bad.jsonl")
    with pytest.raises(HarborConfigError, match=r"\.jsonl, \.json or \.parquet"):
        read_rows(_write_jsonl(tmp_path / "r.csv", []))


def test_read_rows_parquet(tmp_path):
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        (tmp_path / "r.parquet").write_bytes(b"PAR1")
        with pytest.raises(HarborConfigError, match=r"needs pyarrow.*arl-harbor\[parquet\]"):
            read_rows(tmp_path / "r.parquet")
        return
    pq.write_table(pa.Table.from_pylist([GYM_ROW]), tmp_path / "r.parquet")
    assert read_rows(tmp_path / "r.parquet") == [GYM_ROW]


# ----- test commands ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cmd, expected",
    [
        ("pytest", PytestCommand()),
        (
            "pytest -rA --tb=no -p no:cacheprovider",
            PytestCommand(args=("-rA", "--tb=no", "-p", "no:cacheprovider")),
        ),
        ("python -m pytest -c setup.cfg -x", PytestCommand(config="setup.cfg", args=("-x",))),
        (
            "PYTHONPATH=/testbed/src /opt/miniconda3/envs/testbed/bin/python -m pytest --config-file=/testbed/tox.ini",
            PytestCommand(python="/opt/miniconda3/envs/testbed/bin/python", src_root="src", config="tox.ini"),
        ),
        (
            "/usr/local/bin/pytest -o addopts=",
            PytestCommand(python="/usr/local/bin/python", args=("-o", "addopts=")),
        ),
    ],
)
def test_pytest_commands_parse_and_round_trip(cmd, expected):
    assert parse_test_cmd(cmd) == expected
    assert parse_test_cmd(expected.command()) == expected


@pytest.mark.parametrize(
    "cmd, why",
    [
        ("./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1", "does not run pytest"),
        ("bin/test -C --verbose", "does not run pytest"),
        ("tox --current-env -epy39 -v --", "does not run pytest"),
        ("pytest --rootdir=/x", "pins --rootdir"),
        ("pytest -x && rm -rf /", "shell operators"),
        ("DJANGO_SETTINGS_MODULE=x pytest", "takes only PYTHONPATH"),
        ("pytest -c ../etc/pytest.ini", "under /testbed"),
    ],
)
def test_other_runners_and_unsafe_commands_are_refused(cmd, why):
    with pytest.raises(ValueError, match=why):
        parse_test_cmd(cmd)


def test_image_templates(tmp_path):
    row = parse_row(GYM_ROW, 1, "r")
    assert image_name(row, "mirror.local/{owner}/{name}:{version}") == "mirror.local/getmoto/moto:4.0"
    assert (
        image_name(row, IMAGE_PRESETS["swebench"][0])
        == "swebench/sweb.eval.x86_64.getmoto_1776_moto-5752:latest"
    )
    with pytest.raises(HarborConfigError, match=r"image template '\{nope\}' is not usable.*openhands_key"):
        ImportOptions(image_template="{nope}").check()


def test_convert_flags_map_repos_and_the_default(tmp_path):
    rows = _write_jsonl(tmp_path / "r.jsonl", [GYM_ROW])
    path, options = options_from_args(
        str(rows),
        image_template="swe-gym",
        python=None,
        skip_invalid=True,
        test_cmds=["pytest -rA", "getmoto/moto=pytest -n0 -p no:randomly"],
    )
    assert path == rows and options.test_cmd == "pytest -rA" and options.skip_invalid
    assert options.repo_test_cmds == {"getmoto/moto": "pytest -n0 -p no:randomly"}


# ----- rows → task dirs -------------------------------------------------------------------------------


def test_published_rows_convert_to_tasks_graded_like_arls(tmp_path):
    rows = _write_jsonl(tmp_path / "rows.jsonl", [VERIFIED_ROW])
    gym_rows = _write_jsonl(tmp_path / "gym.jsonl", [GYM_ROW])
    convert_rows(rows, tmp_path / "verified", ImportOptions(image_template="swebench"))
    convert_rows(
        gym_rows,
        tmp_path / "gym",
        ImportOptions(image_template="swe-gym", repo_test_cmds={"getmoto/moto": "pytest -rA"}),
    )
    task = tmp_path / "verified" / "astropy__astropy-12907"
    assert validate_task(task).ok and validate_task(task).verifier_mode == "separate"
    dockerfile = (task / "environment" / "Dockerfile").read_text()
    # SWE-bench's image key: lowercased, "__" -> "_1776_", namespace swebench; its conda env runs the tests.
    assert dockerfile.startswith("FROM swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest\n")
    assert (
        "cp -a /testbed /arl/base" in dockerfile
        and "ENV PATH=/opt/miniconda3/envs/testbed/bin:$PATH" in dockerfile
    )
    gym_docker = (tmp_path / "gym" / "getmoto__moto-5752" / "environment" / "Dockerfile").read_text()
    assert gym_docker.startswith("FROM docker.io/xingyaoww/sweb.eval.x86_64.getmoto_s_moto-5752\n")
    toml = (task / "task.toml").read_text()
    assert 'artifacts = ["/testbed"]' in toml and f'arl_grading = "{GRADING}"' in toml
    assert 'network_mode = "no-network"' in toml
    assert (task / "instruction.md").read_text() == VERIFIED_ROW["problem_statement"]
    assert (task / "solution" / "fix.patch").read_text() == VERIFIED_ROW["patch"]
    assert (task / "tests" / "test.patch").read_text() == VERIFIED_ROW["test_patch"]
    assert not (tmp_path / "gym" / "getmoto__moto-5752" / "tests" / "test.patch").exists()  # empty test_patch
    for name in ("arl_swe_report.py", "score.py", "grade_change.py", "pytest.ini"):
        assert (task / "tests" / "plugin" / name).is_file()
    config = json.loads((task / "tests" / "config.json").read_text())
    assert config["fail_to_pass"] == json.loads(VERIFIED_ROW["FAIL_TO_PASS"])
    assert (
        config["test_files"] == ["astropy/modeling/tests/test_separable.py"]
        and "reach_patterns" not in config
    )
    test_sh = (task / "tests" / "test.sh").read_text()
    assert not re.search(r"@[A-Z_]+@", test_sh)  # every placeholder filled
    assert "TEST_FILES=(astropy/modeling/tests/test_separable.py)" in test_sh
    assert 'for cand in "${ARL_SWE_PYTHON:-}" /opt/miniconda3/envs/testbed/bin/python python3' in test_sh
    gym_sh = (tmp_path / "gym" / "getmoto__moto-5752" / "tests" / "test.sh").read_text()
    assert "PYTEST_ARGS=(-rA)" in gym_sh
    manifest = [
        json.loads(line) for line in (tmp_path / "verified" / "manifest.jsonl").read_text().splitlines()
    ]
    assert [m["id"] for m in manifest] == ["astropy__astropy-12907"]


def test_a_fix_that_needs_a_reach_pattern_keeps_it_and_only_it(tmp_path):
    convert_rows(
        _write_jsonl(tmp_path / "r.jsonl", [PYTEST_ROW]),
        tmp_path / "out",
        ImportOptions(image_template="swe-gym"),
    )
    config = json.loads((tmp_path / "out" / "pytest-dev__pytest-5103" / "tests" / "config.json").read_text())
    defaults = grade_change_module().DEFAULT_REACH_PATTERNS
    assert set(defaults) - set(config["reach_patterns"]) == {r"_pytest"}


def test_rows_arl_cannot_grade_are_refused_with_the_reason(tmp_path):
    binary = {
        **GYM_ROW,
        "instance_id": "o__r-2",
        "test_patch": "diff --git a/tests/a.png b/tests/a.png\n"
        "new file mode 100644\nindex 0000000..1111111\nGIT binary patch\nliteral 3\nKcmZ?wa>fy\n",
    }
    config_fix = {
        **GYM_ROW,
        "instance_id": "o__r-3",
        "patch": "--- a/setup.cfg\n+++ b/setup.cfg\n@@ -1 +1 @@\n-a\n+b\n",
    }
    no_image = {**GYM_ROW, "instance_id": "o__r-4"}
    truncated = {**GYM_ROW, "instance_id": "o__r-5", "PASS_TO_PASS": ["tests/test_a.py::test_b[x"]}
    rows = _write_jsonl(
        tmp_path / "rows.jsonl", [DJANGO_ROW, GYM_ROW, binary, config_fix, GYM_ROW, truncated]
    )
    with pytest.raises(HarborConfigError) as info:
        convert_rows(rows, tmp_path / "out", ImportOptions(image_template="swe-gym"))
    text = str(info.value)
    assert "5 of 6 rows cannot become tasks" in text
    assert "row 1 (django__django-11099): FAIL_TO_PASS[0]: 'test_ascii_validator (auth_tests" in text
    assert "not a pytest node id" in text and "runtests.py" in text and "future work" in text
    assert "row 3 (o__r-2): test_patch: has binary changes" in text
    assert "row 4 (o__r-3): patch: changes setup.cfg, which the grader puts back" in text
    assert "row 5 (getmoto__moto-5752): instance_id: repeats row 2" in text
    assert "row 6 (o__r-5): PASS_TO_PASS[0]: 'tests/test_a.py::test_b[x' is cut short" in text
    assert not (tmp_path / "out").exists()  # nothing written
    with pytest.raises(HarborConfigError, match="row 1 .*image: the row names no image"):
        convert_rows(_write_jsonl(tmp_path / "n.jsonl", [no_image]), tmp_path / "out")
    # skip_invalid: the rest are imported and every refused row is listed, with its field and reason.
    result = convert_rows(rows, tmp_path / "out", ImportOptions(image_template="swe-gym", skip_invalid=True))
    assert result.tasks == ["getmoto__moto-5752"]
    refused = [json.loads(line) for line in (tmp_path / "out" / "refused.jsonl").read_text().splitlines()]
    assert [(r["row"], r["field"]) for r in refused] == [
        (1, "FAIL_TO_PASS[0]"),
        (3, "test_patch"),
        (4, "patch"),
        (5, "instance_id"),
        (6, "PASS_TO_PASS[0]"),
    ]


def test_convert_replaces_only_an_earlier_import(tmp_path):
    rows = _write_jsonl(tmp_path / "r.jsonl", [GYM_ROW])
    options = ImportOptions(image_template="swe-gym")
    convert_rows(rows, tmp_path / "out", options)
    convert_rows(rows, tmp_path / "out", options)  # an earlier import: replaced whole
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("x")
    with pytest.raises(HarborConfigError, match="not an import"):
        convert_rows(rows, tmp_path / "mine", options)


def test_swebench_data_source_is_converted_once(tmp_path, monkeypatch):
    monkeypatch.setenv("ARL_SWE_ROWS_CACHE", str(tmp_path / "cache"))
    rows = _write_jsonl(tmp_path / "rows.jsonl", [{**GYM_ROW, "image": "registry.local/moto:5752"}])
    tasks = load_harbor_tasks(f"swebench:{rows}")
    assert [t.id for t in tasks] == ["getmoto__moto-5752"]
    task_dir = Path(tasks[0].metadata["harbor_task_path"])
    assert task_dir.parent.parent == tmp_path / "cache"
    assert tasks[0].messages[0]["content"] == GYM_ROW["problem_statement"]
    stamp = (task_dir.parent / "import.json").stat().st_mtime_ns
    assert imported_set(str(rows)) == task_dir.parent
    assert (task_dir.parent / "import.json").stat().st_mtime_ns == stamp  # reused, not converted again
    # An import .toml: options and the rows file (relative to it); other options, another import.
    spec = tmp_path / "import.toml"
    spec.write_text(
        'rows = "rows.jsonl"\nout = "moto-tasks"\nskip_invalid = true\n'
        '[repo_test_cmds]\n"getmoto/moto" = "pytest -rA"\n'
    )
    tasks = load_harbor_tasks(f"swebench:{spec}")
    assert Path(tasks[0].metadata["harbor_task_path"]).parent == tmp_path / "moto-tasks"
    spec.write_text('rows = "rows.jsonl"\nimage_tempalte = "swebench"\n')
    with pytest.raises(HarborConfigError, match="image_tempalte"):
        load_harbor_tasks(f"swebench:{spec}")


# ----- arl's tasks → rows -----------------------------------------------------------------------------


def write_swe_set(root: Path, names: tuple[str, ...] = ("tinycalc__clamp",)) -> Path:
    """A SWE task set as the builder leaves it: task dirs of `write_swe_task` and a manifest.jsonl."""
    rows = []
    for name in names:
        task = write_swe_task(root, name)
        config = json.loads((task / "tests" / "config.json").read_text())
        rows.append(
            {
                "id": name,
                "package": config["package"],
                "version": config["version"],
                "module": config["module"],
                "function": config["function"],
                "operator": config["operator"],
                "fail_to_pass": config["fail_to_pass"],
                "pass_to_pass": config["pass_to_pass"],
                "validate_s": 0.5,
                "test_files": config["test_files"],
                "seed": 0,
                "image": None,
                "image_build_s": None,
            }
        )
    (root / "manifest.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


@pytest.mark.parametrize("style", ["swe-bench", "swe-gym"])
async def test_export_rows_have_the_published_shape(tmp_path, style):
    task_set = write_swe_set(tmp_path / "set")
    (row,) = await export_rows.export_set(task_set, tmp_path / "rows.jsonl", style=style, log=lambda _: None)
    shape = {"swe-bench": "swe-bench-verified", "swe-gym": "swe-gym"}[style]
    validate_published({k: v for k, v in row.items() if k not in ("image", "test_cmd")}, shape)
    task = task_set / "tinycalc__clamp"
    assert row["repo"] == "pypi/tinycalc" and row["version"] == "0.0.1" and row["test_patch"] == ""
    assert row["patch"] == (task / "solution" / "fix.patch").read_text()
    assert row["problem_statement"] == (task / "instruction.md").read_text()
    assert len(row["base_commit"]) == 40 and row["image"].startswith("hb__")
    assert row["test_cmd"] == "python3 -m pytest"
    listed = row["FAIL_TO_PASS"] if style == "swe-gym" else json.loads(row["FAIL_TO_PASS"])
    assert listed == json.loads((task / "tests" / "config.json").read_text())["fail_to_pass"]
    assert json.loads((tmp_path / "rows.jsonl").read_text()) == row
    # The rows convert back into a task graded from the exported image.
    convert_rows(tmp_path / "rows.jsonl", tmp_path / "back")
    back = tmp_path / "back" / "tinycalc__clamp"
    assert (back / "environment" / "Dockerfile").read_text().startswith(f"FROM {row['image']}\n")
    original = json.loads((task / "tests" / "config.json").read_text())
    imported = json.loads((back / "tests" / "config.json").read_text())
    for name in ("fail_to_pass", "pass_to_pass", "src_root"):
        assert imported[name] == original[name]
    # tinycalc has no pytest config: the import leaves it to the grader's "auto" (the base's own, none here).
    assert imported["pytest_config"] == (original["pytest_config"] or "auto")
    assert (back / "solution" / "fix.patch").read_text() == row["patch"]
    assert os.access(back / "solution" / "solve.sh", os.X_OK)


@needs_sandbox
async def test_the_local_sandbox_refuses_an_imported_task(tmp_path, tokenizer):  # noqa: F811
    """An imported task's repository exists only in its image; arl's local sandbox runs the host's system
    dirs, not an image's filesystem, so it refuses the task at start (dropped as invalid_task, never a 0)."""
    convert_rows(
        _write_jsonl(tmp_path / "r.jsonl", [{**GYM_ROW, "image": "registry.local/moto:5752"}]),
        tmp_path / "out",
    )
    result = await run_check(
        tmp_path / "out" / "getmoto__moto-5752",
        agent="shell",
        script="nop",
        env="local",
        tokenizer=tokenizer,
        trials_dir=tmp_path / "trials",
        trial_timeout_sec=60,
    )
    assert result.failed and result.failure_kind == "invalid_task"
    assert "RUN steps the local sandbox does not execute" in result.error
    assert "the repository of this task is its image's /testbed" in result.error
