// Command httpserver is a runnable example of hybridlimit's HTTP
// middleware: a small server whose every route is rate-limited per client
// IP (or per API key), with the RateLimit headers on every response, a 429
// problem+json on denial, and a /stats endpoint showing the limiter's
// statistics. With -redis it runs in ModeAsync (or ModeSynchronous with
// -sync=0) against that Redis, so several instances share their quotas;
// without it, in ModeLocal.
//
//	go run ./examples/httpserver -rules 5/10s,20/1m     # one instance, ModeLocal, on :8080
//	curl -i localhost:8080/hello
//
// Two instances sharing their quotas through Redis:
//
//	go run ./examples/httpserver -redis 127.0.0.1:6379 -listen :8080
//	go run ./examples/httpserver -redis 127.0.0.1:6379 -listen :8081
//	curl -i localhost:8080/hello; curl -i localhost:8081/hello
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybridlimit"
	"github.com/hybridlimit/hybridlimit/httplimit"
	"github.com/hybridlimit/hybridlimit/store"
)

// config is the command line.
type config struct {
	listen     string
	redisAddr  string
	rules      string
	syncRate   time.Duration
	prefix     string
	trust      string
	keyHeader  string
	shadow     bool
	failClosed bool
}

func main() {
	var c config
	flag.StringVar(&c.listen, "listen", ":8080", "address to listen on")
	flag.StringVar(&c.redisAddr, "redis", "", "Redis address (host:port); empty runs in local mode, one node only")
	flag.StringVar(&c.rules, "rules", "10/1m", "comma-separated rules, limit/window, e.g. 5/1s,100/1m (append :fixed for a fixed window)")
	flag.DurationVar(&c.syncRate, "sync", 100*time.Millisecond, "with -redis: async sync period; 0 decides every request in Redis (synchronous mode)")
	flag.StringVar(&c.prefix, "prefix", "example", "with -redis: counter key prefix")
	flag.StringVar(&c.trust, "trust", "", "comma-separated CIDRs of trusted reverse proxies, whose X-Forwarded-For is believed")
	flag.StringVar(&c.keyHeader, "key-header", "", "key on this request header (an API key) instead of the client IP")
	flag.BoolVar(&c.shadow, "shadow", false, "shadow mode: report, never block")
	flag.BoolVar(&c.failClosed, "fail-closed", false, "deny while Redis is unreachable (default: keep deciding locally)")
	flag.Parse()

	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(c, log); err != nil {
		log.Error("httpserver", "err", err)
		os.Exit(1)
	}
}

func run(c config, log *slog.Logger) error {
	l, h, err := newServer(c, log)
	if err != nil {
		return err
	}
	srv := &http.Server{Addr: c.listen, Handler: h, ReadHeaderTimeout: 5 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	log.Info("listening", "addr", c.listen, "mode", l.Mode(), "rules", c.rules)
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err = srv.Shutdown(shutdown)
	// Close pushes what this node admitted since its last sync; then the
	// store's own connections and the Redis client can go.
	err = errors.Join(err, l.Close(shutdown))
	for _, c := range closers {
		err = errors.Join(err, c())
	}
	return err
}

// closers close what newServer opened for Redis, after the limiter.
var closers []func() error

// newServer builds the limiter and the rate-limited handler.
func newServer(c config, log *slog.Logger) (*hybridlimit.Limiter, http.Handler, error) {
	rules, err := parseRules(c.rules)
	if err != nil {
		return nil, nil, err
	}
	cfg := hybridlimit.Config{Rules: rules, Logger: log}
	if c.failClosed {
		cfg.FailurePolicy = hybridlimit.FailClosed
	}
	if c.redisAddr != "" {
		rdb := redis.NewClient(&redis.Options{Addr: c.redisAddr, ContextTimeoutEnabled: true})
		st, err := store.NewRedis(rdb, store.RedisOptions{})
		if err != nil {
			_ = rdb.Close()
			return nil, nil, err
		}
		closers = append(closers, rdb.Close)
		cfg.Store, cfg.Prefix = st, c.prefix
		cfg.Mode, cfg.SyncRate = hybridlimit.ModeAsync, c.syncRate
		if c.syncRate == 0 {
			cfg.Mode = hybridlimit.ModeSynchronous
		}
	}
	l, err := hybridlimit.New(cfg)
	if err != nil {
		return nil, nil, err
	}
	var key httplimit.KeyFunc
	if c.keyHeader != "" {
		if key, err = httplimit.Header(c.keyHeader); err != nil {
			return nil, nil, err
		}
	} else {
		trusted, err := httplimit.ParsePrefixes(c.trust)
		if err != nil {
			return nil, nil, err
		}
		if key, err = httplimit.ClientIP(httplimit.IPOptions{TrustedProxies: trusted}); err != nil {
			return nil, nil, err
		}
	}
	mw, err := httplimit.New(l, key, httplimit.Options{
		Shadow: c.shadow,
		OnDenied: func(r *http.Request, key string, res hybridlimit.Result) {
			log.Debug("denied", "key", key, "path", r.URL.Path, "retry_after", res.RetryAfter, "shadow", c.shadow)
		},
	})
	if err != nil {
		return nil, nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /hello", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "hello")
	})
	limited := mw.Wrap(mux)
	root := http.NewServeMux()
	// /stats is not rate-limited: monitoring must see an overloaded node.
	root.HandleFunc("GET /stats", func(w http.ResponseWriter, r *http.Request) {
		s := l.Stats()
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(map[string]any{
			"mode": l.Mode().String(), "allowed": s.Allowed, "denied": s.Denied, "degraded": s.Degraded,
			"keys": s.Keys, "evicted": s.Evicted, "pending": s.Pending, "sync_cycles": s.SyncCycles,
			"sync_errors": s.SyncErrors, "last_sync_latency": s.LastSyncLatency.String(), "store_failing": s.StoreFailing,
		})
	})
	root.Handle("/", limited)
	return l, root, nil
}

// parseRules parses "5/1s,100/1m:fixed".
func parseRules(s string) ([]hybridlimit.Rule, error) {
	var rules []hybridlimit.Rule
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		var r hybridlimit.Rule
		if rest, ok := strings.CutSuffix(f, ":fixed"); ok {
			f, r.Type = rest, hybridlimit.Fixed
		}
		limit, window, ok := strings.Cut(f, "/")
		if !ok {
			return nil, fmt.Errorf("rule %q: want limit/window, e.g. 100/1m", f)
		}
		var err error
		if r.Limit, err = strconv.ParseInt(limit, 10, 64); err != nil {
			return nil, fmt.Errorf("rule %q: limit: %w", f, err)
		}
		if r.Window, err = time.ParseDuration(window); err != nil {
			return nil, fmt.Errorf("rule %q: window: %w", f, err)
		}
		rules = append(rules, r)
	}
	return rules, nil
}
