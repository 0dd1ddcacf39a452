package feedback

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/notify-throttle/throttler/internal/clip"
	"github.com/notify-throttle/throttler/lifecycle"
	"github.com/notify-throttle/throttler/providers"
)

// sesMail is an SES event in an SNS Message: a configuration set's event
// (eventType; mail.tags has task_id), or an identity's notification
// (notificationType; no tags, so it names no message of ours).
type sesMail struct {
	EventType        string `json:"eventType"`
	NotificationType string `json:"notificationType"`
	Mail             struct {
		MessageID string              `json:"messageId"`
		Tags      map[string][]string `json:"tags"`
	} `json:"mail"`
	Bounce *struct {
		BounceType        string `json:"bounceType"`
		BounceSubType     string `json:"bounceSubType"`
		BouncedRecipients []struct {
			EmailAddress   string `json:"emailAddress"`
			Status         string `json:"status"`
			DiagnosticCode string `json:"diagnosticCode"`
		} `json:"bouncedRecipients"`
	} `json:"bounce"`
	Complaint *struct {
		ComplaintFeedbackType string `json:"complaintFeedbackType"`
		ComplainedRecipients  []struct {
			EmailAddress string `json:"emailAddress"`
		} `json:"complainedRecipients"`
	} `json:"complaint"`
	Delivery *struct {
		Recipients   []string `json:"recipients"`
		SMTPResponse string   `json:"smtpResponse"`
	} `json:"delivery"`
}

// TaskTag is the message tag providers.SES sends each message's ID in.
const TaskTag = "task_id"

// sesEvent reads the reports of an SES event: a Bounce (hard if
// Permanent), a Complaint or a Delivery, one report per recipient; its
// other events are ignored.
func sesEvent(message string) (reading, error) {
	var ev sesMail
	if err := json.Unmarshal([]byte(message), &ev); err != nil {
		return reading{}, fmt.Errorf("%w: the SNS Message is not an SES event (JSON): %v", ErrMalformed, err)
	}
	kind := cmp.Or(ev.EventType, ev.NotificationType)
	base := Report{ProviderMessageID: ev.Mail.MessageID}
	if tags := ev.Mail.Tags[TaskTag]; len(tags) > 0 {
		base.Message = tags[0]
	}
	var reports []Report
	switch {
	case kind == "":
		return reading{}, fmt.Errorf("%w: the SNS Message has neither eventType nor notificationType", ErrMalformed)
	case kind == "Bounce" && ev.Bounce != nil:
		b := ev.Bounce
		reason := lifecycle.BouncedSoft
		if b.BounceType == "Permanent" {
			reason = lifecycle.BouncedHard
		}
		for _, rc := range b.BouncedRecipients {
			r := base
			r.Type, r.Address, r.Reason = lifecycle.Bounced, rc.EmailAddress, reason
			r.Detail = words(rc.EmailAddress, b.BounceType+"/"+b.BounceSubType, rc.Status, rc.DiagnosticCode)
			reports = append(reports, r)
		}
	case kind == "Complaint" && ev.Complaint != nil:
		for _, rc := range ev.Complaint.ComplainedRecipients {
			r := base
			r.Type, r.Address, r.Detail = lifecycle.Complained, rc.EmailAddress, words(rc.EmailAddress, ev.Complaint.ComplaintFeedbackType)
			reports = append(reports, r)
		}
	case kind == "Delivery" && ev.Delivery != nil:
		r := base
		if len(ev.Delivery.Recipients) > 0 {
			r.Address = ev.Delivery.Recipients[0]
		}
		r.Type, r.Detail = lifecycle.Delivered, words(r.Address, ev.Delivery.SMTPResponse)
		reports = append(reports, r)
	case kind == "Bounce" || kind == "Complaint" || kind == "Delivery":
		return reading{}, fmt.Errorf("%w: an SES %s without its %s object", ErrMalformed, kind, strings.ToLower(kind))
	default:
		return reading{ignored: 1}, nil
	}
	if len(reports) == 0 {
		return reading{}, fmt.Errorf("%w: an SES %s naming no recipient", ErrMalformed, kind)
	}
	return reading{reports: reports}, nil
}

// maxDetail bounds a report's detail, as jobs bounds an event's.
const maxDetail = 300

// words joins a provider's words for a report's detail, address redacted
// (message.Redact), cut to maxDetail.
func words(address string, parts ...string) string {
	var kept []string
	for _, p := range parts {
		if p = strings.TrimSpace(p); p != "" {
			kept = append(kept, p)
		}
	}
	s := strings.Join(kept, ": ")
	if address != "" {
		s = providers.RedactError(errors.New(s), address).Error()
	}
	return clip.Cut(s, maxDetail, "")
}
