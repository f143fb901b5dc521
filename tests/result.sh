#!/bin/sh
# Judges one test program for the Makefile's runners: `tests/result.sh NAME LOG STATUS` reads the
# program's closing line "name: N passed, N failed[, N skipped]" from LOG and prints
# "PASSED FAILED SKIPPED". A program with no closing line, one that exits non-zero without a
# failed check, and one that passed no check at all (it tested nothing) each count as a
# failure; the reason goes to stderr, naming the program.
name=$1 log=$2 status=$3
line=$(grep -E '^[a-z_0-9]+: [0-9]+ passed, [0-9]+ failed' "$log" | tail -1)
if [ -z "$line" ]; then
    echo "$name: no result line (exit $status)" >&2
    echo "0 1 0"
    exit 0
fi
passed=$(echo "$line" | sed -E 's/^[a-z_0-9]+: ([0-9]+) passed.*/\1/')
failed=$(echo "$line" | sed -E 's/^[^,]*, ([0-9]+) failed.*/\1/')
skipped=$(echo "$line" | sed -nE 's/^[^,]*, [^,]*, ([0-9]+) skipped.*/\1/p')
skipped=${skipped:-0}
if [ "$status" -ne 0 ] && [ "$failed" -eq 0 ]; then
    echo "$name: exit status $status with no failed check" >&2
    failed=1
fi
if [ "$passed" -eq 0 ] && [ "$failed" -eq 0 ]; then
    echo "$name: no check passed (it tested nothing)" >&2
    failed=1
fi
echo "$passed $failed $skipped"
