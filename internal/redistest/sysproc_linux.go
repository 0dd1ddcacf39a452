//go:build linux

package redistest

import "syscall"

// sysProcAttr makes the kernel kill redis-server when the test process dies,
// so a crashed test run does not leak servers.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
