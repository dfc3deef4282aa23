package redistest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// healWait bounds the wait for the topologies to be whole again; a Sentinel
// group takes some 10 s to turn a failed-over master into a replica.
const healWait = 45 * time.Second

// Destructive prepares a test that breaks shared servers (kills, stops or
// restarts them, fails them over): it takes the topology lock exclusive
// (see the package doc), makes sure every topology is whole before the
// test starts, and registers a cleanup that makes them whole again
// (HealTopologies). Call it first, before any other helper of this
// package. It ends the test when $HYBRIDLIMIT_REDIS_DIR is unset (Skip, or
// Fatal under CI=true).
func Destructive(t testing.TB) {
	t.Helper()
	LockTopology(t, true)
	if HealTopologies(t); t.Failed() {
		t.FailNow()
	}
	t.Cleanup(func() { HealTopologies(t) })
}

// HealTopologies resumes every stopped test server, restarts every killed
// one from its config file, and waits until every topology is whole: the
// standalone server answers; every cluster node answers, the cluster is ok
// with 3 masters each with a synced replica (a restarted master rejoins as
// a replica); the Sentinel group is stable (WaitSentinelStable; a master
// that was failed over stays a replica). The test must hold the topology
// lock exclusive. Failures are reported with t.Errorf, so that it can run
// in a cleanup.
func HealTopologies(t testing.TB) {
	t.Helper()
	dir := env(t, EnvDir, "the redis-server processes that fault tests break")
	requireExclusive(t, "HealTopologies")
	for _, s := range allServers(dir) {
		switch pid, state := s.process(); {
		case state == 'T' || state == 't':
			s.cont()
			t.Logf("redistest: heal: resumed %s (pid %d)", s.Addr, pid)
		case state == 0:
			if err := s.restart(); err != nil {
				t.Errorf("redistest: heal: restart %s: %v", s.Addr, err)
				return
			}
			t.Logf("redistest: heal: restarted %s", s.Addr)
		}
	}
	deadline := time.Now().Add(healWait)
	if addr := os.Getenv(EnvAddr); addr != "" {
		if err := poll(time.Until(deadline), func() error { return ping(addr) }); err != nil {
			t.Errorf("redistest: heal: standalone %s: %v", addr, err)
		}
	}
	if addrs := os.Getenv(EnvClusterAddrs); addrs != "" {
		err := poll(time.Until(deadline), func() error {
			_, err := clusterHealth(strings.Split(addrs, ","), true)
			return err
		})
		if err != nil {
			t.Errorf("redistest: heal: the cluster is not whole after %v: %v", healWait, err)
		}
	}
	if addrs, name := os.Getenv(EnvSentinelAddrs), os.Getenv(EnvSentinelMaster); addrs != "" && name != "" {
		err := poll(time.Until(deadline), func() error {
			_, err := sentinelHealth(strings.Split(addrs, ","), name)
			return err
		})
		if err != nil {
			t.Errorf("redistest: heal: the Sentinel group is not stable after %v: %v", healWait, err)
		}
	}
}

// allServers returns every server of dir.
func allServers(dir string) []*Server {
	var out []*Server
	m, _ := filepath.Glob(filepath.Join(dir, "*-*", "*.conf"))
	for _, conf := range m {
		if b := filepath.Base(conf); b != "redis.conf" && b != "sentinel.conf" {
			continue
		}
		d := filepath.Base(filepath.Dir(conf))
		if s, err := serverAt(dir, "127.0.0.1:"+d[strings.LastIndexByte(d, '-')+1:]); err == nil {
			out = append(out, s)
		}
	}
	return out
}
