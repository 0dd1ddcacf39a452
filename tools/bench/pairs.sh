#!/usr/bin/env bash
# pairs.sh: a throughput benchmark of two commits side by side, in
# interleaved runs (A, B, A, B...), so that what else the machine does hits
# both alike. It prints each run's ratio and per-task costs, then the
# median, range and mean of each and the mean of the paired differences
# (B - A).
#
#   tools/bench/pairs.sh [-n PAIRS] [-r ROUNDS] [-b] A B
#
# By default the benchmark is BenchmarkThroughputVsPlain (throttled/plain,
# in-process); -b runs BenchmarkWorkerVsBare instead (worker/bare: the built
# cmd/worker against a bare asynq worker, black-box). A and B are commits
# (or anything git rev-parse takes). Each is checked out in a temporary
# worktree and its benchmark built once; a commit from before the tools
# module kept the benchmark in integration_test/bench.
set -euo pipefail
pairs=10 rounds=8
bench=ThroughputVsPlain metric='throttled/plain' variant='throttled' flags='-e2e.rounds'
while getopts n:r:b o; do
  case $o in
    n) pairs=$OPTARG ;;
    r) rounds=$OPTARG ;;
    b) bench=WorkerVsBare metric='worker/bare' variant='worker' flags='-bare.rounds' ;;
    *) echo "usage: $0 [-n pairs] [-r rounds] [-b] A B" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ $# -eq 2 ] || { echo "usage: $0 [-n pairs] [-r rounds] [-b] A B" >&2; exit 2; }

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
    r=$(cd "$(cat "$work/$v.dir")" && "$work/$v.test" -test.run '^$' -test.bench "$bench" \
      -test.benchtime 1x "$flags" "$rounds" 2>&1)
    ratio=$(echo "$r" | grep -oE "[0-9.]+ $metric" | head -1 | cut -d' ' -f1)
    cost=$(echo "$r" | grep -E "$variant: " | grep -oE 'Redis CPU [0-9]+µs, test process CPU [0-9]+µs, [0-9.]+ Redis commands')
    [ -n "$ratio" ] || { echo "$v: no ratio in the benchmark's output:" >&2; echo "$r" >&2; exit 1; }
    echo "$i $v $ratio $cost" | tee -a "$out"
  done
done
for v in A B; do
  awk -v v="$v" '$2 == v { print $3 }' "$out" | sort -n | awk -v v="$v" -v name="$metric" '
    { x[NR] = $1 }
    END { m = NR % 2 ? x[(NR + 1) / 2] : (x[NR / 2] + x[NR / 2 + 1]) / 2
          printf "%s: %s median %.3f, range %.3f-%.3f (%d runs)\n", v, name, m, x[1], x[NR], NR }'
done
awk -v name="$metric" '
  { r[$2] += $3; r2[$2] += $3 * $3; n[$2]++; x[$1, $2] = $3 }
  END {
    for (v in r) { m = r[v] / n[v]; printf "%s: %s mean %.3f (sd %.3f, %d runs)\n", v, name, m, sqrt((r2[v] - n[v] * m * m) / (n[v] - 1)), n[v] }
    for (i = 1; i <= n["A"]; i++) { d = x[i, "B"] - x[i, "A"]; s += d; s2 += d * d }
    m = s / n["A"]; sd = sqrt((s2 - n["A"] * m * m) / (n["A"] - 1))
    printf "B - A: %.3f (sd %.3f, se %.3f)\n", m, sd, sd / sqrt(n["A"])
  }' "$out"
