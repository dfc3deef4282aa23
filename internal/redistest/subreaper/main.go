// Command subreaper runs a command as a Linux child subreaper: every
// process that the command leaves behind (a redis-server that a test
// restarted with daemonize, whose parent has exited) becomes our child
// instead of PID 1's, and we reap it when it dies. Without it, in a
// container whose PID 1 does not reap orphans, every server a test killed
// would stay in the process table as a zombie.
//
// scripts/test.sh runs itself under it:
//
//	go run ./internal/redistest/subreaper bash scripts/test.sh
//
// It exits with the command's status (128+n when a signal n ended it) once
// the command has exited; descendants still running then are left to PID 1.
// SIGTERM and SIGHUP are passed on to the command; SIGINT is not, because
// the terminal sends it to the whole process group already.
package main

import (
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: subreaper command [argument...]")
		os.Exit(2)
	}
	if err := becomeSubreaper(); err != nil {
		fmt.Fprintln(os.Stderr, "subreaper:", err)
	}
	path, err := exec.LookPath(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "subreaper:", err)
		os.Exit(127)
	}
	// Started with os.StartProcess and never Waited through os.Process:
	// the loop below reaps every child with wait4(-1), the command included.
	p, err := os.StartProcess(path, os.Args[1:], &os.ProcAttr{Files: []*os.File{os.Stdin, os.Stdout, os.Stderr}})
	if err != nil {
		fmt.Fprintln(os.Stderr, "subreaper:", err)
		os.Exit(127)
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGINT)
	go func() {
		for s := range sigs {
			if s != syscall.SIGINT {
				_ = p.Signal(s)
			}
		}
	}()
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, 0, nil)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "subreaper: wait:", err)
			os.Exit(1)
		}
		if pid != p.Pid {
			continue // an orphan: reaped, nothing else to do
		}
		reapDead()
		switch {
		case ws.Exited():
			os.Exit(ws.ExitStatus())
		case ws.Signaled():
			os.Exit(128 + int(ws.Signal()))
		}
		os.Exit(1)
	}
}

// reapDead reaps the children that have already exited, without waiting
// for the others.
func reapDead() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}
