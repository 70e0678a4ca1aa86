"""Scores an arl SWE task: `score.py CONFIG REPORT REWARD_JSON` (run by tests/test.sh).

reward = 1.0 iff every FAIL_TO_PASS and PASS_TO_PASS test passed, else 0.0; the pass fractions of each
list are extra keys. A listed test that did not run (e.g. its module no longer imports) counts as failed.
"""

import json
import sys


def main() -> int:
    config_path, report_path, reward_path = sys.argv[1:4]
    with open(config_path) as f:
        config = json.load(f)
    with open(report_path) as f:
        outcomes = json.load(f)["tests"]
    result = {}
    all_passed = True
    for key in ("fail_to_pass", "pass_to_pass"):
        ids = config[key]
        passed = sum(1 for i in ids if outcomes.get(i) == "passed")
        all_passed = all_passed and passed == len(ids)
        result[key] = passed / len(ids) if ids else 1.0
    reward = {"reward": 1.0 if all_passed else 0.0, **result}
    with open(reward_path, "w") as f:
        json.dump(reward, f)
    print(json.dumps(reward))
    return 0


if __name__ == "__main__":
    sys.exit(main())
