package hybridlimit_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
	"github.com/hybridlimit/hybridlimit/store"
)

// One master of the Redis Cluster hangs (SIGSTOP, shorter than the
// cluster's node timeout, so no failover) while a ModeSynchronous limiter
// decides on keys of all three shards from many goroutines. The decisions
// of each master go out in their own batches (the Redis store is a
// store.Router), so those on the healthy masters' keys never wait for the
// hung one: none fails but by its deadline on a loaded machine, and none
// waits as long as the hung master's calls, which end at the
// StoreTimeout. The decisions on the hung master's keys are Degraded
// (FailOpen), none later than the StoreTimeout and one batch.
//
// The cluster is set not to require full coverage, so that a hang the
// cluster notices on a loaded machine does not make the healthy masters
// answer CLUSTERDOWN (TestFaultClusterMasterKilled shows that case).
//
// A loaded machine can delay a call past the StoreTimeout, hung master or
// not. As in TestFaultClusterMasterKilled, a request on a healthy master's
// key in doubt is excused only when its call's own record shows it waited
// for that master and this process alone (judgeHealthyTakes); a witness
// pinging each healthy master tells stalls apart from slow decisions: a
// slow decision on a healthy key is excused only when the witness got no
// answer from its master, or the process' own ticks stopped, for a
// quarter of the StoreTimeout while it ran.
func TestFaultClusterHungMasterSynchronous(t *testing.T) {
	redistest.Destructive(t)
	shards := redistest.WaitClusterOK(t, 30*time.Second)
	require.Len(t, shards, 3)
	addrs := redistest.ClusterAddrs(t)
	setCoverage(t, addrs, "no")
	t.Cleanup(func() { setCoverage(t, addrs, "yes") })
	calls := newCallLog(t)
	c := redis.NewClusterClient(calls.trace(&redis.ClusterOptions{Addrs: addrs, PoolSize: 32,
		DialTimeout: 2 * time.Second, ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second}))
	t.Cleanup(func() { _ = c.Close() })

	var healthy, hung []string
	masterOf := map[string]string{} // healthy key -> its master
	for i, sh := range shards {
		keys := keysOnShard(sh, "k", 4)
		if i == 1 {
			hung = keys
			continue
		}
		healthy = append(healthy, keys...)
		for _, k := range keys {
			masterOf[k] = sh.Master
		}
	}
	// Every request on a healthy master's key, judged after the hang.
	var takesMu sync.Mutex
	var takes []healthyTake
	st := &watched{Store: newRedisStore(t, c), calls: calls, onTakeCall: func(call int64, start, end time.Time, reqs []*store.TakeRequest) {
		for _, r := range reqs {
			if masterOf[r.Key] != "" {
				takesMu.Lock()
				takes = append(takes, healthyTake{node: 1, key: r.Key, call: call, start: start, end: end, status: r.Status, err: r.Err,
					late: errors.Is(r.Err, store.ErrDeadline)})
				takesMu.Unlock()
			}
		}
	}}
	const timeout = faultTimeout
	l, err := hybridlimit.New(hybridlimit.Config{Mode: hybridlimit.ModeSynchronous, Store: st, StoreTimeout: timeout,
		Prefix: redistest.Prefix(t), Rules: []hybridlimit.Rule{{Limit: 1 << 40, Window: time.Hour}}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	warmUp(t, l, append(append([]string(nil), healthy...), hung...), nil)

	witness := watchMasters(t, []string{shards[0].Master, shards[2].Master})
	var good, bad routeSide
	type span struct {
		key        string
		start, end time.Time
	}
	var slowMu sync.Mutex
	var slow []span // decisions on healthy keys of timeout*3/4 or longer
	stop := make(chan struct{})
	var wg sync.WaitGroup
	decide := func(keys []string, s *routeSide) {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			k := keys[i%len(keys)]
			start := time.Now()
			res, err := l.Allow(context.Background(), k)
			end := time.Now()
			s.note(end.Sub(start), res)
			assert.NoError(t, err)
			if s == &good && end.Sub(start) >= timeout*3/4 {
				slowMu.Lock()
				slow = append(slow, span{k, start, end})
				slowMu.Unlock()
			}
		}
	}
	for range 8 {
		wg.Go(func() { decide(healthy, &good) })
		wg.Go(func() { decide(hung, &bad) })
	}
	time.Sleep(100 * time.Millisecond)
	srv := redistest.ServerAt(t, shards[1].Master)
	srv.Stop()
	time.Sleep(800 * time.Millisecond) // below the cluster's node timeout of 1 s
	srv.Cont()
	close(stop)
	wg.Wait()
	witness.stop()

	t.Logf("healthy masters' keys: %d decisions, %d degraded, slowest %v; hung master's keys: %d decisions, %d degraded, slowest %v",
		good.n.Load(), good.degraded.Load(), &good, bad.n.Load(), bad.degraded.Load(), &bad)
	// Every request on a healthy master's key was applied or refused for
	// its deadline, but those a stall excuses.
	judgeHealthyTakes(t, takes, masterOf, calls, true)
	excused, waited := 0, 0
	for _, d := range slow {
		g := max(witness.gap("", d.start, d.end), witness.gap(masterOf[d.key], d.start, d.end))
		if g >= faultTimeout/4 {
			excused++
			continue
		}
		if waited++; waited <= 5 {
			t.Errorf("a decision on healthy key %q took %v (want less than %v) while neither its master nor the process stalled (longest silence %v): it waited for the hung master",
				d.key, d.end.Sub(d.start).Round(time.Millisecond), timeout*3/4, g.Round(time.Millisecond))
		}
	}
	if waited > 5 {
		t.Errorf("... %d such decisions in all", waited)
	}
	if excused > 0 {
		t.Logf("decisions on healthy keys of %v or longer excused by a stall of the process or its master: %d", timeout*3/4, excused)
	}
	assert.Positive(t, bad.degraded.Load(), "decisions on the hung master's keys")
	assert.Less(t, time.Duration(bad.worst.Load()), 2*timeout+500*time.Millisecond,
		"a decision on the hung master's key waited past the StoreTimeout and one batch")
}

// masterWitness pings masters, each through a client of its own, one ping
// at a time with 5 ms between them, and records when each answer
// came: a master with no answer for a long time was not reached by any
// client of this process, the machine holding the process or the server.
type masterWitness struct {
	mu      sync.Mutex
	answers map[string][]time.Time
	done    chan struct{}
	wg      sync.WaitGroup
}

func watchMasters(t *testing.T, addrs []string) *masterWitness {
	w := &masterWitness{answers: map[string][]time.Time{}, done: make(chan struct{})}
	for _, a := range addrs {
		c := redis.NewClient(&redis.Options{Addr: a, MaxRetries: -1, PoolSize: 1, ReadTimeout: 10 * time.Second})
		t.Cleanup(func() { _ = c.Close() })
		w.wg.Go(func() {
			for {
				select {
				case <-w.done:
					return
				case <-time.After(5 * time.Millisecond):
				}
				if c.Ping(context.Background()).Err() == nil {
					w.mu.Lock()
					w.answers[a] = append(w.answers[a], time.Now())
					w.mu.Unlock()
				}
			}
		})
	}
	w.wg.Go(func() {
		for {
			select {
			case <-w.done:
				return
			case <-time.After(time.Millisecond):
			}
			w.mu.Lock()
			w.answers[""] = append(w.answers[""], time.Now())
			w.mu.Unlock()
		}
	})
	t.Cleanup(w.stop)
	return w
}

func (w *masterWitness) stop() {
	select {
	case <-w.done:
	default:
		close(w.done)
	}
	w.wg.Wait()
}

// gap returns the longest time from from to to without an answer from
// addr ("" for the process' own ticks).
func (w *masterWitness) gap(addr string, from, to time.Time) time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	last, longest := from, time.Duration(0)
	for _, at := range w.answers[addr] {
		if at.Before(from) {
			continue
		}
		if at.After(to) {
			break
		}
		longest = max(longest, at.Sub(last))
		last = at
	}
	return max(longest, to.Sub(last))
}
