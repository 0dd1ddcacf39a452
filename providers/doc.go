// Package providers holds the adapters of real delivery services: SMTP,
// Amazon SES, Twilio, FCM, APNs and SendGrid. Each is a jobs.Provider and a
// jobs.Scoper in a file of its own, and maps every answer of its service
// into the one classification of jobs.SendError (see docs/providers.md):
// sent; retry at a moment; throttled, with a scope (the whole provider, a
// sender, a number pair, a device); dead address; bad message; broken
// credentials. A send that got no answer is classified by jobs.Unreached
// (an untrusted certificate is broken); an accepted message reports the
// service's ID for it; an error shows the recipient only redacted
// (jobs.RedactError).
//
// They live apart from package jobs so that the vendors' SDKs (AWS, OAuth2,
// JWT, mail) are linked only by the worker that builds them, not by the
// throttle core and its tests. None of them retries on its own: the
// throttle owns every wait, and a send is one request, admitted by the
// provider's bucket.
package providers
