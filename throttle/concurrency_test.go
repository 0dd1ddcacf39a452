//go:build integration

package throttle

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/internal/keyspace"
)

// The concurrency tests race 200 goroutines spread over two OS processes on
// the same rules. The parent (TestConcurrency) starts the Redis servers and
// re-executes the test binary twice, running only TestConcurrencyChild, with
// the environment below; each child runs its goroutines behind a barrier kept
// in Redis and prints its result as one JSON line.

const (
	envConcAddrs    = "THROTTLE_CONC_ADDRS"    // comma-separated; its absence skips the child
	envConcCluster  = "THROTTLE_CONC_CLUSTER"  // "1": the addresses are cluster masters
	envConcScenario = "THROTTLE_CONC_SCENARIO" // a key of concScenarios
	envConcRun      = "THROTTLE_CONC_RUN"      // run ID: names the subjects, IDs and barrier
	envConcProc     = "THROTTLE_CONC_PROC"     // this child's index
	envConcProcs    = "THROTTLE_CONC_PROCS"    // how many children meet at the barrier

	concResultPrefix = "THROTTLE-CONC-RESULT "
	concProcs        = 2
	concPerProc      = 100
)

// concScenario is one race. Every request takes the weekly quota (3 per
// 168h) of its recipient and one token of the provider's bucket, whose rate
// (1 an hour) is negligible over the test.
type concScenario struct {
	distinct bool // every goroutine has its own recipient (else all share one)
	twice    bool // every goroutine admits twice with the same ID
	burst    int  // the bucket's burst
	want     int  // task IDs allowed in total
}

var concScenarios = map[string]concScenario{
	"a": {burst: 50, want: 3},
	"b": {distinct: true, burst: 20, want: 20},
	"c": {twice: true, burst: 50, want: 3},
}

const concRate = 1.0 / 3600

func concRules(sc concScenario) (*Quota, *Bucket, error) {
	q, err := NewQuota("weekly", Window{3, 168 * time.Hour})
	if err != nil {
		return nil, nil, err
	}
	b, err := NewBucket("sms", concRate, sc.burst)
	return q, b, err
}

func concProvider(run string) string { return "gw-" + run }

func concRecipient(sc concScenario, run string, proc, g int) string {
	if sc.distinct {
		return fmt.Sprintf("rcpt-%s-p%d-g%d", run, proc, g)
	}
	return "alice-" + run
}

func concID(run string, proc, g int) string { return fmt.Sprintf("%s-p%d-g%d", run, proc, g) }

func concBarrierKey(run string) string { return "conctest:barrier:" + run }

// concRepliedKey is a set of the processes that have had a reply.
func concRepliedKey(run string) string { return "conctest:replied:" + run }

// concResult is what a child reports.
type concResult struct {
	Proc     int
	Allowed  []string // IDs whose (first) admission was allowed
	Denied   int      // IDs whose (first) admission was denied
	Repeated int      // second admissions that were allowed and repeated
	Problems []string // decisions that break the scenario's rules
	Errors   []string // errors returned by the Limiter
	FirstUS  int64    // Redis time of the earliest and latest decision, µs
	LastUS   int64
	SentNS   int64 // local time the first admission was sent, ns
	DoneNS   int64 // local time the last reply came, ns
	StartNS  int64 // local time the barrier opened, ns
}

// TestConcurrencyChild is one racing process; it only runs when
// TestConcurrency re-executes the test binary.
func TestConcurrencyChild(t *testing.T) {
	addrs := os.Getenv(envConcAddrs)
	if addrs == "" {
		t.Skip("run by TestConcurrency in a child process")
	}
	sc, ok := concScenarios[os.Getenv(envConcScenario)]
	if !ok {
		t.Fatalf("unknown scenario %q", os.Getenv(envConcScenario))
	}
	run := os.Getenv(envConcRun)
	proc, err1 := strconv.Atoi(os.Getenv(envConcProc))
	procs, err2 := strconv.Atoi(os.Getenv(envConcProcs))
	if run == "" || err1 != nil || err2 != nil {
		t.Fatalf("bad environment: run %q, proc %v, procs %v", run, err1, err2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()

	// Enough connections that the goroutines race in Redis, not for the pool.
	var rdb redis.UniversalClient
	var pingAll func(context.Context) error
	if os.Getenv(envConcCluster) == "1" {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(addrs, ","), PoolSize: 2 * concPerProc})
		rdb = c
		pingAll = func(ctx context.Context) error {
			return c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error { return n.Ping(ctx).Err() })
		}
	} else {
		c := redis.NewClient(&redis.Options{Addr: addrs, PoolSize: 2 * concPerProc})
		rdb = c
		pingAll = func(ctx context.Context) error { return c.Ping(ctx).Err() }
	}
	defer rdb.Close()
	l, err := New(rdb, Options{})
	if err != nil {
		t.Fatal(err)
	}
	q, b, err := concRules(sc)
	if err != nil {
		t.Fatal(err)
	}

	// Warm up: open the connections and load the functions on every node.
	var wg sync.WaitGroup
	warm := make(chan error, concPerProc)
	for range concPerProc {
		wg.Go(func() { warm <- pingAll(ctx) })
	}
	wg.Wait()
	close(warm)
	for err := range warm {
		if err != nil {
			t.Fatalf("warm-up: %v", err)
		}
	}
	if err := l.loadFunctions(ctx); err != nil {
		t.Fatalf("load functions: %v", err)
	}

	// The goroutines wait on start; start closes once every process has
	// arrived at the barrier. The second half of them also waits until the
	// other processes have had a reply (otherReplied), so that the processes
	// certainly race: without it, a process scheduled a few milliseconds
	// late could find the other one already done.
	start := make(chan struct{})
	replied := concRepliedKey(run)
	var firstReply sync.Once
	otherReplied := make(chan struct{})
	go func() {
		defer close(otherReplied)
		for ctx.Err() == nil {
			n, err := rdb.SCard(ctx, replied).Result()
			if err == nil && n >= int64(procs) {
				return
			}
			time.Sleep(200 * time.Microsecond)
		}
	}()
	var mu sync.Mutex
	res := concResult{Proc: proc}
	note := func(d Decision) {
		us := d.Now.UnixMicro()
		if res.FirstUS == 0 || us < res.FirstUS {
			res.FirstUS = us
		}
		res.LastUS = max(res.LastUS, us)
	}
	for g := range concPerProc {
		wg.Go(func() {
			id := concID(run, proc, g)
			r := Request{ID: id, Takes: []Take{
				{Rule: q, Subject: concRecipient(sc, run, proc, g)},
				{Rule: b, Subject: concProvider(run)},
			}}
			<-start
			if g >= concPerProc/2 {
				<-otherReplied
			}
			sent := time.Now().UnixNano()
			first, err := l.Admit(ctx, r)
			done := time.Now().UnixNano()
			firstReply.Do(func() {
				if err := rdb.SAdd(ctx, replied, proc).Err(); err != nil {
					t.Errorf("mark the first reply: %v", err)
				}
			})
			mu.Lock()
			defer mu.Unlock()
			if res.SentNS == 0 || sent < res.SentNS {
				res.SentNS = sent
			}
			res.DoneNS = max(res.DoneNS, done)
			if err != nil {
				res.Errors = append(res.Errors, fmt.Sprintf("%s: %v", id, err))
				return
			}
			note(first)
			if first.Allowed() {
				res.Allowed = append(res.Allowed, id)
				if first.Outcome == Repeated {
					res.Problems = append(res.Problems, fmt.Sprintf("%s: first admission is repeated: %+v", id, first))
				}
			} else {
				res.Denied++
			}
			if !sc.twice {
				return
			}
			mu.Unlock()
			again, err := l.Admit(ctx, r)
			done = time.Now().UnixNano()
			mu.Lock()
			res.DoneNS = max(res.DoneNS, done)
			if err != nil {
				res.Errors = append(res.Errors, fmt.Sprintf("%s again: %v", id, err))
				return
			}
			note(again)
			switch {
			case first.Allowed() && again.Allowed() && again.Outcome == Repeated:
				res.Repeated++
			case first.Allowed():
				res.Problems = append(res.Problems, fmt.Sprintf("%s: allowed, then %+v; want allowed and repeated", id, again))
			case again.Allowed():
				res.Problems = append(res.Problems, fmt.Sprintf("%s: denied, then allowed: %+v", id, again))
			}
		})
	}

	// The barrier: the last process to arrive picks a start moment a little
	// ahead and hands it to the others, which are blocked on a list; every
	// process (same host, same clock) then sleeps until that moment.
	barrier := concBarrierKey(run)
	n, err := rdb.Incr(ctx, barrier).Result()
	if err != nil {
		t.Fatalf("barrier: %v", err)
	}
	var at time.Time
	if n == int64(procs) {
		at = time.Now().Add(30 * time.Millisecond)
		for range procs - 1 {
			if err := rdb.RPush(ctx, barrier+":go", at.UnixNano()).Err(); err != nil {
				t.Fatalf("barrier: %v", err)
			}
		}
	} else {
		v, err := rdb.BLPop(ctx, 40*time.Second, barrier+":go").Result()
		if err != nil {
			t.Fatalf("barrier: %v", err)
		}
		ns, err := strconv.ParseInt(v[1], 10, 64)
		if err != nil {
			t.Fatalf("barrier: %v", err)
		}
		at = time.Unix(0, ns)
	}
	// Go's timers wake up to a millisecond late: sleep until just before the
	// moment, then spin.
	time.Sleep(time.Until(at) - 3*time.Millisecond)
	for time.Now().Before(at) {
	}
	res.StartNS = time.Now().UnixNano()
	close(start)
	wg.Wait()

	sort.Strings(res.Allowed)
	out, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("\n%s%s\n", concResultPrefix, out)
}

// TestConcurrency races 200 admissions from two processes on a single node
// and on a cluster, and checks that exactly the allowed number pass and that
// Redis holds exactly the allowed tasks afterwards.
func TestConcurrency(t *testing.T) {
	if os.Getenv(envConcAddrs) != "" {
		t.Skip("in a child process")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	scenarios := []string{"a", "b", "c"}
	t.Run("standalone", func(t *testing.T) {
		_, rdb := newOwnServer(t)
		for _, name := range scenarios {
			t.Run(name, func(t *testing.T) { raceScenario(t, exe, rdb, []string{rdb.Options().Addr}, false, name) })
		}
	})
	t.Run("cluster", func(t *testing.T) {
		_, rdb := newCluster(t)
		for _, name := range scenarios {
			t.Run(name, func(t *testing.T) { raceScenario(t, exe, rdb, rdb.Options().Addrs, true, name) })
		}
	})
}

func raceScenario(t *testing.T, exe string, rdb redis.UniversalClient, addrs []string, cluster bool, name string) {
	sc := concScenarios[name]
	run := newRunID(t, name)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	type child struct {
		cmd            *exec.Cmd
		stdout, stderr bytes.Buffer
	}
	children := make([]*child, concProcs)
	for i := range children {
		c := &child{cmd: exec.CommandContext(ctx, exe, "-test.run=^TestConcurrencyChild$", "-test.count=1", "-test.timeout=50s")}
		c.cmd.Env = append(os.Environ(),
			envConcAddrs+"="+strings.Join(addrs, ","),
			envConcCluster+"="+map[bool]string{true: "1", false: "0"}[cluster],
			envConcScenario+"="+name,
			envConcRun+"="+run,
			envConcProc+"="+strconv.Itoa(i),
			envConcProcs+"="+strconv.Itoa(concProcs),
		)
		c.cmd.Stdout, c.cmd.Stderr = &c.stdout, &c.stderr
		if err := c.cmd.Start(); err != nil {
			t.Fatalf("start child %d: %v", i, err)
		}
		children[i] = c
	}
	results := make([]concResult, concProcs)
	for i, c := range children {
		err := c.cmd.Wait()
		if err != nil {
			t.Errorf("child %d: %v\nstdout:\n%s\nstderr:\n%s", i, err, c.stdout.String(), c.stderr.String())
			continue
		}
		found := false
		for _, line := range strings.Split(c.stdout.String(), "\n") {
			if js, ok := strings.CutPrefix(line, concResultPrefix); ok {
				if err := json.Unmarshal([]byte(js), &results[i]); err != nil {
					t.Fatalf("child %d: bad result line %q: %v", i, line, err)
				}
				found = true
			}
		}
		if !found {
			t.Errorf("child %d printed no result:\n%s", i, c.stdout.String())
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	var allowed []string
	denied, repeated := 0, 0
	for _, r := range results {
		allowed = append(allowed, r.Allowed...)
		denied += r.Denied
		repeated += r.Repeated
		for _, e := range r.Errors {
			t.Errorf("child %d: admission error: %s", r.Proc, e)
		}
		for _, p := range r.Problems {
			t.Errorf("child %d: %s", r.Proc, p)
		}
		t.Logf("child %d: %d allowed, %d denied; barrier opened %s, sent from %s, replies within %s; Redis decided from %s over %s",
			r.Proc, len(r.Allowed), r.Denied, time.Unix(0, r.StartNS).Format("15:04:05.000000"), time.Unix(0, r.SentNS).Format("15:04:05.000000"),
			time.Duration(r.DoneNS-r.SentNS), time.UnixMicro(r.FirstUS).Format("15:04:05.000000"),
			time.Duration(r.LastUS-r.FirstUS)*time.Microsecond)
	}
	sort.Strings(allowed)
	if len(allowed) != sc.want || len(slices.Compact(slices.Clone(allowed))) != sc.want {
		t.Errorf("%d admissions allowed (%v), want exactly %d", len(allowed), allowed, sc.want)
	}
	if total := len(allowed) + denied; total != concProcs*concPerProc {
		t.Errorf("%d decisions, want %d", total, concProcs*concPerProc)
	}
	if sc.twice && repeated != len(allowed) {
		t.Errorf("%d second admissions allowed and repeated, want %d (one per allowed ID)", repeated, len(allowed))
	}
	// The processes must really have raced: each sent its first admission
	// before the other had its last reply (Redis may still serve one
	// process's burst before the other's, as they arrive). The child's
	// second half waits for the other's first reply, which makes this
	// certain however the processes are scheduled; the check guards that.
	a, b := results[0], results[1]
	if a.SentNS > b.DoneNS || b.SentNS > a.DoneNS {
		t.Errorf("the processes did not race: one sent its first admission after the other's last reply: [%d, %d] and [%d, %d]",
			a.SentNS, a.DoneNS, b.SentNS, b.DoneNS)
	}

	// Redis holds exactly the allowed tasks.
	bg := context.Background()
	q, bk, _ := concRules(sc)
	provider := keyspace.Tag(DefaultPrefix, concProvider(run))
	if sc.distinct {
		isAllowed := map[string]bool{}
		for _, id := range allowed {
			isAllowed[id] = true
		}
		for p := range concProcs {
			for g := range concPerProc {
				id := concID(run, p, g)
				key := keyspace.Quota(keyspace.Tag(DefaultPrefix, concRecipient(sc, run, p, g)), q.Name())
				members, err := rdb.ZRange(bg, key, 0, -1).Result()
				if err != nil {
					t.Fatalf("ZRANGE %s: %v", key, err)
				}
				want := []string{}
				if isAllowed[id] {
					want = []string{id}
				}
				if !slices.Equal(members, want) {
					t.Errorf("quota of %s's recipient holds %q, want %q", id, members, want)
				}
			}
		}
	} else {
		key := keyspace.Quota(keyspace.Tag(DefaultPrefix, concRecipient(sc, run, 0, 0)), q.Name())
		members, err := rdb.ZRange(bg, key, 0, -1).Result()
		if err != nil {
			t.Fatalf("ZRANGE %s: %v", key, err)
		}
		sort.Strings(members)
		if !slices.Equal(members, allowed) {
			t.Errorf("quota set holds %q, want exactly the allowed %q", members, allowed)
		}
	}
	if ledger := ledgerIDs(t, rdb, provider, bk.Name()); !slices.Equal(ledger, allowed) {
		t.Errorf("bucket ledger holds %q, want exactly the allowed %q", ledger, allowed)
	}
	tok := tokens(t, rdb, keyspace.Bucket(provider, bk.Name()), bk.Rate(), sc.burst)
	// Between the first and the last take the bucket refills by at most a
	// few seconds at 1 an hour, far below 0.01.
	if want := float64(sc.burst - len(allowed)); tok < want || tok > want+0.01 {
		t.Errorf("bucket tokens = %v, want %v (burst %d - %d allowed)", tok, want, sc.burst, len(allowed))
	}
}

func newRunID(t testing.TB, name string) string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return name + "-" + hex.EncodeToString(b[:])
}
