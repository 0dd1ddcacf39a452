//go:build integration

package redistest

// integrationTier: built with -tags integration, where clusters start.
const integrationTier = true
