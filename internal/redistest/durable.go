package redistest

// StartDurable is Start for a server that keeps every acknowledged write
// across Restart and Kill, as a production Redis with AOF does
// ("appendfsync always"). extra comes after and wins.
func StartDurable(t TB, extra ...string) *Server {
	t.Helper()
	return Start(t, append([]string{"appendonly yes", "appendfsync always"}, extra...)...)
}

// StartDurableCluster is StartCluster with every node durable, so that a
// node killed and started again (Cluster.Rejoin) keeps what it acknowledged.
func StartDurableCluster(t TB, masters, replicasPerMaster int) *Cluster {
	t.Helper()
	return StartClusterWith(t, masters, replicasPerMaster, Options{Extra: []string{"appendonly yes", "appendfsync always"}})
}
