// Package providers is the contract between the worker and the services
// that deliver (provider.go) and the adapters that keep it, a file each:
// docs/providers.md. An adapter never retries on its own: the throttle
// owns every wait.
package providers
