package jobs

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sync"
	"time"
)

// LogProvider writes one JSON line per message: for trying things out, and
// as the smallest example of a provider.
type LogProvider struct {
	Name string
	mu   sync.Mutex
	w    io.Writer
}

// NewLogProvider returns a provider named name that writes to w.
func NewLogProvider(name string, w io.Writer) *LogProvider {
	return &LogProvider{Name: name, w: w}
}

// Send writes m as one line: {"time", "provider", "id", "recipient",
// "template", "data"}. Its ID for m is the task ID, the line's "id".
func (p *LogProvider) Send(_ context.Context, m Message) (string, error) {
	line, err := json.Marshal(struct {
		Time     time.Time `json:"time"`
		Provider string    `json:"provider"`
		Message
	}{time.Now().UTC(), p.Name, m})
	if err != nil {
		return "", sendErrorf(Reject, 0, "log provider %s: %v", p.Name, err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, err := p.w.Write(append(line, '\n')); err != nil {
		return "", fmt.Errorf("log provider %s: %w", p.Name, err)
	}
	return m.ID, nil
}
