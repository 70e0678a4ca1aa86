#!/bin/bash
# Grader of an arl SWE task (written by `python -m arl.harbor.swe build`). It runs as root in a clean
# environment started from the task's image after the agent's environment is gone (Harbor's separate
# verifier mode); the agent's /testbed was carried into it. In order:
#   1. the harness must run before the change is looked at (python, pytest, the base copy): when it
#      cannot, NO reward file and exit 3 (an infrastructure failure, retried);
#   2. grade_change.py keeps only what a fix may touch and puts the rest back as in the base, or refuses
#      the change (reward 0, change_refused); then tests/test.patch, when the task has one, is applied;
#   3. pytest runs the FAIL_TO_PASS + PASS_TO_PASS tests as an unprivileged user that can write nothing
#      here but its own home folder, with its config, rootdir and plugins pinned and `python -P` (no
#      current-dir imports); its report comes back through a pipe, with a nonce and what the plugin saw
#      of the runner being tampered with; every process of that user is killed before the report is read;
#   4. score.py writes reward.json = {"reward": 1.0 iff all listed tests passed, ...}. A few PASS_TO_PASS
#      failures when every FAIL_TO_PASS test passed are rerun once (flakes).
# After step 1 nothing but the agent's change differs from a correct run, so a verifier the change broke
# (no report, a crash, a timeout) scores 0.0 with agent_broke_verifier = 1 and the cause on stderr.
# Overrides for running it outside the task image: ARL_SWE_PYTHON, ARL_SWE_TESTBED, ARL_SWE_BASE,
# ARL_SWE_LOGS, ARL_SWE_RUNNER_UID (default 65534; "" runs pytest as the caller). PYTEST_CONFIG "auto": the
# base's own pytest config file, found as pytest finds it.
set -u
TESTS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TESTBED="${ARL_SWE_TESTBED:-/testbed}"
BASE="${ARL_SWE_BASE:-@BASE_DIR@}"
LOGS="${ARL_SWE_LOGS:-/logs/verifier}"
RUNNER_UID="${ARL_SWE_RUNNER_UID-65534}"
SRC_ROOT=@SRC_ROOT@
PYTEST_CONFIG=@PYTEST_CONFIG@
TEST_FILES=(@TEST_FILES@)
PYTEST_ARGS=(@PYTEST_ARGS@)
PYTEST_TIMEOUT_SEC=@PYTEST_TIMEOUT_SEC@
fail() { echo "arl-swe verifier cannot run: $*" >&2; exit 3; }

# 1. The harness, checked from / before the change can matter.
PY=""
for cand in "${ARL_SWE_PYTHON:-}" @VENV_PYTHON@ python3; do
  [ -n "$cand" ] || continue
  if [ -x "$cand" ] || command -v "$cand" >/dev/null 2>&1; then PY="$(command -v "$cand")"; break; fi
done
[ -n "$PY" ] || fail "no python interpreter found"
(cd / && "$PY" -I -c "import pytest") >/dev/null 2>&1 || fail "pytest is not importable by $PY"
[ -d "$BASE" ] || fail "no base copy of the repository at $BASE"
# The task's own tests (a SWE-bench row's test_patch) must apply to the base: if not, the task is broken.
if [ -f "$TESTS_DIR/test.patch" ]; then
  (cd "$BASE" && patch -p1 --dry-run --forward --batch --quiet < "$TESTS_DIR/test.patch") >/dev/null 2>&1 \
    || fail "the task's tests/test.patch does not apply to the base copy at $BASE"
fi
# "auto": the repository's own pytest configuration, as the base has it (imported rows).
if [ "$PYTEST_CONFIG" = auto ]; then
  PYTEST_CONFIG="$("$PY" -I "$TESTS_DIR/plugin/grade_change.py" --pytest-config "$BASE")" || fail "cannot read the base's pytest config"
fi
mkdir -p "$LOGS" || fail "cannot create $LOGS"
chown 0:0 "$LOGS" 2>/dev/null; chmod 755 "$LOGS" || fail "cannot protect $LOGS"
RUN_AS=()
if [ -n "$RUNNER_UID" ]; then
  command -v setpriv >/dev/null 2>&1 || fail "no setpriv to drop privileges"
  RUN_AS=(setpriv "--reuid=$RUNNER_UID" "--regid=$RUNNER_UID" --clear-groups --)
  "${RUN_AS[@]}" "$PY" -I -c "import pytest" >/dev/null 2>&1 || fail "pytest is not importable by uid $RUNNER_UID"
fi
REPORT_DIR="$(mktemp -d /tmp/arl-swe-report.XXXXXX)" || fail "cannot create a report folder"
[ -z "$RUNNER_UID" ] || chown "$RUNNER_UID:$RUNNER_UID" "$REPORT_DIR" || fail "cannot hand $REPORT_DIR to the runner"
# The runner's report comes back through a pipe only root opens (the runner inherits the open end: it can
# append, never rewrite), and carries a nonce handed to the plugin through another pipe.
PIPES="$(mktemp -d /tmp/arl-swe-pipes.XXXXXX)" && chmod 700 "$PIPES" && mkfifo "$PIPES/report" "$PIPES/nonce" \
  || fail "cannot create the report pipes"
NONCE="$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
[ ${#NONCE} -eq 32 ] || fail "cannot draw a nonce"

broke() {  # the agent's change made the verifier fail: a kept 0, with the cause
  echo "arl-swe verifier: the agent's change broke the verifier: $*" >&2
  "$PY" -I "$TESTS_DIR/plugin/score.py" --broken "$*" "$LOGS/reward.json" || fail "scoring failed"
  exit 0
}

# 2. The change: only what a fix may touch.
[ -d "$TESTBED" ] || mkdir -p "$TESTBED"  # the agent removed it: an empty change, graded as such
"$PY" -I "$TESTS_DIR/plugin/grade_change.py" "$TESTS_DIR/config.json" "$BASE" "$TESTBED" "$LOGS/change.json"
rc=$?
if [ "$rc" -eq 10 ]; then
  "$PY" -I "$TESTS_DIR/plugin/score.py" --refused "$LOGS/change.json" "$LOGS/reward.json" || fail "scoring failed"
  exit 0
fi
[ "$rc" -eq 0 ] || fail "grade_change.py exited $rc"
# Tests that come with the task rather than with the repository (a SWE-bench row's test_patch): applied
# only here, after the change was graded, so the agent never saw them and cannot have edited them.
if [ -f "$TESTS_DIR/test.patch" ]; then
  (cd "$TESTBED" && patch -p1 --forward --batch --quiet < "$TESTS_DIR/test.patch") >"$LOGS/test_patch.log" 2>&1 \
    || broke "the task's test patch does not apply over the change (see $LOGS/test_patch.log)"
fi
# Nothing of the runner's may write the tree it tests (a test could rewrite a test file not yet collected).
chown -R 0:0 "$TESTBED" 2>/dev/null && chmod -R u+rwX,go+rX,go-w "$TESTBED" 2>/dev/null || fail "cannot protect $TESTBED"

# 3. pytest, as the runner user, pinned.
CONFIG_ARGS=(-c "$TESTS_DIR/plugin/pytest.ini")
[ -z "$PYTEST_CONFIG" ] || CONFIG_ARGS=(-c "$TESTBED/$PYTEST_CONFIG")
kill_runner() {  # every process the tests left behind
  [ -z "$RUNNER_UID" ] || "${RUN_AS[@]}" "$PY" -I -c "import os, signal; os.kill(-1, signal.SIGKILL)" 2>/dev/null
}
run_pytest() {  # run_pytest REPORT LOG ARGS...: the tests, their report copied out by root
  local report="$1" log="$2"; shift 2
  rm -f "$PIPES/report.json"
  cat "$PIPES/report" >"$PIPES/report.json" &
  local reader=$!
  printf '%s' "$NONCE" >"$PIPES/nonce" &
  local started=$SECONDS
  (cd "$TESTBED" && "${RUN_AS[@]}" env -u PYTEST_ADDOPTS -u PYTEST_PLUGINS -u PYTHONSTARTUP -u PYTHONHOME \
    -u BASH_ENV -u ARL_SWE_REPORT HOME="$REPORT_DIR" ARL_SWE_REPORT_FD=9 ARL_SWE_NONCE_FD=8 \
    ARL_SWE_CHANGE="$LOGS/change.json" ARL_SWE_TESTBED_ROOT="$TESTBED" PYTHONDONTWRITEBYTECODE=1 \
    PYTHONPATH="$TESTS_DIR/plugin:$TESTBED/$SRC_ROOT" \
    timeout -k 5 "$PYTEST_TIMEOUT_SEC" "$PY" -P -m pytest -p arl_swe_report -p no:cacheprovider \
    "--rootdir=$TESTBED" "${CONFIG_ARGS[@]}" -q --tb=short "${PYTEST_ARGS[@]}" "$@") \
    8<"$PIPES/nonce" 9>"$PIPES/report" >"$log" 2>&1
  local rc=$?
  kill_runner
  # The pipe ends when the last holder of its write end is gone: a process the tests forked and left
  # (possible only when pytest runs as the caller, who is not killed wholesale) gets 5 s.
  local waited=0
  while kill -0 "$reader" 2>/dev/null && [ "$waited" -lt 50 ]; do sleep 0.1; waited=$((waited + 1)); done
  kill "$reader" 2>/dev/null
  wait "$reader" 2>/dev/null
  # The plugin's alarm (arl_swe_report.CHANNEL_ALARM): its report pipe was closed or swapped under it.
  if [ "$rc" -eq 86 ]; then
    "$PY" -I "$TESTS_DIR/plugin/score.py" --tampered "the report pipe was closed or swapped" "$LOGS/reward.json" \
      || fail "scoring failed"
    exit 0
  fi
  # 137 is also a test process killed by SIGKILL: a timeout only when the time was up.
  if [ "$rc" -eq 124 ] || { [ "$rc" -eq 137 ] && [ $((SECONDS - started)) -ge "$PYTEST_TIMEOUT_SEC" ]; }; then
    broke "pytest timed out after ${PYTEST_TIMEOUT_SEC}s (see $log)"
  fi
  "$PY" -I "$TESTS_DIR/plugin/score.py" --take-report "$PIPES/report.json" "$report" "$NONCE" \
    || broke "pytest (exit $rc) left no readable report of its own (see $log)"
}
run_pytest "$LOGS/pytest_report.json" "$LOGS/pytest.log" "${TEST_FILES[@]}"
RERUN_IDS="$("$PY" -I "$TESTS_DIR/plugin/score.py" --to-rerun "$TESTS_DIR/config.json" "$LOGS/pytest_report.json")" \
  || fail "scoring failed"
SCORE_ARGS=("$TESTS_DIR/config.json" "$LOGS/pytest_report.json" "$LOGS/reward.json" "$LOGS/change.json")
if [ -n "$RERUN_IDS" ]; then
  mapfile -t RERUN <<<"$RERUN_IDS"
  run_pytest "$LOGS/pytest_rerun_report.json" "$LOGS/pytest_rerun.log" "${RERUN[@]}"
  SCORE_ARGS+=("$LOGS/pytest_rerun_report.json")
fi
# 4. The reward.
"$PY" -I "$TESTS_DIR/plugin/score.py" "${SCORE_ARGS[@]}" || fail "scoring failed"
