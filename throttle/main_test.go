package throttle

import (
	"context"
	"fmt"
	"maps"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/internal/keyspace"
	"github.com/notify-throttle/throttler/internal/redistest"
)

// shared is the redis-server the package's tests share, started by TestMain:
// each test has a database of its own (newStandalone), and the examples (which
// get no *testing.T) run on database 0, like the examples of a database
// driver. Tests of what is server-wide start their own (newOwnServer).
//
// Most tests run one at a time (no t.Parallel): they sequence operations
// within slots and windows of tens to hundreds of milliseconds, and side by
// side on a machine with two busy cores the stalls broke several of them.
// TestDifferential's walks and TestLedgerFollowsSlotsInFlight, whose
// outcomes do not depend on how fast they go, run in parallel after them.
var shared *redistest.Shared

func TestMain(m *testing.M) { os.Exit(redistest.RunShared(m, &shared)) }

// exampleClient returns a client on the examples' server, flushed.
func exampleClient() *redis.Client {
	rdb := redis.NewClient(&redis.Options{Addr: shared.Addr})
	rdb.FlushDB(context.Background())
	return rdb
}

// encodeSubject is the subject as its keys hold it.
func encodeSubject(s string) string { return keyspace.EncodeSubject(s) }

// zmembers returns a sorted set's members, sorted.
func zmembers(t testing.TB, rdb redis.UniversalClient, key string) []string {
	t.Helper()
	ids, err := rdb.ZRange(context.Background(), key, 0, -1).Result()
	if err != nil {
		t.Fatalf("ZRANGE %s: %v", key, err)
	}
	sort.Strings(ids)
	return ids
}

// tokens returns what a bucket (key: its state key) could hand out now,
// read from its calendar: burst less the slots busy from now to burst/rate
// ahead.
func tokens(t testing.TB, rdb redis.UniversalClient, key string, rate float64, burst int) float64 {
	t.Helper()
	ctx := context.Background()
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatalf("TIME: %v", err)
	}
	from := float64(now.UnixMicro())
	to := from + float64(burst)*1e6/rate
	spans, err := rdb.ZRangeByScoreWithScores(ctx, key+":slots", &redis.ZRangeBy{Min: fmt.Sprintf("(%d", now.UnixMicro()), Max: "+inf"}).Result()
	if err != nil {
		t.Fatalf("ZRANGEBYSCORE %s:slots: %v", key, err)
	}
	busy := 0.0
	for _, z := range spans {
		a, err := strconv.ParseFloat(z.Member.(string), 64)
		if err != nil {
			t.Fatalf("%s:slots member %q: %v", key, z.Member, err)
		}
		busy += max(0, min(z.Score, to)-max(a, from))
	}
	return float64(burst) - busy*rate/1e6
}

var cmdCalls = regexp.MustCompile(`(?m)^cmdstat_([a-z_|]+):calls=(\d+)`)

// commandCalls returns a node's INFO commandstats calls by command ("evalsha",
// "function|load", and the commands scripts run: "zscore", "exists", ...).
// The counts are the whole server's: on the shared server only a difference
// taken within one test that does not run in parallel (t.Parallel) is the
// test's own.
func commandCalls(t testing.TB, c *redis.Client) map[string]int {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatalf("INFO commandstats: %v", err)
	}
	out := map[string]int{}
	for _, m := range cmdCalls.FindAllStringSubmatch(info, -1) {
		n, _ := strconv.Atoi(m[2])
		out[m[1]] = n
	}
	return out
}

// ledger returns the entries of the ledger of bucket rule on the subject of
// tag, which live in its calendar (lua/rules.lua): task ID -> the start
// of its slot (µs).
func ledger(t testing.TB, rdb redis.UniversalClient, tag, rule string) map[string]int64 {
	t.Helper()
	zs, err := rdb.ZRangeArgsWithScores(context.Background(), redis.ZRangeArgs{Key: keyspace.Slots(tag, rule), ByScore: true, Start: "-inf", Stop: "(0"}).Result()
	if err != nil {
		t.Fatalf("ledger of %s: %v", rule, err)
	}
	out := map[string]int64{}
	for _, z := range zs {
		out[strings.TrimPrefix(z.Member.(string), keyspace.LedgerEntry(""))] = -int64(z.Score)
	}
	return out
}

// ledgerIDs returns the task IDs of a bucket's ledger, sorted.
func ledgerIDs(t testing.TB, rdb redis.UniversalClient, tag, rule string) []string {
	t.Helper()
	return slices.Sorted(maps.Keys(ledger(t, rdb, tag, rule)))
}
