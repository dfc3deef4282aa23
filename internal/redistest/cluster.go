package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// ClusterAddrs returns the addresses of every node of the test cluster and
// takes the topology lock shared, or ends the test: Skip when the variable
// is unset, Fatal when it is unset under CI=true.
func ClusterAddrs(t testing.TB) []string {
	t.Helper()
	v := env(t, EnvClusterAddrs, "a Redis Cluster")
	LockTopology(t, false)
	return strings.Split(v, ",")
}

// ClusterClient returns a client of the test cluster, closed when the test
// ends, after checking that the cluster answers.
func ClusterClient(t testing.TB) *redis.ClusterClient {
	t.Helper()
	addrs := ClusterAddrs(t)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, PoolSize: 64,
		DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second})
	t.Cleanup(func() { _ = c.Close() })
	err := poll(2*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		return c.Ping(ctx).Err()
	})
	if err != nil {
		unreachable(t, strings.Join(addrs, ","), err)
	}
	return c
}

// SlotRange is a range of hash slots, both ends included.
type SlotRange struct{ Start, End int }

// ClusterShard is a master of the cluster with the slots it serves and its
// replicas (those the cluster does not consider failed).
type ClusterShard struct {
	Master   string
	Replicas []string
	Slots    []SlotRange
}

// Key returns a key that hashes to a slot of the shard: prefix followed by
// a hash tag.
func (s ClusterShard) Key(prefix string) string {
	for i := 0; ; i++ {
		tag := strconv.Itoa(i)
		slot := KeySlot(tag)
		for _, r := range s.Slots {
			if slot >= r.Start && slot <= r.End {
				return prefix + "{" + tag + "}"
			}
		}
	}
}

// ClusterMasters returns the masters of the cluster that c connects to and
// their slots, as most nodes that report cluster_state:ok see them (CLUSTER
// SHARDS). Right after a failover, nodes may still disagree; WaitClusterOK
// waits until they agree.
func ClusterMasters(ctx context.Context, c *redis.ClusterClient) ([]ClusterShard, error) {
	views := clusterViews(ctx, c.Options().Addrs)
	count := map[string]int{}
	var best *clusterView
	for i, v := range views {
		if v.err == nil && v.ok {
			if count[v.sig]++; best == nil || count[v.sig] > count[best.sig] {
				best = &views[i]
			}
		}
	}
	if best == nil {
		return nil, errors.New("redistest: no cluster node reports cluster_state:ok")
	}
	return best.shards, nil
}

// MasterForKey returns the address of the master serving key's slot.
func MasterForKey(ctx context.Context, c *redis.ClusterClient, key string) (string, error) {
	shards, err := ClusterMasters(ctx, c)
	if err != nil {
		return "", err
	}
	slot := KeySlot(key)
	for _, s := range shards {
		for _, r := range s.Slots {
			if slot >= r.Start && slot <= r.End {
				return s.Master, nil
			}
		}
	}
	return "", fmt.Errorf("redistest: no master serves slot %d of key %q", slot, key)
}

// KeySlot returns the cluster hash slot of key: CRC16 (XMODEM) of the key,
// or of its hash tag, modulo 16384.
func KeySlot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for k := 0; k < len(key); k++ {
		crc ^= uint16(key[k]) << 8
		for b := 0; b < 8; b++ {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % 16384
}

// MigratingSlot begins moving hash slot from src's master to dst's as
// redis-cli --cluster reshard does (CLUSTER SETSLOT IMPORTING on dst, then
// MIGRATING on src), and returns clients of both masters, dst's id, and the
// function that calls the move off (SETSLOT STABLE on both), which also
// runs when the test ends.
func MigratingSlot(t testing.TB, slot int, src, dst ClusterShard) (sc, dc *redis.Client, dstID string, stable func()) {
	t.Helper()
	ctx := context.Background()
	sc, dc = ClientAt(t, src.Master), ClientAt(t, dst.Master)
	srcID, err := sc.Do(ctx, "cluster", "myid").Text()
	if err != nil {
		t.Fatalf("redistest: CLUSTER MYID of %s: %v", src.Master, err)
	}
	if dstID, err = dc.Do(ctx, "cluster", "myid").Text(); err != nil {
		t.Fatalf("redistest: CLUSTER MYID of %s: %v", dst.Master, err)
	}
	stable = func() {
		_ = sc.Do(ctx, "cluster", "setslot", slot, "stable").Err()
		_ = dc.Do(ctx, "cluster", "setslot", slot, "stable").Err()
	}
	t.Cleanup(stable)
	if err := dc.Do(ctx, "cluster", "setslot", slot, "importing", srcID).Err(); err != nil {
		t.Fatalf("redistest: CLUSTER SETSLOT %d IMPORTING on %s: %v", slot, dst.Master, err)
	}
	if err := sc.Do(ctx, "cluster", "setslot", slot, "migrating", dstID).Err(); err != nil {
		t.Fatalf("redistest: CLUSTER SETSLOT %d MIGRATING on %s: %v", slot, src.Master, err)
	}
	return sc, dc, dstID, stable
}

// WaitClusterOK waits until every cluster node that answers reports
// cluster_state:ok with all 16384 slots served, they all agree on which
// master serves which slot, and every such master answers. Nodes that do
// not answer (killed or stopped) are left out. It returns the masters, or
// ends the test after timeout.
func WaitClusterOK(t testing.TB, timeout time.Duration) []ClusterShard {
	t.Helper()
	return waitCluster(t, ClusterAddrs(t), timeout, false)
}

func waitCluster(t testing.TB, addrs []string, timeout time.Duration, strict bool) []ClusterShard {
	t.Helper()
	var shards []ClusterShard
	err := poll(timeout, func() (err error) {
		shards, err = clusterHealth(addrs, strict)
		return err
	})
	if err != nil {
		t.Fatalf("redistest: the cluster is not ok after %v: %v", timeout, err)
	}
	return shards
}

// clusterView is what one node says about the cluster.
type clusterView struct {
	addr   string
	err    error // the node does not answer
	ok     bool  // cluster_state:ok and every slot served
	info   string
	shards []ClusterShard
	sig    string // masters and their slots, to compare views
	role   string // from INFO replication: master or slave
	master string // a replica's master, host:port
	linkUp bool   // a replica's master_link_status is up
	known  int    // cluster_known_nodes
}

func clusterViews(ctx context.Context, addrs []string) []clusterView {
	views := make([]clusterView, len(addrs))
	var wg sync.WaitGroup
	for i, addr := range addrs {
		wg.Go(func() { views[i] = viewOf(ctx, addr) })
	}
	wg.Wait()
	return views
}

func viewOf(ctx context.Context, addr string) clusterView {
	v := clusterView{addr: addr}
	v.err = withClient(ctx, addr, func(ctx context.Context, c *redis.Client) error {
		info, err := c.ClusterInfo(ctx).Result()
		if err != nil {
			return err
		}
		v.info = info
		fields := infoFields(info)
		v.ok = fields["cluster_state"] == "ok" && fields["cluster_slots_ok"] == "16384"
		v.known, _ = strconv.Atoi(fields["cluster_known_nodes"])
		shards, err := c.ClusterShards(ctx).Result()
		if err != nil {
			return err
		}
		v.shards, v.sig = shardsOf(shards)
		repl, err := c.Info(ctx, "replication").Result()
		if err != nil {
			return err
		}
		r := infoFields(repl)
		v.role, v.linkUp = r["role"], r["master_link_status"] == "up"
		if v.role == "slave" {
			v.master = r["master_host"] + ":" + r["master_port"]
		}
		return nil
	})
	return v
}

// shardsOf turns CLUSTER SHARDS into the shards that serve slots, sorted
// by first slot, and a signature of who serves what.
func shardsOf(in []redis.ClusterShard) ([]ClusterShard, string) {
	var shards []ClusterShard
	for _, sh := range in {
		var s ClusterShard
		for _, n := range sh.Nodes {
			addr := net.JoinHostPort(n.IP, strconv.FormatInt(n.Port, 10))
			switch {
			case n.Role == "master":
				s.Master = addr
			case n.Health != "fail":
				// Redis 7.0 says "loading" for a replica at offset
				// 0, as any replica is until its master gets a write.
				s.Replicas = append(s.Replicas, addr)
			}
		}
		for _, r := range sh.Slots {
			s.Slots = append(s.Slots, SlotRange{int(r.Start), int(r.End)})
		}
		if len(s.Slots) > 0 {
			slices.SortFunc(s.Slots, func(a, b SlotRange) int { return a.Start - b.Start })
			slices.Sort(s.Replicas)
			shards = append(shards, s)
		}
	}
	slices.SortFunc(shards, func(a, b ClusterShard) int { return a.Slots[0].Start - b.Slots[0].Start })
	var sig strings.Builder
	for _, s := range shards {
		fmt.Fprintf(&sig, "%s:%v ", s.Master, s.Slots)
	}
	return shards, sig.String()
}

// clusterHealth checks the cluster as WaitClusterOK describes. Strict, it
// also wants every node to answer and know all the others, every node that
// is not a master to replicate one with its link up, and every master to
// have a replica: the whole topology, as the test command made it.
func clusterHealth(addrs []string, strict bool) ([]ClusterShard, error) {
	views := clusterViews(context.Background(), addrs)
	var ref *clusterView
	reachable := map[string]*clusterView{}
	for i := range views {
		v := &views[i]
		if v.err != nil {
			if strict {
				return nil, fmt.Errorf("node %s does not answer: %v", v.addr, v.err)
			}
			continue
		}
		reachable[v.addr] = v
		if !v.ok {
			f := infoFields(v.info)
			return nil, fmt.Errorf("node %s: cluster_state:%s cluster_slots_ok:%s", v.addr, f["cluster_state"], f["cluster_slots_ok"])
		}
		if ref == nil {
			ref = v
		} else if v.sig != ref.sig {
			return nil, fmt.Errorf("nodes disagree on the slots: %s has %s; %s has %s", ref.addr, ref.sig, v.addr, v.sig)
		}
	}
	if ref == nil {
		return nil, errors.New("no node answers")
	}
	replicas := map[string]int{}
	for _, s := range ref.shards {
		if reachable[s.Master] == nil {
			return nil, fmt.Errorf("master %s does not answer", s.Master)
		}
		replicas[s.Master] = 0
	}
	if !strict {
		return ref.shards, nil
	}
	for _, v := range views {
		if v.known != len(addrs) {
			return nil, fmt.Errorf("node %s knows %d nodes, want %d", v.addr, v.known, len(addrs))
		}
		if _, master := replicas[v.addr]; master {
			continue
		}
		if _, ok := replicas[v.master]; v.role != "slave" || !ok || !v.linkUp {
			return nil, fmt.Errorf("node %s is not a synced replica of a master: role %s, master %q, link up %v", v.addr, v.role, v.master, v.linkUp)
		}
		replicas[v.master]++
	}
	for m, n := range replicas {
		if n == 0 {
			return nil, fmt.Errorf("master %s has no replica", m)
		}
	}
	return ref.shards, nil
}

// infoFields parses the field:value lines of INFO or CLUSTER INFO.
func infoFields(info string) map[string]string {
	m := map[string]string{}
	for _, line := range strings.Split(info, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			m[k] = v
		}
	}
	return m
}
