package store_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit/internal/redistest"
	"github.com/hybridlimit/hybridlimit/store"
)

// With RedisOptions.WaitReplicas, a batch in doubt for want of a replica's
// acknowledgement stays in doubt when it is sent again on another
// connection (the first one cut) while the replica still lacks it: the
// master recognizes the batch by its marker and writes nothing, and a WAIT
// on a connection that wrote nothing asks the replicas for nothing, but
// the batch's first run is not on the replica, and a failover would lose
// it. Once the replica has it, the batch is applied.
func TestRedisWaitReplicasCoversABatchSentAgain(t *testing.T) {
	redistest.Destructive(t)
	master := redistest.WaitSentinelStable(t, 30*time.Second)
	admin := redistest.ClientAt(t, master)
	ctx := context.Background()
	info, err := admin.Info(ctx, "replication").Result()
	require.NoError(t, err)
	replica := ""
	for _, line := range strings.Split(info, "\n") {
		if !strings.HasPrefix(line, "slave0:") {
			continue
		}
		var ip, port string
		for _, f := range strings.Split(strings.TrimSpace(strings.TrimPrefix(line, "slave0:")), ",") {
			k, v, _ := strings.Cut(f, "=")
			switch k {
			case "ip":
				ip = v
			case "port":
				port = v
			}
		}
		replica = net.JoinHostPort(ip, port)
	}
	require.NotEmpty(t, replica, "the master's replica, in:\n%s", info)

	const name = "waitagain"
	c := redis.NewClient(&redis.Options{Addr: master, ClientName: name, MaxRetries: -1, DialTimeout: time.Second,
		ReadTimeout: time.Second, WriteTimeout: time.Second})
	t.Cleanup(func() { _ = c.Close() })
	s, err := store.NewRedis(c, store.RedisOptions{WaitReplicas: 1, BreakerMin: -1})
	require.NoError(t, err)
	pfx := redistest.Prefix(t)
	const w = 60_000
	id := future / w
	key := store.CounterKey(pfx, store.Counter{Key: "k", Window: w, ID: id})
	push(t, s, batch(s, pfx, "n", "k", 1, op(w, id, 1))) // on the replica too

	srv := redistest.ServerAt(t, replica)
	srv.Stop() // still connected to the master, acknowledging nothing new
	b := batch(s, pfx, "n", "k", 2, op(w, id, 5))
	require.NoError(t, s.Push(ctx, []*store.Batch{b}))
	require.Equal(t, store.InDoubt, b.Status, "%v", b.Err)
	v, err := admin.Get(ctx, key).Int64()
	require.NoError(t, err)
	require.Equal(t, int64(6), v, "the master ran the batch")

	// The connection that carried the batch is cut: the next call goes on
	// another one.
	list, err := admin.ClientList(ctx).Result()
	require.NoError(t, err)
	for _, line := range strings.Split(list, "\n") {
		if strings.Contains(line, " name="+name+" ") {
			cid, _, _ := strings.Cut(strings.TrimPrefix(line, "id="), " ")
			require.NoError(t, admin.Do(ctx, "client", "kill", "id", cid).Err())
		}
	}
	again := batch(s, pfx, "n", "k", 2, op(w, id, 5))
	require.NoError(t, s.Push(ctx, []*store.Batch{again}))
	assert.Equal(t, store.InDoubt, again.Status, "sent again while the replica lacks it: %v", again.Err)

	srv.Cont()
	require.Eventually(t, func() bool {
		last := batch(s, pfx, "n", "k", 2, op(w, id, 5))
		require.NoError(t, s.Push(ctx, []*store.Batch{last}))
		return last.Status == store.Applied && assert.Equal(t, []int64{6}, last.Totals, "applied once")
	}, 10*time.Second, 20*time.Millisecond)
	got, err := redistest.ClientAt(t, replica).Get(ctx, key).Int64()
	require.NoError(t, err)
	assert.Equal(t, int64(6), got, "on the replica")
}
