package redisconn

import (
	"fmt"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
)

// ttlTick is how often the embedded server's TTLs count down: miniredis
// only expires keys when told time has passed.
const ttlTick = time.Second

// embedded is the in-process server (miniredis) of url: embedded.
type embedded struct {
	srv  *miniredis.Miniredis
	stop chan struct{}
	done sync.WaitGroup
}

func startEmbedded(addr string) (*embedded, error) {
	srv := miniredis.NewMiniRedis()
	if err := srv.StartAddr(addr); err != nil {
		return nil, fmt.Errorf("config: start embedded redis on %s: %w", addr, err)
	}
	e := &embedded{srv: srv, stop: make(chan struct{})}
	e.done.Go(e.tick)
	return e, nil
}

func (e *embedded) tick() {
	t := time.NewTicker(ttlTick)
	defer t.Stop()
	last := time.Now()
	for {
		select {
		case <-e.stop:
			return
		case now := <-t.C:
			e.srv.FastForward(now.Sub(last))
			last = now
		}
	}
}

func (e *embedded) close() {
	close(e.stop)
	e.done.Wait()
	e.srv.Close()
}
