package hybridlimit_test

import (
	"context"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
	"github.com/hybridlimit/hybridlimit/store"
)

// writeConn records the instant of its last write.
type writeConn struct {
	net.Conn
	last *atomic.Int64
}

func (c writeConn) Write(p []byte) (int, error) {
	c.last.Store(time.Now().UnixNano())
	return c.Conn.Write(p)
}

// role returns the replication role of the server at addr ("master",
// "slave"), or "" when it does not answer.
func role(ctx context.Context, c *redis.Client) string {
	return replInfo(ctx, c, "role")
}

// replInfo returns a field of the server's INFO replication, or "".
func replInfo(ctx context.Context, c *redis.Client, field string) string {
	info, err := c.Info(ctx, "replication").Result()
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v
		}
	}
	return ""
}

// offsetSample is the old master's replication offset at an instant.
type offsetSample struct{ at, offset int64 }

// SENTINEL FAILOVER while async and synchronous nodes decide through
// redis.NewFailoverClient. The sentinels promote the replica; go-redis
// follows their +switch-master and closes its connections to the old
// master; some 10 s later the old master becomes a replica of the new one
// and discards what it received meanwhile.
//
// The switch window runs from the replica's promotion (observed every
// 5 ms, less a 50 ms margin for replication lag) to the nodes' last write
// to the old master while it was still a master. Proven: the increments
// lost are at most those of the pushes the store reported applied during
// that window; no async increment is counted twice; the synchronous mode
// admits at most the limit plus the admissions made during that window
// (which the new master never saw), and counts twice at most the requests
// whose answer was lost.
//
// With RedisOptions.WaitReplicas 1 the same failover loses nothing: every
// increment admitted is in the new master, and the synchronous mode admits
// at most the limit plus what nodes admitted on their own (Degraded) while
// their calls were in doubt.
func TestFaultSentinelFailover(t *testing.T) {
	t.Run("without WAIT", func(t *testing.T) { sentinelFailover(t, 0) })
	t.Run("WaitReplicas 1", func(t *testing.T) { sentinelFailover(t, 1) })
}

func sentinelFailover(t *testing.T, waitReplicas int) {
	redistest.Destructive(t)
	old := redistest.WaitSentinelStable(t, 30*time.Second)
	addrs, name := redistest.SentinelAddrs(t), redistest.SentinelMaster(t)
	oldC := faultClient(t, old)
	ctx := context.Background()
	var replica string
	info, err := oldC.Info(ctx, "replication").Result()
	require.NoError(t, err)
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "slave0:"); ok {
			f := map[string]string{}
			for _, kv := range strings.Split(v, ",") {
				k, v, _ := strings.Cut(kv, "=")
				f[k] = v
			}
			replica = net.JoinHostPort(f["ip"], f["port"])
		}
	}
	require.NotEmpty(t, replica, "the master has no replica: %s", info)
	replicaC := faultClient(t, replica)

	var lastOldWrite atomic.Int64 // Unix ns of the nodes' last write to the old master
	newClient := func() *redis.Client {
		c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: name, SentinelAddrs: addrs,
			MaxRetries: -1, PoolSize: 32, DialTimeout: faultIO, ReadTimeout: faultIO, WriteTimeout: faultIO,
			Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
				c, err := (&net.Dialer{Timeout: faultIO}).DialContext(ctx, network, addr)
				if err != nil || addr != old {
					return c, err
				}
				return writeConn{c, &lastOldWrite}, nil
			}})
		t.Cleanup(func() { _ = c.Close() })
		return c
	}

	// Every applied push and synchronous admission, with its call's span.
	type span struct {
		start, end int64
		n          int64
		key        string
	}
	var mu sync.Mutex
	var pushes, takes []span
	var inDoubt atomic.Int64
	const syncLimit = 2000
	pfxA, pfxS := redistest.Prefix(t), redistest.Prefix(t)
	mk := func(mode hybridlimit.Mode) *hybridlimit.Limiter {
		st, err := store.NewRedis(newClient(), store.RedisOptions{WaitReplicas: waitReplicas})
		require.NoError(t, err)
		w := &watched{Store: st}
		w.onPush = func(start, end time.Time, bs []*store.Batch) {
			mu.Lock()
			defer mu.Unlock()
			for _, b := range bs {
				if b.Status != store.Applied {
					continue
				}
				for _, op := range b.Ops {
					pushes = append(pushes, span{start.UnixNano(), end.UnixNano(), op.Delta, op.Key})
				}
			}
		}
		w.onTake = func(start, end time.Time, rs []*store.TakeRequest) {
			mu.Lock()
			defer mu.Unlock()
			for _, r := range rs {
				switch {
				case r.Status == store.Applied && r.Allowed:
					takes = append(takes, span{start.UnixNano(), end.UnixNano(), r.Cost, r.Key})
				case r.Status == store.InDoubt:
					inDoubt.Add(1)
				}
			}
		}
		l, err := hybridlimit.New(faultConfig(mode, w, pfxA, pfxS, syncLimit))
		require.NoError(t, err)
		t.Cleanup(func() { _ = l.Close(context.Background()) })
		return l
	}
	var asyncNodes, syncNodes []*hybridlimit.Limiter
	for range 3 {
		asyncNodes = append(asyncNodes, mk(hybridlimit.ModeAsync))
	}
	for range 2 {
		syncNodes = append(syncNodes, mk(hybridlimit.ModeSynchronous))
	}
	asyncKeys, syncKeys := []string{"a0", "a1", "a2", "a3"}, []string{"s0", "s1", "s2", "s3"}
	for _, l := range append(append([]*hybridlimit.Limiter(nil), asyncNodes...), syncNodes...) {
		_, err := l.Peek(ctx, "warm") // connections open, scripts cached
		require.NoError(t, err)
	}

	// Watch the roles (the replica's promotion, the old master's demotion)
	// and the old master's replication offset: what the replica had at its
	// promotion tells from when the old master's writes were lost.
	var promoted, demoted atomic.Int64
	var offsets []offsetSample // the old master's, until its demotion
	promotedAt := int64(-1)    // the replica's offset when promoted
	watchStop := make(chan struct{})
	var watch sync.WaitGroup
	watch.Go(func() {
		for {
			select {
			case <-watchStop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			if demoted.Load() == 0 {
				before := time.Now().UnixNano()
				if o, err := strconv.ParseInt(replInfo(ctx, oldC, "master_repl_offset"), 10, 64); err == nil {
					offsets = append(offsets, offsetSample{before, o})
				}
			}
			if promoted.Load() == 0 && role(ctx, replicaC) == "master" {
				promoted.Store(time.Now().UnixNano())
				// A promoted replica keeps the offset up to which it
				// shares the old master's history: second_repl_offset − 1.
				if o, err := strconv.ParseInt(replInfo(ctx, replicaC, "second_repl_offset"), 10, 64); err == nil {
					promotedAt = o - 1
				}
			}
			if demoted.Load() == 0 && role(ctx, oldC) == "slave" {
				demoted.Store(time.Now().UnixNano())
			}
		}
	})

	admittedA, admittedS := newTally(asyncKeys), newTally(syncKeys)
	degradedS := newTally(syncKeys) // admitted by the FailurePolicy
	var errs atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	start := time.Now()
	decideAll(&wg, asyncNodes, 4, asyncKeys, stop, admittedA, &errs, nil)
	for _, l := range syncNodes {
		traffic(&wg, 8, stop, func(g, i int) bool {
			k := syncKeys[(g+i)%len(syncKeys)]
			res, err := l.Allow(ctx, k)
			if err != nil {
				errs.Add(1)
				return false
			}
			if res.Allowed {
				admittedS.add(k)
				if res.Degraded {
					degradedS.add(k)
				}
			}
			time.Sleep(10 * time.Millisecond)
			return true
		})
	}
	time.Sleep(time.Second)
	f := redistest.SentinelFailover(t)
	require.Equal(t, old, f.Old)
	// Until every synchronous key reached its limit, so that the limit is
	// tested after the switch.
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if min(admittedS.get("s0"), admittedS.get("s1"), admittedS.get("s2"), admittedS.get("s3")) >= syncLimit {
			break
		}
	}
	close(stop)
	wg.Wait()
	close(watchStop)
	watch.Wait()
	closeAll(t, append(asyncNodes, syncNodes...), 10*time.Second)
	end := time.Now()
	assert.Zero(t, errs.Load(), "decisions returned errors")

	require.NotZero(t, promoted.Load(), "the replica's promotion was not observed")
	require.GreaterOrEqual(t, promotedAt, int64(0), "the promoted replica's offset was not read")
	// The switch window begins at the last sample at which the old master
	// had written nothing the replica lacks at its promotion: what it
	// acknowledged after that may be lost.
	from := promoted.Load()
	for _, o := range offsets {
		if o.offset <= promotedAt {
			from = o.at
		}
	}
	to := lastOldWrite.Load()
	if d := demoted.Load(); d != 0 && d < to {
		to = d
	}
	t.Logf("switch window: from +%v (the replica's offset at its promotion), promotion seen at +%v, last write to the old master at +%v (demoted at +%v): %v",
		time.Duration(from-start.UnixNano()).Round(time.Millisecond), time.Duration(promoted.Load()-start.UnixNano()).Round(time.Millisecond), time.Duration(lastOldWrite.Load()-start.UnixNano()).Round(time.Millisecond),
		time.Duration(demoted.Load()-start.UnixNano()).Round(time.Millisecond), time.Duration(to-from).Round(time.Millisecond))
	inWindow := func(spans []span, key string) (n int64) {
		for _, s := range spans {
			if s.key == key && s.end >= from && s.start <= to {
				n += s.n
			}
		}
		return n
	}

	read := newClient()
	ids := hourIDs(start, end)
	var lostA, boundA int64
	for _, k := range asyncKeys {
		a, s, b := admittedA.get(k), stored(t, read, pfxA, k, ids), inWindow(pushes, k)
		assert.LessOrEqual(t, s, a, "async key %q counted twice", k)
		if waitReplicas > 0 {
			assert.Equal(t, a, s, "async key %q: with WAIT nothing is lost", k)
		}
		assert.LessOrEqual(t, a-s, b, "async key %q lost more than the pushes applied in the switch window", k)
		lostA, boundA = lostA+a-s, boundA+b
	}
	t.Logf("async: admitted %d, lost %d; applied in the switch window %d", admittedA.sum(asyncKeys), lostA, boundA)
	var lostS, boundS int64
	for _, k := range syncKeys {
		a, s, b := admittedS.get(k), stored(t, read, pfxS, k, ids), inWindow(takes, k)
		assert.GreaterOrEqual(t, a, int64(syncLimit), "synchronous key %q did not reach its limit: the limit was not tested", k)
		if waitReplicas > 0 {
			// The new master has no replica until the old one rejoins as
			// one (some 10 s): its calls are in doubt meanwhile, and the
			// nodes decide by the FailurePolicy (FailOpen here).
			assert.LessOrEqual(t, a, limitBound(syncLimit, start, end)+degradedS.get(k), "synchronous key %q admitted more than the limit plus its degraded admissions", k)
			assert.LessOrEqual(t, a, s, "synchronous key %q: with WAIT nothing is lost", k)
		} else {
			assert.LessOrEqual(t, a, limitBound(syncLimit, start, end)+b, "synchronous key %q admitted more than the limit plus the switch window's admissions", k)
			assert.LessOrEqual(t, a-s, b, "synchronous key %q lost more than the switch window's admissions", k)
		}
		assert.LessOrEqual(t, s-a, inDoubt.Load(), "synchronous key %q counted twice beyond the requests in doubt", k)
		lostS, boundS = lostS+a-s, boundS+b
	}
	t.Logf("synchronous: admitted %d (limit %d per key; %d degraded), store − admitted %d, admitted in the switch window %d, requests in doubt %d",
		admittedS.sum(syncKeys), syncLimit, degradedS.sum(syncKeys), -lostS, boundS, inDoubt.Load())
}
