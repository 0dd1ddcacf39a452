package redistest

import (
	"bufio"
	"os"
	"strings"
)

// RecommendedACL returns, as redis.conf's user directive takes it, the ACL
// user that the config file at path recommends in its comment block
// starting "#   user <user> ", with password for CHANGE-ME: tests log in
// as exactly the user operators are told to create.
func RecommendedACL(t TB, path, user, password string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("redistest: %v", err)
		return ""
	}
	defer f.Close()
	var parts []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(line, "#   user "+user+" "):
			parts = append(parts, strings.TrimPrefix(line, "#   user "))
		case len(parts) > 0 && strings.HasPrefix(line, "#     "):
			parts = append(parts, strings.TrimPrefix(line, "#     "))
		case len(parts) > 0:
			return strings.Replace(strings.Join(parts, " "), ">CHANGE-ME", ">"+password, 1)
		}
	}
	t.Fatalf("redistest: %s has no line starting with %q", path, "#   user "+user+" ")
	return ""
}
