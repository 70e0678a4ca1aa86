#!/bin/bash
# Verifier of an arl SWE task (written by `python -m arl.harbor.swe build`): restores the pristine test
# files over the testbed, runs the FAIL_TO_PASS + PASS_TO_PASS tests with pytest and writes
# reward.json = {"reward": 1.0 iff all listed tests passed, "fail_to_pass": ..., "pass_to_pass": ...}.
# When the harness itself cannot run (no python/pytest, no report, a timeout) it writes NO reward file
# and exits non-zero naming the cause: a verifier failure, never a reward of 0.
# Overrides for running it outside the task image: ARL_SWE_PYTHON, ARL_SWE_TESTBED, ARL_SWE_LOGS.
set -u
TESTS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TESTBED="${ARL_SWE_TESTBED:-/testbed}"
LOGS="${ARL_SWE_LOGS:-/logs/verifier}"
SRC_ROOT=@SRC_ROOT@
TEST_FILES=(@TEST_FILES@)
PYTEST_ARGS=(@PYTEST_ARGS@)
PYTEST_TIMEOUT_SEC=@PYTEST_TIMEOUT_SEC@
fail() { echo "arl-swe verifier cannot run: $*" >&2; exit 3; }

# The interpreter: an explicit one, else the package's venv bound by the local sandbox, else python3 (image).
PY=""
for cand in "${ARL_SWE_PYTHON:-}" @VENV_PYTHON@ python3; do
  [ -n "$cand" ] || continue
  if [ -x "$cand" ] || command -v "$cand" >/dev/null 2>&1; then PY="$cand"; break; fi
done
[ -n "$PY" ] || fail "no python interpreter found"
(cd / && "$PY" -c "import pytest") >/dev/null 2>&1 || fail "pytest is not importable by $PY"
[ -d "$TESTBED" ] || fail "no testbed at $TESTBED"
mkdir -p "$LOGS" || fail "cannot create $LOGS"

# Undo any edit to the tests: pristine copies back, conftest.py files the package does not ship removed.
cp -a "$TESTS_DIR/pristine/." "$TESTBED/" || fail "cannot restore the pristine tests into $TESTBED"
while IFS= read -r -d '' f; do
  rel="${f#"$TESTBED"/}"
  [ -f "$TESTS_DIR/pristine/$rel" ] || rm -f "$f"
done < <(find "$TESTBED" -name conftest.py -not -path '*/.git/*' -print0)
find "$TESTBED" -name __pycache__ -type d -prune -exec rm -rf {} + 2>/dev/null

REPORT="$LOGS/pytest_report.json"
rm -f "$REPORT" "$LOGS/reward.json"
cd "$TESTBED" || fail "cannot enter $TESTBED"
ARL_SWE_REPORT="$REPORT" PYTHONDONTWRITEBYTECODE=1 PYTHONPATH="$TESTS_DIR/plugin:$TESTBED/$SRC_ROOT" \
  timeout -k 5 "$PYTEST_TIMEOUT_SEC" "$PY" -m pytest -p arl_swe_report -p no:cacheprovider -q --tb=short \
  "${PYTEST_ARGS[@]}" "${TEST_FILES[@]}" >"$LOGS/pytest.log" 2>&1
rc=$?
if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then fail "pytest timed out after ${PYTEST_TIMEOUT_SEC}s (see $LOGS/pytest.log)"; fi
[ -s "$REPORT" ] || fail "pytest (exit $rc) wrote no report; see $LOGS/pytest.log"
(cd / && "$PY" "$TESTS_DIR/plugin/score.py" "$TESTS_DIR/config.json" "$REPORT" "$LOGS/reward.json") \
  || fail "scoring failed"
