package providers

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// serviceAccount returns a service account JSON key, its private key made
// for the test, whose token endpoint is tokenURL.
func serviceAccount(t *testing.T, tokenURL string) string {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	der, _ := x509.MarshalPKCS8PrivateKey(key)
	js, _ := json.Marshal(map[string]string{
		"type": "service_account", "project_id": "demo-app", "private_key_id": "k1",
		"private_key":  string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})),
		"client_email": "sender@demo-app.iam.gserviceaccount.com", "token_uri": tokenURL,
	})
	return string(js)
}

func fcmErr(status int, grpc, code string, extra string) answer {
	return fcmErrSaying(status, grpc, code, extra, "documented")
}

// fcmErrSaying is fcmErr with msg as the error's message.
func fcmErrSaying(status int, grpc, code, extra, msg string) answer {
	details := `{"@type":"type.googleapis.com/google.firebase.fcm.v1.FcmError","errorCode":"` + code + `"}`
	if extra != "" {
		details += "," + extra
	}
	return answer{status: status, body: `{"error":{"code":` + itoa(status) + `,"message":"` + msg + `","status":"` + grpc + `","details":[` + details + `]}}`}
}

func TestFCMClassifiesEveryAnswer(t *testing.T) {
	t.Parallel()
	var tokens atomic.Int32
	tokenSrv := newFake(t, answer{status: 200, body: `{"access_token":"ya29.test","expires_in":3600,"token_type":"Bearer"}`}, nil, func(t *testing.T, r *http.Request) string {
		tokens.Add(1)
		if err := r.ParseForm(); err != nil || r.PostForm.Get("grant_type") != "urn:ietf:params:oauth:grant-type:jwt-bearer" || r.PostForm.Get("assertion") == "" {
			t.Errorf("token request %v, %v", r.PostForm, err)
		}
		return ""
	})
	deviceQuota := `{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"subject":"device","description":"device message rate exceeded"}]}`
	answers := map[string]answer{
		"tok-unregistered": fcmErr(404, "NOT_FOUND", "UNREGISTERED", ""),
		"tok-invalid": fcmErrSaying(400, "INVALID_ARGUMENT", "INVALID_ARGUMENT", "",
			`Invalid value at 'message.token' (TYPE_STRING), \"tok-invalid\"`),
		"tok-auth":        fcmErr(401, "UNAUTHENTICATED", "THIRD_PARTY_AUTH_ERROR", ""),
		"tok-mismatch":    fcmErr(403, "PERMISSION_DENIED", "SENDER_ID_MISMATCH", ""),
		"tok-device":      withHeader(fcmErr(429, "RESOURCE_EXHAUSTED", "QUOTA_EXCEEDED", deviceQuota), "Retry-After", "9"),
		"tok-project":     withHeader(fcmErr(429, "RESOURCE_EXHAUSTED", "QUOTA_EXCEEDED", ""), "Retry-After", "60"),
		"tok-unavailable": withHeader(fcmErr(503, "UNAVAILABLE", "UNAVAILABLE", ""), "Retry-After", "4"),
		"tok-internal":    fcmErr(500, "INTERNAL", "INTERNAL", ""),
	}
	f := newFake(t, answer{status: 200, body: `{"name":"projects/demo-app/messages/1"}`}, answers, func(t *testing.T, r *http.Request) string {
		if r.Method != http.MethodPost || r.URL.Path != "/v1/projects/demo-app/messages:send" || r.Header.Get("Authorization") != "Bearer ya29.test" {
			t.Errorf("request %s %s auth %q", r.Method, r.URL.Path, r.Header.Get("Authorization"))
		}
		var m fcmMessage
		if err := json.NewDecoder(r.Body).Decode(&m); err != nil || m.Message.Notification == nil ||
			*m.Message.Notification != (fcmNotification{"Order shipped", "It left the warehouse"}) || m.Message.Data["order"] != "42" {
			t.Errorf("message %+v, %v", m, err)
		}
		return m.Message.Token
	})
	p, err := NewFCM(ctx(t), Settings{Name: "push", BaseURL: f.URL}, "demo-app", serviceAccount(t, tokenSrv.URL), "", "")
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string]want{
		"tok-ok":           {sent: true, id: "projects/demo-app/messages/1"},
		"tok-unregistered": {outcome: Dead, text: "UNREGISTERED"},
		"tok-invalid":      {outcome: Reject, text: `400 INVALID_ARGUMENT: Invalid value at 'message.token' (TYPE_STRING), "to***id"`},
		"tok-auth":         {outcome: Broken},
		"tok-mismatch":     {outcome: Broken},
		"tok-device":       {outcome: Pause, scope: DeviceScope("tok-device"), after: 9 * time.Second},
		"tok-project":      {outcome: Pause, after: time.Minute},
		"tok-unavailable":  {outcome: Retry, after: 4 * time.Second},
		"tok-internal":     {retry: true},
	}
	for to, w := range cases {
		id, err := p.Send(ctx(t), Message{ID: "t1", Recipient: to, Data: []byte(`{"title":"Order shipped","body":"It left the warehouse","data":{"order":"42"}}`)})
		checkOutcome(t, to, id, err, w)
		noRecipient(t, err, to)
	}
	if n := tokens.Load(); n != 1 {
		t.Errorf("%d token requests for %d sends, want 1 (the token is reused)", n, len(cases))
	}
	if _, err := NewFCM(ctx(t), Settings{Name: "push"}, "demo-app", `not a key SECRET-VALUE`, "", ""); err == nil || strings.Contains(err.Error(), "SECRET") {
		t.Errorf("a broken key: %v", err)
	}
}

func withHeader(a answer, k, v string) answer {
	a.headers = map[string]string{k: v}
	return a
}
