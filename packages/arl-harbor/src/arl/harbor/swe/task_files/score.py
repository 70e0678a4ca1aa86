"""Scores an arl SWE task (run by tests/test.sh):

    score.py CONFIG REPORT REWARD_JSON [RERUN_REPORT]   # write the reward
    score.py --to-rerun CONFIG REPORT                   # print the PASS_TO_PASS ids worth one rerun

reward = 1.0 iff every FAIL_TO_PASS and PASS_TO_PASS test passed, else 0.0; the pass fractions of each
list are extra keys. A listed test that did not run (e.g. its module no longer imports) counts as failed.

A PASS_TO_PASS test can be flaky (sockets with 10 ms timeouts in a loaded, 1-cpu container): the builder
leaves out the tests that flaked in its side-by-side baseline runs, but rare flakes still happen. So
when every FAIL_TO_PASS test passed and at most MAX_RERUN PASS_TO_PASS tests failed, test.sh runs those
once more and a pass there counts (`pass_to_pass_rerun`: how many were rerun, `pass_to_pass_flaky`: how
many passed on the rerun). A solution that really breaks a test fails it twice; one that breaks many is
never rerun.
"""

import json
import sys

MAX_RERUN = 3


def _load(path):
    with open(path) as f:
        return json.load(f)


def _failed(ids, outcomes):
    return [i for i in ids if outcomes.get(i) != "passed"]


def to_rerun(config, outcomes):
    """The PASS_TO_PASS ids to run once more: none unless every FAIL_TO_PASS test passed."""
    if _failed(config["fail_to_pass"], outcomes):
        return []
    failed = _failed(config["pass_to_pass"], outcomes)
    return failed if len(failed) <= MAX_RERUN else []


def score(config, outcomes, rerun_outcomes=None):
    rerun = to_rerun(config, outcomes) if rerun_outcomes is not None else []
    flaky = {i for i in rerun if rerun_outcomes.get(i) == "passed"}
    result = {}
    all_passed = True
    for key in ("fail_to_pass", "pass_to_pass"):
        ids = config[key]
        passed = sum(1 for i in ids if outcomes.get(i) == "passed" or i in flaky)
        all_passed = all_passed and passed == len(ids)
        result[key] = passed / len(ids) if ids else 1.0
    if rerun:
        result.update(pass_to_pass_rerun=len(rerun), pass_to_pass_flaky=len(flaky))
    return {"reward": 1.0 if all_passed else 0.0, **result}


def main() -> int:
    if sys.argv[1] == "--to-rerun":
        config, report = sys.argv[2:4]
        for node_id in to_rerun(_load(config), _load(report)["tests"]):
            print(node_id)
        return 0
    config_path, report_path, reward_path = sys.argv[1:4]
    rerun_outcomes = _load(sys.argv[4])["tests"] if len(sys.argv) > 4 else None
    reward = score(_load(config_path), _load(report_path)["tests"], rerun_outcomes)
    with open(reward_path, "w") as f:
        json.dump(reward, f)
    print(json.dumps(reward))
    return 0


if __name__ == "__main__":
    sys.exit(main())
