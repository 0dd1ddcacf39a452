//go:build unix

package redistest

import "syscall"

// Freeze stops the server's process with SIGSTOP until Thaw (or the test's
// end): it keeps its port and its connections but answers nothing, as a
// hung host or a node cut off by the network does, so that calls to it time
// out instead of being refused. A cluster takes a frozen master for failed
// as it does a killed one (AwaitPromotion).
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

// Thaw lets a frozen server go on. A master frozen through its replica's
// promotion finds the replica in its place and becomes its replica.
func (s *Server) Thaw() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil && s.frozen {
		_ = s.proc.cmd.Process.Signal(syscall.SIGCONT)
	}
	s.frozen = false
}
