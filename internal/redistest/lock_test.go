package redistest_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hybridlimit/hybridlimit/internal/redistest"
)

// TestHelperLock is not a test: run by TestLockWritersFirst in a child
// process, it takes the topology lock as $REDISTEST_LOCK says (shared or
// exclusive), holds it for $REDISTEST_HOLD (a duration, or "stdin": until
// its standard input is closed), and prints when it got it and
// when it is about to let it go.
func TestHelperLock(t *testing.T) {
	mode := os.Getenv("REDISTEST_LOCK")
	if mode == "" {
		return
	}
	hold := os.Getenv("REDISTEST_HOLD")
	d, err := time.ParseDuration(hold)
	if err != nil && hold != "stdin" {
		t.Fatal(err)
	}
	redistest.LockTopology(t, mode == "exclusive")
	fmt.Printf("locked %d\n", time.Now().UnixNano())
	t.Cleanup(func() { fmt.Printf("releasing %d\n", time.Now().UnixNano()) }) // runs before the unlock
	if hold == "stdin" {
		_, _ = io.Copy(io.Discard, os.Stdin) // until the test closes it
		return
	}
	time.Sleep(d)
}

// lockHolder is a child process holding the topology lock of a private
// directory.
type lockHolder struct {
	cmd              *exec.Cmd
	stdin            io.WriteCloser // closing it ends a hold of -1
	locked, released chan time.Time
}

// holdLock starts a child process that takes the lock as mode says and
// holds it for hold, or, with hold -1, until its stdin is closed.
func holdLock(t *testing.T, dir, mode string, hold time.Duration) *lockHolder {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run", "^TestHelperLock$", "-test.count=1")
	h := &lockHolder{cmd: cmd, locked: make(chan time.Time, 1), released: make(chan time.Time, 1)}
	holdEnv := hold.String()
	if hold < 0 {
		holdEnv = "stdin"
		in, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		h.stdin = in
	}
	cmd.Env = append(os.Environ(), redistest.EnvDir+"="+dir, "REDISTEST_LOCK="+mode, "REDISTEST_HOLD="+holdEnv)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			what, ns, _ := strings.Cut(sc.Text(), " ")
			n, err := strconv.ParseInt(ns, 10, 64)
			if err != nil {
				continue
			}
			switch what {
			case "locked":
				h.locked <- time.Unix(0, n)
			case "releasing":
				h.released <- time.Unix(0, n)
			}
		}
	}()
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return h
}

func (h *lockHolder) wait(t *testing.T, what string, c chan time.Time) time.Time {
	t.Helper()
	select {
	case at := <-c:
		return at
	case <-time.After(20 * time.Second):
		t.Fatalf("%s: no news after 20s", what)
		return time.Time{}
	}
}

// TestLockWritersFirst checks the topology lock across processes: readers
// share it, a writer waits for the readers inside, and a reader that comes
// while a writer waits goes after the writer.
func TestLockWritersFirst(t *testing.T) {
	dir := t.TempDir()
	r1 := holdLock(t, dir, "shared", -1) // until the test lets it go
	r1Locked := r1.wait(t, "first reader locks", r1.locked)
	r2 := holdLock(t, dir, "shared", 0)
	r2Locked := r2.wait(t, "second reader locks beside the first", r2.locked)
	w := holdLock(t, dir, "exclusive", 300*time.Millisecond)
	waitGateHeld(t, dir) // w is waiting for r1, holding the gate
	r3 := holdLock(t, dir, "shared", 0)
	time.Sleep(200 * time.Millisecond) // r3 would get in now if it could
	_ = r1.stdin.Close()

	r1Released := r1.wait(t, "first reader releases", r1.released)
	wLocked := w.wait(t, "writer locks", w.locked)
	wReleased := w.wait(t, "writer releases", w.released)
	r3Locked := r3.wait(t, "third reader locks", r3.locked)
	if r2Locked.After(r1Released) {
		t.Errorf("second reader locked at +%v, after the first released at +%v: readers do not share", r2Locked.Sub(r1Locked), r1Released.Sub(r1Locked))
	}
	if wLocked.Before(r1Released) {
		t.Errorf("writer locked at +%v, before the reader released at +%v", wLocked.Sub(r1Locked), r1Released.Sub(r1Locked))
	}
	if r3Locked.Before(wReleased) {
		t.Errorf("late reader locked at +%v, before the waiting writer released at +%v", r3Locked.Sub(r1Locked), wReleased.Sub(r1Locked))
	}
}

// waitGateHeld waits until a writer holds the lock's gate: it keeps it
// while it waits, and a reader holds it only for an instant.
func waitGateHeld(t *testing.T, dir string) {
	t.Helper()
	gate, err := os.OpenFile(filepath.Join(dir, "topology.gate"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer gate.Close()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		err := syscall.Flock(int(gate.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return
		}
		if err == nil {
			_ = syscall.Flock(int(gate.Fd()), syscall.LOCK_UN)
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatal("the writer did not take the gate within 20s")
}
