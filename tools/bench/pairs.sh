#!/usr/bin/env bash
# pairs.sh: BenchmarkThroughputVsPlain of two commits side by side, in
# interleaved runs (A, B, A, B...), so that what else the machine does hits
# both alike. It prints each run's throttled/plain ratio and per-task costs,
# then the mean of each and of the paired differences (B - A).
#
#   tools/bench/pairs.sh [-n PAIRS] [-r ROUNDS] A B
#
# A and B are commits (or anything git rev-parse takes). Each is checked out
# in a temporary worktree and its benchmark built once; a commit from before
# the tools module kept the benchmark in integration_test/bench.
set -euo pipefail
pairs=10 rounds=8
while getopts n:r: o; do
  case $o in
    n) pairs=$OPTARG ;;
    r) rounds=$OPTARG ;;
    *) echo "usage: $0 [-n pairs] [-r rounds] A B" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ $# -eq 2 ] || { echo "usage: $0 [-n pairs] [-r rounds] A B" >&2; exit 2; }

work=$(mktemp -d)
trap 'for w in "$work"/A "$work"/B; do [ -d "$w" ] && git worktree remove --force "$w"; done; rm -rf "$work"' EXIT

build() { # build NAME REV: the worktree and its test binary
  git worktree add -q --detach "$work/$1" "$2"
  if [ -d "$work/$1/tools/bench/pipeline" ]; then
    (cd "$work/$1/tools" && go test -c -o "$work/$1.test" ./bench/pipeline/)
    echo "$work/$1/tools/bench/pipeline" > "$work/$1.dir"
  else
    (cd "$work/$1" && go test -c -o "$work/$1.test" ./integration_test/bench/)
    echo "$work/$1/integration_test/bench" > "$work/$1.dir"
  fi
}
build A "$1"
build B "$2"

out="$work/runs"
for i in $(seq "$pairs"); do
  for v in A B; do
    r=$(cd "$(cat "$work/$v.dir")" && "$work/$v.test" -test.run '^$' -test.bench ThroughputVsPlain \
      -test.benchtime 1x -e2e.rounds "$rounds" 2>&1)
    ratio=$(echo "$r" | grep -oE '[0-9.]+ throttled/plain' | head -1 | cut -d' ' -f1)
    cost=$(echo "$r" | grep -E 'throttled: ' | grep -oE 'Redis CPU [0-9]+µs, test process CPU [0-9]+µs, [0-9.]+ Redis commands')
    [ -n "$ratio" ] || { echo "$v: no ratio in the benchmark's output:" >&2; echo "$r" >&2; exit 1; }
    echo "$i $v $ratio $cost" | tee -a "$out"
  done
done
awk '
  { r[$2] += $3; r2[$2] += $3 * $3; n[$2]++; x[$1, $2] = $3 }
  END {
    for (v in r) { m = r[v] / n[v]; printf "%s: throttled/plain %.3f (sd %.3f, %d runs)\n", v, m, sqrt((r2[v] - n[v] * m * m) / (n[v] - 1)), n[v] }
    for (i = 1; i <= n["A"]; i++) { d = x[i, "B"] - x[i, "A"]; s += d; s2 += d * d }
    m = s / n["A"]; sd = sqrt((s2 - n["A"] * m * m) / (n["A"] - 1))
    printf "B - A: %.3f (sd %.3f, se %.3f)\n", m, sd, sd / sqrt(n["A"])
  }' "$out"
