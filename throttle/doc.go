// Package throttle admits tasks through rate rules whose state lives in
// Redis, so that any number of processes on any number of hosts share one
// truth. Every decision is taken by a Lua script (package lua) at Redis's
// own TIME, never a caller's clock.
//
// A Request is one task (its ID) and its Takes: each a Rule and the subject
// it applies to, such as a recipient's Quota (several sliding windows on one
// key), a provider's Bucket (rate and burst), a Calendar day or month, or
// QuietHours in the recipient's zone. Limiter.Admit checks every take and
// consumes them all or none: a denied task leaves nothing in Redis, and a
// task admitted again under the same ID passes without consuming twice.
// Limiter.Release gives back what an admitted task took when it did not go.
//
// A request that may not go now either waits (MaxWait lets a bucket reserve
// a token ahead) or, by Limiter.Book with a Booking, books the earliest
// moment every take allows, after the moments booked before it; a booking
// further ahead than its Horizon is a place in the tenant's line instead,
// which holds nothing. Decision says which, and when to come back.
//
// Files, by concern:
//
//	limiter.go      the API: New, Admit, Book, Check, HasSlot, Release, Forget, Pause, Repace
//	request.go      Request, Booking, Take and their validation
//	decision.go     Decision and ThrottledError
//	rule.go         Quota, Bucket; calendar.go, quiet.go the zoned rules
//	engine.go       one node: a request is one script call
//	cluster.go      a Redis Cluster: a call per subject, and why it never over-admits
//	transport.go    running the Lua library: FCALL, or EVALSHA where there are no functions
//	wire.go         the calling convention shared with lua/admit.lua and the reply it reads
//
// Every key is named by internal/keyspace.
//
// Errors: what the Limiter returns starts with "throttle: " and wraps
// ErrInvalidRequest or ErrInvalidRule where the caller's input is at fault
// (a *RuleError says which rule and what). A parser of a single value
// (ParseQuietRange) describes only the value, as time.LoadLocation does, for
// the caller to place after the setting's name.
package throttle
