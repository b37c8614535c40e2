#!/usr/bin/env bash
# The test suite as two pytest processes side by side, one per core (scripts/test.sh runs it):
#   bash scripts/pytest_two_halves.sh PYTHON [PYTEST ARGS...]
# One half runs the tests that start a vLLM engine or server (marker `capture`; each engine is pinned
# to one core), the other everything else; the arguments go to both (test files, -k, -x; not -m).
# Each half has its own temporary folder (and so its own numba cache and read-out); they share
# nothing else but the read-only checkout. The engine half's output follows the other's. Exit status:
# the first failing half's; 5 (nothing collected) only when neither half collected anything.
# Each half lists its 15 slowest tests (where the time goes, in every run of the test command).
set -uo pipefail
PY="$1"
shift
start=$(date +%s)
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# The engine half runs in a session of its own, so that Ctrl-C or a TERM stops it and every server
# it started (a background job's SIGINT is ignored in a script; its group is signalled instead).
END="$tmp/engines.end" setsid bash -c 'rc=0; "$@" || rc=$?; date +%s >"$END"; exit "$rc"' _ \
    "$PY" -m pytest -q -p no:cacheprovider -m capture --durations=15 --basetemp "$tmp/engines" "$@" \
    >"$tmp/engines.log" 2>&1 &
engines=$!
trap 'kill -TERM -- -"$engines" 2>/dev/null; wait "$engines" 2>/dev/null; exit 130' INT TERM
rest=0
"$PY" -m pytest -q -p no:cacheprovider -m "not capture" --durations=15 --basetemp "$tmp/rest" "$@" || rest=$?
rest_done=$(date +%s)
eng=0
wait "$engines" || eng=$?
echo "pytest_two_halves: the tests without an engine (-m 'not capture') ran in $(( rest_done - start )) s" \
     "(exit $rest); the engine tests (-m capture) in $(( $(cat "$tmp/engines.end" 2>/dev/null || date +%s) - start )) s" \
     "(exit $eng), their output:"
cat "$tmp/engines.log"
for rc in "$rest" "$eng"; do
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then exit "$rc"; fi
done
[ "$rest" -eq 5 ] && [ "$eng" -eq 5 ] && exit 5
exit 0
