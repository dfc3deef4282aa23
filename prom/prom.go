// Package prom exposes a hybridlimit.Limiter's statistics to Prometheus: a
// prometheus.Collector that reads Limiter.Stats on every scrape (decisions,
// keys, evictions, pending increments, sync cycles and errors, store state)
// and a histogram of sync round-trip latencies fed by Config.OnSync.
//
// It lives in a module of its own (github.com/hybridlimit/hybridlimit/prom)
// so that the limiter's module does not depend on client_golang.
//
// Wiring, by hand:
//
//	c := prom.NewCollector(prom.Options{})
//	cfg.OnSync = c.ObserveSync
//	l, err := hybridlimit.New(cfg)
//	c.SetLimiter(l)
//	prometheus.MustRegister(c)
//
// or in one call with NewLimiter.
package prom

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"time"
	"weak"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hybridlimit/hybridlimit"
)

// DefaultBuckets are the sync latency histogram's buckets, in seconds:
// 100µs to 2.5s, for round trips to a Redis on the same host (≈ 0.1–1 ms)
// up to a slow or failing one (bounded by Config.StoreTimeout).
var DefaultBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}

// Options configures a Collector. The zero value names the metrics
// hybridlimit_* with the default buckets and no constant labels.
type Options struct {
	// Namespace prefixes every metric name; default "hybridlimit".
	Namespace string
	// ConstLabels are added to every metric: set one (for example
	// limiter="api") to register collectors of several limiters in one
	// registry.
	ConstLabels prometheus.Labels
	// Buckets are the sync latency histogram's upper bounds in seconds;
	// nil means DefaultBuckets.
	Buckets []float64
}

// Collector is a prometheus.Collector for one Limiter at a time. Create one
// with NewCollector; the zero value is not usable. It is safe for
// concurrent use: ObserveSync runs on the limiter's sync loop while scrapes
// call Collect.
type Collector struct {
	mu    sync.Mutex // guards the fields up to seen, and Stats reads
	l     *hybridlimit.Limiter
	base  counts // what the limiters set before l added
	start counts // l's counts when it was set again (zero the first time)
	seen  map[weak.Pointer[hybridlimit.Limiter]]struct{}

	latency *prometheus.HistogramVec
	ok, bad prometheus.Observer

	decisions, degraded, overflow, keys, evicted, pending, dropped *prometheus.Desc
	cycles, errors, calls, pushed, lastLatency, failing, offset    *prometheus.Desc
	period, cycleTime, cycleKeys, inDoubt                          *prometheus.Desc
	blocked                                                        *prometheus.Desc
}

// NewCollector returns a collector without a limiter: wire its ObserveSync
// into Config.OnSync, create the limiter, then call SetLimiter. Until
// then it exports the histogram only. It panics on invalid Buckets or a
// constant label named "le", like prometheus.NewHistogramVec (NewLimiter
// returns an error for them instead); other
// invalid ConstLabels (names or values Prometheus refuses) make Register
// fail, and Collect sends metrics whose Write returns the error.
func NewCollector(opts Options) *Collector {
	ns := opts.Namespace
	if ns == "" {
		ns = "hybridlimit"
	}
	buckets := opts.Buckets
	if buckets == nil {
		buckets = DefaultBuckets
	}
	c := &Collector{
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace:   ns,
			Name:        "sync_duration_seconds",
			Help:        "Round-trip time of sync pushes to the store (one per tier and 4096 keys of a cycle), by result (ok or error).",
			Buckets:     buckets,
			ConstLabels: opts.ConstLabels,
		}, []string{"result"}),
	}
	c.ok = c.latency.WithLabelValues("ok")
	c.bad = c.latency.WithLabelValues("error")
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(ns, "", name), help, labels, opts.ConstLabels)
	}
	c.decisions = d("decisions_total", "Decisions made (Peek excluded), by decision (allowed or denied).", "decision")
	c.degraded = d("degraded_decisions_total", "Decisions (Peek excluded) made by the failure policy because the store failed.")
	c.overflow = d("overflow_decisions_total", "Decisions on new keys while the key table was full (MaxKeys).")
	c.blocked = d("blocked_decisions_total", "Denials of blocked keys (Limiter.Block, Config.Ban); decisions_total counts them as denied too.")
	c.keys = d("keys", "Keys tracked in the local table.")
	c.evicted = d("evicted_keys_total", "Keys removed from the local table after being idle.")
	c.pending = d("pending_increments", "Increments admitted locally and not yet acknowledged by the store.")
	c.dropped = d("dropped_increments_total", "Increments discarded unpushed because their window could no longer influence a decision and the store had not taken them.")
	c.cycles = d("sync_cycles_total", "Sync cycles that had something to send, whether the store took it or not.")
	c.errors = d("store_errors_total", "Store errors: failed sync pushes, probes and clock reads, synchronous decisions the store did not decide, failed policy reloads.")
	c.calls = d("store_calls_total", "Round trips to the store: sync pushes, probes, clock reads and batches of synchronous decisions.")
	c.pushed = d("sync_ops_total", "Counter operations the store applied for sync cycles.")
	c.lastLatency = d("last_sync_duration_seconds", "Round-trip time of the last successful sync push.")
	c.failing = d("store_failing", "1 when the last store call failed, 0 otherwise.")
	c.offset = d("clock_offset_seconds", "The store's clock minus this node's clock, as last measured.")
	c.period = d("sync_period_seconds", "Time between the starts of the last two sync cycles: the configured SyncRate while the loop keeps up, more when it lags or backs off.")
	c.cycleTime = d("sync_cycle_seconds", "Duration of the last sync cycle (taking, pushing and settling every touched key).")
	c.cycleKeys = d("sync_cycle_keys", "Keys the last sync cycle handled.")
	c.inDoubt = d("sync_batches_in_doubt", "Batches sent to the store whose answer was lost; they are sent again until the store answers.")
	return c
}

// SetLimiter sets the limiter whose Stats the collector exports. It may
// replace a limiter (one rebuilt on a configuration change, say): the
// counters then carry on from the values they had, adding what the new
// limiter counts, so that they never go down. A limiter set for the first
// time adds its whole history; one set again adds only what it counts from
// then on. What the replaced limiter counts after SetLimiter is not
// exported: close it first. The gauges describe the limiter set.
func (c *Collector) SetLimiter(l *hybridlimit.Limiter) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if l == c.l {
		return
	}
	if c.l != nil {
		now := countsOf(c.l.Stats())
		for i := range c.base {
			c.base[i] += now[i] - c.start[i]
		}
	}
	c.l, c.start = l, counts{}
	if l == nil {
		return
	}
	w := weak.Make(l)
	if _, ok := c.seen[w]; ok {
		c.start = countsOf(l.Stats())
	}
	if c.seen == nil {
		c.seen = map[weak.Pointer[hybridlimit.Limiter]]struct{}{}
	}
	c.seen[w] = struct{}{}
}

// counts are the counters of a Stats, in the order countsOf gives them.
type counts [11]uint64

// countsOf returns the counters of s.
func countsOf(s hybridlimit.Stats) counts {
	return counts{s.Allowed, s.Denied, s.Degraded, s.Overflow, s.Blocked, s.Evicted, s.Dropped,
		s.SyncCycles, s.SyncErrors, s.StoreCalls, s.KeysPushed}
}

// ObserveSync records one push of a sync cycle in the latency histogram. Its
// signature is Config.OnSync's: assign it there. It does not block.
func (c *Collector) ObserveSync(latency time.Duration, ops int, err error) {
	if err != nil {
		c.bad.Observe(latency.Seconds())
		return
	}
	c.ok.Observe(latency.Seconds())
}

// NewLimiter creates a limiter from cfg with a collector wired in: the
// collector's ObserveSync is chained after any cfg.OnSync. Register the
// collector with a prometheus.Registerer. Where NewCollector panics
// (Buckets not increasing, a constant label named "le"), NewLimiter
// returns an error naming the field and creates no limiter.
func NewLimiter(cfg hybridlimit.Config, opts Options) (*hybridlimit.Limiter, *Collector, error) {
	if err := checkHistogram(opts); err != nil {
		return nil, nil, err
	}
	c := NewCollector(opts)
	if prev := cfg.OnSync; prev != nil {
		cfg.OnSync = func(latency time.Duration, ops int, err error) {
			prev(latency, ops, err)
			c.ObserveSync(latency, ops, err)
		}
	} else {
		cfg.OnSync = c.ObserveSync
	}
	l, err := hybridlimit.New(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("prom: %w", err)
	}
	c.SetLimiter(l)
	return l, c, nil
}

// checkHistogram returns an error for the Options prometheus.NewHistogramVec
// panics on: upper bounds that do not increase (NaN among them) and a
// constant label named "le", the bucket label.
func checkHistogram(opts Options) error {
	if _, ok := opts.ConstLabels["le"]; ok {
		return errors.New(`prom: Options.ConstLabels has "le", want another name: the histogram's bucket label`)
	}
	for i, b := range opts.Buckets {
		switch {
		case math.IsNaN(b):
			return fmt.Errorf("prom: Options.Buckets[%d] is NaN, want a number", i)
		case i > 0 && b <= opts.Buckets[i-1]:
			return fmt.Errorf("prom: Options.Buckets[%d] is %v, want above Buckets[%d] (%v): increasing upper bounds", i, b, i-1, opts.Buckets[i-1])
		}
	}
	return nil
}

// Describe sends the descriptors of every metric the collector exports.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.decisions, c.degraded, c.overflow, c.keys, c.evicted, c.pending, c.dropped,
		c.cycles, c.errors, c.calls, c.pushed, c.lastLatency, c.failing, c.offset,
		c.period, c.cycleTime, c.cycleKeys, c.inDoubt, c.blocked} {
		ch <- d
	}
	c.latency.Describe(ch)
}

// Collect reads the limiter's Stats once and sends every metric. It does
// not panic.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.latency.Collect(ch)
	c.mu.Lock()
	l := c.l
	if l == nil {
		c.mu.Unlock()
		return
	}
	s := l.Stats()
	n := countsOf(s)
	for i := range n {
		n[i] = c.base[i] + n[i] - c.start[i]
	}
	c.mu.Unlock()
	send := func(d *prometheus.Desc, t prometheus.ValueType, v float64, labels ...string) {
		m, err := prometheus.NewConstMetric(d, t, v, labels...)
		if err != nil { // invalid Options.ConstLabels: Register fails too
			m = prometheus.NewInvalidMetric(d, err)
		}
		ch <- m
	}
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		send(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v float64) {
		send(d, prometheus.GaugeValue, v)
	}
	counter(c.decisions, n[0], "allowed")
	counter(c.decisions, n[1], "denied")
	counter(c.degraded, n[2])
	counter(c.overflow, n[3])
	counter(c.blocked, n[4])
	gauge(c.keys, float64(s.Keys))
	counter(c.evicted, n[5])
	gauge(c.pending, float64(s.Pending))
	counter(c.dropped, n[6])
	counter(c.cycles, n[7])
	counter(c.errors, n[8])
	counter(c.calls, n[9])
	counter(c.pushed, n[10])
	gauge(c.lastLatency, s.LastSyncLatency.Seconds())
	failing := 0.0
	if s.StoreFailing {
		failing = 1
	}
	gauge(c.failing, failing)
	gauge(c.offset, s.ClockOffset.Seconds())
	gauge(c.period, s.SyncPeriod.Seconds())
	gauge(c.cycleTime, s.SyncCycleTime.Seconds())
	gauge(c.cycleKeys, float64(s.SyncCycleKeys))
	gauge(c.inDoubt, float64(s.InDoubt))
}
