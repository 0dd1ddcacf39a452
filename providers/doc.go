// Package providers is the contract between the worker and the services
// that deliver (Message, Provider, SendError and its Outcomes: provider.go)
// and the adapters that keep it: log and webhook, and SMTP, Amazon SES,
// Twilio, FCM, APNs and SendGrid, a file each. Each adapter maps every
// answer of its service into one Outcome (docs/providers.md), shows the
// recipient only redacted (RedactError) and never retries on its own: the
// throttle owns every wait.
package providers
