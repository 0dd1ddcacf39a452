//go:build !integration

package redistest

// integrationTier: see tier_integration.go.
const integrationTier = false
