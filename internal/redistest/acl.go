package redistest

import (
	"bufio"
	"os"
	"strings"
)

// RecommendedACL returns the rules of the ACL user that the config file at
// path recommends (config.yaml's comment block that starts "#   user
// <user> "), joined onto one line as redis.conf's user directive takes it,
// with password for CHANGE-ME: tests log in as exactly the user the
// documentation tells operators to create.
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
