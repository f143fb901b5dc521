#!/bin/bash
# Mutation testing: do the tests notice a plausible bug? `scripts/mutation-test.sh [NAME...]`
# (or `make mutation-test [MUTATIONS="NAME..."]`) applies each mutant of tests/mutations.txt
# (the format is described at its top) on its own to a copy of the tree, rebuilds, and runs the
# release test programs of `make test`: the mutant's expected killer first (only its `part:`, when
# the entry names one, then if need be the whole program), then the others in the Makefile's
# order, stopping at the first program that fails (or runs past MUTATION_TIMEOUT seconds). Each
# mutant rebuilds only g4 and its killer; the other programs are built only when the killer
# does not kill it. Each mutant is reported "killed by PROGRAM" or "SURVIVED"; a mutant
# whose text no longer occurs exactly once (STALE) or that does not build (BROKEN) is an error
# of the list, not a kill. Exits 0 only when every mutant was killed.
#
# The worktree itself is never modified: the copy (the tracked and untracked, not ignored files,
# so uncommitted edits are included) lives in a temporary folder, gets one full build, and each
# mutant then costs an incremental make. Before any mutant the unmutated copy must pass every
# program, or nothing would mean anything.
#
#   scripts/mutation-test.sh --check   only checks that every entry's text occurs exactly once
# Environment: MUTATION_LIST (default tests/mutations.txt), MUTATION_TIMEOUT (seconds per program,
# default 600: a hang guard; test_draft takes 35 s idle, 5 minutes on a loaded machine),
# MUTATION_JOBS (make -j, default the number of CPUs), MUTATION_SHARDS (runs side by side, each in a copy
# of its own, taking the next mutant from a queue they share; default the number of CPUs), MUTATION_KEEP=1 (keep the copy, to look at
# its logs), G4_SHARED (the shared fixtures, default ../shared).
set -u
export LC_ALL=C

root=$(cd "$(dirname "$0")/.." && pwd)
list=${MUTATION_LIST:-$root/tests/mutations.txt}
limit=${MUTATION_TIMEOUT:-600}
jobs=${MUTATION_JOBS:-$(nproc 2>/dev/null || echo 2)}
start=$(date +%s.%N)

die() {
    echo "mutation-test: $*" >&2
    exit 2
}

elapsed() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

check_only=0
if [ "${1:-}" = --check ]; then
    check_only=1
    shift
fi
[ -f "$list" ] || die "no mutation list $list"

work=$(mktemp -d "${TMPDIR:-/tmp}/g4-mutation.XXXXXX") || die "cannot make a temporary folder"
cleanup() {
    if [ "${MUTATION_KEEP:-0}" = 1 ]; then echo "mutation-test: kept $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
# timeout(1) runs a program in a process group of its own, which a Ctrl-C does not reach: the
# running one (its timeout's pid) is stopped here, and timeout passes the signal to its group.
running=
on_signal() {
    [ -z "$running" ] || kill -TERM "$running" 2>/dev/null
    [ -z "$(jobs -p)" ] || kill -TERM $(jobs -p) 2>/dev/null
    wait
    exit 130
}
trap on_signal INT TERM

# ---- the list: one folder per entry under $work/list (name, file, killer, from, to, line) ----
# Parse errors name the list's line; names must be unique.
perl - "$list" "$work/list" <<'PERL' || exit 2
use strict;
my ($path, $out) = @ARGV;
open my $in, '<', $path or die "mutation-test: $path: $!\n";
my (@entries, $cur, $last);
my %known = map { $_ => 1 } qw(name file killer part needs from to);
sub finish {
    return unless $cur;
    for my $k (qw(name file from to)) {
        die "mutation-test: $path:$cur->{line}: entry without '$k:'\n" unless exists $cur->{$k};
    }
    die "mutation-test: $path:$cur->{line}: $cur->{name}: 'from' and 'to' are the same text\n" if $cur->{from} eq $cur->{to};
    die "mutation-test: $path:$cur->{line}: $cur->{name}: empty 'from'\n" if $cur->{from} eq '';
    die "mutation-test: $path:$cur->{line}: $cur->{name}: 'part' without 'killer'\n" if exists $cur->{part} && !exists $cur->{killer};
    push @entries, $cur;
    undef $cur;
    undef $last;
}
while (my $l = <$in>) {
    chomp $l;
    $l =~ s/\s+$//;
    next if $l =~ /^#/;
    if ($l eq '') { finish(); next; }
    if ($l =~ /^\|(.*)$/) {
        die "mutation-test: $path:$.: '|' line with no value above it\n" unless $last;
        $cur->{$last} .= "\n$1";
        next;
    }
    my ($k, $v) = $l =~ /^([a-z]+):\s*(.*)$/ or die "mutation-test: $path:$.: expected 'key: value', '|text' or '#'\n";
    die "mutation-test: $path:$.: unknown key '$k'\n" unless $known{$k};
    $cur //= { line => $. };
    die "mutation-test: $path:$.: '$k' given twice in one entry\n" if exists $cur->{$k};
    $cur->{$k} = $v;
    $last = $k;
}
finish();
my %seen;
mkdir $out or die "mutation-test: $out: $!\n";
my $i = 0;
for my $e (@entries) {
    die "mutation-test: $path:$e->{line}: bad name '$e->{name}'\n" unless $e->{name} =~ /^[A-Za-z0-9._-]+$/;
    die "mutation-test: $path:$e->{line}: name $e->{name} used twice\n" if $seen{$e->{name}}++;
    my $d = sprintf "%s/%03d", $out, ++$i;
    mkdir $d or die "mutation-test: $d: $!\n";
    for my $k (qw(name file killer part needs from to line)) {
        open my $f, '>', "$d/$k" or die "mutation-test: $d/$k: $!\n";
        print $f $e->{$k} // '';
        close $f;
    }
}
die "mutation-test: $path: no entries\n" unless $i;
PERL

# Occurrences of the text in FROM_FILE within FILE (overlapping ones counted: any second
# occurrence makes the entry ambiguous).
count_in() {
    perl -e 'local $/; open my $f, "<", $ARGV[0] or exit 99; my $s = <$f>; open my $p, "<", $ARGV[1] or exit 99;
             my $t = <$p>; my ($n, $at) = (0, -1); $n++ while ($at = index($s, $t, $at + 1)) >= 0; print $n' "$1" "$2"
}

# Replaces the one occurrence of FROM_FILE's text in FILE by TO_FILE's (FILE gets a new mtime).
apply_in() {
    perl -e 'local $/; my ($file, $from, $to) = map { open my $f, "<", $_ or die "$_: $!\n"; scalar <$f> } @ARGV;
             my $at = index($file, $from); die "text not found\n" if $at < 0; substr($file, $at, length $from) = $to;
             open my $o, ">", $ARGV[0] or die "$ARGV[0]: $!\n"; print $o $file; close $o or die "$ARGV[0]: $!\n"' "$1" "$2" "$3"
}

field() { cat "$1/$2"; }

# ---- which entries: all, or the ones named on the command line ----
entries=()
if [ $# -eq 0 ]; then
    for d in "$work"/list/*/; do entries+=("${d%/}"); done
else
    for want in "$@"; do
        found=
        for d in "$work"/list/*/; do [ "$(field "$d" name)" = "$want" ] && found=${d%/}; done
        [ -n "$found" ] || die "no mutant named $want in $list"
        entries+=("$found")
    done
fi

stale_in() { # prints why the entry cannot be applied to the tree at $1, or nothing
    local tree=$1 e=$2 file n
    file=$(field "$e" file)
    [ -f "$tree/$file" ] || { echo "no file $file"; return; }
    n=$(count_in "$tree/$file" "$e/from")
    [ "$n" = 1 ] || echo "its text occurs $n times in $file (must be once)"
}

if [ $check_only = 1 ]; then
    bad=0
    for e in "${entries[@]}"; do
        why=$(stale_in "$root" "$e")
        if [ -n "$why" ]; then
            echo "$(field "$e" name): STALE: $why ($(basename "$list") line $(field "$e" line))"
            bad=$((bad + 1))
        fi
    done
    echo "mutation-test --check: ${#entries[@]} entries, $bad stale"
    [ $bad -eq 0 ]
    exit
fi

# ---- shards: MUTATION_SHARDS runs of this script side by side (default: one per CPU), each in a copy
# of the tree of its own, taking the next mutant of the selection from a queue they share (a counter
# under flock), so a shard that is done with its part takes more: the first also checks the unmutated
# tree, and mutants differ in cost. Each mutant is still applied alone. Their reports are printed one
# after the other once all have finished, then the sums.
shards=${MUTATION_SHARDS:-$jobs}
if [ -z "${MUTATION_SHARD:-}" ] && [ "$shards" -gt 1 ] && [ ${#entries[@]} -gt 1 ]; then
    [ "$shards" -le ${#entries[@]} ] || shards=${#entries[@]}
    pids=() names=()
    for e in "${entries[@]}"; do names+=("$(field "$e" name)"); done
    echo 0 >"$work/queue"
    for ((i = 0; i < shards; i++)); do
        MUTATION_SHARD=$i MUTATION_QUEUE=$work/queue "$0" "${names[@]}" >"$work/shard$i.log" 2>&1 &
        pids+=($!)
    done
    rc=0
    for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
    for ((i = 0; i < shards; i++)); do sed "s/^mutation-test: /mutation-test (shard $((i + 1)) of $shards): /" "$work/shard$i.log"; done
    cat "$work"/shard*.log | perl -ne '
        if (my @m = /^mutation-test: (\d+) mutants: (\d+) killed, (\d+) survived, (\d+) broken, (\d+) stale, (\d+) skipped/) {
            $n++; $s[$_] += $m[$_] for 0..5 }
        END { $s[$_] //= 0 for 0..5; $n //= 0;
              print "mutation-test: $s[0] mutants: $s[1] killed, $s[2] survived, $s[3] broken, $s[4] stale, $s[5] skipped for a CPU feature, in $n shards" }'
    echo " ($(elapsed "$start") s)"
    exit $rc
fi

# ---- the copy and its build ----
shared=$(cd "${G4_SHARED:-$root/../shared}" 2>/dev/null && pwd) || die "no shared fixtures at ${G4_SHARED:-$root/../shared}"
tree=$work/tree
mkdir "$tree" || exit 2
(cd "$root" && git ls-files -z --cached --others --exclude-standard | perl -0ne 'print if -f substr($_, 0, -1)' |
    tar --null -T - -cf -) | tar -xf - -C "$tree" || die "cannot copy the tree"
# A nested make must not inherit the caller's jobserver or flags.
unset MAKEFLAGS MFLAGS MAKELEVEL
mk() { make -C "$tree" --no-print-directory -j"$jobs" BUILD=release "$@"; }
read -r -a tests <<<"$(mk -s --eval 'g4-mutation-print-tests: ; @echo $(TESTS)' g4-mutation-print-tests)"
[ ${#tests[@]} -gt 0 ] || die "the Makefile lists no TESTS"
targets=(build/release/g4 "${tests[@]/#/build/release/tests/}")

for e in "${entries[@]}"; do # every killer must be a test program
    k=$(field "$e" killer)
    [ -z "$k" ] || [[ " ${tests[*]} " == *" $k "* ]] ||
        die "$(field "$e" name) (line $(field "$e" line)): killer $k is not one of the Makefile's TESTS"
done

# build [PROGRAM]: g4 and that test program, or (no argument) g4 and every test program
build() {
    if [ $# -gt 0 ]; then mk build/release/g4 "build/release/tests/$1"; else mk "${targets[@]}"; fi >"$work/build.log" 2>&1
}

# Runs one program as `make test` does, or only its parts PARTS (G4_TEST_PARTS, tests/testutil.h);
# fails (status 1) when tests/result.sh counts a failure.
run_test() {
    local t=$1 parts=${2:-} rc
    (cd "$tree" && G4_BIN=build/release/g4 G4_SHARED=$shared G4_TEST_PARTS=$parts exec timeout -k 10 "$limit" "build/release/tests/$t") \
        >"$work/$t.log" 2>&1 &
    running=$!
    wait "$running"
    rc=$?
    running=
    set -- $(cd "$tree" && sh tests/result.sh "$t" "$work/$t.log" "$rc" 2>>"$work/$t.log")
    [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] && [ "${2:-1}" -eq 0 ]
}

# The first line of a program's log that says what failed, shortened.
first_failure() {
    { grep -m1 -E '^FAIL|: no result line|: exit status|no check passed' "$work/$1.log" || echo "(no FAIL line; see its log)"; } |
        cut -c1-160
}

t0=$(date +%s.%N)
build || { tail -20 "$work/build.log"; die "the unmutated copy does not build"; }
echo "mutation-test: built the copy in $(elapsed "$t0") s; ${#entries[@]} mutants${MUTATION_QUEUE:+ in a queue the shards share}, ${#tests[@]} test programs"
# The unmutated tree's programs (by the first shard only: the others copy the same tree), $jobs at a time (as `make test` runs them: none depends on
# timing); each in a subshell with its own signal trap for its own running program.
t0=$(date +%s.%N)
n=0
if [ "${MUTATION_SHARD:-0}" = 0 ]; then
    for t in "${tests[@]}"; do
        if [ $n -ge "$jobs" ]; then wait -n; n=$((n - 1)); fi
        (trap on_signal INT TERM; run_test "$t" || touch "$work/$t.failed") &
        n=$((n + 1))
    done
    wait
    for t in "${tests[@]}"; do
        [ ! -e "$work/$t.failed" ] || { grep -v '^ok ' "$work/$t.log" | tail -20; die "$t fails on the unmutated tree"; }
    done
    echo "mutation-test: the unmutated tree passes every program ($(elapsed "$t0") s)"
fi

# ---- the mutants, one at a time ----
# next_mutant: idx, the next mutant's index: from the shards' queue (MUTATION_QUEUE), else each in turn
taken=0
next_mutant() {
    if [ -n "${MUTATION_QUEUE:-}" ]; then
        idx=$(flock "$MUTATION_QUEUE" sh -c 'n=$(cat "$1") && echo $((n + 1)) >"$1" && echo "$n"' sh "$MUTATION_QUEUE") ||
            die "cannot take a mutant from $MUTATION_QUEUE"
    else
        idx=$taken
        taken=$((taken + 1))
    fi
}

killed=0 survived=0 broken=0 stale=0 skipped=0 total=0
while next_mutant && [ "$idx" -lt ${#entries[@]} ]; do
    e=${entries[$idx]}
    total=$((total + 1))
    name=$(field "$e" name) file=$(field "$e" file) killer=$(field "$e" killer)
    t0=$(date +%s.%N)
    why=$(stale_in "$tree" "$e")
    if [ -n "$why" ]; then
        echo "$name: STALE: $why (list line $(field "$e" line))"
        stale=$((stale + 1))
        continue
    fi
    # a mutant only a CPU feature lets its killer see (a kernel level's cpuid check) is skipped,
    # never counted as killed, on a CPU without it
    lacks=
    for flag in $(field "$e" needs); do grep -qw -- "$flag" /proc/cpuinfo || lacks="$lacks $flag"; done
    if [ -n "$lacks" ]; then
        echo "$name: SKIPPED: this CPU lacks$lacks, which its killer needs to see it"
        skipped=$((skipped + 1))
        continue
    fi
    cp -p "$tree/$file" "$work/original"
    apply_in "$tree/$file" "$e/from" "$e/to" || die "$name: cannot write $file"
    part=$(field "$e" part)
    if ! build $killer; then
        echo "$name: BROKEN: the mutant does not build ($(elapsed "$t0") s)"
        grep -m3 -E 'error|Error' "$work/build.log" | sed 's/^/    /'
        broken=$((broken + 1))
    else
        by=
        if [ -n "$part" ] && ! run_test "$killer" "$part"; then
            # a part the program does not name is an error of the list, not a kill
            ! grep -q '^FAIL.*G4_TEST_PARTS=' "$work/$killer.log" || die "$name: $killer has no part '$part': $(first_failure "$killer")"
            by="$killer ($part)"
        fi
        [ -n "$by" ] || [ -z "$killer" ] || run_test "$killer" || by=$killer
        if [ -z "$by" ]; then
            build || die "$name: the other test programs do not build"
            for t in "${tests[@]}"; do [ "$t" = "$killer" ] || run_test "$t" || { by=$t; break; }; done
        fi
        if [ -n "$by" ]; then
            note=
            [ -n "$killer" ] && [ "${by%% *}" != "$killer" ] && note=", not by the expected $killer"
            [ -n "$part" ] && [ "$by" = "$killer" ] && note=", not by its part $part"
            echo "$name: killed by $by ($(elapsed "$t0") s$note)"
            echo "    $(first_failure "${by%% *}")"
            killed=$((killed + 1))
        else
            echo "$name: SURVIVED ($(elapsed "$t0") s)"
            survived=$((survived + 1))
        fi
    fi
    # The original text back, with a new mtime (cp without -p), so the next build recompiles it.
    cp "$work/original" "$tree/$file" || die "cannot restore $file"
done

echo "mutation-test: $total mutants: $killed killed, $survived survived, $broken broken, $stale stale, $skipped skipped for a CPU feature ($(elapsed "$start") s)"
[ $((killed + skipped)) -eq "$total" ]
