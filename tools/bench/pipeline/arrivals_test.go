package pipeline

import (
	"testing"
	"time"
)

// pacing is a drain seen from one place (the provider, or the bucket's
// ledger): event times as offsets from an origin, sorted.
type pacing struct {
	at []time.Duration
}

// newPacing takes sorted times and the origin to measure them from.
func newPacing(times []time.Time, origin time.Time) pacing {
	p := pacing{at: make([]time.Duration, len(times))}
	for i, t := range times {
		p.at[i] = t.Sub(origin)
	}
	return p
}

// span is the time from the first event to the last.
func (p pacing) span() time.Duration {
	if len(p.at) == 0 {
		return 0
	}
	return p.at[len(p.at)-1] - p.at[0]
}

// end is the offset of the last event.
func (p pacing) end() time.Duration {
	if len(p.at) == 0 {
		return 0
	}
	return p.at[len(p.at)-1]
}

// rate is events per second over the drain: n events make n-1 gaps.
func (p pacing) rate() float64 {
	if len(p.at) < 2 || p.span() <= 0 {
		return 0
	}
	return float64(len(p.at)-1) / p.span().Seconds()
}

// maxWindow returns the most events in any window [t, t+w).
func (p pacing) maxWindow(w time.Duration) int {
	best, lo := 0, 0
	for hi, t := range p.at {
		for t-p.at[lo] >= w {
			lo++
		}
		best = max(best, hi-lo+1)
	}
	return best
}

// bins counts events in consecutive bins of width w from the origin (one
// before it counts in the first).
func (p pacing) bins(w time.Duration) []int {
	if len(p.at) == 0 {
		return nil
	}
	out := make([]int, int(max(p.end(), 0)/w)+1)
	for _, t := range p.at {
		out[int(max(t, 0)/w)]++
	}
	return out
}

// trailing returns, every step from the origin to the last event, the
// number of events in (t-w, t]: the rate a 1 s moving window sees.
func (p pacing) trailing(w, step time.Duration) []int {
	if len(p.at) == 0 {
		return nil
	}
	var out []int
	lo, hi := 0, 0
	for t := time.Duration(0); t <= p.end(); t += step {
		for hi < len(p.at) && p.at[hi] <= t {
			hi++
		}
		for lo < hi && p.at[lo] <= t-w {
			lo++
		}
		out = append(out, hi-lo)
	}
	return out
}

func TestPacing(t *testing.T) {
	ms := func(v ...int) pacing {
		p := pacing{}
		for _, x := range v {
			p.at = append(p.at, time.Duration(x)*time.Millisecond)
		}
		return p
	}
	tests := []struct {
		name      string
		p         pacing
		rate      float64
		window    int // most in any 1 s
		bins      []int
		trailing  []int // 1 s window, every 500 ms
		spanMilli int
	}{
		{"empty", ms(), 0, 0, nil, nil, 0},
		{"one", ms(0), 0, 1, []int{1}, []int{1}, 0},
		{"steady 4/s", ms(0, 250, 500, 750, 1000, 1250, 1500, 1750, 2000), 4, 4,
			[]int{4, 4, 1}, []int{1, 3, 4, 4, 4}, 2000},
		{"burst then steady", ms(0, 0, 0, 0, 500, 1000, 1500), 4, 5,
			[]int{5, 2}, []int{4, 5, 2, 2}, 1500},
		{"window edge is open", ms(0, 999, 1000), 2, 2, []int{2, 1}, []int{1, 1, 2}, 1000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.p.rate(); got != tt.rate {
				t.Errorf("rate %v, want %v", got, tt.rate)
			}
			if got := tt.p.maxWindow(time.Second); got != tt.window {
				t.Errorf("maxWindow %d, want %d", got, tt.window)
			}
			if got := tt.p.bins(time.Second); !equalInts(got, tt.bins) {
				t.Errorf("bins %v, want %v", got, tt.bins)
			}
			if got := tt.p.trailing(time.Second, 500*time.Millisecond); !equalInts(got, tt.trailing) {
				t.Errorf("trailing %v, want %v", got, tt.trailing)
			}
			if got := tt.p.span(); got != time.Duration(tt.spanMilli)*time.Millisecond {
				t.Errorf("span %s, want %dms", got, tt.spanMilli)
			}
		})
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
