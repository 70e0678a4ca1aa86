#!/bin/bash
# Verifier of an arl SWE task (written by `python -m arl.harbor.swe build`): restores the pristine test
# files over the testbed, runs the FAIL_TO_PASS + PASS_TO_PASS tests with pytest and writes
# reward.json = {"reward": 1.0 iff all listed tests passed, "fail_to_pass": ..., "pass_to_pass": ...}.
# A few PASS_TO_PASS tests that fail when every FAIL_TO_PASS test passed run once more (flakes; score.py).
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
RERUN_REPORT="$LOGS/pytest_rerun_report.json"
rm -f "$REPORT" "$RERUN_REPORT" "$LOGS/reward.json"
cd "$TESTBED" || fail "cannot enter $TESTBED"
run_pytest() {  # run_pytest REPORT LOG ARGS...: pytest with the report plugin; fails the verifier on a timeout
  local report="$1" log="$2"; shift 2
  ARL_SWE_REPORT="$report" PYTHONDONTWRITEBYTECODE=1 PYTHONPATH="$TESTS_DIR/plugin:$TESTBED/$SRC_ROOT" \
    timeout -k 5 "$PYTEST_TIMEOUT_SEC" "$PY" -m pytest -p arl_swe_report -p no:cacheprovider -q --tb=short \
    "${PYTEST_ARGS[@]}" "$@" >"$log" 2>&1
  local rc=$?
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then fail "pytest timed out after ${PYTEST_TIMEOUT_SEC}s (see $log)"; fi
  [ -s "$report" ] || fail "pytest (exit $rc) wrote no report; see $log"
}
run_pytest "$REPORT" "$LOGS/pytest.log" "${TEST_FILES[@]}"
RERUN_IDS="$(cd / && "$PY" "$TESTS_DIR/plugin/score.py" --to-rerun "$TESTS_DIR/config.json" "$REPORT")" \
  || fail "scoring failed"
SCORE_ARGS=("$TESTS_DIR/config.json" "$REPORT" "$LOGS/reward.json")
if [ -n "$RERUN_IDS" ]; then
  mapfile -t RERUN <<<"$RERUN_IDS"
  run_pytest "$RERUN_REPORT" "$LOGS/pytest_rerun.log" "${RERUN[@]}"
  SCORE_ARGS+=("$RERUN_REPORT")
fi
(cd / && "$PY" "$TESTS_DIR/plugin/score.py" "${SCORE_ARGS[@]}") || fail "scoring failed"
