package main

import (
	"github.com/notify-throttle/throttler/address"
	"github.com/notify-throttle/throttler/jobs"
)

// addressed returns p as a jobs.Addresser that refuses, before a send,
// a recipient a provider of type kind cannot take (package address), or p
// itself for the types that take any (log, webhook). A service's adapter
// is a jobs.Scoper, and stays one.
func addressed(kind string, p jobs.Provider) jobs.Provider {
	if address.Any(kind) {
		return p
	}
	if sc, ok := p.(jobs.Scoper); ok {
		return checkedScoper{sc, kind}
	}
	return checkedProvider{p, kind}
}

type checkedProvider struct {
	jobs.Provider
	kind string
}

func (c checkedProvider) CheckRecipient(r string) error { return address.Check(c.kind, r) }

type checkedScoper struct {
	jobs.Scoper
	kind string
}

func (c checkedScoper) CheckRecipient(r string) error { return address.Check(c.kind, r) }
