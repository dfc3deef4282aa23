package hybridlimit_test

import (
	"context"
	"net"
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
	info, err := c.Info(ctx, "replication").Result()
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "role:"); ok {
			return v
		}
	}
	return ""
}

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
func TestFaultSentinelFailover(t *testing.T) {
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
		w := &watched{Store: newRedisStore(t, newClient())}
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
		cfg := hybridlimit.Config{Mode: mode, Store: w, StoreTimeout: faultTimeout, Prefix: pfxA,
			Rules: []hybridlimit.Rule{{Limit: 1 << 40, Window: time.Hour}}}
		if mode == hybridlimit.ModeAsync {
			cfg.SyncRate = 20 * time.Millisecond
		} else {
			cfg.Prefix = pfxS
			cfg.Rules = []hybridlimit.Rule{{Limit: syncLimit, Window: time.Hour}}
		}
		l, err := hybridlimit.New(cfg)
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

	// Watch the roles: the replica's promotion, the old master's demotion.
	var promoted, demoted atomic.Int64
	watchStop := make(chan struct{})
	var watch sync.WaitGroup
	watch.Go(func() {
		for {
			select {
			case <-watchStop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			if promoted.Load() == 0 && role(ctx, replicaC) == "master" {
				promoted.Store(time.Now().UnixNano())
			}
			if demoted.Load() == 0 && role(ctx, oldC) == "slave" {
				demoted.Store(time.Now().UnixNano())
			}
		}
	})

	admittedA, admittedS := newTally(asyncKeys), newTally(syncKeys)
	var errs atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	start := time.Now()
	for _, l := range asyncNodes {
		traffic(&wg, 4, stop, func(g, i int) bool {
			k := asyncKeys[(g+i)%len(asyncKeys)]
			res, err := l.Allow(ctx, k)
			if err != nil {
				errs.Add(1)
				return false
			}
			if res.Allowed {
				admittedA.add(k)
			}
			if i%16 == 0 {
				time.Sleep(time.Millisecond)
			}
			return true
		})
	}
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
	from := promoted.Load() - int64(50*time.Millisecond)
	to := lastOldWrite.Load()
	if d := demoted.Load(); d != 0 && d < to {
		to = d
	}
	t.Logf("switch window: promotion at +%v, last write to the old master at +%v (demoted at +%v): %v",
		time.Duration(promoted.Load()-start.UnixNano()).Round(time.Millisecond), time.Duration(lastOldWrite.Load()-start.UnixNano()).Round(time.Millisecond),
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
		assert.LessOrEqual(t, a-s, b, "async key %q lost more than the pushes applied in the switch window", k)
		lostA, boundA = lostA+a-s, boundA+b
	}
	t.Logf("async: admitted %d, lost %d; applied in the switch window %d", admittedA.sum(asyncKeys), lostA, boundA)
	var lostS, boundS int64
	for _, k := range syncKeys {
		a, s, b := admittedS.get(k), stored(t, read, pfxS, k, ids), inWindow(takes, k)
		assert.GreaterOrEqual(t, a, int64(syncLimit), "synchronous key %q did not reach its limit: the limit was not tested", k)
		assert.LessOrEqual(t, a, limitBound(syncLimit, start, end)+b, "synchronous key %q admitted more than the limit plus the switch window's admissions", k)
		assert.LessOrEqual(t, a-s, b, "synchronous key %q lost more than the switch window's admissions", k)
		assert.LessOrEqual(t, s-a, inDoubt.Load(), "synchronous key %q counted twice beyond the requests in doubt", k)
		lostS, boundS = lostS+a-s, boundS+b
	}
	t.Logf("synchronous: admitted %d (limit %d per key), store − admitted %d, admitted in the switch window %d, requests in doubt %d",
		admittedS.sum(syncKeys), syncLimit, -lostS, boundS, inDoubt.Load())
}
