package redistest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// lockWait bounds the wait for the topology lock: a fault test waits for
// the tests already running in other packages, which may take a while.
const lockWait = 4 * time.Minute

// held records, per test name, the topology locks this process holds, so
// that a test and its subtests take the lock once.
var held = struct {
	sync.Mutex
	m map[string]bool // test name -> exclusive
}{m: map[string]bool{}}

// LockTopology takes the cross-process lock on the shared test servers
// until the end of the test: shared for a test that only uses them,
// exclusive for a test that breaks them (see the package doc). Taking it
// again in the same test or in a subtest of its holder does nothing; asking
// exclusive while holding it shared is a test bug and fails.
//
// Without $HYBRIDLIMIT_REDIS_DIR there is nothing to share: the shared
// lock is a no-op, and the exclusive one ends the test (Skip, or Fatal
// under CI=true), since fault tests need the servers' processes.
func LockTopology(t testing.TB, exclusive bool) {
	t.Helper()
	dir := os.Getenv(EnvDir)
	if dir == "" {
		if exclusive {
			env(t, EnvDir, "the redis-server processes that fault tests break")
		}
		return
	}
	name := t.Name()
	if ex, ok := heldBy(name); ok {
		if exclusive && !ex {
			t.Fatalf("redistest: %s holds the topology lock shared and asks for it exclusive: call Destructive (or LockTopology(t, true)) before any other redistest helper", name)
		}
		return
	}
	start := time.Now()
	f, err := acquire(t, dir, exclusive)
	if err != nil {
		t.Fatalf("redistest: topology lock (exclusive=%v): %v", exclusive, err)
	}
	if waited := time.Since(start); waited > time.Second {
		t.Logf("redistest: waited %v for the topology lock (exclusive=%v)", waited.Round(time.Millisecond), exclusive)
	}
	held.Lock()
	held.m[name] = exclusive
	held.Unlock()
	t.Cleanup(func() {
		held.Lock()
		delete(held.m, name)
		held.Unlock()
		_ = f.Close() // releases the lock
	})
}

// heldBy reports whether the test name or one of its parents holds the
// topology lock, and how.
func heldBy(name string) (exclusive, ok bool) {
	held.Lock()
	defer held.Unlock()
	for n, ex := range held.m {
		if n == name || strings.HasPrefix(name, n+"/") {
			return ex, true
		}
	}
	return false, false
}

// requireExclusive fails the test unless it holds the topology lock
// exclusive.
func requireExclusive(t testing.TB, what string) {
	t.Helper()
	if ex, ok := heldBy(t.Name()); !ok || !ex {
		t.Fatalf("redistest: %s breaks shared servers: call Destructive(t) (or LockTopology(t, true)) first", what)
	}
}

// acquire takes the lock file in dir, shared or exclusive, and returns it
// open: closing it releases the lock.
//
// A second file, the gate, gives waiting writers priority: a reader holds
// the gate only for the instant it takes the lock, a writer keeps it while
// it waits, so no new reader gets in while the running ones finish.
func acquire(t testing.TB, dir string, exclusive bool) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, "topology.lock"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	w := waiter{t: t, exclusive: exclusive, start: time.Now()}
	for {
		ok, err := acquireThroughGate(dir, f, exclusive, &w)
		if ok {
			return f, nil
		}
		if err == nil {
			err = w.wait()
		}
		if err != nil {
			_ = f.Close()
			return nil, err
		}
	}
}

// acquireThroughGate makes one attempt at taking the gate and then f; a
// writer that gets the gate keeps it until it has f.
func acquireThroughGate(dir string, f *os.File, exclusive bool, w *waiter) (bool, error) {
	gate, err := os.OpenFile(filepath.Join(dir, "topology.gate"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return false, err
	}
	defer gate.Close() // releases the gate
	if ok, err := flock(gate, syscall.LOCK_EX); !ok || err != nil {
		return false, err
	}
	if !exclusive {
		return flock(f, syscall.LOCK_SH)
	}
	for {
		if ok, err := flock(f, syscall.LOCK_EX); ok || err != nil {
			return ok, err
		}
		if err := w.wait(); err != nil {
			return false, err
		}
	}
}

// waiter paces the polling for the lock, tells the test log that it waits
// now and then, and gives up after lockWait.
type waiter struct {
	t         testing.TB
	exclusive bool
	start     time.Time
	logged    time.Duration
}

func (w *waiter) wait() error {
	waited := time.Since(w.start)
	if waited > lockWait {
		return fmt.Errorf("still held by other tests after %v", lockWait)
	}
	if waited-w.logged >= 20*time.Second {
		w.logged = waited
		w.t.Logf("redistest: waiting for the topology lock (exclusive=%v) for %v", w.exclusive, waited.Round(time.Second))
	}
	time.Sleep(10 * time.Millisecond)
	return nil
}

// flock tries once to take f with how, without blocking.
func flock(f *os.File, how int) (bool, error) {
	err := syscall.Flock(int(f.Fd()), how|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) || errors.Is(err, syscall.EINTR) {
		return false, nil
	}
	return err == nil, err
}
