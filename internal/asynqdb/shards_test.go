package asynqdb

import (
	"maps"
	"slices"
	"testing"
)

// TestSlot: the slots Redis gives (CLUSTER KEYSLOT).
func TestSlot(t *testing.T) {
	for key, want := range map[string]uint16{"foo": 12182, "bar": 5061, "hello": 866, "123456789": 12739} {
		if got := slot(key); got != want {
			t.Errorf("slot(%q) = %d, want %d", key, got, want)
		}
	}
}

// TestShardsSpread: n shards of a queue fall in n different n-ths of the
// slot space (so on n masters with even slot ranges), and a name is the
// same for the same (queue, i, n).
func TestShardsSpread(t *testing.T) {
	for _, queue := range []string{"default", "critical", "low", "campaigns"} {
		for n := 1; n <= 8; n++ {
			seen := map[int]string{}
			for i := range n {
				name := Shard(queue, i, n)
				if name != Shard(queue, i, n) || BaseQueue(name) != queue {
					t.Fatalf("Shard(%s, %d, %d) = %s: not stable, or not of its queue", queue, i, n, name)
				}
				part := int(slot(name)) * n / slots
				if other, ok := seen[part]; ok {
					t.Errorf("%s and %s (of %d) share the %d-th part of the slots", name, other, n, part)
				}
				seen[part] = name
			}
		}
	}
}

// TestServed: every shard of every queue with the queue's weight, and the
// shards of another count that asynq knows, never another queue's.
func TestServed(t *testing.T) {
	got := Served(map[string]int{"default": 3, "critical": 6}, 2, []string{"default", "default~5", "other~1", "critical~1.4"})
	want := map[string]int{"default": 3, Shard("default", 1, 2): 3, "default~5": 3, "critical": 6, Shard("critical", 1, 2): 6, "critical~1.4": 6}
	if !maps.Equal(got, want) {
		t.Errorf("Served = %v, want %v", got, want)
	}
	if one := Served(map[string]int{"default": 3}, 1, nil); !maps.Equal(one, map[string]int{"default": 3}) {
		t.Errorf("one shard: %v, want the queue alone", one)
	}
	if q := ShardOf("default", "alice", 1); q != "default" {
		t.Errorf("AsynqQueue with one shard = %s, want default", q)
	}
	counts := map[string]int{}
	for _, r := range []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l"} {
		q := ShardOf("default", r, 3)
		if q != ShardOf("default", r, 3) {
			t.Fatal("a recipient's shard changed")
		}
		counts[q]++
	}
	if len(counts) != 3 || !slices.Contains(Names(Served(map[string]int{"default": 1}, 3, nil)), ShardOf("default", "a", 3)) {
		t.Errorf("12 recipients over 3 shards: %v, want all 3 used, each served", counts)
	}
}
