//go:build integration

package redistest

// integrationTier reports whether the tests were built with -tags
// integration: then clusters start; in the quick tier they are skipped.
const integrationTier = true
