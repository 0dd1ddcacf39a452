package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/config"
	"github.com/notify-throttle/throttler/internal/redisconn"
)

// errReported means the problem was printed already: the exit status is 1.
var errReported = errors.New("reported")

// connectTimeout bounds -check -connect's connection and its questions.
const connectTimeout = 15 * time.Second

// check is -check, with -connect if connect (see usage).
func check(ctx context.Context, path string, connect bool, stdout, stderr io.Writer) error {
	cfg, err := config.Load(path)
	if err == nil {
		_, err = cfg.Worker.Dashboard.Secret(os.Getenv)
	}
	if err == nil {
		err = checkServices(cfg)
	}
	if err != nil {
		fmt.Fprintln(stderr, err)
		return errReported
	}
	for _, w := range append(cfg.Warnings(), cfg.Redis.Warnings()...) {
		fmt.Fprintln(stderr, "warning:", w)
	}
	api := ""
	if cfg.API.Addr != "" {
		api = fmt.Sprintf(", the API on %s with %s", cfg.API.Addr, count(len(cfg.API.Keys), "key", "keys"))
	}
	fmt.Fprintf(stdout, "%s: ok: %s, %s, %s%s\n", path, count(len(cfg.Policies), "policy", "policies"),
		count(len(cfg.Providers), "provider", "providers"), count(len(cfg.Campaigns), "campaign", "campaigns"), api)
	if !connect {
		return nil
	}
	redis.SetLogger(quiet{}) // its pool's dial errors: the one that matters is returned
	if cfg.Redis.IsEmbedded() {
		fmt.Fprintf(stdout, "%s: redis: %s: the worker runs it in-process, nothing to connect to\n", path, cfg.Redis)
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	rdb, closeRedis, err := redisconn.Connect(ctx, cfg.Redis)
	if err != nil {
		fmt.Fprintf(stderr, "%s: redis: %v\n", path, err)
		return errReported
	}
	defer closeRedis()
	fmt.Fprintf(stdout, "%s: redis: ok: %s: %s\n", path, cfg.Redis, describe(ctx, rdb))
	return nil
}

// quiet is a go-redis logger that writes nothing.
type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

// count is "1 policy", "2 policies".
func count(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

// describe says what answered: the server's version, a cluster's masters,
// replicas and slots, and the user logged in as. The least-privilege ACL
// (config.yaml) denies INFO and ACL WHOAMI; then it says so.
func describe(ctx context.Context, rdb redis.UniversalClient) string {
	var parts []string
	if info, err := rdb.Info(ctx, "server").Result(); err == nil {
		parts = append(parts, "Redis "+infoField(info, "redis_version"))
	} else {
		parts = append(parts, "version unknown (INFO: "+firstWord(err)+")")
	}
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		parts = append(parts, clusterShape(ctx, cc))
	} else {
		parts = append(parts, "standalone")
	}
	if who, err := rdb.Do(ctx, "acl", "whoami").Text(); err == nil {
		parts = append(parts, "user "+who)
	} else {
		parts = append(parts, "user unknown (ACL WHOAMI: "+firstWord(err)+")")
	}
	return strings.Join(parts, ", ")
}

// clusterShape counts a cluster's masters and replicas and the slots they
// serve, as CLUSTER SLOTS reports them.
func clusterShape(ctx context.Context, cc *redis.ClusterClient) string {
	//lint:ignore SA1019 go-redis routes by CLUSTER SLOTS: the check reports the map the client will use.
	slots, err := cc.ClusterSlots(ctx).Result()
	if err != nil {
		return "cluster (CLUSTER SLOTS: " + firstWord(err) + ")"
	}
	masters, replicas, covered := map[string]bool{}, map[string]bool{}, 0
	for _, s := range slots {
		covered += s.End - s.Start + 1
		for i, n := range s.Nodes {
			if i == 0 {
				masters[n.Addr] = true
			} else {
				replicas[n.Addr] = true
			}
		}
	}
	return fmt.Sprintf("cluster of %s and %s serving %d of 16384 slots",
		count(len(masters), "master", "masters"), count(len(replicas), "replica", "replicas"), covered)
}

// infoField returns the value of name in an INFO reply, or "?".
func infoField(info, name string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return "?"
}

// firstWord is the error code of a Redis error reply (NOPERM), or the
// whole error.
func firstWord(err error) string {
	msg := err.Error()
	if code, _, ok := strings.Cut(msg, " "); ok && code == strings.ToUpper(code) {
		return code
	}
	return msg
}
