package campaign

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/notify-throttle/throttler/config"
	"github.com/notify-throttle/throttler/message"
)

// TestFileReaderResumes reads a file in batches, reopening it at each
// position returned, as a resumed fan-out does, and checks that the entries
// are those of one pass.
func TestFileReaderResumes(t *testing.T) {
	content := "a@x\r\n\n" + strings.Repeat("L", lineBuffer+10) + "\n b@x \tEurope/Paris \n" + strings.Repeat("m", 257) + "\nc@x"
	path := filepath.Join(t.TempDir(), "audience.txt")
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	want := []entry{
		{recipient: "a@x", line: 1},
		{line: 2, bad: "blank"},
		{line: 3, bad: "longer than 256 bytes"},
		{recipient: "b@x", tz: "Europe/Paris", line: 4},
		{recipient: strings.Repeat("m", 257), line: 5, bad: "longer than 256 bytes"},
		{recipient: "c@x", line: 6},
	}
	var got []entry
	pos, line, end := "", int64(0), false
	for !end {
		r, err := openFile(path, pos, line)
		if err != nil {
			t.Fatal(err)
		}
		var batch []entry
		batch, pos, end, err = r.next(context.Background(), 2)
		r.Close()
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, batch...)
		line = batch[len(batch)-1].line
	}
	if !slices.Equal(got, want) {
		t.Errorf("entries:\n got %+v\nwant %+v", got, want)
	}
	if want := strconv.Itoa(len(content)); pos != want {
		t.Errorf("end position %s, want the file's size, %s", pos, want)
	}
}

// TestMessageSaysWhyAlone checks that an entry jobs rejects is logged with
// the mistake alone, not with the "bad notification" jobs wraps it with.
func TestMessageSaysWhyAlone(t *testing.T) {
	b := &batchRun{c: &campaign{Campaign: config.Campaign{Name: "c", Policy: "p", Provider: "x", Template: "t", Queue: "default"}},
		tick: NewTick("c", time.Unix(1_800_000_000, 0)), r: &Runner{shards: 1}}
	if _, why := b.message(entry{recipient: "a\xffb@x", line: 1}, nil); why != "recipient: not UTF-8" {
		t.Errorf("why = %q, want %q", why, "recipient: not UTF-8")
	}
	if _, why := b.message(entry{recipient: "a@x", line: 2}, nil); why != "" {
		t.Errorf("a good entry: why = %q, want none", why)
	}
}

// TestMessageTimeZone: an entry's zone, else the campaign's recipient_tz;
// an unknown one rejects the entry, saying which.
func TestMessageTimeZone(t *testing.T) {
	b := &batchRun{c: &campaign{Campaign: config.Campaign{Name: "c", Policy: "p", Provider: "x", Template: "t", Queue: "default", RecipientTZ: "Asia/Tokyo"}},
		tick: NewTick("c", time.Unix(1_800_000_000, 0)), r: &Runner{shards: 1}}
	for _, tc := range []struct{ tz, want, why string }{
		{"", "Asia/Tokyo", ""},
		{"Europe/Paris", "Europe/Paris", ""},
		{"Europe/Pariss", "", `tz: unknown time zone "Europe/Pariss" (an IANA zone such as Europe/Paris)`},
	} {
		msg, why := b.message(entry{recipient: "a@x", tz: tc.tz, line: 1}, nil)
		if why != tc.why {
			t.Errorf("tz %q: why = %q, want %q", tc.tz, why, tc.why)
			continue
		}
		if tc.why == "" && !strings.Contains(string(msg.Payload), `"tz":"`+tc.want+`"`) {
			t.Errorf("tz %q: payload %s, want tz %s", tc.tz, msg.Payload, tc.want)
		}
	}
}

// TestMessageTenant: a campaign's notifications carry its tenant (a file's
// campaign defaults it to its name: see config.Campaign.Tenant); none when
// it is "", the default tenant.
func TestMessageTenant(t *testing.T) {
	for _, tenant := range []string{"growth", ""} {
		b := &batchRun{c: &campaign{Campaign: config.Campaign{Name: "c", Policy: "p", Provider: "x", Template: "t", Queue: "default", Tenant: tenant}},
			tick: NewTick("c", time.Unix(1_800_000_000, 0)), r: &Runner{shards: 1}}
		msg, why := b.message(entry{recipient: "a@x", line: 1}, nil)
		if why != "" {
			t.Fatalf("tenant %q: %s", tenant, why)
		}
		n, err := message.Decode(msg.Payload)
		if err != nil || n.Tenant != tenant {
			t.Errorf("tenant %q: payload %s carries %q (%v)", tenant, msg.Payload, n.Tenant, err)
		}
	}
}
