package throttle_test

import (
	"context"
	"fmt"
	"time"

	"github.com/notify-throttle/throttler/throttle"
)

// A recipient may get at most one marketing message a day and three a week.
func ExampleQuota() {
	ctx := context.Background()
	l, _ := throttle.New(throttle.NewExampleClient(), throttle.Options{})
	marketing, _ := throttle.NewQuota("marketing",
		throttle.Window{Limit: 1, Per: 24 * time.Hour},
		throttle.Window{Limit: 3, Per: 7 * 24 * time.Hour})

	for _, id := range []string{"msg-1", "msg-2"} {
		d, _ := l.Admit(ctx, throttle.Request{ID: id, Takes: []throttle.Take{{Rule: marketing, Subject: "alice@example.com"}}})
		if d.Allowed() {
			fmt.Println(id, "allowed;", d.Remaining, "left")
			continue
		}
		fmt.Println(id, "denied by", d.Limit, "for about", d.Delay.Round(time.Hour))
	}
	// Output:
	// msg-1 allowed; 0 left
	// msg-2 denied by 1 per 24h for about 24h0m0s
}

// One call checks a recipient's quota and a provider's bucket together: a
// task the bucket denies takes nothing from the quota.
func ExampleLimiter_Admit() {
	ctx := context.Background()
	l, _ := throttle.New(throttle.NewExampleClient(), throttle.Options{})
	weekly, _ := throttle.NewQuota("weekly", throttle.Window{Limit: 3, Per: 7 * 24 * time.Hour})
	sms, _ := throttle.NewBucket("sms", 1, 2) // 1 message a second, bursts of 2

	for i := 1; i <= 3; i++ {
		r := throttle.Request{
			ID: fmt.Sprintf("msg-%d", i),
			Takes: []throttle.Take{
				{Rule: weekly, Subject: fmt.Sprintf("user-%d", i)},
				{Rule: sms, Subject: "twilio"},
			},
		}
		d, err := l.Admit(ctx, r)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(r.ID, d.Allowed(), d.Err() != nil)
		if !d.Allowed() {
			fmt.Printf("retry %s in about %s\n", d.Rule.Name(), d.Delay.Round(time.Second))
		}
	}
	// Output:
	// msg-1 true false
	// msg-2 true false
	// msg-3 false true
	// retry sms in about 1s
}

// A request with MaxWait paces a provider: instead of being denied, a task
// that only waits for the bucket learns the moment its token is due.
func ExampleRequest_maxWait() {
	ctx := context.Background()
	l, _ := throttle.New(throttle.NewExampleClient(), throttle.Options{})
	gw, _ := throttle.NewBucket("gateway", 10, 1) // a token every 100ms

	var first time.Time
	for _, id := range []string{"a", "b", "c"} {
		r := throttle.Request{ID: id, Takes: []throttle.Take{{Rule: gw, Subject: "gw"}}, MaxWait: time.Second}
		d, _ := l.Admit(ctx, r)
		if id == "a" {
			first = d.At()
		}
		fmt.Println(id, "goes", d.At().Sub(first).Round(10*time.Millisecond), "after a")
	}
	// Output:
	// a goes 0s after a
	// b goes 100ms after a
	// c goes 200ms after a
}

// Release gives a quota back when a message could not be sent.
func ExampleLimiter_Release() {
	ctx := context.Background()
	l, _ := throttle.New(throttle.NewExampleClient(), throttle.Options{})
	daily, _ := throttle.NewQuota("daily", throttle.Window{Limit: 1, Per: 24 * time.Hour})
	r := throttle.Request{ID: "msg-1", Takes: []throttle.Take{{Rule: daily, Subject: "bob"}}}

	d, _ := l.Admit(ctx, r)
	fmt.Println("admitted:", d.Allowed())
	n, _ := l.Release(ctx, r) // the send failed
	fmt.Println("released takes:", n)
	d, _ = l.Admit(ctx, throttle.Request{ID: "msg-2", Takes: r.Takes})
	fmt.Println("msg-2 admitted:", d.Allowed())
	// Output:
	// admitted: true
	// released takes: 1
	// msg-2 admitted: true
}

// A done marker stops a task that needs no admission any more: here a
// message already sent, redelivered after its worker died before it could
// report the send. The admission takes nothing and says the task is done.
func ExampleRequest_done() {
	ctx := context.Background()
	rdb := throttle.NewExampleClient()
	l, _ := throttle.New(rdb, throttle.Options{})
	daily, _ := throttle.NewQuota("daily", throttle.Window{Limit: 1, Per: 24 * time.Hour})
	r := throttle.Request{ID: "msg-7", CheckDone: true, Takes: []throttle.Take{{Rule: daily, Subject: "carol"}}}

	d, _ := l.Admit(ctx, r)
	fmt.Println("first delivery admitted:", d.Allowed())
	_ = l.MarkDone(ctx, r.ID, time.Now(), time.Hour) // the provider accepted it
	d, _ = l.Admit(ctx, r)
	fmt.Println("redelivery admitted:", d.Allowed(), "done:", d.Outcome == throttle.Done)
	// Output:
	// first delivery admitted: true
	// redelivery admitted: false done: true
}
