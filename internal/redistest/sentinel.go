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
		err := withSentinel(s, func(ctx context.Context, sc *redis.SentinelClient) error {
			m, err := masterAddr(ctx, sc, name)
			if err != nil {
				return err
			}
			if master == "" {
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
	Switched time.Duration // from the first SENTINEL FAILOVER until every sentinel names New
	Settled  time.Duration // until the group is stable, Old a synced replica of New
	Issued   int           // the SENTINEL FAILOVER commands that a sentinel accepted
}

// failoverSwitchTimeout bounds SentinelFailover's wait from its first
// SENTINEL FAILOVER until every sentinel names the new master: room for a
// failover that aborts (failover-timeout, 5 s in scripts/redis-topology.sh)
// and a second one, or for a sentinel that learns the switch late.
const failoverSwitchTimeout = 40 * time.Second

// failoverRetryAfter is how long the sentinels must have shown no failover
// in progress, and named the old master, before SentinelFailover issues
// SENTINEL FAILOVER again.
const failoverRetryAfter = time.Second

// SentinelFailover makes the sentinels fail their master over (SENTINEL
// FAILOVER), waits until every sentinel names the new master and the old
// master has become its synced replica (Sentinel converts it some 10 s
// after the switch), and returns what happened. The test must hold the
// topology lock exclusive (Destructive).
//
// A failover can end without a switch: the sentinel that runs it aborts it
// when the replica does not report itself master within the failover
// timeout (-failover-abort-slave-timeout in its log; the sentinels turn a
// replica promoted too late back into a replica of the old master some 8 s
// later), or when it finds no replica fit to promote; and a sentinel in
// TILT mode (its timer ran more than 2 s late, as on a starved machine)
// acts on nothing for 30 s. Every sentinel then keeps naming the old
// master, which is up, so nothing starts another failover. So while no
// sentinel outside TILT has a failover in progress and every
// sentinel that answers still names the old master, SentinelFailover
// issues SENTINEL FAILOVER again (a forced failover starts at once), to
// the next sentinel outside TILT. When some sentinels name the new master
// and others still the old one, it waits for the laggards: they learn the
// switch from the hello messages that the sentinels publish every 2 s on
// the servers. The whole wait is bounded by failoverSwitchTimeout; past it
// the test fails, with what each sentinel says and the end of its log.
func SentinelFailover(t testing.TB) Failover {
	t.Helper()
	requireExclusive(t, "SentinelFailover")
	addrs, name := SentinelAddrs(t), SentinelMaster(t)
	f := Failover{Old: WaitSentinelStable(t, 30*time.Second)}
	start := time.Now()
	deadline := start.Add(failoverSwitchTimeout)
	var (
		target  = -1      // index in addrs of the sentinel last sent SENTINEL FAILOVER
		lastErr error     // its reply
		idle    time.Time // since when the group is stuck (see stuck); zero: it is not
	)
	for {
		views := sentinelViews(addrs, name)
		if m, ok := switched(views, f.Old); ok {
			f.New = m
			break
		}
		now := time.Now()
		if now.After(deadline) {
			for _, v := range views {
				t.Logf("redistest: sentinel %s: %s\n%s", v.addr, v, sentinelLogTail(v.addr, 20))
			}
			t.Fatalf("redistest: the sentinels did not switch from master %s to one new master within %v of the first SENTINEL FAILOVER (%s): %s",
				f.Old, failoverSwitchTimeout, issued(f.Issued, addrs, target, lastErr), describeViews(views))
		}
		if !stuck(views, f.Old) {
			idle = time.Time{}
		} else if idle.IsZero() {
			idle = now
		}
		// The first SENTINEL FAILOVER goes at once; another only once the
		// group has stayed stuck for failoverRetryAfter.
		if !idle.IsZero() && (target < 0 || now.Sub(idle) >= failoverRetryAfter) {
			if next := nextTarget(views, target); next >= 0 {
				if target >= 0 {
					t.Logf("redistest: after %v no sentinel runs a failover and every one that answers names the old master %s (%s; SENTINEL FAILOVER %s): SENTINEL FAILOVER again, to %s",
						now.Sub(start).Round(time.Millisecond), f.Old, describeViews(views), issued(f.Issued, addrs, target, lastErr), addrs[next])
				}
				target, lastErr = next, failover(addrs[next], name)
				if lastErr == nil {
					f.Issued++
				}
				idle = time.Time{} // whatever the reply (OK, NOGOODSLAVE, INPROG), look again first
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	f.Switched = time.Since(start)
	if m := WaitSentinelStable(t, 30*time.Second); m != f.New {
		t.Fatalf("redistest: after the failover to %s the sentinels name %s", f.New, m)
	}
	f.Settled = time.Since(start)
	t.Logf("redistest: sentinel failover %s -> %s: switched in %v (SENTINEL FAILOVER accepted %d time(s)), old master a synced replica after %v",
		f.Old, f.New, f.Switched.Round(time.Millisecond), f.Issued, f.Settled.Round(time.Millisecond))
	return f
}

// sentinelView is what one sentinel says of the group's master.
type sentinelView struct {
	addr   string
	master string // GET-MASTER-ADDR-BY-NAME
	flags  string // SENTINEL MASTER: failover_in_progress while it runs one
	tilt   bool   // INFO sentinel: in TILT mode, acting on nothing
	err    error  // it did not answer
}

func (v sentinelView) String() string {
	if v.err != nil {
		return v.err.Error()
	}
	s := "names " + v.master + ", flags " + v.flags
	if v.tilt {
		s += ", in TILT mode"
	}
	return s
}

// failingOver tells whether the sentinel runs a failover that may still
// switch masters: one in progress, outside TILT mode.
func (v sentinelView) failingOver() bool {
	return v.err == nil && !v.tilt && slices.Contains(strings.Split(v.flags, ","), "failover_in_progress")
}

// sentinelViews asks every sentinel what it says of the master name.
func sentinelViews(addrs []string, name string) []sentinelView {
	views := make([]sentinelView, len(addrs))
	for i, s := range addrs {
		v := &views[i]
		v.addr = s
		err := withSentinel(s, func(ctx context.Context, sc *redis.SentinelClient) (err error) {
			if v.master, err = masterAddr(ctx, sc, name); err != nil {
				return err
			}
			m, err := sc.Master(ctx, name).Result()
			if err != nil {
				return fmt.Errorf("sentinel master: %v", err)
			}
			v.flags = m["flags"]
			info := redis.NewStringCmd(ctx, "info", "sentinel")
			if err := sc.Process(ctx, info); err != nil {
				return fmt.Errorf("info sentinel: %v", err)
			}
			v.tilt = infoFields(info.Val())["sentinel_tilt"] == "1"
			return nil
		})
		if err != nil {
			v.err = fmt.Errorf("does not answer: %v", err)
		}
	}
	return views
}

// switched returns the master that every sentinel names, when they all
// answer and name the same one, other than old.
func switched(views []sentinelView, old string) (string, bool) {
	m := ""
	for _, v := range views {
		if v.err != nil || v.master == old || (m != "" && v.master != m) {
			return "", false
		}
		m = v.master
	}
	return m, m != ""
}

// stuck tells whether nothing will switch the sentinels from old without a
// new SENTINEL FAILOVER: a majority answers, all of those name old, and
// none runs a failover outside TILT mode.
func stuck(views []sentinelView, old string) bool {
	answered := 0
	for _, v := range views {
		if v.err != nil {
			continue
		}
		if v.master != old || v.failingOver() {
			return false
		}
		answered++
	}
	return answered > len(views)/2
}

// nextTarget returns the index of the sentinel to send SENTINEL FAILOVER
// to: the first one after last that answers and is outside TILT mode, or
// -1 when none is.
func nextTarget(views []sentinelView, last int) int {
	for i := 1; i <= len(views); i++ {
		j := (last + i) % len(views) // last is -1 before the first
		if views[j].err == nil && !views[j].tilt {
			return j
		}
	}
	return -1
}

// failover sends SENTINEL FAILOVER name to the sentinel at addr.
func failover(addr, name string) error {
	return withSentinel(addr, func(ctx context.Context, sc *redis.SentinelClient) error {
		return sc.Failover(ctx, name).Err()
	})
}

// withSentinel runs f with a client of the sentinel at addr (see
// withClient).
func withSentinel(addr string, f func(context.Context, *redis.SentinelClient) error) error {
	return withClient(context.Background(), addr, func(ctx context.Context, c *redis.Client) error {
		sc := redis.NewSentinelClient(c.Options())
		defer sc.Close()
		return f(ctx, sc)
	})
}

// masterAddr returns the address of the master the sentinel names name.
func masterAddr(ctx context.Context, sc *redis.SentinelClient, name string) (string, error) {
	a, err := sc.GetMasterAddrByName(ctx, name).Result()
	if err != nil || len(a) != 2 {
		return "", fmt.Errorf("get-master-addr-by-name: %v %v", a, err)
	}
	return net.JoinHostPort(a[0], a[1]), nil
}

// issued describes the SENTINEL FAILOVER commands sent, for a failure
// message.
func issued(n int, addrs []string, last int, lastErr error) string {
	switch {
	case last < 0:
		return "none sent: no sentinel outside TILT mode answered"
	case lastErr != nil:
		return fmt.Sprintf("accepted %d time(s); the last, to %s, answered %v", n, addrs[last], lastErr)
	default:
		return fmt.Sprintf("accepted %d time(s), the last by %s", n, addrs[last])
	}
}

// describeViews joins what the sentinels say, for a message.
func describeViews(views []sentinelView) string {
	s := make([]string, len(views))
	for i, v := range views {
		s[i] = "sentinel " + v.addr + " " + v.String()
	}
	return strings.Join(s, "; ")
}

// sentinelLogTail returns the last n lines of the log of the sentinel at
// addr, or "" when $HYBRIDLIMIT_REDIS_DIR does not hold it.
func sentinelLogTail(addr string, n int) string {
	dir := os.Getenv(EnvDir)
	if dir == "" {
		return ""
	}
	s, err := serverAt(dir, addr)
	if err != nil {
		return ""
	}
	return s.LogTail(n)
}
