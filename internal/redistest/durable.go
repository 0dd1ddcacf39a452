package redistest

// StartDurable is Start for a server that keeps its data across Restart and
// Kill: an append-only file in the server's dir, fsynced on every write
// ("appendfsync always"), so every write a client saw acknowledged is there
// after a restart, as on a production Redis with AOF. Extra config lines
// come after these and win.
func StartDurable(t TB, extra ...string) *Server {
	t.Helper()
	return Start(t, append([]string{"appendonly yes", "appendfsync always"}, extra...)...)
}

// StartDurableCluster is StartCluster with every node durable as
// StartDurable's server is, so that a node killed and started again
// (Cluster.Rejoin) comes back with what it had acknowledged.
func StartDurableCluster(t TB, masters, replicasPerMaster int) *Cluster {
	t.Helper()
	return StartClusterWith(t, masters, replicasPerMaster, Options{Extra: []string{"appendonly yes", "appendfsync always"}})
}
