package lifecycle_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/notify-throttle/throttler/lifecycle"
)

// A receiver of status callbacks checks each POST's signature on the body
// as it arrived, before it parses it, and deduplicates on the event's ID.
func ExampleVerify() {
	const secret = "whsec-0123456789abcdef" // the tenant's events.callbacks secret
	seen := map[string]bool{}
	receiver := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if err := lifecycle.Verify(secret, r.Header.Get(lifecycle.SignatureHeader), body, 5*time.Minute); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		id := r.Header.Get(lifecycle.EventIDHeader)
		fmt.Println("verified", id, "first time:", !seen[id])
		seen[id] = true
		w.WriteHeader(http.StatusNoContent)
	})

	body := `{"id":"5f0e6c1d2b3a49587766554433221100","type":"sent","message":"0b7c","tenant":"billing","at":"2025-06-10T08:00:00Z","provider":"sms"}`
	for _, sig := range []string{lifecycle.Sign(secret, time.Now(), []byte(body)), lifecycle.Sign("not-the-secret", time.Now(), []byte(body))} {
		req := httptest.NewRequest(http.MethodPost, "/events", strings.NewReader(body))
		req.Header.Set(lifecycle.SignatureHeader, sig)
		req.Header.Set(lifecycle.EventIDHeader, "5f0e6c1d2b3a49587766554433221100")
		rec := httptest.NewRecorder()
		receiver.ServeHTTP(rec, req)
		fmt.Println(strings.TrimSpace(fmt.Sprintf("answered %d %s", rec.Code, rec.Body.String())))
	}
	// Output:
	// verified 5f0e6c1d2b3a49587766554433221100 first time: true
	// answered 204
	// answered 400 lifecycle: the signature does not match the body
}
