// Package providers holds the adapters of the delivery services (SMTP,
// Amazon SES, Twilio, FCM, APNs, SendGrid), a file each: each is a
// jobs.Provider and a jobs.Scoper that maps every answer of its service
// into the one classification of jobs.SendError (docs/providers.md), shows
// the recipient only redacted (jobs.RedactError) and never retries on its
// own: the throttle owns every wait. They live apart from package jobs so
// that the vendors' SDKs are linked only by the worker.
package providers
