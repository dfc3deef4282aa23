// Command sim runs N real hybridlimit limiters sharing one store, in
// virtual time, beside an exact reference limiter fed the same requests,
// and reports what each mode and sync rate costs in accuracy and in store
// calls. Run it with no flags for the default scenario; see -h and
// docs/simulation.md.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybridlimit/store"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is the whole program: it returns the exit status, 0 on success, 2 for
// a bad command line, 1 for a failed run (or a trace it cannot read).
func run(args []string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	var ue *usageError
	if errors.As(err, &ue) {
		fmt.Fprintf(stderr, "sim: %v\nrun 'go run ./sim -h' for the flags\n", err)
		return 2
	}
	if err == nil && o.WriteTrace != "" {
		err = writeTrace(o, stderr)
		if err == nil {
			return 0
		}
	}
	if err == nil && o.HasTarget {
		err = runTarget(o, stdout, stderr)
		if err == nil {
			return 0
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "sim: %v\n", err)
		return 1
	}
	reports, err := simulate(o, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "sim: %v\n", err)
		return 1
	}
	if o.JSON {
		err = writeJSON(stdout, reports)
	} else {
		err = writeTable(stdout, o, reports)
		if err == nil && o.Small && o.Trace == "" && !o.Realtime {
			err = writeSmall(stdout, o, stderr)
		}
	}
	if err == nil && o.Plot != "" {
		err = writePlot(o.Plot, o, reports)
		if err == nil && !o.Quiet {
			fmt.Fprintf(stderr, "sim: chart written to %s\n", o.Plot)
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "sim: %v\n", err)
		return 1
	}
	return 0
}

// simulate runs every configuration of o and returns their reports in the
// order of -modes.
func simulate(o *options, stderr io.Writer) ([]*report, error) {
	return runModes(o, o.Modes, "", stderr)
}

// runModes runs the configurations modes of o and returns their reports in
// that order. tag tells the store keys of one call from another's.
func runModes(o *options, modes []modeSpec, tag string, stderr io.Writer) ([]*report, error) {
	var rdb *redis.Client
	if o.Redis != "" {
		rdb = redis.NewClient(&redis.Options{Addr: o.Redis, PoolSize: 64})
		defer rdb.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err := rdb.Ping(ctx).Err()
		cancel()
		if err != nil {
			return nil, fmt.Errorf("redis at %s does not answer: %w", o.Redis, err)
		}
	}
	if o.Realtime {
		return runRealtime(o, rdb, stderr)
	}
	runID := o.Prefix
	if runID == "" {
		var b [4]byte
		_, _ = rand.Read(b[:])
		runID = "sim_" + hex.EncodeToString(b[:])
	}
	runID += tag
	e := env{start: virtualStart}
	if rdb != nil {
		// Redis expires counters on its own clock: start virtual time at
		// the real present, aligned to the longest window.
		var longest time.Duration
		for _, r := range o.Rules {
			longest = max(longest, r.Window)
		}
		e.start = time.Now().Truncate(longest)
	}
	reports := make([]*report, len(modes))
	errs := make([]error, len(modes))
	prog := newProgress(o, modes, stderr)
	// Configurations are independent (own store, own clock): run them in
	// parallel, one per core.
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	var wg sync.WaitGroup
	for i, m := range modes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			ce := e
			ce.newStore = func(c *vclock) (store.Store, string, error) {
				pfx := fmt.Sprintf("%s_%d", runID, i)
				if rdb != nil {
					s, err := store.NewRedis(rdb, store.RedisOptions{})
					return s, pfx, err
				}
				return store.NewMemory(c), pfx, nil
			}
			ce.progress = func(d time.Duration) { prog.update(i, d) }
			t0 := time.Now()
			reports[i], errs[i] = runConfig(o, m, ce)
			prog.done(i, time.Since(t0))
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("%v: %w", modes[i], err)
		}
	}
	return reports, nil
}

// progress reports on stderr, at most once a second, how far each
// configuration has come.
type progress struct {
	o     *options
	modes []modeSpec
	w     io.Writer
	mu    sync.Mutex
	at    []time.Duration
	last  time.Time
	t0    time.Time
}

func newProgress(o *options, modes []modeSpec, w io.Writer) *progress {
	now := time.Now()
	return &progress{o: o, modes: modes, w: w, at: make([]time.Duration, len(modes)), last: now, t0: now}
}

func (p *progress) update(i int, d time.Duration) {
	if p.o.Quiet {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.at[i] = d
	if time.Since(p.last) < time.Second {
		return
	}
	p.last = time.Now()
	fmt.Fprintf(p.w, "sim: %.0fs:", time.Since(p.t0).Seconds())
	for j, m := range p.modes {
		fmt.Fprintf(p.w, " %v %.0f%%", m, 100*p.at[j].Seconds()/p.o.Duration.Seconds())
	}
	fmt.Fprintln(p.w)
}

func (p *progress) done(i int, took time.Duration) {
	if p.o.Quiet {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.at[i] = p.o.Duration
	fmt.Fprintf(p.w, "sim: %v done in %.2fs\n", p.modes[i], took.Seconds())
}
