package syncloop_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"

	"github.com/hybridlimit/hybridlimit/local"
	"github.com/hybridlimit/hybridlimit/store"
	syncloop "github.com/hybridlimit/hybridlimit/sync"
)

type flaky struct {
	*store.Memory
	down atomic.Bool
}

func (f *flaky) Apply(ctx context.Context, ops []store.Op) error {
	if f.down.Load() {
		return errors.New("down")
	}
	return f.Memory.Apply(ctx, ops)
}

func (f *flaky) Time(ctx context.Context) (time.Time, error) {
	if f.down.Load() {
		return time.Time{}, errors.New("down")
	}
	return f.Memory.Time(ctx)
}

type logSink struct{ b strings.Builder }

func (s *logSink) Write(p []byte) (int, error) { return s.b.Write(p) }

func TestRunBacksOffAndRecovers(t *testing.T) {
	mock := clock.NewMock()
	mock.Set(time.Unix(1_800_000_000, 0))
	st := &flaky{Memory: store.NewMemory(mock)}
	st.down.Store(true)
	table := local.NewTable([]int64{int64(time.Minute)}, 10, true)
	now := func() int64 { return mock.Now().UnixNano() }
	e := table.LoadOrCreate("k", now())
	for {
		w := e.C[0].Load()
		if e.C[0].CompareAndAdd(w, 3) {
			break
		}
	}
	table.Touch(e)
	var sink logSink
	var errs, syncs atomic.Int64
	l := syncloop.New(syncloop.Config{
		Table: table, Store: st, Prefix: "hl", Now: now,
		Rate: 100 * time.Millisecond, Timeout: time.Second, MaxBackoff: time.Second,
		OnError:  func(error) { errs.Add(1) },
		OnSync:   func(time.Duration, int, error) { syncs.Add(1) },
		Logger:   slog.New(slog.NewTextHandler(&sink, nil)),
		LogEvery: time.Hour,
	})
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.Run(stop, syncloop.Schedule{Clock: mock, Sync: true})
	}()
	step := func() {
		for range 30 {
			mock.Add(100 * time.Millisecond)
		}
	}
	step() // 3 s of failures
	s := l.Stats()
	assert.True(t, s.Failing)
	assert.GreaterOrEqual(t, s.Backoff, time.Second, "backed off to MaxBackoff")
	assert.LessOrEqual(t, s.Backoff, 1200*time.Millisecond, "plus at most 20% jitter")
	assert.Less(t, errs.Load(), int64(10), "backing off: far fewer attempts than 30")
	assert.Positive(t, errs.Load())
	assert.Equal(t, 1, strings.Count(sink.b.String(), "store error"), "the log is rate-limited")
	st.down.Store(false)
	step()
	close(stop)
	<-done
	s = l.Stats()
	assert.False(t, s.Failing)
	assert.Equal(t, 100*time.Millisecond, s.Backoff)
	assert.Positive(t, syncs.Load())
	id := mock.Now().UnixMilli() / 60_000
	assert.Equal(t, int64(3), st.Get(store.CounterKey(store.KeyBase("hl", "k"), 60_000, id)), "the increments reached the store once")
}
