package prom_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit"
	"github.com/hybridlimit/hybridlimit/prom"
	"github.com/hybridlimit/hybridlimit/store"
)

func newAsync(t testing.TB, opts prom.Options) (*hybridlimit.Limiter, *prom.Collector) {
	mc := clock.NewMock()
	mc.Set(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	l, c, err := prom.NewLimiter(hybridlimit.Config{
		Rules:  []hybridlimit.Rule{{Limit: 2, Window: time.Minute}},
		Mode:   hybridlimit.ModeAsync,
		Store:  store.NewMemory(mc),
		Clock:  mc,
		Manual: true,
	}, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	return l, c
}

func TestCollector(t *testing.T) {
	l, c := newAsync(t, prom.Options{ConstLabels: prometheus.Labels{"limiter": "api"}})
	ctx := context.Background()
	for range 3 {
		_, err := l.Allow(ctx, "k")
		require.NoError(t, err)
	}
	_, err := l.Allow(ctx, "other")
	require.NoError(t, err)

	before := `
# HELP hybridlimit_decisions_total Decisions made (Peek excluded), by decision (allowed or denied).
# TYPE hybridlimit_decisions_total counter
hybridlimit_decisions_total{decision="allowed",limiter="api"} 3
hybridlimit_decisions_total{decision="denied",limiter="api"} 1
# HELP hybridlimit_keys Keys tracked in the local table.
# TYPE hybridlimit_keys gauge
hybridlimit_keys{limiter="api"} 2
# HELP hybridlimit_pending_increments Increments admitted locally and not yet acknowledged by the store.
# TYPE hybridlimit_pending_increments gauge
hybridlimit_pending_increments{limiter="api"} 3
# HELP hybridlimit_sync_cycles_total Sync cycles that had something to send, whether the store took it or not.
# TYPE hybridlimit_sync_cycles_total counter
hybridlimit_sync_cycles_total{limiter="api"} 0
# HELP hybridlimit_store_failing 1 when the last store call failed, 0 otherwise.
# TYPE hybridlimit_store_failing gauge
hybridlimit_store_failing{limiter="api"} 0
`
	names := []string{"hybridlimit_decisions_total", "hybridlimit_keys", "hybridlimit_pending_increments", "hybridlimit_sync_cycles_total", "hybridlimit_store_failing"}
	assert.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(before), names...))
	assert.Equal(t, [2]uint64{0, 0}, syncCounts(t, c, "hybridlimit"), "no cycle yet")

	require.NoError(t, l.Sync(ctx))
	after := strings.NewReplacer(
		`hybridlimit_pending_increments{limiter="api"} 3`, `hybridlimit_pending_increments{limiter="api"} 0`,
		`hybridlimit_sync_cycles_total{limiter="api"} 0`, `hybridlimit_sync_cycles_total{limiter="api"} 1`,
	).Replace(before)
	assert.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(after), names...))
	assert.Equal(t, [2]uint64{1, 0}, syncCounts(t, c, "hybridlimit"), "one cycle, ok")
	assert.Equal(t, 4.0, value(t, c, "hybridlimit_sync_ops_total"), "per key and rule, an INCRBY and, at the key's first sync on this node, a read of the previous window")

	c.ObserveSync(3*time.Second, 10, errors.New("down"))
	assert.Equal(t, [2]uint64{1, 1}, syncCounts(t, c, "hybridlimit"), "one ok, one error")

	problems, err := testutil.CollectAndLint(c)
	require.NoError(t, err)
	assert.Empty(t, problems)
}

// syncCounts returns the sample counts of the sync latency histogram's
// result="ok" and result="error" series.
func syncCounts(t *testing.T, c prometheus.Collector, ns string) (n [2]uint64) {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != ns+"_sync_duration_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				switch {
				case l.GetName() == "result" && l.GetValue() == "ok":
					n[0] = m.GetHistogram().GetSampleCount()
				case l.GetName() == "result" && l.GetValue() == "error":
					n[1] = m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	return n
}

// value gathers c and returns the value of the counter or gauge name.
func value(t *testing.T, c prometheus.Collector, name string) float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() == name {
			m := f.GetMetric()[0]
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

func TestCollectorWithoutLimiter(t *testing.T) {
	c := prom.NewCollector(prom.Options{Namespace: "x"})
	assert.Equal(t, 2, testutil.CollectAndCount(c), "the histogram's two series only")
	c.ObserveSync(time.Millisecond, 1, nil)
	assert.Equal(t, [2]uint64{1, 0}, syncCounts(t, c, "x"))
	reg := prometheus.NewPedanticRegistry()
	assert.NoError(t, reg.Register(c))
}

func TestNewLimiterErrors(t *testing.T) {
	_, _, err := prom.NewLimiter(hybridlimit.Config{}, prom.Options{})
	assert.ErrorContains(t, err, "prom: hybridlimit: Config.Rules has 0 rules")

	// An OnSync already set is kept, and runs before the collector's.
	var calls int
	mc := clock.NewMock()
	l, c, err := prom.NewLimiter(hybridlimit.Config{
		Rules: []hybridlimit.Rule{{Limit: 5, Window: time.Minute}}, Mode: hybridlimit.ModeAsync,
		Store: store.NewMemory(mc), Clock: mc, Manual: true,
		OnSync: func(time.Duration, int, error) { calls++ },
	}, prom.Options{})
	require.NoError(t, err)
	defer func() { _ = l.Close(context.Background()) }()
	_, _ = l.Allow(context.Background(), "k")
	require.NoError(t, l.Sync(context.Background()))
	assert.Equal(t, 1, calls)
	assert.Equal(t, [2]uint64{1, 0}, syncCounts(t, c, "hybridlimit"))
}

// Example wires a collector into an async limiter and registers it. In a
// server, expose the registry with promhttp.HandlerFor(reg,
// promhttp.HandlerOpts{}) on /metrics.
func Example() {
	mc := clock.NewMock() // a real server leaves Clock nil
	l, c, err := prom.NewLimiter(hybridlimit.Config{
		Rules:  []hybridlimit.Rule{{Limit: 100, Window: time.Minute}},
		Mode:   hybridlimit.ModeAsync,
		Store:  store.NewMemory(mc), // store.NewRedis(client) in production
		Clock:  mc,
		Manual: true, // the example syncs by hand; a server lets the loop run
	}, prom.Options{ConstLabels: prometheus.Labels{"limiter": "api"}})
	if err != nil {
		panic(err)
	}
	defer l.Close(context.Background())
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)

	for range 3 {
		_, _ = l.Allow(context.Background(), "client-1")
	}
	_ = l.Sync(context.Background()) // two store calls: the store's clock, then the push

	families, _ := reg.Gather()
	for _, f := range families {
		for _, m := range f.GetMetric() {
			switch f.GetType().String() {
			case "COUNTER":
				fmt.Println(f.GetName(), labels(m.GetLabel()), m.GetCounter().GetValue())
			case "GAUGE":
				if !strings.Contains(f.GetName(), "seconds") { // timings vary
					fmt.Println(f.GetName(), labels(m.GetLabel()), m.GetGauge().GetValue())
				}
			case "HISTOGRAM":
				fmt.Println(f.GetName(), labels(m.GetLabel()), "count", m.GetHistogram().GetSampleCount())
			}
		}
	}
	// Output:
	// hybridlimit_blocked_decisions_total limiter=api 0
	// hybridlimit_decisions_total decision=allowed,limiter=api 3
	// hybridlimit_decisions_total decision=denied,limiter=api 0
	// hybridlimit_degraded_decisions_total limiter=api 0
	// hybridlimit_dropped_increments_total limiter=api 0
	// hybridlimit_evicted_keys_total limiter=api 0
	// hybridlimit_keys limiter=api 1
	// hybridlimit_overflow_decisions_total limiter=api 0
	// hybridlimit_pending_increments limiter=api 0
	// hybridlimit_store_calls_total limiter=api 2
	// hybridlimit_store_errors_total limiter=api 0
	// hybridlimit_store_failing limiter=api 0
	// hybridlimit_sync_batches_in_doubt limiter=api 0
	// hybridlimit_sync_cycle_keys limiter=api 1
	// hybridlimit_sync_cycles_total limiter=api 1
	// hybridlimit_sync_duration_seconds limiter=api,result=error count 0
	// hybridlimit_sync_duration_seconds limiter=api,result=ok count 1
	// hybridlimit_sync_ops_total limiter=api 2
}

func labels(ls []*dto.LabelPair) string {
	var parts []string
	for _, l := range ls {
		parts = append(parts, l.GetName()+"="+l.GetValue())
	}
	return strings.Join(parts, ",")
}

// NewLimiter returns an error, not a panic, for Options that
// NewCollector panics on (as prometheus.NewHistogramVec does), and creates
// no limiter then.
func TestNewLimiterInvalidOptions(t *testing.T) {
	cfg := hybridlimit.Config{Rules: []hybridlimit.Rule{{Limit: 5, Window: time.Minute}}}
	for _, c := range []struct {
		opts prom.Options
		want string
	}{
		{prom.Options{Buckets: []float64{2, 1}}, "prom: Options.Buckets[1] is 1, want above Buckets[0] (2): increasing upper bounds"},
		{prom.Options{Buckets: []float64{1, 1}}, "prom: Options.Buckets[1] is 1, want above Buckets[0] (1): increasing upper bounds"},
		{prom.Options{Buckets: []float64{1, math.NaN()}}, "prom: Options.Buckets[1] is NaN, want a number"},
		{prom.Options{ConstLabels: prometheus.Labels{"le": "x"}}, `prom: Options.ConstLabels has "le", want another name: the histogram's bucket label`},
	} {
		var err error
		require.NotPanics(t, func() { _, _, err = prom.NewLimiter(cfg, c.opts) }, "%+v", c.opts)
		assert.EqualError(t, err, c.want)
	}
	// The implicit +Inf bucket may be given, and the empty list is valid.
	for _, b := range [][]float64{{0.1, math.Inf(1)}, {}} {
		l, _, err := prom.NewLimiter(cfg, prom.Options{Buckets: b})
		require.NoError(t, err, "%v", b)
		require.NoError(t, l.Close(context.Background()))
	}
}
