package providers

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sync"
	"time"
)

// Log writes one JSON line per message: for trying things out, and
// as the smallest example of a provider.
type Log struct {
	Name string
	mu   sync.Mutex
	w    io.Writer
}

// NewLog returns a provider named name that writes to w.
func NewLog(name string, w io.Writer) *Log {
	return &Log{Name: name, w: w}
}

// Send writes m as one line: {"time", "provider", "id", "recipient",
// "template", "data"}. Its ID for m is the task ID, the line's "id".
func (p *Log) Send(_ context.Context, m Message) (string, error) {
	line, err := json.Marshal(struct {
		Time     time.Time `json:"time"`
		Provider string    `json:"provider"`
		Message
	}{time.Now().UTC(), p.Name, m})
	if err != nil {
		return "", reject("log provider %s: %v", p.Name, err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, err := p.w.Write(append(line, '\n')); err != nil {
		return "", fmt.Errorf("log provider %s: %w", p.Name, err)
	}
	return m.ID, nil
}
