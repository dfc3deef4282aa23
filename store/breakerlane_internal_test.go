package store

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit/internal/redistest"
	"github.com/hybridlimit/hybridlimit/local"
)

// A probe that a lane sends is the probe even when the lane began before
// the circuit opened: a lane allows its calls one after another, and
// another lane's failure can open the circuit in between (or the lane's
// goroutine waits that long for a processor). When that probe fails, the
// next call after the backoff must be the next probe; otherwise the
// circuit refuses every call to the server from then on, and the server's
// pushes and synchronous decisions never reach it again.
func TestRedisFailedProbeOfALaneBegunBeforeTheOpening(t *testing.T) {
	for _, call := range []string{"push", "take"} {
		t.Run(call, func(t *testing.T) { failedProbeOfALane(t, call == "take") })
	}
}

func failedProbeOfALane(t *testing.T, take bool) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close()) // connections to addr are refused
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialerRetries: 1, DialTimeout: time.Second})
	t.Cleanup(func() { _ = c.Close() })
	s, err := NewRedis(c, RedisOptions{Lanes: 1})
	require.NoError(t, err)

	now := time.Unix(1000, 0)
	var atLaneStart func()
	s.breaker.now = func() time.Time {
		t := now
		if f := atLaneStart; f != nil {
			atLaneStart = nil
			f()
		}
		return t
	}
	// The lane takes its start; meanwhile another call fails and opens
	// the circuit, and BreakerMin passes before the lane allows its call.
	atLaneStart = func() {
		now = now.Add(10 * time.Millisecond)
		s.breaker.done(s.server(context.Background(), 0), now, false)
		now = now.Add(150 * time.Millisecond)
	}
	rule := local.NewRule(local.Spec{Kind: local.Sliding, Limit: 10, Window: time.Minute})
	// call sends a push or a take and returns its outcome.
	call := func(seq uint64) (Status, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if take {
			r := &TakeRequest{Prefix: "probe", Key: "k", Rules: []local.Rule{rule}, Now: time.Now().UnixMicro(),
				Deadline: time.Now().Add(time.Minute).UnixMicro(), Cost: 1}
			require.NoError(t, s.Take(ctx, []*TakeRequest{r}))
			return r.Status, r.Err
		}
		b := &Batch{Prefix: "probe", Node: "n", Group: 0, Seq: seq,
			Ops: []Op{{Counter: Counter{Key: "k", Window: 60_000, ID: 1}, Delta: 1}}}
		require.NoError(t, s.Push(ctx, []*Batch{b}))
		return b.Status, b.Err
	}
	calls := s.Calls()
	status, err := call(1)
	require.Greater(t, s.Calls(), calls, "the lane's call is the probe, sent")
	require.NotEqual(t, Applied, status)
	require.False(t, errors.Is(err, errOpen), "sent: %v", err)

	now = now.Add(10 * time.Second) // past any backoff
	calls = s.Calls()
	_, err = call(2)
	assert.Greater(t, s.Calls(), calls, "after the backoff, the next call probes the server: %v", err)
	assert.False(t, errors.Is(err, errOpen), "after the backoff, the next call probes the server: %v", err)
}

// After a failure without an answer, calls to the server fail at once,
// without being sent, until the backoff has passed; then one call probes.
// The breaker's clock is the test's, so that a loaded machine cannot let
// the backoff pass between the failure and the calls it refuses.
func TestRedisBreaker(t *testing.T) {
	p := redistest.NewProxy(t, redistest.Addr(t))
	c := redis.NewClient(&redis.Options{Addr: p.Addr(), MaxRetries: -1, DialTimeout: 200 * time.Millisecond,
		ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { _ = c.Close() })
	const backoff = 300 * time.Millisecond
	s, err := NewRedis(c, RedisOptions{BreakerMin: backoff, BreakerMax: time.Second})
	require.NoError(t, err)
	var mu sync.Mutex
	start := time.Unix(1000, 0)
	now := start
	s.breaker.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	at := func(d time.Duration) { mu.Lock(); defer mu.Unlock(); now = start.Add(d) }

	pfx := redistest.Prefix(t)
	ctx := context.Background()
	rule := local.NewRule(local.Spec{Kind: local.Sliding, Limit: 10, Window: time.Minute})
	take := func() *TakeRequest {
		r := &TakeRequest{Prefix: pfx, Key: "brk", Rules: []local.Rule{rule}, Now: time.Now().UnixMicro(),
			Deadline: time.Now().Add(time.Minute).UnixMicro(), Cost: 1}
		require.NoError(t, s.Take(ctx, []*TakeRequest{r}))
		return r
	}
	p.Down()
	b := &Batch{Prefix: pfx, Node: "n", Group: 0, Seq: 1,
		Ops: []Op{{Counter: Counter{Key: "brk", Window: 60_000, ID: 1}, Delta: 1}}}
	require.NoError(t, s.Push(ctx, []*Batch{b}))
	require.NotEqual(t, Applied, b.Status)
	p.Up() // a call sent now would be answered: only the breaker refuses it
	calls := s.Calls()
	for _, d := range []time.Duration{0, backoff - time.Nanosecond} {
		at(d)
		r := take()
		assert.Equal(t, Failed, r.Status, "%v after the failure", d)
		assert.ErrorIs(t, r.Err, ErrUnavailable, "%v after the failure", d)
		assert.Equal(t, calls, s.Calls(), "%v after the failure: nothing sent while the circuit is open", d)
	}
	at(backoff)
	r := take()
	assert.Equal(t, Applied, r.Status, "the probe closes the circuit: %v", r.Err)
	assert.Greater(t, s.Calls(), calls, "the probe is sent")
}
