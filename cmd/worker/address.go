package main

import (
	"github.com/notify-throttle/throttler/address"
	"github.com/notify-throttle/throttler/providers"
)

// addressed returns p as a providers.Addresser of the recipients type kind
// takes (package address), or p itself for the types that take any; a
// providers.Scoper stays one.
func addressed(kind string, p providers.Provider) providers.Provider {
	if address.Any(kind) {
		return p
	}
	if sc, ok := p.(providers.Scoper); ok {
		return checkedScoper{sc, kind}
	}
	return checkedProvider{p, kind}
}

type checkedProvider struct {
	providers.Provider
	kind string
}

func (c checkedProvider) CheckRecipient(r string) error { return address.Check(c.kind, r) }

type checkedScoper struct {
	providers.Scoper
	kind string
}

func (c checkedScoper) CheckRecipient(r string) error { return address.Check(c.kind, r) }
