//go:build unix

package redistest

import "syscall"

// Freeze stops the server with SIGSTOP until Thaw (or the test's end): it
// keeps its port and connections but answers nothing, as a hung host does,
// so that calls time out instead of being refused. A cluster fails over a
// frozen master as a killed one (AwaitPromotion).
func (s *Server) Freeze(t TB) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil || s.frozen {
		t.Fatalf("redistest: freeze %s: not running, or frozen already", s.Addr)
		return
	}
	if err := s.proc.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatalf("redistest: freeze %s: %v", s.Addr, err)
		return
	}
	s.frozen = true
	t.Cleanup(s.Thaw)
}

// Thaw lets a frozen server go on; a master that was replaced meanwhile
// becomes its replica's replica.
func (s *Server) Thaw() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil && s.frozen {
		_ = s.proc.cmd.Process.Signal(syscall.SIGCONT)
	}
	s.frozen = false
}
