"""Scores an arl SWE task (run by tests/test.sh, as root):

    score.py CONFIG REPORT REWARD_JSON CHANGE_JSON [RERUN_REPORT]   # write the reward
    score.py --to-rerun CONFIG REPORT                   # print the PASS_TO_PASS ids worth one rerun
    score.py --take-report SOURCE DEST [NONCE]          # take the runner's report stream, checked
    score.py --refused CHANGE_JSON REWARD_JSON          # reward 0: grade_change.py refused the change
    score.py --broken REASON REWARD_JSON                # reward 0: the change broke the verifier
    score.py --tampered REASON REWARD_JSON              # reward 0: the runner's report channel was tampered with

reward = 1.0 iff every FAIL_TO_PASS and PASS_TO_PASS test passed, else 0.0; the pass fractions of each
list are extra keys. A listed test that did not run (e.g. its module no longer imports) counts as failed.

A PASS_TO_PASS test can be flaky (sockets with 10 ms timeouts in a loaded, 1-cpu container): the builder
leaves out the tests that flaked in its side-by-side baseline runs, but rare flakes still happen. So
when every FAIL_TO_PASS test passed and at most MAX_RERUN PASS_TO_PASS tests failed, test.sh runs those
once more and a pass there counts (`pass_to_pass_rerun`: how many were rerun, `pass_to_pass_flaky`: how
many passed on the rerun). A solution that really breaks a test fails it twice; one that breaks many is
never rerun.

Besides the reward, reward.json says how the change was graded, as numbers (Harbor's rewards are a map of
numbers): `protected_touched` (paths grade_change.py put back), `change_refused`, `agent_broke_verifier`,
`runner_tampered` (the report plugin saw the runner's code replaced: reward 0).
The runner's report is written by a process running the agent's code: it is read without following links,
bounded in size, checked in shape, and must be a stream of outcome lines ending in exactly one document
carrying the run's nonce; anything else is a verifier the change broke. The stream's outcomes count, and a
document that disagrees with them is tampering.
"""

import json
import os
import sys

MAX_RERUN = 3
_REPORT_LIMIT = 64 * 1024 * 1024
_OUTCOMES = ("passed", "failed", "skipped")


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


def merge_outcome(old, new):
    """One test's outcome after another report of it (the plugin's rule): failed beats everything, a
    skipped phase stays skipped unless the call passed."""
    if old == "failed" or not (new == "failed" or old is None or (old == "skipped" and new == "passed")):
        return old
    return new


def _parse_stream(raw):
    """The runner's stream: outcome lines, tampering lines, then one document; None if it is not that."""
    lines = [line for line in raw.split(b"\n") if line.strip()]
    try:
        items = [json.loads(line) for line in lines]
    except ValueError:
        return None
    if not items or not all(isinstance(item, dict) for item in items):
        return None
    *stream, document = items
    outcomes, tampered = {}, []
    for item in stream:
        if (
            set(item) == {"test", "outcome"}
            and isinstance(item["test"], str)
            and item["outcome"] in _OUTCOMES
        ):
            outcomes[item["test"]] = merge_outcome(outcomes.get(item["test"]), item["outcome"])
        elif set(item) == {"tampered"} and isinstance(item["tampered"], str):
            tampered.append(item["tampered"])
        else:
            return None  # a second document, or a line of no known shape
    return outcomes, tampered, document


def take_report(source, dest, nonce=None):
    """Copy the runner's report to `dest` when it has the plugin's shape (with `nonce`, when given: a stream
    ending in one document that carries it); False if not. The stream's outcomes are the report's: outcomes
    the document lists otherwise were changed in memory after they were streamed, which is tampering."""
    try:
        fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    with os.fdopen(fd, "rb") as f:
        raw = f.read(_REPORT_LIMIT + 1)
    if len(raw) > _REPORT_LIMIT:
        return False
    if nonce is None:
        try:
            stream, data = ({}, []), json.loads(raw)
        except ValueError:
            return False
    else:
        parsed = _parse_stream(raw)
        if parsed is None:
            return False
        outcomes, tampered, data = parsed[0], parsed[1], parsed[2]
        stream = (outcomes, tampered)
    if not (
        isinstance(data, dict)
        and isinstance(data.get("tests"), dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in data["tests"].items())
    ):
        return False
    if nonce is not None:
        if not (data.get("nonce") == nonce and isinstance(data.get("tampered"), list)):
            return False
        outcomes, tampered = stream
        changed = sorted(
            k for k in set(outcomes) | set(data["tests"]) if outcomes.get(k) != data["tests"].get(k)
        )
        if changed:
            tampered.append(f"{len(changed)} outcome(s) changed in memory after they were recorded")
        data["tests"] = outcomes
        data["tampered"] = list(dict.fromkeys(data["tampered"] + tampered))
    with open(dest, "w") as f:
        json.dump(data, f)
    return True


def protected_touched(change):
    return float(len(change.get("restored") or {}) + len(change.get("deleted") or {}))


def score(config, outcomes, rerun_outcomes=None, tampered=()):
    if tampered:
        return {"reward": 0.0, "runner_tampered": 1.0}
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


def _write(path, reward):
    with open(path, "w") as f:
        json.dump(reward, f)
    print(json.dumps(reward))


def main() -> int:
    if sys.argv[1] == "--to-rerun":
        config, report = sys.argv[2:4]
        for node_id in to_rerun(_load(config), _load(report)["tests"]):
            print(node_id)
        return 0
    if sys.argv[1] == "--take-report":
        return 0 if take_report(*sys.argv[2:5]) else 1
    if sys.argv[1] == "--refused":
        change = _load(sys.argv[2])
        # Counts only: the reasons name the agent's files, which must not reach the verifier's output (it is
        # searched for harness failures); they are in change.json.
        reach = len(change.get("reach") or [])
        why = (
            f"{reach} reference(s) to the test harness or the interpreter's machinery"
            if reach
            else "the agent's tree was not carried (over the carry's size limit)"
        )
        print(f"the change is refused: {why} (change.json)", file=sys.stderr)
        _write(
            sys.argv[3],
            {"reward": 0.0, "change_refused": 1.0, "protected_touched": protected_touched(change)},
        )
        return 0
    if sys.argv[1] == "--broken":
        _write(sys.argv[3], {"reward": 0.0, "agent_broke_verifier": 1.0})
        return 0
    if sys.argv[1] == "--tampered":
        print(f"the runner was tampered with: {sys.argv[2]}", file=sys.stderr)
        _write(sys.argv[3], {"reward": 0.0, "runner_tampered": 1.0})
        return 0
    config_path, report_path, reward_path, change_path = sys.argv[1:5]
    report = _load(report_path)
    rerun_report = _load(sys.argv[5]) if len(sys.argv) > 5 else None
    tampered = report.get("tampered", []) + (rerun_report.get("tampered", []) if rerun_report else [])
    if tampered:
        # What was replaced names runner objects, never the agent's paths: safe for the verifier's output.
        print("the runner was tampered with: " + "; ".join(map(str, tampered[:8])), file=sys.stderr)
    reward = score(
        _load(config_path), report["tests"], rerun_report["tests"] if rerun_report else None, tampered
    )
    reward["protected_touched"] = protected_touched(_load(change_path))
    _write(reward_path, reward)
    return 0


if __name__ == "__main__":
    sys.exit(main())
