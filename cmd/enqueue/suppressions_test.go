package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/notify-throttle/throttler/screen"
)

func TestSuppressionsListAndLift(t *testing.T) {
	h := newHarness(t)
	out := h.runArgs("-suppressions", "sms")
	if out.code != exitOK || out.stdout != "" || !strings.Contains(out.stderr, "provider sms has no suppressed addresses") {
		t.Fatalf("empty list: %+v", out)
	}
	screen := screen.New(h.rdb, "")
	at := time.Date(2026, 11, 29, 6, 0, 0, 0, time.UTC)
	if err := screen.Suppress(context.Background(), "sms", "tok:with:colons", "fcm push: 404 UNREGISTERED", at); err != nil {
		t.Fatal(err)
	}
	out = h.runArgs("-suppressions", "sms")
	want := "ADDRESS          SINCE                 REASON\ntok:with:colons  2026-11-29T06:00:00Z  fcm push: 404 UNREGISTERED\n"
	if out.code != exitOK || out.stdout != want {
		t.Fatalf("list: exit %d stdout\n%s\nwant\n%s\nstderr %q", out.code, out.stdout, want, out.stderr)
	}
	if out = h.runArgs("-unsuppress", "sms:tok:with:colons"); out.code != exitOK {
		t.Fatalf("unsuppress: %+v", out)
	}
	if sups, _ := screen.Suppressions(context.Background(), "sms"); len(sups) != 0 {
		t.Errorf("still suppressed: %+v", sups)
	}
	for args, msg := range map[[2]string]string{
		{"-unsuppress", "sms:tok:with:colons"}: "enqueue: provider sms had no suppression of that address",
		{"-unsuppress", "nocolon"}:             `enqueue: -unsuppress takes PROVIDER:ADDRESS (got "nocolon")`,
		{"-suppressions", "nope"}:              `enqueue: -suppressions: provider "nope" is not defined in testdata/config.yaml`,
	} {
		out := h.runArgs(args[0], args[1])
		if out.code == exitOK || !strings.HasPrefix(out.stderr, msg) {
			t.Errorf("%v: exit %d stderr %q, want %q", args, out.code, out.stderr, msg)
		}
	}
}
