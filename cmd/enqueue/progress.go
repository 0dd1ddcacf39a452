package main

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// barWidth is the width of the bar itself, in characters.
const barWidth = 24

// progress draws a one-line progress bar on a terminal, redrawn in place.
// A nil *progress, stderr's when not a terminal, draws nothing.
type progress struct {
	w     io.Writer
	size  int64 // bytes in the input, or 0 when unknown (a pipe)
	start time.Time
	shown bool
}

// draw shows the progress up to item last, at now.
func (p *progress) draw(now time.Time, last item, enqueued, rejected int) {
	if p == nil {
		return
	}
	var b strings.Builder
	b.WriteString("\r\033[K")
	if p.size > 0 {
		frac := min(float64(last.off)/float64(p.size), 1)
		full := int(frac * barWidth)
		fmt.Fprintf(&b, "%3d%% [%s%s] ", int(frac*100), strings.Repeat("#", full), strings.Repeat(".", barWidth-full))
	}
	fmt.Fprintf(&b, "line %d  enqueued %d  rejected %d", last.line, enqueued, rejected)
	if secs := now.Sub(p.start).Seconds(); secs > 0 {
		fmt.Fprintf(&b, "  %.0f lines/s", float64(last.line)/secs)
	}
	io.WriteString(p.w, b.String())
	p.shown = true
}

// clear erases the bar, so that a message can take its line.
func (p *progress) clear() {
	if p == nil || !p.shown {
		return
	}
	io.WriteString(p.w, "\r\033[K")
	p.shown = false
}
