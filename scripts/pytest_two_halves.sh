#!/usr/bin/env bash
# The test suite as two pytest processes side by side, one per core (scripts/test.sh runs it):
#   bash scripts/pytest_two_halves.sh PYTHON [PYTEST ARGS...]
# One half runs the tests that start a vLLM engine or server (marker `capture`; each engine is pinned
# to one core), the other everything else; the arguments go to every process (test files, -k, -x; not -m).
# A queue of slow files without an engine (tests/either_half.txt, or the file LEAP_EITHER_HALF names)
# is shared: the rest half leaves those files out, and whichever half has ended its own tests takes
# the next line no one has taken (a claim is a mkdir, atomic), in a pytest process of its own
# (-m 'not capture', only that line's files: tests/either_half.py). So the halves end close together
# whichever is faster on the machine at hand, and no numba object is loaded in the engine half's
# process before its engines start (the queue runs in fresh processes).
# Each process has its own temporary folder; they share one numba cache (a kernel compiled once
# serves every process; a cache the caller set is kept) and the read-only checkout. The engine half's
# output follows the other's. Exit status: the first failing process's; 5 (nothing collected) only
# when no process collected anything. Each process lists its slowest tests (where the time goes).
set -uo pipefail
PY="$1"
shift
start=$(date +%s)
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
export PY tmp NUMBA_CACHE_DIR="${NUMBA_CACHE_DIR:-$tmp/numba}"
# the queue's lines, comments and blank lines dropped: one pytest process each, its test files' names
QUEUE="${LEAP_EITHER_HALF:-tests/either_half.txt}"
: >"$tmp/queue"
if [ -f "$QUEUE" ]; then
    while IFS= read -r line || [ -n "$line" ]; do
        read -ra words <<<"${line%%#*}"
        [ "${#words[@]}" -gt 0 ] && echo "${words[*]}" >>"$tmp/queue"
    done <"$QUEUE"
fi
queued="$(tr '\n' ' ' <"$tmp/queue")"

# merge A B: two exit statuses as one: the first failure's, else 5 only when both collected nothing
merge() {
    if [ "$1" -ne 0 ] && [ "$1" -ne 5 ]; then echo "$1"
    elif [ "$2" -ne 0 ] && [ "$2" -ne 5 ]; then echo "$2"
    elif [ "$1" -eq 5 ] && [ "$2" -eq 5 ]; then echo 5
    else echo 0; fi
}
# take_queue WHO [PYTEST ARGS...]: run the queue lines not yet taken, one pytest process each;
# the merged exit status (5 for an empty queue)
take_queue() {
    local who="$1" i=0 rc worst=5 t0 line
    shift
    while IFS= read -r line; do
        i=$((i + 1))
        mkdir "$tmp/claim.$i" 2>/dev/null || continue
        t0=$(date +%s)
        rc=0
        LEAP_TEST_ONLY="$line" "$PY" -m pytest -q -p no:cacheprovider -m "not capture" --durations=5 \
            --basetemp "$tmp/queue$i" "$@" </dev/null || rc=$?
        echo "pytest_two_halves: the $who half ran queue line $i ($line) in $(( $(date +%s) - t0 )) s (exit $rc)"
        worst=$(merge "$worst" "$rc")
        [ "$rc" -eq 2 ] && break   # interrupted
    done <"$tmp/queue"
    return "$worst"
}
export -f merge take_queue

# The engine half runs in a session of its own, so that Ctrl-C or a TERM stops it and every server
# it started (a background job's SIGINT is ignored in a script; its group is signalled instead).
setsid bash -c 'rc=0; "$PY" -m pytest -q -p no:cacheprovider -m capture --durations=15 --basetemp "$tmp/engines" "$@" || rc=$?
                date +%s >"$tmp/engines.end"
                q=0; take_queue engine "$@" || q=$?
                date +%s >"$tmp/engines.queue.end"
                exit "$(merge "$rc" "$q")"' _ "$@" >"$tmp/engines.log" 2>&1 &
engines=$!
trap 'kill -TERM -- -"$engines" 2>/dev/null; wait "$engines" 2>/dev/null; exit 130' INT TERM
rest=0
LEAP_TEST_SKIP="$queued" "$PY" -m pytest -q -p no:cacheprovider -m "not capture" --durations=15 \
    --basetemp "$tmp/rest" "$@" || rest=$?
rest_done=$(date +%s)
q=0
take_queue rest "$@" || q=$?
rest_queue_done=$(date +%s)
eng=0
wait "$engines" || eng=$?
ended() { echo $(( $(cat "$1" 2>/dev/null || date +%s) - start )); }
echo "pytest_two_halves: the tests without an engine (-m 'not capture') ran in $(( rest_done - start )) s" \
     "(exit $rest), that half with its queue lines in $(( rest_queue_done - start )) s (exit $(merge "$rest" "$q"));" \
     "the engine tests (-m capture) in $(ended "$tmp/engines.end") s, that half with its queue lines in" \
     "$(ended "$tmp/engines.queue.end") s (exit $eng), their output:"
cat "$tmp/engines.log"
status=$(merge "$(merge "$rest" "$q")" "$eng")
exit "$status"
