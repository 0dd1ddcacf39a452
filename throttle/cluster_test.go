//go:build integration

package throttle

import (
	"context"
	"fmt"
	"maps"
	"regexp"
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

// TestClusterPath exercises the cluster plan on a real 3-master cluster: a
// recipient's quota and a provider's bucket on different masters, admitted
// by separate script calls, with release as compensation. One cluster serves
// every subtest; each starts from an empty cluster.
func TestClusterPath(t *testing.T) {
	l, rdb := newCluster(t)
	bg := context.Background()

	// alice's keys and gw's keys are on different masters, so every request
	// taking both is a two-group plan on two nodes.
	const alice = "alice"
	gw := subjectOnOtherMaster(t, rdb, "gw", alice)
	bob := subjectOnOtherMaster(t, rdb, "bob", alice, gw)
	tag := func(s string) string { return keyspace.Tag(DefaultPrefix, s) }

	t.Run("recipient and provider keys are in different slots", func(t *testing.T) {
		flushCluster(t, rdb)
		weekly := mustQuota(t, "weekly", Window{3, 168 * time.Hour})
		sms := mustBucket(t, "sms", 1.0/3600, 5)
		qk := keyspace.Quota(tag(alice), "weekly")
		bk, lk := keyspace.Bucket(tag(gw), "sms"), keyspace.Slots(tag(gw), "sms")

		qs, bs, ls := keySlot(t, rdb, qk), keySlot(t, rdb, bk), keySlot(t, rdb, lk)
		if qs == bs {
			t.Fatalf("quota %s and bucket %s share slot %d", qk, bk, qs)
		}
		if bs != ls {
			t.Errorf("bucket %s (slot %d) and its calendar %s (slot %d) must share a slot", bk, bs, lk, ls)
		}
		// The slot is the hash tag's: the encoded subject alone.
		if s := keySlot(t, rdb, encodeSubject(alice)); s != qs {
			t.Errorf("slot of %s = %d, want %d, the slot of its hash tag", qk, qs, s)
		}
		if s := keySlot(t, rdb, encodeSubject(gw)); s != bs {
			t.Errorf("slot of %s = %d, want %d, the slot of its hash tag", bk, bs, s)
		}

		d := mustAdmit(t, l, Request{ID: "m1", Takes: []Take{{Rule: weekly, Subject: alice}, {Rule: sms, Subject: gw}}})
		if !d.Allowed() || d.Outcome == Repeated || d.Remaining != 2 {
			t.Fatalf("%+v, want allowed with 2 remaining (the quota's)", d)
		}
		// Each key was written on its own master.
		for _, k := range []string{qk, keyspace.Slots(tag(gw), "sms"), lk} {
			node := masterFor(t, rdb, k)
			if n, err := node.Exists(bg, k).Result(); err != nil || n != 1 {
				t.Errorf("%s missing on its master %s: %d, %v", k, node.Options().Addr, n, err)
			}
		}
		if masterFor(t, rdb, qk).Options().Addr == masterFor(t, rdb, bk).Options().Addr {
			t.Errorf("quota and bucket on the same master")
		}
		if ids := zmembers(t, rdb, qk); !slices.Equal(ids, []string{"m1"}) {
			t.Errorf("quota holds %q, want [m1]", ids)
		}
		if ids := ledgerIDs(t, rdb, tag(gw), "sms"); !slices.Equal(ids, []string{"m1"}) {
			t.Errorf("ledger holds %q, want [m1]", ids)
		}
		if tok := tokens(t, rdb, bk, 1.0/3600, 5); tok < 4 || tok > 4.01 {
			t.Errorf("bucket tokens %v, want 4", tok)
		}
	})

	t.Run("bucket denial compensates the quota", func(t *testing.T) {
		flushCluster(t, rdb)
		weekly := mustQuota(t, "weekly", Window{3, 168 * time.Hour})
		sms := mustBucket(t, "sms", 1.0/3600, 1)
		mustAdmit(t, l, Request{ID: "drain", Takes: []Take{{Rule: sms, Subject: gw}}})
		// bob already has an entry, so his set outlives the denied admission.
		mustAdmit(t, l, Request{ID: "b0", Takes: []Take{{Rule: weekly, Subject: bob}}})

		for _, who := range []string{alice, bob} {
			before := snapshot(t, rdb)
			d := mustAdmit(t, l, Request{ID: "x-" + who, Takes: []Take{{Rule: weekly, Subject: who}, {Rule: sms, Subject: gw}}})
			if d.Allowed() || d.TakeIndex != 1 || d.Rule != Rule(sms) || d.Subject != gw {
				t.Fatalf("%s: %+v, want denied by the bucket (take 1)", who, d)
			}
			if d.Delay < 59*time.Minute || d.Delay > time.Hour {
				t.Errorf("%s: delay %s, want about 1h (a token at 1 an hour)", who, d.Delay)
			}
			if diff := diffMaps(before, snapshot(t, rdb)); diff != "" {
				t.Errorf("%s: a denied admission changed Redis:\n%s", who, diff)
			}
		}
		if n, _ := rdb.Exists(bg, keyspace.Quota(tag(alice), "weekly")).Result(); n != 0 {
			t.Errorf("alice's quota key exists after a denied admission")
		}
		if ids := zmembers(t, rdb, keyspace.Quota(tag(bob), "weekly")); !slices.Equal(ids, []string{"b0"}) {
			t.Errorf("bob's quota holds %q, want [b0]", ids)
		}
	})

	t.Run("bucket denial does not extend the quota's TTL", func(t *testing.T) {
		flushCluster(t, rdb)
		weekly := mustQuota(t, "weekly", Window{3, 168 * time.Hour})
		sms := mustBucket(t, "sms", 1.0/3600, 1)
		mustAdmit(t, l, Request{ID: "drain", Takes: []Take{{Rule: sms, Subject: gw}}})
		mustAdmit(t, l, Request{ID: "b0", Takes: []Take{{Rule: weekly, Subject: bob}}})
		time.Sleep(50 * time.Millisecond) // time under test: bob's set now expires 50ms before a fresh write's would
		beforeTTL := pttls(t, rdb)
		if d := mustAdmit(t, l, Request{ID: "x", Takes: []Take{{Rule: weekly, Subject: bob}, {Rule: sms, Subject: gw}}}); d.Allowed() {
			t.Fatalf("%+v, want denied by the bucket", d)
		}
		assertTTLsNotExtended(t, beforeTTL, pttls(t, rdb))
	})

	t.Run("bucket denial leaves no trace of other compensated takes", func(t *testing.T) {
		flushCluster(t, rdb)
		daily := mustQuota(t, "daily", Window{2, 24 * time.Hour})
		sms := mustBucket(t, "sms", 1.0/3600, 3)
		gw2 := subjectOnOtherMaster(t, rdb, "gw2", gw)
		push := mustBucket(t, "push", 1.0/3600, 1)
		mustAdmit(t, l, Request{ID: "drain", Takes: []Take{{Rule: push, Subject: gw2}}})
		before, beforeTTL := snapshot(t, rdb), pttls(t, rdb)
		// alice's quota (first group) and the full sms bucket (second)
		// pass, the drained push bucket (third) denies.
		d := mustAdmit(t, l, Request{ID: "x", Takes: []Take{{Rule: daily, Subject: alice}, {Rule: sms, Subject: gw}, {Rule: push, Subject: gw2}}})
		if d.Allowed() || d.TakeIndex != 2 {
			t.Fatalf("%+v, want denied by push (take 2)", d)
		}
		after := snapshot(t, rdb)
		// The compensated take leaves its calendar's marks of life (scored
		// 0, expiring with it) and nothing else: its burst and no ledger
		// entry.
		sk := keyspace.Bucket(tag(gw), "sms")
		if tok := tokens(t, rdb, sk, 1.0/3600, 3); tok != 3 {
			t.Errorf("sms tokens %v, want its burst of 3", tok)
		}
		cal := keyspace.Slots(tag(gw), "sms")
		if n := rdb.ZCard(ctx, cal).Val() - rdb.ZCount(ctx, cal, "0", "0").Val(); n != 0 {
			t.Errorf("sms calendar holds %d members besides its marks after a compensated take", n)
		}
		delete(after, cal)
		if diff := diffMaps(before, after); diff != "" {
			t.Errorf("a denied admission changed Redis:\n%s", diff)
		}
		assertTTLsNotExtended(t, beforeTTL, pttls(t, rdb))
	})

	t.Run("quota denial never touches the bucket", func(t *testing.T) {
		flushCluster(t, rdb)
		daily := mustQuota(t, "daily", Window{1, 24 * time.Hour})
		sms := mustBucket(t, "sms", 1.0/3600, 5)
		r := func(id string) Request {
			return Request{ID: id, Takes: []Take{{Rule: sms, Subject: gw}, {Rule: daily, Subject: alice}}}
		}
		if d := mustAdmit(t, l, r("a1")); !d.Allowed() {
			t.Fatalf("a1: %+v", d)
		}
		bucketNode := masterFor(t, rdb, keyspace.Bucket(tag(gw), "sms"))
		quotaNode := masterFor(t, rdb, keyspace.Quota(tag(alice), "daily"))
		before, beforeTTL := snapshot(t, rdb), pttls(t, rdb)
		bucketEvals, quotaEvals := evalCalls(t, bucketNode), evalCalls(t, quotaNode)

		d := mustAdmit(t, l, r("a2"))
		if d.Allowed() || d.TakeIndex != 1 || d.Limit != "1 per 24h" || d.Subject != alice {
			t.Fatalf("a2: %+v, want denied by the quota (take 1, 1 per 24h)", d)
		}
		if n := evalCalls(t, bucketNode) - bucketEvals; n != 0 {
			t.Errorf("%d script calls reached the bucket's master, want none", n)
		}
		if n := evalCalls(t, quotaNode) - quotaEvals; n != 1 {
			t.Errorf("%d script calls reached the quota's master, want 1", n)
		}
		if diff := diffMaps(before, snapshot(t, rdb)); diff != "" {
			t.Errorf("a denied admission changed Redis:\n%s", diff)
		}
		assertTTLsNotExtended(t, beforeTTL, pttls(t, rdb))
	})

	t.Run("re-admission is idempotent", func(t *testing.T) {
		flushCluster(t, rdb)
		weekly := mustQuota(t, "weekly", Window{3, 168 * time.Hour})
		sms := mustBucket(t, "sms", 1.0/3600, 5)
		now := redisNow(t, l)
		cal := mustCalendarWindow(t, 2, now.Add(-time.Hour), now.Add(time.Hour))
		r := Request{ID: "job-1", Takes: []Take{{Rule: weekly, Subject: alice}, {Rule: sms, Subject: gw, Cost: 2}, {Rule: cal, Subject: alice}}}
		first := mustAdmit(t, l, r)
		if !first.Allowed() || first.Outcome == Repeated {
			t.Fatalf("first: %+v", first)
		}
		before, beforeTTL := snapshot(t, rdb), pttls(t, rdb)
		for i := range 2 {
			again := mustAdmit(t, l, r)
			if !again.Allowed() || again.Outcome != Repeated || again.Delay != 0 || again.Remaining != first.Remaining {
				t.Errorf("again %d: %+v, want allowed, repeated, no delay, remaining %d", i+1, again, first.Remaining)
			}
		}
		if diff := diffMaps(before, snapshot(t, rdb)); diff != "" {
			t.Errorf("a repeated admission changed Redis:\n%s", diff)
		}
		assertTTLsNotExtended(t, beforeTTL, pttls(t, rdb))
		if tok := tokens(t, rdb, keyspace.Bucket(tag(gw), "sms"), 1.0/3600, 5); tok < 3 || tok > 3.01 {
			t.Errorf("bucket tokens %v, want 3: the repeats must not take again", tok)
		}
		// Another ID is a new task.
		if d := mustAdmit(t, l, Request{ID: "job-2", Takes: r.Takes}); !d.Allowed() || d.Outcome == Repeated {
			t.Errorf("job-2: %+v, want allowed, not repeated", d)
		}
	})

	t.Run("release gives back both", func(t *testing.T) {
		flushCluster(t, rdb)
		weekly := mustQuota(t, "weekly", Window{1, 168 * time.Hour})
		sms := mustBucket(t, "sms", 1.0/3600, 2)
		r := Request{ID: "job-1", Takes: []Take{{Rule: weekly, Subject: alice}, {Rule: sms, Subject: gw, Cost: 2}}}
		mustAdmit(t, l, r)
		if d := mustAdmit(t, l, Request{ID: "job-2", Takes: r.Takes}); d.Allowed() {
			t.Fatalf("job-2 admitted while job-1 holds both takes")
		}
		for i, want := range []int{2, 0} {
			if n, err := l.Release(bg, r); n != want || err != nil {
				t.Fatalf("release %d: %d, %v; want %d", i+1, n, err, want)
			}
		}
		if ids := zmembers(t, rdb, keyspace.Quota(tag(alice), "weekly")); len(ids) != 0 {
			t.Errorf("quota still holds %q", ids)
		}
		if ids := ledgerIDs(t, rdb, tag(gw), "sms"); len(ids) != 0 {
			t.Errorf("ledger still holds %q", ids)
		}
		if tok := tokens(t, rdb, keyspace.Bucket(tag(gw), "sms"), 1.0/3600, 2); tok != 2 {
			t.Errorf("bucket tokens %v after release, want its burst of 2", tok)
		}
		if d := mustAdmit(t, l, Request{ID: "job-2", Takes: r.Takes}); !d.Allowed() || d.Outcome == Repeated {
			t.Errorf("job-2 after job-1 was released: %+v, want allowed", d)
		}
	})

	t.Run("requests one after another leave no trace of the denied ones", func(t *testing.T) {
		flushCluster(t, rdb)
		weekly := mustQuota(t, "weekly", Window{1, 168 * time.Hour})
		sms := mustBucket(t, "sms", 1.0/3600, 4)
		// A second provider, drained below, with a bucket on its own master.
		gw2 := subjectOnOtherMaster(t, rdb, "gw2", gw)
		push := mustBucket(t, "push", 1.0/3600, 1)
		mustAdmit(t, l, Request{ID: "drain", Takes: []Take{{Rule: push, Subject: gw2}}})
		carol, dave, erin := "carol", "dave", "erin"
		req := func(id, who string, extra ...Take) Request {
			return Request{ID: id, Takes: append([]Take{{Rule: weekly, Subject: who}, {Rule: sms, Subject: gw}}, extra...)}
		}
		rs := []Request{
			req("r1", alice),
			req("r2-denied", alice), // by alice's quota (r1 has it)
			req("r3", bob),
			req("r4", carol),
			req("r6-denied", erin, Take{Rule: push, Subject: gw2}), // by the drained push bucket, after taking sms
			req("r5", dave), // sms's last token: r6 gave back the one it took
		}
		want := []bool{true, false, true, true, false, true}
		before := snapshot(t, rdb)
		for i, r := range rs {
			if d := mustAdmit(t, l, r); d.Allowed() != want[i] {
				t.Errorf("%s: allowed %v, want %v (%+v)", r.ID, d.Allowed(), want[i], d)
			}
		}
		after := snapshot(t, rdb)

		// The quota keys of the allowed, nothing of the denied anywhere.
		wantQuota := map[string][]string{alice: {"r1"}, bob: {"r3"}, carol: {"r4"}, dave: {"r5"}}
		for _, who := range []string{alice, bob, carol, dave, erin} {
			if ids := zmembers(t, rdb, keyspace.Quota(tag(who), "weekly")); !slices.Equal(ids, wantQuota[who]) {
				t.Errorf("%s's quota holds %q, want %q", who, ids, wantQuota[who])
			}
		}
		if ids := ledgerIDs(t, rdb, tag(gw), "sms"); !slices.Equal(ids, []string{"r1", "r3", "r4", "r5"}) {
			t.Errorf("sms ledger holds %q, want [r1 r3 r4 r5]", ids)
		}
		if tok := tokens(t, rdb, keyspace.Bucket(tag(gw), "sms"), 1.0/3600, 4); tok > 0.01 {
			t.Errorf("sms tokens %v, want 0 (r6's token given back, and taken by r5)", tok)
		}
		// The push bucket denied r6, so it is unchanged.
		for _, k := range []string{keyspace.Slots(tag(gw2), "push")} {
			if before[k] != after[k] {
				t.Errorf("%s changed by a denied request", k)
			}
		}
		wantKeys := []string{
			keyspace.Quota(tag(alice), "weekly"), keyspace.Quota(tag(bob), "weekly"), keyspace.Quota(tag(carol), "weekly"), keyspace.Quota(tag(dave), "weekly"),
			keyspace.Slots(tag(gw), "sms"), keyspace.Slots(tag(gw2), "push"),
		}
		sort.Strings(wantKeys)
		if keys := slices.Sorted(maps.Keys(after)); !slices.Equal(keys, wantKeys) {
			t.Errorf("keys after the requests:\n%q\nwant\n%q", keys, wantKeys)
		}
		for k, v := range after {
			for _, id := range []string{"r2-denied", "r6-denied"} {
				if strings.Contains(v, id) {
					t.Errorf("%s holds denied task %s", k, id)
				}
			}
		}
	})

	t.Run("denied re-admission keeps the earlier admission", func(t *testing.T) {
		flushCluster(t, rdb)
		weekly := mustQuota(t, "weekly", Window{1, 168 * time.Hour})
		sms := mustBucket(t, "sms", 1.0/3600, 1)
		// job-1 was admitted and delivered with alice's quota alone.
		mustAdmit(t, l, Request{ID: "job-1", Takes: []Take{{Rule: weekly, Subject: alice}}})
		mustAdmit(t, l, Request{ID: "drain", Takes: []Take{{Rule: sms, Subject: gw}}})
		before := snapshot(t, rdb)
		// The same task again, now also through an empty bucket: the quota
		// take already holds it (repeated), the bucket denies.
		d := mustAdmit(t, l, Request{ID: "job-1", Takes: []Take{{Rule: weekly, Subject: alice}, {Rule: sms, Subject: gw}}})
		if d.Allowed() {
			t.Fatalf("%+v, want denied by the bucket", d)
		}
		if diff := diffMaps(before, snapshot(t, rdb)); diff != "" {
			t.Errorf("a denied admission changed Redis:\n%s", diff)
		}
		if ids := zmembers(t, rdb, keyspace.Quota(tag(alice), "weekly")); !slices.Equal(ids, []string{"job-1"}) {
			t.Errorf("alice's quota holds %q, want [job-1]: the denial undid job-1's earlier admission", ids)
		}
		if d := mustAdmit(t, l, Request{ID: "job-2", Takes: []Take{{Rule: weekly, Subject: alice}}}); d.Allowed() {
			t.Errorf("job-2 allowed: alice got 2 messages under a quota of 1 per 168h")
		}
	})

	t.Run("redelivery after the ledger forgot keeps the quota entry", func(t *testing.T) {
		flushCluster(t, rdb)
		weekly := mustQuota(t, "weekly", Window{1, 168 * time.Hour})
		sms := mustBucket(t, "sms", 2, 1) // slots of 500ms
		r := Request{ID: "job-1", Takes: []Take{{Rule: weekly, Subject: alice}, {Rule: sms, Subject: gw}}}
		if d := mustAdmit(t, l, r); !d.Allowed() {
			t.Fatalf("%+v", d)
		}
		time.Sleep(600 * time.Millisecond) // time under test: job-1's slot ends, the ledger holds it no more
		// Others take the bucket's next slots, 1.5s of them.
		for i := range 3 {
			if d, err := l.Admit(bg, Request{ID: fmt.Sprint("drain", i), Takes: []Take{{Rule: sms, Subject: gw}}, MaxWait: 2 * time.Second}); err != nil || !d.Allowed() {
				t.Fatalf("drain %d: %+v, %v", i, d, err)
			}
		}
		// Redelivered: the quota still holds job-1, the bucket no longer
		// holds it and its next slot is a second or more away: denied.
		if d := mustAdmit(t, l, r); d.Allowed() {
			t.Fatalf("redelivery: %+v, want denied by the empty bucket", d)
		}
		if ids := zmembers(t, rdb, keyspace.Quota(tag(alice), "weekly")); !slices.Equal(ids, []string{"job-1"}) {
			t.Errorf("alice's quota holds %q, want [job-1]: the denied redelivery removed the entry of a delivered task", ids)
		}
	})

	t.Run("nasty subjects keep one slot per subject", func(t *testing.T) {
		flushCluster(t, rdb)
		q := mustQuota(t, "weekly", Window{3, 168 * time.Hour})
		b := mustBucket(t, "sms", 1.0/3600, 5)
		now := redisNow(t, l)
		c := mustCalendarWindow(t, 2, now.Add(-time.Hour), now.Add(time.Hour))
		for i, s := range nastySubjects() {
			// Three rules of one subject: one group, one script call, which
			// fails with CROSSSLOT unless the keys share a slot.
			d, err := l.Admit(bg, Request{ID: fmt.Sprint("n", i), Takes: []Take{{Rule: q, Subject: s}, {Rule: b, Subject: s}, {Rule: c, Subject: s}}})
			if err != nil || !d.Allowed() {
				t.Errorf("subject %q: %+v, %v", s, d, err)
				continue
			}
			tg := tag(s)
			want := keySlot(t, rdb, encodeSubject(s))
			for _, k := range []string{keyspace.Quota(tg, "weekly"), keyspace.Bucket(tg, "sms"), keyspace.Slots(tg, "sms"), keyspace.Calendar(tg, "cal")} {
				if got := keySlot(t, rdb, k); got != want {
					t.Errorf("subject %q: %s in slot %d, want %d", s, k, got, want)
				}
			}
		}
	})

	t.Run("a request of MaxTakes takes is compensated take by take", func(t *testing.T) {
		flushCluster(t, rdb)
		// MaxTakes-1 quotas of alice and a drained bucket of gw, which
		// denies: the quota group was admitted first and must be undone,
		// but for the one quota the task already held, which stays.
		takes := make([]Take, 0, MaxTakes)
		for i := range MaxTakes - 1 {
			takes = append(takes, Take{Rule: mustQuota(t, fmt.Sprint("q", i), Window{1, 168 * time.Hour}), Subject: alice})
		}
		sms := mustBucket(t, "sms", 1.0/3600, 1)
		mustAdmit(t, l, Request{ID: "drain", Takes: []Take{{Rule: sms, Subject: gw}}})
		held := MaxTakes - 2 // the last quota: the highest bit of the group's fresh takes
		mustAdmit(t, l, Request{ID: "job-1", Takes: takes[held : held+1]})
		before := snapshot(t, rdb)
		d := mustAdmit(t, l, Request{ID: "job-1", Takes: append(takes, Take{Rule: sms, Subject: gw})})
		if d.Allowed() || d.TakeIndex != MaxTakes-1 {
			t.Fatalf("%+v, want denied by the bucket (take %d)", d, MaxTakes-1)
		}
		if diff := diffMaps(before, snapshot(t, rdb)); diff != "" {
			t.Errorf("a denied admission changed Redis:\n%s", diff)
		}
		if ids := zmembers(t, rdb, keyspace.Quota(tag(alice), fmt.Sprint("q", held))); !slices.Equal(ids, []string{"job-1"}) {
			t.Errorf("q%d holds %q, want [job-1]", held, ids)
		}
	})

	t.Run("same outcomes as a single node", func(t *testing.T) {
		flushCluster(t, rdb)
		sl, _ := newStandalone(t)
		q := mustQuota(t, "mkt", Window{2, 24 * time.Hour}, Window{3, 168 * time.Hour})
		b := mustBucket(t, "sms", 1.0/3600, 4)
		b2 := mustBucket(t, "push", 1.0/3600, 2)
		api := mustQuota(t, "api", Window{2, 168 * time.Hour})
		qt := func(who string) Take { return Take{Rule: q, Subject: who} }
		bt := Take{Rule: b, Subject: gw}
		type step struct {
			id      string
			takes   []Take
			release bool
			allowed bool
			// repeated is checked for allowed steps.
			repeated bool
		}
		steps := []step{
			{id: "a1", takes: []Take{qt(alice), bt}, allowed: true},
			{id: "a2", takes: []Take{qt(alice), bt}, allowed: true},
			{id: "a3", takes: []Take{qt(alice), bt}, allowed: false}, // 2 per 24h
			{id: "a1", takes: []Take{qt(alice), bt}, allowed: true, repeated: true},
			{id: "b1", takes: []Take{qt(bob), {Rule: b, Subject: gw, Cost: 2}}, allowed: true}, // the bucket is now empty
			{id: "c1", takes: []Take{qt("carol"), bt}, allowed: false},
			// a2 gives back its quota entry and its slot: c1 takes the slot.
			{id: "a2", takes: []Take{qt(alice), bt}, release: true},
			{id: "c1", takes: []Take{qt("carol"), bt}, allowed: true},
			// b1 gives back its two slots: c2 and a3 take them.
			{id: "b1", takes: []Take{qt(bob), {Rule: b, Subject: gw, Cost: 2}}, release: true},
			{id: "c1", takes: []Take{qt("carol"), bt}, allowed: true, repeated: true},
			{id: "c2", takes: []Take{qt("carl"), bt}, allowed: true},
			{id: "a3", takes: []Take{qt(alice), bt}, allowed: true}, // a2's quota entry, b1's slot
			{id: "a3", takes: []Take{qt(alice)}, allowed: true, repeated: true},
			{id: "a4", takes: []Take{qt(alice)}, allowed: false},
			{id: "d1", takes: []Take{{Rule: api, Subject: alice}, qt("dave"), {Rule: b2, Subject: bob}}, allowed: true},
			{id: "d2", takes: []Take{{Rule: api, Subject: alice}, qt("dave"), {Rule: b2, Subject: bob}}, allowed: true},
			{id: "d3", takes: []Take{{Rule: api, Subject: alice}, qt("erin")}, allowed: false}, // alice's api quota full
			{id: "d3", takes: []Take{qt("erin"), {Rule: b2, Subject: bob}}, allowed: false},    // push bucket empty
			{id: "d2", takes: []Take{{Rule: api, Subject: alice}, qt("dave"), {Rule: b2, Subject: bob}}, release: true},
			{id: "d3", takes: []Take{qt("erin"), {Rule: b2, Subject: bob}}, allowed: true},
			// A task admitted through its quota alone, then again with an
			// empty bucket: denied, and its quota entry must stay.
			{id: "e1", takes: []Take{qt("frank")}, allowed: true},
			{id: "e1", takes: []Take{qt("frank"), {Rule: b2, Subject: bob}}, allowed: false},
			{id: "e2", takes: []Take{qt("frank")}, allowed: true},
			{id: "e3", takes: []Take{qt("frank")}, allowed: false}, // e1 and e2: 2 per 24h
		}
		for _, backend := range []struct {
			name string
			l    *Limiter
		}{{"standalone", sl}, {"cluster", l}} {
			var got []string
			for i, s := range steps {
				r := Request{ID: s.id, Takes: s.takes}
				if s.release {
					if _, err := backend.l.Release(bg, r); err != nil {
						t.Fatalf("%s step %d: release %s: %v", backend.name, i+1, s.id, err)
					}
					continue
				}
				d := mustAdmit(t, backend.l, r)
				if d.Allowed() != s.allowed || (d.Allowed() && (d.Outcome == Repeated) != s.repeated) {
					got = append(got, fmt.Sprintf("step %d (%s): allowed %v repeated %v, want allowed %v repeated %v",
						i+1, s.id, d.Allowed(), d.Outcome == Repeated, s.allowed, s.repeated))
				}
			}
			if len(got) > 0 {
				t.Errorf("%s:\n%s", backend.name, strings.Join(got, "\n"))
			}
		}
	})
}

// subjectOnOtherMaster returns a subject base-N whose keys live on none of
// the masters of the given subjects.
func subjectOnOtherMaster(t *testing.T, rdb *redis.ClusterClient, base string, others ...string) string {
	t.Helper()
	taken := map[string]bool{}
	for _, s := range others {
		taken[masterFor(t, rdb, keyspace.Tag(DefaultPrefix, s)).Options().Addr] = true
	}
	for i := range 1000 {
		s := fmt.Sprint(base, "-", i)
		if !taken[masterFor(t, rdb, keyspace.Tag(DefaultPrefix, s)).Options().Addr] {
			return s
		}
	}
	t.Fatalf("no subject on a master other than those of %q", others)
	return ""
}

func masterFor(t testing.TB, rdb *redis.ClusterClient, key string) *redis.Client {
	t.Helper()
	c, err := rdb.MasterForKey(context.Background(), key)
	if err != nil {
		t.Fatalf("master for %s: %v", key, err)
	}
	return c
}

// keySlot asks the cluster (CLUSTER KEYSLOT) for a key's slot.
func keySlot(t testing.TB, rdb *redis.ClusterClient, key string) int64 {
	t.Helper()
	s, err := rdb.ClusterKeySlot(context.Background(), key).Result()
	if err != nil {
		t.Fatalf("CLUSTER KEYSLOT %q: %v", key, err)
	}
	return s
}

func flushCluster(t testing.TB, rdb *redis.ClusterClient) {
	t.Helper()
	err := rdb.ForEachMaster(context.Background(), func(ctx context.Context, c *redis.Client) error {
		return c.FlushAll(ctx).Err()
	})
	if err != nil {
		t.Fatalf("flush: %v", err)
	}
}

// pttls returns every key's PTTL.
func pttls(t testing.TB, rdb *redis.ClusterClient) map[string]time.Duration {
	t.Helper()
	out := map[string]time.Duration{}
	var mu sync.Mutex
	err := rdb.ForEachMaster(context.Background(), func(ctx context.Context, c *redis.Client) error {
		keys, err := c.Keys(ctx, "*").Result()
		if err != nil {
			return err
		}
		for _, k := range keys {
			d, err := c.PTTL(ctx, k).Result()
			if err != nil {
				return err
			}
			mu.Lock()
			out[k] = d
			mu.Unlock()
		}
		return nil
	})
	if err != nil {
		t.Fatalf("pttls: %v", err)
	}
	return out
}

// assertTTLsNotExtended fails for a key whose TTL grew between the two
// readings (time only shortens a TTL nobody touched).
func assertTTLsNotExtended(t *testing.T, before, after map[string]time.Duration) {
	t.Helper()
	for k, b := range before {
		if a, ok := after[k]; ok && a > b+time.Millisecond {
			t.Errorf("%s: TTL extended from %s to %s", k, b, a)
		}
	}
}

var evalStat = regexp.MustCompile(`(?m)^cmdstat_(?:eval|evalsha|fcall):calls=(\d+)`)

// evalCalls returns how many script calls (EVAL, EVALSHA, FCALL) a node has
// served.
func evalCalls(t testing.TB, c *redis.Client) int {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatalf("INFO commandstats: %v", err)
	}
	n := 0
	for _, m := range evalStat.FindAllStringSubmatch(info, -1) {
		k, _ := strconv.Atoi(m[1])
		n += k
	}
	return n
}

// diffMaps describes how two snapshots differ, "" if they do not.
func diffMaps(before, after map[string]string) string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(before)) {
		a, ok := after[k]
		switch {
		case !ok:
			out = append(out, "removed "+k)
		case a != before[k]:
			out = append(out, "changed "+k)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(after)) {
		if _, ok := before[k]; !ok {
			out = append(out, "added "+k)
		}
	}
	return strings.Join(out, "\n")
}

// TestClusterReservedSendKeepsQuota: on a cluster the recipient's quota
// group is admitted before the provider's bucket group reserves a token up
// to MaxWait ahead. The quota entry must count from the moment the message
// goes (the reserved one), not from the quota node's earlier now, or the
// recipient's next messages go early: here a quota of 2 per 1s, a bucket of
// 4/s that other traffic (x1, x2) makes job 2 reserve 750ms ahead; job 4
// would be admitted when job 2's early stamp left, 500ms after job 2's send
// (3 sends in 500ms). A send that goes at once is stamped at the quota
// node's now, a round trip before the bucket's (clusterSkew at most).
func TestClusterReservedSendKeepsQuota(t *testing.T) {
	l, rdb := newCluster(t)
	const limit, per = 2, time.Second
	q := mustQuota(t, "mkt", Window{limit, per})
	b := mustBucket(t, "sms", 4, 1)
	const maxWait = time.Second
	job := func(id string) Request {
		return Request{ID: id, Takes: []Take{{Rule: q, Subject: "alice"}, {Rule: b, Subject: "gw"}}}
	}
	qkey := keyspace.Quota(keyspace.Tag(DefaultPrefix, "alice"), "mkt")
	var sends []time.Time
	send := func(id string) {
		t.Helper()
		for try := 0; ; try++ {
			d, err := l.Admit(ctx, withWait(job(id), maxWait))
			if err != nil {
				t.Fatalf("reserve %s: %v", id, err)
			}
			if d.Allowed() {
				sends = append(sends, d.At())
				// The entry counts from no earlier than the send, and no
				// later than the provisional stamp.
				s, err := rdb.ZScore(ctx, qkey, id).Result()
				if err != nil {
					t.Fatalf("quota entry of %s: %v", id, err)
				}
				stamp := time.UnixMicro(int64(s))
				if stamp.Before(d.At().Add(-clusterSkew)) || stamp.After(d.Now.Add(maxWait+time.Second)) {
					t.Errorf("%s: quota entry stamped %s, send at %s (admitted %s)", id, stamp, d.At(), d.Now)
				}
				return
			}
			if try > 20 {
				t.Fatalf("%s still denied: %+v", id, d)
			}
			time.Sleep(d.Delay + time.Millisecond) // time under test: the retry comes after the delay given
		}
	}
	send("job-1")
	for _, id := range []string{"x1", "x2"} {
		if d, err := l.Admit(ctx, withWait(Request{ID: id, Takes: []Take{{Rule: b, Subject: "gw"}}}, maxWait)); err != nil || !d.Allowed() {
			t.Fatalf("reserve %s: %+v, %v", id, d, err)
		}
	}
	send("job-2")
	if ahead := sends[1].Sub(sends[0]); ahead < 500*time.Millisecond {
		t.Fatalf("job-2 reserved only %s after job-1; the test needs a reservation well ahead", ahead)
	}
	send("job-3")
	send("job-4")
	for i := 0; i+limit < len(sends); i++ {
		if gap := sends[i+limit].Sub(sends[i]); gap < per {
			t.Errorf("sends %d..%d within %s: more than %d per %s (sends at %v)", i+1, i+limit+1, gap, limit, per, sends)
		}
	}
	// A request the bucket denies leaves no provisional quota entry.
	for _, id := range []string{"y1", "y2", "y3", "y4", "y5", "y6"} {
		_, _ = l.Admit(ctx, withWait(Request{ID: id, Takes: []Take{{Rule: b, Subject: "gw"}}}, maxWait))
	}
	bob := Request{ID: "bob-1", Takes: []Take{{Rule: q, Subject: "bob"}, {Rule: b, Subject: "gw"}}}
	if d, err := l.Admit(ctx, withWait(bob, maxWait)); err != nil || d.Allowed() || d.TakeIndex != 1 {
		t.Fatalf("bob-1 with the bucket reserved past max wait: %+v, %v; want denied by the bucket", d, err)
	}
	if n, _ := rdb.Exists(ctx, keyspace.Quota(keyspace.Tag(DefaultPrefix, "bob"), "mkt")).Result(); n != 0 {
		t.Errorf("bob's quota key left behind by a denied request")
	}
}

// TestClusterReservedSendKeepsCalendar: as TestClusterReservedSendKeepsQuota
// for a calendar window: its entry, stamped ahead while the bucket's node
// had not answered, is moved to the moment the token was reserved for.
func TestClusterReservedSendKeepsCalendar(t *testing.T) {
	l, rdb := newCluster(t)
	now := time.Now()
	c := mustCalendarWindow(t, 5, now.Add(-time.Hour), now.Add(time.Hour))
	b := mustBucket(t, "sms", 4, 1)
	const maxWait = time.Second
	if d, err := l.Admit(ctx, withWait(Request{ID: "x", Takes: []Take{{Rule: b, Subject: "gw"}}}, maxWait)); err != nil || !d.Allowed() {
		t.Fatalf("reserve x: %+v, %v", d, err)
	}
	d, err := l.Admit(ctx, withWait(Request{ID: "job", Takes: []Take{{Rule: c, Subject: "alice"}, {Rule: b, Subject: "gw"}}}, maxWait))
	if err != nil || !d.Allowed() || d.Delay <= 0 {
		t.Fatalf("reserve job: %+v, %v; want allowed a token ahead", d, err)
	}
	s, err := rdb.ZScore(ctx, keyspace.Calendar(keyspace.Tag(DefaultPrefix, "alice"), "cal"), "job").Result()
	if err != nil {
		t.Fatal(err)
	}
	if stamp := time.UnixMicro(int64(s)); stamp.Before(d.At()) || stamp.After(d.At().Add(50*time.Millisecond)) {
		t.Errorf("calendar entry stamped %s, the token's moment is %s", stamp, d.At())
	}
}

// TestClusterNewTaskReadsNoLedger: on a cluster, a new task whose
// recipient's quota (asked first) it held no entry of takes its provider's
// slot without reading the ledger (no ZSCORE on the bucket's node, the
// busiest), and a redelivery of it, which holds its entry, still finds its
// slot its own.
func TestClusterNewTaskReadsNoLedger(t *testing.T) {
	l, rdb := newCluster(t)
	q := mustQuota(t, "weekly", Window{3, 168 * time.Hour})
	// A slot of a second: the redelivery below comes within it, on a busy
	// machine too (at 100/s its 10 ms slot had ended by then once).
	b := mustBucket(t, "sms", 1, 10)
	req := Request{ID: "n1", Takes: []Take{{Rule: q, Subject: "alice"}, {Rule: b, Subject: "gw"}}}
	node := masterFor(t, rdb, keyspace.Bucket(keyspace.Tag(DefaultPrefix, "gw"), "sms"))
	before := commandCalls(t, node)
	if d := mustAdmit(t, l, req); d.Outcome != Admitted {
		t.Fatalf("n1: %+v, want admitted", d)
	}
	after := commandCalls(t, node)
	// A take that starts a bin of the calendar's life prunes it and writes
	// its marks again: one ZADD more.
	pruned := after["zremrangebyscore"] - before["zremrangebyscore"]
	if n, z := after["zscore"]-before["zscore"], after["zadd"]-before["zadd"]; n != 0 || z != 1+pruned {
		t.Errorf("%d ZSCORE and %d ZADD (%d prunes) on the bucket's node for a new task, want none and one (its span and ledger entry)", n, z, pruned)
	}
	if d := mustAdmit(t, l, req); d.Outcome != Repeated {
		t.Errorf("n1 again: %+v, want repeated: its slot found its own", d)
	}
	if ids := ledgerIDs(t, rdb, keyspace.Tag(DefaultPrefix, "gw"), "sms"); !slices.Equal(ids, []string{"n1"}) {
		t.Errorf("ledger holds %q, want [n1]", ids)
	}
}

// TestClusterDoneKeepsTheLedger: a booked task that was sent (marked done)
// and comes back after its slot ended (a redelivery: its worker died
// between the send and the acknowledgement) is Done, and its admission,
// whose first call goes to the bucket's node beside the read of the
// marker, leaves the ledger's record of the send as it was: nothing taken,
// nothing given back. So for a task with no quota (one call), whose marker
// is looked for too. One that is not marked takes a new slot.
func TestClusterDoneKeepsTheLedger(t *testing.T) {
	l, rdb := newCluster(t)
	ctx := context.Background()
	q := mustQuota(t, "weekly", Window{3, 168 * time.Hour})
	for i, c := range []struct {
		name   string
		book   bool
		quota  bool
		marked bool
	}{
		{"booked", true, true, true},
		{"admitted, no quota", false, false, true},
		{"booked, no quota", true, false, true},
		{"booked, not marked", true, true, false},
		{"admitted, no quota, not marked", false, false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := mustBucket(t, fmt.Sprint("sms", i), 50, 1) // a slot of 20 ms
			r := Request{ID: fmt.Sprint("s", i), CheckDone: true}
			if c.book {
				r.book = &Booking{}
			}
			if c.quota {
				r.Takes = append(r.Takes, Take{Rule: q, Subject: fmt.Sprint("alice", i)})
			}
			r.Takes = append(r.Takes, Take{Rule: b, Subject: "gw"})
			first := mustAdmit(t, l, r)
			if !first.Allowed() || first.Delay > 0 {
				t.Fatalf("%s: %+v, want admitted now", r.ID, first)
			}
			if c.marked {
				if err := l.MarkDone(ctx, r.ID, time.Now(), time.Hour); err != nil {
					t.Fatal(err)
				}
			}
			untilRedis(t, l, time.Now().Add(60*time.Millisecond)) // the slot ends
			before := snapshot(t, rdb)
			d := mustAdmit(t, l, r)
			if !c.marked {
				if d.Outcome != Admitted || !d.Now.After(first.Now) {
					t.Errorf("%s again, not marked: %+v, want admitted, a new slot", r.ID, d)
				}
				return
			}
			if d.Outcome != Done {
				t.Fatalf("%s again: %+v, want done", r.ID, d)
			}
			if diff := diffMaps(before, snapshot(t, rdb)); diff != "" {
				t.Errorf("a done task's admission changed the keys:\n%s", diff)
			}
		})
	}
}

// TestClusterOneMasterOneCall: a recipient whose slot is on the bucket's
// master, though not in its slot, is decided with the bucket in one call
// there, as on a single node: admitted, denied without a trace, booked and
// released, one script call each on that master and none elsewhere. A
// call that brings a key of another master's slot answers NONLOCAL having
// written nothing, and the request decided apart goes through.
func TestClusterOneMasterOneCall(t *testing.T) {
	l, rdb := newCluster(t)
	ctx := context.Background()
	q := mustQuota(t, "daily", Window{1, 24 * time.Hour})
	b := mustBucket(t, "sms", 1, 1) // one token: the second admission books a second ahead
	gw := keyspace.Tag(DefaultPrefix, "gw")
	home := masterFor(t, rdb, gw)
	near := ""
	for i := range 1000 {
		s := fmt.Sprint("r-", i)
		tag := keyspace.Tag(DefaultPrefix, s)
		if masterFor(t, rdb, tag).Options().Addr == home.Options().Addr && keySlot(t, rdb, tag) != keySlot(t, rdb, gw) {
			near = s
			break
		}
	}
	if near == "" {
		t.Fatal("no recipient on the bucket's master")
	}
	calls := func() map[string]int {
		out := map[string]int{}
		var mu sync.Mutex
		_ = rdb.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			n := evalCalls(t, c)
			mu.Lock()
			out[c.Options().Addr] = n
			mu.Unlock()
			return nil
		})
		return out
	}
	oneCall := func(what string, do func()) {
		t.Helper()
		before := calls()
		do()
		after := calls()
		for addr, n := range after {
			want := 0
			if addr == home.Options().Addr {
				want = 1
			}
			if got := n - before[addr]; got != want {
				t.Errorf("%s: %d script calls on %s, want %d", what, got, addr, want)
			}
		}
	}
	req := func(id string) Request {
		return Request{ID: id, Takes: []Take{{Rule: q, Subject: near}, {Rule: b, Subject: "gw"}}}
	}
	// The library on every master first, as a first call would load it.
	if err := l.loadFunctions(ctx); err != nil {
		t.Fatal(err)
	}

	oneCall("admit", func() {
		if d := mustAdmit(t, l, req("a1")); d.Outcome != Admitted {
			t.Errorf("a1: %+v, want admitted", d)
		}
	})
	if ids := ledgerIDs(t, rdb, gw, "sms"); !slices.Equal(ids, []string{"a1"}) {
		t.Errorf("ledger holds %q, want [a1]", ids)
	}
	if got := zmembers(t, rdb, keyspace.Quota(keyspace.Tag(DefaultPrefix, near), "daily")); !slices.Equal(got, []string{"a1"}) {
		t.Errorf("quota holds %q, want [a1]", got)
	}
	before := snapshot(t, rdb)
	oneCall("deny", func() {
		if d := mustAdmit(t, l, req("a2")); d.Outcome != Denied || d.Rule != Rule(q) {
			t.Errorf("a2: %+v, want denied by the quota", d)
		}
	})
	if diff := diffMaps(before, snapshot(t, rdb)); diff != "" {
		t.Errorf("a denied request left a trace: %s", diff)
	}
	oneCall("release", func() {
		if n, err := l.Release(ctx, req("a1")); err != nil || n != 2 {
			t.Errorf("release a1: %d, %v; want both takes given back", n, err)
		}
	})
	oneCall("book", func() {
		d, err := l.Book(ctx, Request{ID: "k1", Takes: req("k1").Takes, MaxWait: 0}, Booking{})
		if err != nil || !d.Allowed() && !d.Booked() {
			t.Errorf("k1: %+v, %v; want admitted or booked", d, err)
		}
	})

	// A call brings its second subject's keys after its arguments: one on
	// another master is refused before anything is written.
	far := subjectOnOtherMaster(t, rdb, "far", "gw")
	b2 := mustBucket(t, "push", 1, 1)
	r := Request{ID: "f1", Takes: []Take{{Rule: b2, Subject: "gw"}, {Rule: q, Subject: far}}}
	before = snapshot(t, rdb)
	var buf [128]byte
	c, _ := l.groupCall(r, single(r), planHead{}, admitting, 0, buf[:0])
	if _, err := l.eval1(ctx, l.admit, c); !nonLocal(err) {
		t.Fatalf("a call with a key of another master answered %v, want NONLOCAL", err)
	}
	if diff := diffMaps(before, snapshot(t, rdb)); diff != "" {
		t.Errorf("a NONLOCAL call wrote: %s", diff)
	}
	if d := mustAdmit(t, l, r); !d.Allowed() {
		t.Errorf("f1 apart: %+v, want admitted", d)
	}
}
