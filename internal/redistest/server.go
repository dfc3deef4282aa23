package redistest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Server is one redis-server process of the test topologies (a
// standalone server, a cluster node, a Sentinel data node or a sentinel),
// for fault tests. It lives in its own directory under
// $HYBRIDLIMIT_REDIS_DIR, with the config file it was started from and the
// pidfile it writes, so it can be found by address, signalled, and started
// again under the same port and identity.
//
// Its methods end the test on failure and must be called from the test's
// goroutine.
type Server struct {
	// Addr is the address the server listens on, host:port.
	Addr string
	// Dir is the server's directory: config file, pidfile redis.pid, log
	// redis.log and, for a cluster node, nodes.conf.
	Dir string
	// Config is the path of its config file.
	Config string
	// Sentinel tells whether the server is a sentinel.
	Sentinel bool

	t testing.TB
}

// ServerAt returns the test server listening on addr. The test must hold
// the topology lock exclusive (Destructive), since it is about to break
// the server; ServerAt ends the test when $HYBRIDLIMIT_REDIS_DIR is unset
// (Skip, or Fatal under CI=true) or no server of it listens on addr.
func ServerAt(t testing.TB, addr string) *Server {
	t.Helper()
	dir := env(t, EnvDir, "the redis-server processes that fault tests break")
	requireExclusive(t, "ServerAt")
	s, err := serverAt(dir, addr)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	s.t = t
	return s
}

// serverAt finds the directory <kind>-<port> of the server at addr in dir.
func serverAt(dir, addr string) (*Server, error) {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("server address %q: %v", addr, err)
	}
	m, _ := filepath.Glob(filepath.Join(dir, "*-"+port))
	if len(m) != 1 {
		return nil, fmt.Errorf("no test server listens on %s (found %d directories %s/*-%s)", addr, len(m), dir, port)
	}
	s := &Server{Addr: addr, Dir: m[0], Config: filepath.Join(m[0], "redis.conf")}
	if _, err := os.Stat(filepath.Join(m[0], "sentinel.conf")); err == nil {
		s.Sentinel, s.Config = true, filepath.Join(m[0], "sentinel.conf")
	}
	return s, nil
}

// PID returns the process id from the server's pidfile, or 0 when no
// redis-server serving its port runs under that id (the server was killed
// and the pidfile is stale).
func (s *Server) PID() int {
	pid, state := s.process()
	if state == 0 {
		return 0
	}
	return pid
}

// process returns the pid of the server and its state letter from
// /proc/<pid>/stat (R, S, T...), or state 0 when it does not run.
func (s *Server) process() (pid int, state byte) {
	b, err := os.ReadFile(filepath.Join(s.Dir, "redis.pid"))
	if err != nil {
		return 0, 0
	}
	pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, 0
	}
	comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	if err != nil || strings.TrimSpace(string(comm)) != "redis-server" {
		return 0, 0
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	i := bytes.LastIndexByte(stat, ')')
	if err != nil || i < 0 || i+2 >= len(stat) || stat[i+2] == 'Z' || stat[i+2] == 'X' {
		return 0, 0
	}
	// The process title is "redis-server host:port [mode]": make sure a
	// reused pid is not taken for the server.
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	_, port, _ := net.SplitHostPort(s.Addr)
	title := " " + strings.ReplaceAll(string(cmdline), "\x00", " ") + " "
	if err != nil || !strings.Contains(title, ":"+port+" ") {
		return 0, 0
	}
	return pid, stat[i+2]
}

// Kill sends SIGKILL to the server and waits until it is gone.
func (s *Server) Kill() {
	s.t.Helper()
	s.signal(syscall.SIGKILL, "SIGKILL")
	if err := poll(5*time.Second, func() error {
		if s.PID() != 0 {
			return errors.New("process still running")
		}
		return nil
	}); err != nil {
		s.t.Fatalf("redistest: kill %s: %v", s.Addr, err)
	}
}

// Stop sends SIGSTOP to the server, which then keeps its connections open
// and answers nothing, like a hung host, until Cont. A cleanup resumes it
// when the test ends.
func (s *Server) Stop() {
	s.t.Helper()
	s.signal(syscall.SIGSTOP, "SIGSTOP")
	s.t.Cleanup(s.cont)
	if err := poll(5*time.Second, func() error {
		if _, st := s.process(); st != 'T' {
			return fmt.Errorf("process state %q, want T", st)
		}
		return nil
	}); err != nil {
		s.t.Fatalf("redistest: stop %s: %v", s.Addr, err)
	}
}

// Cont sends SIGCONT to the server, resuming it after Stop.
func (s *Server) Cont() {
	s.t.Helper()
	s.signal(syscall.SIGCONT, "SIGCONT")
}

func (s *Server) cont() {
	if pid := s.PID(); pid != 0 {
		_ = syscall.Kill(pid, syscall.SIGCONT)
	}
}

func (s *Server) signal(sig syscall.Signal, name string) {
	s.t.Helper()
	pid := s.PID()
	if pid == 0 {
		s.t.Fatalf("redistest: %s to %s: the server is not running", name, s.Addr)
	}
	if err := syscall.Kill(pid, sig); err != nil {
		s.t.Fatalf("redistest: %s to %s (pid %d): %v", name, s.Addr, pid, err)
	}
}

// Restart starts the server again from its config file, after Kill, and
// waits until it answers. It comes back under the same port and, for a
// cluster node, the same node id; without persistence it comes back empty.
// test.sh stops it at the end of the run through its pidfile.
func (s *Server) Restart() {
	s.t.Helper()
	if err := s.restart(); err != nil {
		s.t.Fatalf("redistest: restart %s: %v", s.Addr, err)
	}
}

func (s *Server) restart() error {
	if pid := s.PID(); pid != 0 {
		return fmt.Errorf("it still runs (pid %d): Kill it first", pid)
	}
	args := []string{s.Config, "--daemonize", "yes"}
	if s.Sentinel {
		args = append(args, "--sentinel")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// With daemonize, redis-server forks and its parent exits at once: the
	// server outlives this test process (and is reaped by test.sh's
	// subreaper).
	if out, err := exec.CommandContext(ctx, "redis-server", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("redis-server %s: %v\n%s%s", strings.Join(args, " "), err, out, s.LogTail(20))
	}
	if err := poll(10*time.Second, func() error { return ping(s.Addr) }); err != nil {
		return fmt.Errorf("it does not answer: %v\n%s", err, s.LogTail(20))
	}
	return nil
}

// LogTail returns the last n lines of the server's log.
func (s *Server) LogTail(n int) string {
	b, err := os.ReadFile(filepath.Join(s.Dir, "redis.log"))
	if err != nil {
		return ""
	}
	lines := strings.SplitAfter(string(b), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "---- " + filepath.Join(s.Dir, "redis.log") + "\n" + strings.Join(lines, "")
}

// ping checks that the server at addr answers PING within 300 ms.
func ping(addr string) error {
	return withClient(context.Background(), addr, func(ctx context.Context, c *redis.Client) error { return c.Ping(ctx).Err() })
}

// withClient runs f with a one-off client of addr whose calls time out
// after 300 ms, and a context that ends within a second, for probes of
// servers that may be dead or stopped.
func withClient(ctx context.Context, addr string, f func(context.Context, *redis.Client) error) error {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, PoolSize: 1,
		DialTimeout: 300 * time.Millisecond, ReadTimeout: 300 * time.Millisecond, WriteTimeout: 300 * time.Millisecond})
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	return f(ctx, c)
}

// poll calls f every 50 ms until it succeeds or timeout passes, and returns
// its last error.
func poll(timeout time.Duration, f func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}
