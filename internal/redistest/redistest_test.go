package redistest_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybridlimit/internal/redistest"
)

// eventually calls f every 20 ms until it succeeds, and ends the test with
// its last error after timeout. It returns how long it took.
func eventually(t *testing.T, timeout time.Duration, what string, f func(ctx context.Context) error) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := f(ctx)
		cancel()
		if err == nil {
			return time.Since(start)
		}
		if time.Since(start) > timeout {
			t.Fatalf("%s: not after %v: %v", what, timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// role returns the role (master or slave) and, for a replica, the master
// and whether its link is up, from INFO replication.
func role(ctx context.Context, c *redis.Client) (role, master string, up bool, err error) {
	info, err := c.Info(ctx, "replication").Result()
	if err != nil {
		return "", "", false, err
	}
	f := map[string]string{}
	for _, line := range strings.Split(info, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			f[k] = v
		}
	}
	if f["role"] == "slave" {
		master = f["master_host"] + ":" + f["master_port"]
	}
	return f["role"], master, f["master_link_status"] == "up", nil
}

func TestClusterRoundTrip(t *testing.T) {
	c := redistest.ClusterClient(t)
	ctx := context.Background()
	shards := redistest.WaitClusterOK(t, 10*time.Second)
	if len(shards) != 3 {
		t.Fatalf("%d masters, want 3: %+v", len(shards), shards)
	}
	if n := len(redistest.ClusterAddrs(t)); n != 6 {
		t.Fatalf("%s names %d nodes, want 6", redistest.EnvClusterAddrs, n)
	}
	pfx := redistest.Prefix(t)
	for _, s := range shards {
		key := s.Key(pfx + ":")
		if m, err := redistest.MasterForKey(ctx, c, key); err != nil || m != s.Master {
			t.Fatalf("MasterForKey(%q) = %s, %v; want %s", key, m, err, s.Master)
		}
		want := "on " + s.Master
		if err := c.Set(ctx, key, want, time.Minute).Err(); err != nil {
			t.Fatalf("SET %s through the cluster client: %v", key, err)
		}
		if got, err := c.Get(ctx, key).Result(); err != nil || got != want {
			t.Fatalf("GET %s through the cluster client = %q, %v; want %q", key, got, err, want)
		}
		// The key is on the master that serves its slot, not elsewhere.
		if got, err := redistest.ClientAt(t, s.Master).Get(ctx, key).Result(); err != nil || got != want {
			t.Fatalf("GET %s on master %s = %q, %v; want %q", key, s.Master, got, err, want)
		}
		c.Del(ctx, key)
	}
}

func TestClusterMasterKill(t *testing.T) {
	redistest.Destructive(t)
	ctx := context.Background()
	c := redistest.ClusterClient(t)
	victim := redistest.WaitClusterOK(t, 10*time.Second)[0]
	if len(victim.Replicas) != 1 {
		t.Fatalf("master %s has replicas %v, want one", victim.Master, victim.Replicas)
	}
	heir := redistest.ClientAt(t, victim.Replicas[0])
	key := victim.Key(redistest.Prefix(t) + ":")

	// A key written, and replicated, before the master dies survives it.
	conn := redistest.ClientAt(t, victim.Master).Conn()
	defer conn.Close()
	if err := conn.Set(ctx, key, "before", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := conn.Wait(ctx, 1, time.Second).Result(); err != nil || n != 1 {
		t.Fatalf("WAIT 1: %d replicas, %v", n, err)
	}

	srv := redistest.ServerAt(t, victim.Master)
	start := time.Now()
	srv.Kill()
	promoted := eventually(t, 15*time.Second, "the replica takes over", func(ctx context.Context) error {
		if r, _, _, err := role(ctx, heir); err != nil || r != "master" {
			return fmt.Errorf("replica %s: role %q, %v", victim.Replicas[0], r, err)
		}
		return nil
	})
	redistest.WaitClusterOK(t, 15*time.Second)
	ok := time.Since(start)
	c.ReloadState(ctx)
	served := eventually(t, 10*time.Second, "the cluster client serves the key again", func(ctx context.Context) error {
		got, err := c.Get(ctx, key).Result()
		if err == nil && got != "before" {
			err = fmt.Errorf("got %q, want %q", got, "before")
		}
		return err
	})
	t.Logf("master %s killed: replica %s promoted after %v, cluster ok after %v, client served after %v",
		victim.Master, victim.Replicas[0], promoted.Round(time.Millisecond), ok.Round(time.Millisecond), (ok + served).Round(time.Millisecond))
	if m, err := redistest.MasterForKey(ctx, c, key); err != nil || m != victim.Replicas[0] {
		t.Fatalf("after the failover the key is on %s (%v), want %s", m, err, victim.Replicas[0])
	}

	// The old master comes back empty and rejoins as the new master's replica.
	start = time.Now()
	srv.Restart()
	old := redistest.ClientAt(t, victim.Master)
	eventually(t, 20*time.Second, "the old master rejoins as a replica", func(ctx context.Context) error {
		if r, m, up, err := role(ctx, old); err != nil || r != "slave" || m != victim.Replicas[0] || !up {
			return fmt.Errorf("%s: role %q of %q, link up %v, %v", victim.Master, r, m, up, err)
		}
		return nil
	})
	rejoined := time.Since(start)
	redistest.WaitClusterOK(t, 15*time.Second)
	t.Logf("old master restarted: a synced replica after %v, cluster ok after %v", rejoined.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	if err := c.Set(ctx, key, "after", time.Minute).Err(); err != nil {
		t.Fatalf("SET after the old master rejoined: %v", err)
	}
}

func TestSentinelFailover(t *testing.T) {
	redistest.Destructive(t)
	ctx := context.Background()
	fc := redistest.FailoverClient(t)
	pfx := redistest.Prefix(t)

	conn := fc.Conn()
	defer conn.Close()
	if err := conn.Set(ctx, pfx+":before", "1", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := conn.Wait(ctx, 1, time.Second).Result(); err != nil || n != 1 {
		t.Fatalf("WAIT 1: %d replicas, %v", n, err)
	}
	conn.Close()

	f := redistest.SentinelFailover(t)
	if f.New == f.Old || f.New == "" {
		t.Fatalf("failover from %s to %q", f.Old, f.New)
	}

	// The failover client follows: its first write lands on the new master.
	if err := fc.Set(ctx, pfx+":after", "2", time.Minute).Err(); err != nil {
		t.Fatalf("SET through the failover client after the failover: %v", err)
	}
	newMaster := redistest.ClientAt(t, f.New)
	for k, want := range map[string]string{pfx + ":before": "1", pfx + ":after": "2"} {
		if got, err := newMaster.Get(ctx, k).Result(); err != nil || got != want {
			t.Fatalf("GET %s on the new master %s = %q, %v; want %q", k, f.New, got, err, want)
		}
	}
	if r, _, _, err := role(ctx, newMaster); err != nil || r != "master" {
		t.Fatalf("new master %s: role %q, %v", f.New, r, err)
	}
	if r, m, up, err := role(ctx, redistest.ClientAt(t, f.Old)); err != nil || r != "slave" || m != f.New || !up {
		t.Fatalf("old master %s: role %q of %q, link up %v, %v", f.Old, r, m, up, err)
	}
}

func TestStandaloneStopCont(t *testing.T) {
	redistest.Destructive(t)
	addr := redistest.Addr(t)
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1,
		DialTimeout: 200 * time.Millisecond, ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond})
	defer c.Close()
	call := func() (time.Duration, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		start := time.Now()
		err := c.Ping(ctx).Err()
		return time.Since(start), err
	}
	if _, err := call(); err != nil {
		t.Fatalf("PING before the stop: %v", err)
	}

	srv := redistest.ServerAt(t, addr)
	srv.Stop()
	took, err := call()
	if err == nil {
		t.Fatal("PING answered while the server is stopped")
	}
	if took > time.Second {
		t.Fatalf("PING failed after %v, want about 200ms", took)
	}
	t.Logf("PING to the stopped server failed after %v: %v", took.Round(time.Millisecond), err)

	srv.Cont()
	if took, err := call(); err != nil {
		t.Fatalf("PING after SIGCONT: %v (after %v)", err, took)
	}
}

// TestFailsUnderCIWithoutTopology runs the tests above in a child process
// without the topology's variables: they must fail under CI=true and skip
// otherwise.
func TestFailsUnderCIWithoutTopology(t *testing.T) {
	tests := []string{"TestClusterRoundTrip", "TestClusterMasterKill", "TestSentinelFailover", "TestStandaloneStopCont"}
	for _, ci := range []string{"true", ""} {
		cmd := exec.Command(os.Args[0], "-test.run", "^("+strings.Join(tests, "|")+")$", "-test.v", "-test.count=1")
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, "HYBRIDLIMIT_") && !strings.HasPrefix(kv, "CI=") {
				cmd.Env = append(cmd.Env, kv)
			}
		}
		cmd.Env = append(cmd.Env, "CI="+ci)
		out, err := cmd.CombinedOutput()
		want := "SKIP"
		if ci == "true" {
			want = "FAIL"
			if err == nil {
				t.Errorf("CI=true without a topology: the tests passed:\n%s", out)
			}
		} else if err != nil {
			t.Errorf("CI unset without a topology: %v\n%s", err, out)
		}
		for _, name := range tests {
			if !strings.Contains(string(out), "--- "+want+": "+name+" ") {
				t.Errorf("CI=%q without a topology: %s does not %s:\n%s", ci, name, want, out)
			}
		}
	}
}
