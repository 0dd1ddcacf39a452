package pipeline

import (
	"cmp"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// nodeStats is what one Redis node has done so far, by INFO commandstats
// (commands run inside scripts and functions included) and INFO cpu.
type nodeStats struct {
	calls float64            // commands
	byCmd map[string]float64 // commands by name ("fcall", "evalsha", "cluster|slots")
	cpu   float64            // used_cpu_sys + used_cpu_user, seconds
}

func (s nodeStats) minus(t nodeStats) nodeStats {
	return nodeStats{calls: s.calls - t.calls, byCmd: addStats(s.byCmd, scaleStats(t.byCmd, -1)), cpu: s.cpu - t.cpu}
}

// readNodes reads each node's stats through its admin client (one
// connection each, made before: a new one's HELLO would be counted).
func readNodes(b *testing.B, admins []*redis.Client) []nodeStats {
	b.Helper()
	out := make([]nodeStats, len(admins))
	for i, admin := range admins {
		// readCostByCmd reads a fleet's admin client only.
		c, byCmd := readCostByCmd(b, &bookFleet{admin: admin})
		out[i] = nodeStats{calls: c.calls, byCmd: byCmd, cpu: c.redisCPU}
	}
	return out
}

// drainCost is what the nodes did over one drain.
type drainCost struct {
	tasks    int
	elapsed  time.Duration
	nodes    []nodeStats        // in the setup's order
	outcomes map[string]float64 // the workers' throttler_*_total series, summed over them
}

// per returns x per task.
func (d drainCost) per(x float64) float64 { return x / float64(d.tasks) }

// calls is the commands of all the nodes.
func (d drainCost) calls() float64 {
	var n float64
	for _, s := range d.nodes {
		n += s.calls
	}
	return n
}

// cmd is the calls of command name on all the nodes.
func (d drainCost) cmd(name string) float64 {
	var n float64
	for _, s := range d.nodes {
		n += s.byCmd[name]
	}
	return n
}

// cpu is the Redis CPU of all the nodes, seconds.
func (d drainCost) cpu() float64 {
	var n float64
	for _, s := range d.nodes {
		n += s.cpu
	}
	return n
}

// busiest is the node that spent the most Redis CPU.
func (d drainCost) busiest() nodeStats {
	return slices.MaxFunc(d.nodes, func(x, y nodeStats) int { return cmp.Compare(x.cpu, y.cpu) })
}
