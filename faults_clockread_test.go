package hybridlimit_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
)

// A synchronous limiter starts while the standalone server hangs
// (SIGSTOP) for 285 ms: its first clock read (Redis TIME) is answered
// after the hang, a round trip whose error on the offset is up to half of
// it. Then the server hangs again during a decision, whose call the client
// gives up after its ReadTimeout (300 ms), and resumes 12 ms later: the
// request, sent 312 ms earlier, is past its deadline (half of the 400 ms
// StoreTimeout) on any clock read precisely. Proven: the resumed server
// does not count it, so the store holds exactly what was admitted. (When
// the slow clock read was kept for ClockSync, 10 s, the offset was 140 ms
// too far ahead, the deadline 340 ms after the sending, and the resumed
// server counted the request the node had already admitted by FailOpen.)
func TestFaultSynchronousSlowClockRead(t *testing.T) {
	redistest.Destructive(t)
	addr := redistest.Addr(t)
	pfx := redistest.Prefix(t)
	srv := redistest.ServerAt(t, addr)
	st := newRedisStore(t, faultClient(t, addr))
	srv.Stop()
	start := time.Now()
	l, err := hybridlimit.New(hybridlimit.Config{Mode: hybridlimit.ModeSynchronous, Store: st, StoreTimeout: faultTimeout,
		Prefix: pfx, Rules: []hybridlimit.Rule{{Limit: 1 << 40, Window: time.Hour}}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	time.Sleep(285 * time.Millisecond)
	srv.Cont()
	time.Sleep(time.Second)
	t.Logf("offset once the hang ended: %v", l.Stats().ClockOffset)
	ctx := context.Background()
	res, err := l.Allow(ctx, "k")
	require.NoError(t, err)
	require.True(t, res.Allowed && !res.Degraded, "the store decides")

	srv.Stop()
	t0 := time.Now()
	res, err = l.Allow(ctx, "k")
	require.NoError(t, err)
	require.True(t, res.Allowed && res.Degraded, "decided by FailOpen while the server hangs")
	time.Sleep(time.Until(t0.Add(312 * time.Millisecond)))
	srv.Cont()
	time.Sleep(300 * time.Millisecond)
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	require.NoError(t, l.Close(cctx))
	got := stored(t, redistest.Client(t), pfx, "k", hourIDs(start, time.Now()))
	assert.Equal(t, int64(2), got, "the store counts the 2 admissions once each: the resumed server ran no request past its deadline")
}
