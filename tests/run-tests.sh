#!/bin/bash
# `make test`'s runner: tests/run-tests.sh BUILD G4_BIN SHARED_DIR JOBS PROGRAM...
#
# Runs the test programs JOBS at a time (each program is one process on its own private temporary
# directory, none depends on timing, so they may share the machine), each judged by
# tests/result.sh. The shared fixtures are reference data: a program that leaves a new entry under
# SHARED_DIR, or changes one, fails (listing and timestamps compared around each program; with
# programs running side by side a write is charged to every program that was running, which still
# fails the run). Each program's report (its lines other than "ok ...") is printed whole, in the
# order given, once every program has finished; the last line is "BUILD: N passed, N failed, N
# skipped".
build=$1 g4_bin=$2 shared=$3 jobs=$4
shift 4
[ "$jobs" -ge 1 ] 2>/dev/null || { echo "run-tests.sh: JOBS '$jobs' is not a positive number" >&2; exit 2; }

# one program: its report to $t.report, "PASSED FAILED SKIPPED" to $t.result
run_one() {
    local t=$1
    find "$shared" 2>/dev/null | LC_ALL=C sort > "$t.shared"
    G4_BIN=$g4_bin "$t" > "$t.log" 2>&1
    local rc=$?
    {
        grep -v '^ok ' "$t.log"
        set -- $(sh tests/result.sh "$t" "$t.log" "$rc" 2>&1 >"$t.result")
        [ $# -eq 0 ] || echo "$*"
        local wrote
        wrote=$({ find "$shared" 2>/dev/null | LC_ALL=C sort | comm -13 "$t.shared" -;
                  find "$shared" -newer "$t.shared" 2>/dev/null; } | LC_ALL=C sort -u)
        if [ -n "$wrote" ]; then
            echo "$t wrote under $shared:" $wrote
            read -r p f s < "$t.result"
            echo "$p $((f + 1)) $s" > "$t.result"
        fi
    } > "$t.report"
}

running=0
for t in "$@"; do
    if [ "$running" -ge "$jobs" ]; then wait -n; running=$((running - 1)); fi
    run_one "$t" &
    running=$((running + 1))
done
wait

total_p=0 total_f=0 total_s=0
for t in "$@"; do
    cat "$t.report"
    read -r p f s < "$t.result" || { echo "$t: no result"; p=0 f=1 s=0; }
    total_p=$((total_p + p)) total_f=$((total_f + f)) total_s=$((total_s + s))
done
echo "$build: $total_p passed, $total_f failed, $total_s skipped"
[ "$total_f" -eq 0 ]
