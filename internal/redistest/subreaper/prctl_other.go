//go:build !linux

package main

import "errors"

// becomeSubreaper fails: only Linux has child subreapers. The command
// still runs; orphans are left to PID 1.
func becomeSubreaper() error { return errors.New("child subreapers need Linux") }
