package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/notify-throttle/throttler/config"
	"github.com/notify-throttle/throttler/lifecycle"
)

// demoCallbackSecret signs the demo's callbacks: a throwaway, valid only
// in the demo's process, like the demo's API key.
const demoCallbackSecret = "demo-callback-secret-only-for-make-demo"

// demoReceiver is the demo's callback endpoint, on a loopback port: it
// checks each event's signature, as a producer's receiver would, and
// counts them.
type demoReceiver struct {
	srv *http.Server

	mu     sync.Mutex
	types  map[lifecycle.Type]int       // verified events, by type
	ids    map[string]bool              // their IDs
	byMsg  map[string][]lifecycle.Event // them, by message
	bad    int                          // POSTs whose signature did not verify
	sample []byte                       // the sent event of the API's message, as POSTed
}

// demoCallbacks starts the demo's receiver and makes it the default
// tenant's callback in cfg; nil (and no callback) if no port is free.
func demoCallbacks(cfg *config.Config) *demoReceiver {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil
	}
	r := &demoReceiver{types: map[lifecycle.Type]int{}, ids: map[string]bool{}, byMsg: map[string][]lifecycle.Event{}}
	r.srv = &http.Server{Handler: r, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = r.srv.Serve(ln) }()
	callbacks := maps.Clone(cfg.Events.Callbacks)
	if callbacks == nil {
		callbacks = map[string]config.Callback{}
	}
	callbacks[""] = config.Callback{URL: "http://" + ln.Addr().String() + "/events", Secret: demoCallbackSecret, Timeout: 5 * time.Second}
	cfg.Events.Callbacks = callbacks
	return r
}

// ServeHTTP receives one callback: verified, counted once by its ID.
func (r *demoReceiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(io.LimitReader(req.Body, 1<<20))
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := lifecycle.Verify(demoCallbackSecret, req.Header.Get(lifecycle.SignatureHeader), body, 0); err != nil {
		r.bad++
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var e lifecycle.Event
	if json.Unmarshal(body, &e) == nil && !r.ids[e.ID] {
		r.ids[e.ID] = true
		r.types[e.Type]++
		r.byMsg[e.Message] = append(r.byMsg[e.Message], e)
		if e.Type == lifecycle.Sent && e.IdempotencyKey != "" {
			r.sample = body // the API's message's, the one with a key
		}
	}
	w.WriteHeader(http.StatusNoContent)
}

// summary stops the receiver and prints what it got, then the events of
// message in the order they happened.
func (r *demoReceiver) summary(out io.Writer, message string, start time.Time) {
	if r == nil {
		return
	}
	_ = r.srv.Close()
	r.mu.Lock()
	defer r.mu.Unlock()
	var counts []string
	for _, ty := range lifecycle.Types {
		if n := r.types[ty]; n > 0 {
			counts = append(counts, fmt.Sprintf("%d %s", n, ty))
		}
	}
	fmt.Fprintf(out, "\nStatus callbacks (events.callbacks in config.yaml): every event of these messages was POSTed to a\n"+
		"receiver on a loopback port, signed; it verified %d (lifecycle.Verify) and refused %d: %s.\n",
		len(r.ids), r.bad, strings.Join(counts, ", "))
	events := r.byMsg[message]
	if len(events) == 0 {
		return
	}
	slices.SortStableFunc(events, func(a, b lifecycle.Event) int { // by time, then in the order of a life
		return cmp.Or(a.At.Compare(b.At), cmp.Compare(slices.Index(lifecycle.Types, a.Type), slices.Index(lifecycle.Types, b.Type)))
	})
	fmt.Fprintf(out, "The scheduled message's events (%s), as the receiver verified them:\n", demoAPIRecipient)
	for _, e := range events {
		fmt.Fprintf(out, "  %7.2fs  %-9s %s\n", e.At.Sub(start).Seconds(), e.Type, demoEventWhat(e, start))
	}
	if r.sample != nil {
		fmt.Fprintf(out, "Its sent event, as POSTed:\n  %s\n", r.sample)
	}
}

// demoEventWhat is what an event of the demo's says beyond its type.
func demoEventWhat(e lifecycle.Event, start time.Time) string {
	var parts []string
	if e.Via != "" {
		parts = append(parts, "via "+e.Via)
	}
	if e.IdempotencyKey != "" && e.Type == lifecycle.Accepted {
		parts = append(parts, "key "+e.IdempotencyKey)
	}
	if e.Moment != nil {
		parts = append(parts, fmt.Sprintf("for %.2fs", e.Moment.Sub(start).Seconds()))
	}
	if e.Rule != "" {
		parts = append(parts, "by "+e.Rule)
	}
	if e.Provider != "" {
		parts = append(parts, "provider "+e.Provider)
	}
	return strings.Join(parts, ", ")
}
