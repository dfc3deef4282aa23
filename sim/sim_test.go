package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
	"github.com/hybridlimit/hybridlimit/store"
)

// runJSON runs the program with args plus -json -quiet and returns its
// reports.
func runJSON(t *testing.T, args ...string) ([]map[string]any, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(append(args, "-json", "-quiet"), &out, &errb)
	require.Equal(t, 0, code, "stderr: %s", errb.String())
	var reps []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m), line)
		reps = append(reps, m)
	}
	return reps, out.String()
}

func TestDeterminism(t *testing.T) {
	args := []string{"-duration", "4s", "-nodes", "4", "-rate", "1500", "-modes", "local,sync,async:50ms", "-pattern", "zipf", "-keys", "50", "-skew", "50ms", "-outage", "2s+1s", "-store-latency", "3ms", "-churn", "1@1s+2s", "-seed", "7"}
	_, a := runJSON(t, args...)
	_, b := runJSON(t, args...)
	assert.Equal(t, a, b)
	_, c := runJSON(t, append(args[:len(args)-1], "8")...)
	assert.NotEqual(t, a, c, "another seed gives other traffic")
}

func TestJSONFields(t *testing.T) {
	reps, _ := runJSON(t, "-duration", "2s", "-nodes", "2", "-rate", "500", "-modes", "async:100ms")
	require.Len(t, reps, 1)
	for _, f := range []string{"nodes", "mode", "sync_rate_ms", "pattern", "limit", "window_ms", "requests", "admitted", "ideal", "overshoot_pct", "false_deny_pct", "peak_window_ratio", "store_calls"} {
		assert.Contains(t, reps[0], f)
	}
	assert.Equal(t, "async", reps[0]["mode"])
	assert.Equal(t, 100.0, reps[0]["sync_rate_ms"])
	assert.Equal(t, 2.0, reps[0]["nodes"])
}

// One node deciding every request in the store is the exact limiter.
func TestOneNodeSynchronousIsExact(t *testing.T) {
	for _, pattern := range []string{"steady", "burst", "zipf"} {
		t.Run(pattern, func(t *testing.T) {
			reps, _ := runJSON(t, "-nodes", "1", "-duration", "10s", "-rules", "100/1s,500/10s", "-pattern", pattern, "-keys", "5", "-overload", "3", "-modes", "sync")
			r := reps[0]
			assert.Equal(t, r["ideal"], r["admitted"])
			assert.Equal(t, 0.0, r["overshoot_pct"])
			// The store decides on microseconds (TakeRequest.NowUs), the
			// reference on nanoseconds: a request within a microsecond of
			// a weight change could go the other way.
			assert.Less(t, r["false_deny_pct"], 0.1)
		})
	}
}

// N nodes on local counters, round robin, under steady overload of more
// than N times the limit, admit about N times the limit.
func TestLocalModeAdmitsNTimesLimit(t *testing.T) {
	const nodes = 4
	reps, _ := runJSON(t, "-nodes", "4", "-duration", "20s", "-rules", "100/1s", "-keys", "1", "-overload", "10", "-modes", "local")
	r := reps[0]
	admitted, ideal := r["admitted"].(float64), r["ideal"].(float64)
	assert.InDelta(t, nodes*ideal, admitted, 0.02*nodes*ideal)
	assert.InDelta(t, nodes, r["peak_window_ratio"].(float64), 0.2)
}

// Under the limit nothing is denied by the store-backed modes.
func TestUnderLimitNoFalseDenials(t *testing.T) {
	reps, _ := runJSON(t, "-nodes", "3", "-duration", "10s", "-pattern", "under", "-overload", "0.5", "-rules", "100/1s", "-modes", "sync,async:100ms")
	for _, r := range reps {
		assert.Equal(t, r["requests"], r["ideal"], r["mode"])
		assert.Equal(t, 0.0, r["false_deny_pct"], r["mode"])
	}
}

// Faster syncs cost more store calls and overshoot less.
func TestSyncRateTradeoff(t *testing.T) {
	reps, _ := runJSON(t, "-nodes", "5", "-duration", "10s", "-rules", "100/1s", "-keys", "3", "-modes", "async:10ms,async:1s")
	fast, slow := reps[0], reps[1]
	assert.Greater(t, fast["store_calls"].(float64), 10*slow["store_calls"].(float64))
	assert.Less(t, fast["overshoot_pct"].(float64), slow["overshoot_pct"].(float64))
	assert.Greater(t, slow["overshoot_pct"].(float64), 0.0)
}

// During an outage fail-closed nodes deny everything, fail-open ones keep
// admitting.
func TestOutage(t *testing.T) {
	args := []string{"-nodes", "2", "-duration", "10s", "-rules", "100/1s", "-keys", "1", "-modes", "async:100ms", "-outage", "2s+5s"}
	open, _ := runJSON(t, args...)
	closed, _ := runJSON(t, append(args, "-fail-closed")...)
	assert.Greater(t, open[0]["store_failures"].(float64), 0.0)
	assert.Less(t, closed[0]["admitted"].(float64), open[0]["admitted"].(float64))
	assert.Greater(t, closed[0]["degraded"].(float64), 0.0)
}

func TestRunWritesPlot(t *testing.T) {
	for _, ext := range []string{"svg", "png"} {
		file := filepath.Join(t.TempDir(), "c."+ext)
		var out, errb bytes.Buffer
		code := run([]string{"-duration", "2s", "-nodes", "2", "-rate", "200", "-modes", "local,sync,async:10ms,async:100ms", "-plot", file, "-quiet"}, &out, &errb)
		require.Equal(t, 0, code, errb.String())
		st, err := os.Stat(file)
		require.NoError(t, err)
		assert.Greater(t, st.Size(), int64(1000))
		assert.Contains(t, out.String(), "async:100ms")
	}
}

func TestPerNode(t *testing.T) {
	reps, _ := runJSON(t, "-duration", "3s", "-nodes", "3", "-rate", "300", "-pattern", "sticky", "-modes", "async:100ms", "-per-node")
	nodes := reps[0]["per_node"].([]any)
	require.Len(t, nodes, 3)
	first := nodes[0].(map[string]any)
	last := nodes[2].(map[string]any)
	sum := first["admitted"].(float64) + first["denied"].(float64)
	assert.Greater(t, sum, last["admitted"].(float64)+last["denied"].(float64), "sticky: node 0 gets the most traffic")
}

func TestBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-nodes", "0"}, "-nodes is 0, want 1 to 1000"},
		{[]string{"-nodes", "x"}, "invalid value"},
		{[]string{"-modes", "async"}, `"async" needs a sync rate`},
		{[]string{"-modes", "async:0s"}, "not a duration from 1ms to 1h"},
		{[]string{"-modes", "turbo"}, `"turbo" is not local, sync, async:RATE or naive:RATE`},
		{[]string{"-modes", "sync:10ms"}, "takes no argument"},
		{[]string{"-rules", "100"}, "is not LIMIT/WINDOW"},
		{[]string{"-rules", "0/1s"}, "limit \"0\""},
		{[]string{"-rules", "10/1.5ms"}, "whole number of milliseconds"},
		{[]string{"-rules", "10/1s,20/1s"}, "counts like Config.Rules[0]"},
		{[]string{"-rules", "10/1s:odd"}, "is not one of sliding, fixed, log"},
		{[]string{"-rules", "10/1s:buckets"}, "needs buckets=N"},
		{[]string{"-rules", "10/1s:buckets=7"}, "does not divide Window 1s"},
		{[]string{"-rules", "10/1s:log=3"}, "takes no argument"},
		{[]string{"-pattern", "wave"}, `-pattern "wave" is not one of`},
		{[]string{"-outage", "20s"}, "is not START+LEN"},
		{[]string{"-outage", "20s+-1s"}, "LEN a duration > 0"},
		{[]string{"-churn", "10@1s+1s"}, "takes 10 of 10 nodes away"},
		{[]string{"-churn", "x@1s+1s"}, "K must be a whole number"},
		{[]string{"-outage", "100s+1s", "-duration", "3s"}, "-outage starts at 1m40s, want before the end of -duration (3s)"},
		{[]string{"-churn", "3@5s+1s", "-duration", "3s"}, "-churn starts at 5s, want before the end of -duration (3s)"},
		{[]string{"-keys", "0"}, "-keys is 0, want 1 to 10000000"},
		{[]string{"-overload", "0"}, "-overload is 0, want more than 0, at most 1000"},
		{[]string{"-overload", "1000", "-keys", "10000000", "-rules", "1000000/1s"}, "-overload 1000 × -keys 10000000 × the tightest rule's 1e+06 per second is 1e+16 requests per second, want at most 1e7: give -rate"},
		{[]string{"-realtime"}, "-realtime needs -redis ADDR"},
		{[]string{"-realtime", "-redis", "x:1", "-outage", "1s+1s"}, "-outage is not available with -realtime"},
		{[]string{"-redis", "x:1", "-store-latency", "1ms"}, "-store-latency simulates"},
		{[]string{"-plot", "chart.jpg"}, "must end in .svg or .png"},
		{[]string{"-duration", "0s"}, "-duration is 0s"},
		{[]string{"-zipf", "1"}, "-zipf is 1"},
		{[]string{"-rate", "-5"}, "-rate is -5"},
		{[]string{"-prefix", "a:b"}, "-prefix"},
		{[]string{"extra"}, `unexpected argument "extra"`},
		{[]string{"-spread", "random"}, `-spread "random" is not one of rr, hash`},
		{[]string{"-pattern", "sticky", "-spread", "hash"}, "-spread is not available with -pattern sticky"},
		{[]string{"-trace", "t.csv", "-pattern", "zipf"}, "-pattern is not available with -trace: the trace is the traffic"},
		{[]string{"-trace", "t.csv", "-rate", "10"}, "-rate is not available with -trace"},
		{[]string{"-trace", "t.csv", "-keys", "10"}, "-keys is not available with -trace"},
		{[]string{"-trace", "t.csv", "-write-trace", "u.csv"}, "-write-trace is not available with -trace"},
		{[]string{"-trace-skip-bad"}, "-trace-skip-bad needs -trace FILE"},
		{[]string{"-write-trace", "t.csv", "-modes", "sync"}, "-modes is not available with -write-trace, which writes the generated traffic and runs nothing"},
		{[]string{"-write-trace", "t.csv", "-target", "1%"}, "-target is not available with -write-trace"},
		{[]string{"-write-trace", "t.csv", "-pattern", "sticky"}, "-write-trace: -pattern sticky picks a node per request"},
		{[]string{"-target", "1"}, `-target "1" is not a percentage from 0% to 1000%, e.g. 1% or 0.5%`},
		{[]string{"-target", "x%"}, `-target "x%" is not a percentage`},
		{[]string{"-target", "-1%"}, `-target "-1%" is not a percentage`},
		{[]string{"-target", "2000%"}, `-target "2000%" is not a percentage`},
		{[]string{"-target", "1%", "-modes", "sync"}, "-modes is not available with -target: the search picks the async sync rates itself"},
		{[]string{"-target", "1%", "-realtime", "-redis", "x:1"}, "-realtime is not available with -target"},
		{[]string{"-target", "1%", "-realtime"}, "-realtime is not available with -target"},
		{[]string{"-target", "1%", "-per-node"}, "-per-node is not available with -target"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			_, err := parseFlags(tc.args, io.Discard)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)

			var out, errb bytes.Buffer
			assert.Equal(t, 2, run(tc.args, &out, &errb))
			assert.Contains(t, errb.String(), tc.want)
			assert.Empty(t, out.String())
		})
	}
}

func TestParseDefaults(t *testing.T) {
	o, err := parseFlags(nil, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, 10, o.Nodes)
	assert.Equal(t, 20000.0, o.Rate)
	assert.Equal(t, []hybridlimit.Rule{{Limit: 1000, Window: time.Second}}, o.Rules)
	naive, share := hybridlimit.Naive, hybridlimit.Share
	assert.Equal(t, []modeSpec{{Mode: hybridlimit.ModeLocal}, {Mode: hybridlimit.ModeSynchronous},
		{Mode: hybridlimit.ModeAsync, SyncRate: 10 * time.Millisecond, Policy: naive}, {Mode: hybridlimit.ModeAsync, SyncRate: 10 * time.Millisecond, Policy: share},
		{Mode: hybridlimit.ModeAsync, SyncRate: 100 * time.Millisecond, Policy: naive}, {Mode: hybridlimit.ModeAsync, SyncRate: 100 * time.Millisecond, Policy: share},
		{Mode: hybridlimit.ModeAsync, SyncRate: time.Second, Policy: naive}, {Mode: hybridlimit.ModeAsync, SyncRate: time.Second, Policy: share}}, o.Modes)
	o, err = parseFlags([]string{"-pattern", "zipf"}, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, 1000, o.Keys)
	assert.Equal(t, 0, run([]string{"-h"}, io.Discard, io.Discard))
}

func TestReference(t *testing.T) {
	o := &options{Keys: 1, Rules: []hybridlimit.Rule{{Limit: 10, Window: time.Second}}}
	ref := newReference(o)
	s := int64(1000 * time.Second)
	for i := range 10 {
		require.True(t, ref.allow(0, s+int64(i)), "step %d", i)
	}
	require.False(t, ref.allow(0, s+10))
	// Next window, half way: 10·0.5 = 5 left.
	half := s + int64(1500*time.Millisecond)
	for i := range 5 {
		require.True(t, ref.allow(0, half+int64(i)), "step %d", i)
	}
	require.False(t, ref.allow(0, half+10))
	// Sliding log: 10 at s, 5 at s+1.5s: at most 10 in any 1s; 15 if the
	// second batch came within 1s.
	assert.Equal(t, 1.0, peakRatio([][]int64{{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1500, 1500, 1500, 1500, 1500}}, &options{Rules: []hybridlimit.Rule{{Limit: 10, Window: 1000}}}))
	assert.Equal(t, 1.5, peakRatio([][]int64{{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 999, 999, 999, 999, 999}}, &options{Rules: []hybridlimit.Rule{{Limit: 10, Window: 1000}}}))
}

func TestRedisVirtual(t *testing.T) {
	addr := redistest.Addr(t)
	redistest.Client(t)
	reps, _ := runJSON(t, "-redis", addr, "-prefix", redistest.Prefix(t), "-nodes", "3", "-duration", "3s", "-rate", "600", "-rules", "50/1s", "-keys", "2", "-modes", "sync,async:100ms")
	require.Len(t, reps, 2)
	assert.Equal(t, "redis", reps[0]["store"])
	assert.Equal(t, reps[0]["ideal"], reps[0]["admitted"], "synchronous against Redis is exact here")
	assert.Greater(t, reps[1]["store_calls"].(float64), 0.0)
}

func TestRedisRealtime(t *testing.T) {
	addr := redistest.Addr(t)
	redistest.Client(t)
	reps, _ := runJSON(t, "-redis", addr, "-realtime", "-prefix", redistest.Prefix(t), "-nodes", "2", "-duration", "1s", "-rate", "400", "-rules", "50/1s", "-keys", "1", "-modes", "sync,async:50ms")
	require.Len(t, reps, 2)
	for _, r := range reps {
		assert.Equal(t, "real", r["time"])
		assert.Greater(t, r["requests"].(float64), 300.0)
		// A sliding window of 50/s over about 1s admits at most about
		// twice the limit, whatever the timing.
		assert.LessOrEqual(t, r["admitted"].(float64), 150.0, r["mode"])
		assert.Greater(t, r["store_calls"].(float64), 0.0)
	}
}

// One node, every algorithm: the library deciding alone (local mode) and in
// the store (synchronous mode) admits exactly what the simulation's own
// reference of the same algorithm admits.
func TestEveryAlgorithmMatchesItsReference(t *testing.T) {
	for _, rules := range []string{
		"100/1s", "100/1s:fixed", "100/1s:buckets=10", "100/1s:log",
		"100/1s:gcra", "100/1s:gcra=10", "100/1s:leaky=10",
		"20/1s:gcra=5,300/10s:log,1000/1m:buckets=6",
	} {
		t.Run(rules, func(t *testing.T) {
			reps, _ := runJSON(t, "-nodes", "1", "-duration", "30s", "-rules", rules, "-pattern", "burst", "-keys", "3", "-overload", "3", "-modes", "local,sync")
			for _, r := range reps {
				assert.Equal(t, r["ideal"], r["admitted"], "%s", r["mode"])
				// The store decides on microseconds, the reference on
				// nanoseconds: a request within a microsecond of a change
				// could go the other way.
				assert.Less(t, r["false_deny_pct"], 0.1, "%s", r["mode"])
			}
		})
	}
}

// The small-limit table offers the load its rows print, 2× and 0.8× of
// the small limit, whatever -rate the main table runs at: with -rate 10000
// (1× of ten keys at 1000/1s) its rows are those of the default run.
func TestSmallTableLoad(t *testing.T) {
	small := func(args ...string) string {
		var out bytes.Buffer
		code := run(append([]string{"-duration", "2s", "-modes", "local", "-quiet"}, args...), &out, io.Discard)
		require.Equal(t, 0, code)
		_, table, ok := strings.Cut(out.String(), "small limit:")
		require.True(t, ok, out.String())
		return table
	}
	want := small()
	assert.Contains(t, want, "2.0×      4031", "2× of 10 keys at 100/1s for 2 s: about 4000 requests")
	assert.Equal(t, want, small("-rate", "10000"))
}

// The synchronous mode's false denials against the reference (0.039 % in
// the default run) are the microsecond: the store decides at the node's
// instant in whole microseconds, the reference at the nanosecond. Fed the
// same instants truncated to the microsecond, the reference decides every
// request as the synchronous mode does; at the nanosecond, each false
// denial has a false admission beside it.
func TestSynchronousDiffersFromTheReferenceOnlyByTheMicrosecond(t *testing.T) {
	o, err := parseFlags([]string{"-nodes", "1", "-keys", "1", "-duration", "20s", "-modes", "sync"}, io.Discard)
	require.NoError(t, err)
	for _, us := range []bool{false, true} {
		c := newVClock(virtualStart)
		l, err := hybridlimit.New(hybridlimit.Config{Rules: o.Rules, Mode: hybridlimit.ModeSynchronous, Clock: c, Manual: true, Store: store.NewMemory(c)})
		require.NoError(t, err)
		ref, g := newReference(o), newTraffic(o)
		var falseDenied, falseAdmitted int
		for q, ok := g.next(); ok; q, ok = g.next() {
			now := virtualStart.UnixNano() + q.at
			c.set(now)
			res, err := l.Allow(context.Background(), "k")
			require.NoError(t, err)
			if us {
				now = now / int64(time.Microsecond) * int64(time.Microsecond)
			}
			ideal := ref.allow(q.key, now)
			falseDenied += int(b2i(ideal && !res.Allowed))
			falseAdmitted += int(b2i(!ideal && res.Allowed))
		}
		if us {
			assert.Zero(t, falseDenied+falseAdmitted, "the reference at the microsecond")
		} else {
			assert.Positive(t, falseDenied, "the reference at the nanosecond")
			assert.Equal(t, falseDenied, falseAdmitted)
		}
	}
}
