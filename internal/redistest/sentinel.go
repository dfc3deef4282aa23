package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// SentinelAddrs returns the addresses of the test sentinels and takes the
// topology lock shared, or ends the test: Skip when the variable is unset,
// Fatal when it is unset under CI=true.
func SentinelAddrs(t testing.TB) []string {
	t.Helper()
	v := env(t, EnvSentinelAddrs, "a Sentinel group")
	LockTopology(t, false)
	return strings.Split(v, ",")
}

// SentinelMaster returns the name under which the test sentinels monitor
// their master, with the same rules as SentinelAddrs.
func SentinelMaster(t testing.TB) string {
	t.Helper()
	SentinelAddrs(t)
	return env(t, EnvSentinelMaster, "a Sentinel group")
}

// SentinelClient returns a client of the first test sentinel that answers,
// closed when the test ends.
func SentinelClient(t testing.TB) *redis.SentinelClient {
	t.Helper()
	addrs := SentinelAddrs(t)
	var err error
	for _, addr := range addrs {
		if err = ping(addr); err == nil {
			c := redis.NewSentinelClient(&redis.Options{Addr: addr, MaxRetries: -1,
				DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second})
			t.Cleanup(func() { _ = c.Close() })
			return c
		}
	}
	unreachable(t, strings.Join(addrs, ","), err)
	return nil
}

// FailoverClient returns a client of the Sentinel group's master
// (redis.NewFailoverClient: it asks the sentinels for the master, and
// follows their +switch-master), closed when the test ends, after checking
// that the master answers. Like ClientAt's, it does not retry failed
// commands, so that tests see every error.
func FailoverClient(t testing.TB) *redis.Client {
	t.Helper()
	addrs, name := SentinelAddrs(t), SentinelMaster(t)
	c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: name, SentinelAddrs: addrs,
		MaxRetries: -1, PoolSize: 64, DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second})
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		unreachable(t, name+"@"+strings.Join(addrs, ","), err)
	}
	return c
}

// WaitSentinelStable waits until the Sentinel group is whole and quiet:
// every sentinel answers and names the same master, sees it up with no
// failover in progress, sees the other sentinels and every replica up; the
// master says it is one, and every replica replicates it with its link up.
// It returns the master's address, or ends the test after timeout.
func WaitSentinelStable(t testing.TB, timeout time.Duration) string {
	t.Helper()
	addrs, name := SentinelAddrs(t), SentinelMaster(t)
	var master string
	err := poll(timeout, func() (err error) {
		master, err = sentinelHealth(addrs, name)
		return err
	})
	if err != nil {
		t.Fatalf("redistest: the Sentinel group is not stable after %v: %v", timeout, err)
	}
	return master
}

// sentinelHealth checks the group as WaitSentinelStable describes and
// returns the master.
func sentinelHealth(sentinels []string, name string) (string, error) {
	want := 1 // replicas: the data nodes of the group but one
	if dir := os.Getenv(EnvDir); dir != "" {
		m, _ := filepath.Glob(filepath.Join(dir, "data-*"))
		want = len(m) - 1
	}
	master := ""
	var replicas []string
	for _, s := range sentinels {
		err := withClient(context.Background(), s, func(ctx context.Context, c *redis.Client) error {
			sc := redis.NewSentinelClient(c.Options())
			defer sc.Close()
			a, err := sc.GetMasterAddrByName(ctx, name).Result()
			if err != nil || len(a) != 2 {
				return fmt.Errorf("get-master-addr-by-name: %v %v", a, err)
			}
			if m := net.JoinHostPort(a[0], a[1]); master == "" {
				master = m
			} else if m != master {
				return fmt.Errorf("names master %s, another sentinel %s", m, master)
			}
			info, err := sc.Master(ctx, name).Result()
			if err != nil {
				return err
			}
			if info["flags"] != "master" || info["num-other-sentinels"] != fmt.Sprint(len(sentinels)-1) || info["num-slaves"] != fmt.Sprint(want) {
				return fmt.Errorf("sees master %s with flags %s, %s other sentinels, %s replicas", master, info["flags"], info["num-other-sentinels"], info["num-slaves"])
			}
			reps, err := sc.Replicas(ctx, name).Result()
			if err != nil {
				return err
			}
			for _, r := range reps {
				addr := net.JoinHostPort(r["ip"], r["port"])
				// Only the flags: a sentinel refreshes the rest (its
				// link status, its master) from the replica's INFO
				// every 10 s; checkRole asks the replica itself.
				if r["flags"] != "slave" {
					return fmt.Errorf("sees replica %s with flags %s", addr, r["flags"])
				}
				if !slices.Contains(replicas, addr) {
					replicas = append(replicas, addr)
				}
			}
			return nil
		})
		if err != nil {
			return "", fmt.Errorf("sentinel %s: %v", s, err)
		}
	}
	if err := checkRole(master, "master", ""); err != nil {
		return "", err
	}
	for _, r := range replicas {
		if err := checkRole(r, "slave", master); err != nil {
			return "", err
		}
	}
	return master, nil
}

// checkRole checks, from INFO replication, that the server at addr has
// role, and as a replica is synced with master.
func checkRole(addr, role, master string) error {
	return withClient(context.Background(), addr, func(ctx context.Context, c *redis.Client) error {
		info, err := c.Info(ctx, "replication").Result()
		if err != nil {
			return fmt.Errorf("%s: %v", addr, err)
		}
		f := infoFields(info)
		if f["role"] != role {
			return fmt.Errorf("%s has role %s, want %s", addr, f["role"], role)
		}
		if role == "slave" && (net.JoinHostPort(f["master_host"], f["master_port"]) != master || f["master_link_status"] != "up") {
			return fmt.Errorf("replica %s: master %s:%s link %s, want master %s link up", addr, f["master_host"], f["master_port"], f["master_link_status"], master)
		}
		return nil
	})
}

// Failover describes a Sentinel failover that SentinelFailover made.
type Failover struct {
	Old, New string        // the master before and after
	Switched time.Duration // from SENTINEL FAILOVER until every sentinel names New
	Settled  time.Duration // until the group is stable, Old a synced replica of New
}

// SentinelFailover makes the sentinels fail their master over (SENTINEL
// FAILOVER), waits until every sentinel names the new master and the old
// master has become its synced replica (Sentinel converts it some 10 s
// after the switch), and returns what happened. The test must hold the
// topology lock exclusive (Destructive).
func SentinelFailover(t testing.TB) Failover {
	t.Helper()
	requireExclusive(t, "SentinelFailover")
	addrs, name := SentinelAddrs(t), SentinelMaster(t)
	f := Failover{Old: WaitSentinelStable(t, 30*time.Second)}
	sc := SentinelClient(t)
	start := time.Now()
	err := poll(10*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		return sc.Failover(ctx, name).Err() // NOGOODSLAVE or INPROG: try again
	})
	if err != nil {
		t.Fatalf("redistest: SENTINEL FAILOVER %s: %v", name, err)
	}
	err = poll(20*time.Second, func() error {
		f.New = ""
		for _, s := range addrs {
			err := withClient(context.Background(), s, func(ctx context.Context, c *redis.Client) error {
				a, err := c.Do(ctx, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", name).StringSlice()
				if err != nil || len(a) != 2 {
					return fmt.Errorf("sentinel %s: %v %v", s, a, err)
				}
				m := net.JoinHostPort(a[0], a[1])
				if m == f.Old || (f.New != "" && m != f.New) {
					return fmt.Errorf("sentinel %s names %s", s, m)
				}
				f.New = m
				return nil
			})
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("redistest: the sentinels did not switch masters after SENTINEL FAILOVER: %v", err)
	}
	f.Switched = time.Since(start)
	if m := WaitSentinelStable(t, 30*time.Second); m != f.New {
		t.Fatalf("redistest: after the failover to %s the sentinels name %s", f.New, m)
	}
	f.Settled = time.Since(start)
	t.Logf("redistest: sentinel failover %s -> %s: switched in %v, old master a synced replica after %v",
		f.Old, f.New, f.Switched.Round(time.Millisecond), f.Settled.Round(time.Millisecond))
	return f
}
