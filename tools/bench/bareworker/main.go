// Command bareworker is the baseline of BenchmarkWorkerVsBare: a bare asynq
// worker that does what cmd/worker does with a notification nothing holds
// back, and nothing else: decode it, POST it to the webhook. It has
// cmd/worker's asynq settings (concurrency, queues, poll interval) and a
// /healthz, so that the benchmark runs both alike.
//
// With -floor it also sends, per task, the least that any throttler must:
// one script call before the POST (the admission: one write, read back),
// through the client's auto-pipeliner, and one SET after it (the done
// marker), on the plain client, as cmd/worker sends its own. What that costs against the
// bare worker is the floor under the throttler's cost where nothing is
// throttled, on the machine it runs on.
//
//	bareworker -redis 127.0.0.1:6379 -url http://.../send -http 127.0.0.1:0 -concurrency 20 -queues default:1
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/message"
	"github.com/notify-throttle/throttler/providers"
)

func main() {
	if err := run(context.Background(), os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "bareworker:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("bareworker", flag.ContinueOnError)
	addr := fs.String("redis", "127.0.0.1:6379", "redis-server address")
	url := fs.String("url", "", "the webhook's URL")
	httpAddr := fs.String("http", "127.0.0.1:0", "address of /healthz")
	concurrency := fs.Int("concurrency", 20, "asynq Config.Concurrency")
	poll := fs.Duration("poll", 100*time.Millisecond, "asynq Config.TaskCheckInterval")
	floor := fs.Bool("floor", false, "per task, also one script call before the POST and a SET after it, through the auto-pipeliner")
	queueList := fs.String("queues", "critical:6,default:3,low:1", "asynq Config.Queues, name:weight comma-separated")
	if err := fs.Parse(args); err != nil {
		return err
	}
	queues, err := parseQueues(*queueList)
	if err != nil {
		return err
	}
	opts, err := redis.ParseURL("redis://" + *addr + "/0") // as cmd/worker connects
	if err != nil {
		return err
	}
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	ap, err := rdb.AutoPipeline()
	if err != nil {
		return err
	}
	provider := providers.NewWebhook("hook", *url, 5*time.Second, nil, nil)
	mux := asynq.NewServeMux()
	mux.HandleFunc(message.TaskType, func(ctx context.Context, t *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		n, err := message.Decode(t.Payload())
		if err != nil {
			return fmt.Errorf("malformed notification: %v: %w", err, asynq.SkipRetry)
		}
		if *floor {
			if err := floorAdmit.Run(ctx, ap, []string{"floor:" + id}).Err(); err != nil {
				return err
			}
		}
		if _, err := provider.Send(ctx, providers.Message{ID: id, Recipient: n.Recipient, Template: n.Template, Data: n.Data}); err != nil {
			return err
		}
		if *floor {
			return rdb.Set(ctx, "floor-done:"+id, 1, time.Minute).Err()
		}
		return nil
	})
	srv := asynq.NewServerFromRedisClient(rdb, asynq.Config{
		Concurrency:              *concurrency,
		Queues:                   queues,
		ShutdownTimeout:          10 * time.Second,
		TaskCheckInterval:        *poll,
		DelayedTaskCheckInterval: time.Second,
		LogLevel:                 asynq.WarnLevel,
	})
	if err := srv.Start(mux); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *httpAddr)
	if err != nil {
		return err
	}
	go func() {
		_ = http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }))
	}()
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
	srv.Shutdown()
	if err := ln.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
		return err
	}
	return nil
}

// floorAdmit is -floor's admission: one write, its answer read back.
var floorAdmit = redis.NewScript(`redis.call('set', KEYS[1], 1, 'px', 60000) return 1`)

// parseQueues reads "name:weight,name:weight".
func parseQueues(list string) (map[string]int, error) {
	queues := map[string]int{}
	for _, q := range strings.Split(list, ",") {
		name, weight, ok := strings.Cut(q, ":")
		w, err := strconv.Atoi(weight)
		if !ok || err != nil || w < 1 {
			return nil, fmt.Errorf("-queues: %q is not name:weight", q)
		}
		queues[name] = w
	}
	return queues, nil
}
