package store

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

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
