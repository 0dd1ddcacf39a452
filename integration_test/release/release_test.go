//go:build integration

package release_test

import (
	"bufio"
	"context"
	"debug/elf"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestRelease builds the release as `make release` does (both
// architectures, once) and checks what the container image relies on,
// where no container tool is installed: each binary is static (no ELF
// interpreter, no shared libraries) for its architecture, carries the time
// zone database, runs from an empty directory (-version names the version
// and commit it was stamped with, -h answers on stdout), SHA256SUMS lists
// what was built, and every COPY of the Dockerfile copies something the
// release produced. It is a package of its own, so that its compiling
// runs beside the integration package's tests, which mostly wait, rather
// than after them.
func TestRelease(t *testing.T) {
	root := moduleRoot(t)
	dist := t.TempDir()
	const version, commit = "v0.0.0-releasetest", "0123456789ab"
	cmd := exec.Command("make", "release", "DIST="+dist, "VERSION="+version, "COMMIT="+commit)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make release: %v\n%s", err, out)
	}
	machines := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}
	var built []string
	for _, prog := range []string{"throttler-worker", "throttler-enqueue"} {
		for arch, machine := range machines {
			name := prog + "-linux-" + arch
			built = append(built, name)
			checkStatic(t, filepath.Join(dist, name), machine)
		}
	}

	sums, err := os.ReadFile(filepath.Join(dist, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	var listed []string
	for _, line := range strings.Split(strings.TrimSpace(string(sums)), "\n") {
		if f := strings.Fields(line); len(f) == 2 && len(f[0]) == 64 {
			listed = append(listed, f[1])
		}
	}
	want := append(slices.Clone(built), "config.yaml")
	slices.Sort(want)
	slices.Sort(listed)
	if !slices.Equal(listed, want) {
		t.Errorf("SHA256SUMS lists %v, want %v", listed, want)
	}

	// From an empty directory, with nothing of the build around: the
	// binaries of this machine's architecture.
	if _, ok := machines[runtime.GOARCH]; runtime.GOOS == "linux" && ok {
		empty := t.TempDir()
		for _, prog := range []string{"throttler-worker", "throttler-enqueue"} {
			bin := filepath.Join(dist, prog+"-linux-"+runtime.GOARCH)
			stdout, stderr, code := run(t, empty, bin, "-version")
			if wantOut := prog + " " + version + " (commit " + commit + ", "; code != 0 || !strings.HasPrefix(stdout, wantOut) || stderr != "" {
				t.Errorf("%s -version: exit %d, stdout %q, stderr %q; want 0 and %q...", prog, code, stdout, stderr, wantOut)
			}
			stdout, stderr, code = run(t, empty, bin, "-h")
			if code != 0 || !strings.HasPrefix(stdout, "Usage") || stderr != "" {
				t.Errorf("%s -h: exit %d, stdout %.80q, stderr %q; want 0 and the usage on stdout", prog, code, stdout, stderr)
			}
			_, stderr, code = run(t, empty, bin, "-no-such-flag")
			if code != 2 || strings.Count(stderr, "flag provided but not defined") != 1 {
				t.Errorf("%s -no-such-flag: exit %d, stderr %q; want 2 and the mistake once", prog, code, stderr)
			}
		}
		// The compose file's config is valid for the release's worker.
		check := exec.Command(filepath.Join(dist, "throttler-worker-linux-"+runtime.GOARCH), "-check", "-config", filepath.Join(root, "deploy", "compose-config.yaml"))
		check.Dir, check.Env = empty, append(os.Environ(), "THROTTLER_DASHBOARD_SECRET=release-test")
		if out, err := check.CombinedOutput(); err != nil {
			t.Errorf("-check of deploy/compose-config.yaml: %v\n%s", err, out)
		}
	}

	checkDockerfile(t, filepath.Join(root, "Dockerfile"), dist, slices.Collect(func(yield func(string) bool) {
		for arch := range machines {
			if !yield(arch) {
				return
			}
		}
	}))
}

// checkStatic fails the test unless path is an ELF executable for machine
// that needs no dynamic loader or shared library, and that carries the
// time zone database (time/tzdata, for hosts and images without one).
func checkStatic(t *testing.T, path string, machine elf.Machine) {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatalf("%s: %v", filepath.Base(path), err)
	}
	defer f.Close()
	if f.Machine != machine {
		t.Errorf("%s: built for %s, want %s", filepath.Base(path), f.Machine, machine)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("%s: has a %s program header: not static", filepath.Base(path), p.Type)
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Errorf("%s: needs shared libraries %v", filepath.Base(path), libs)
	}
	// time/tzdata embeds the zones as a zip whose entries are named for
	// them; no code of ours names this zone.
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), "Antarctica/Troll") {
		t.Errorf("%s: no time zone database inside (import _ \"time/tzdata\" in its main package)", filepath.Base(path))
	}
}

// checkDockerfile fails the test unless the Dockerfile builds FROM scratch,
// runs as a numeric non-root user, and each COPY source, for every
// architecture (${TARGETARCH}), is a file the release put in dist.
func checkDockerfile(t *testing.T, path, dist string, arches []string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var from []string
	var user string
	copies := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 || strings.HasPrefix(fields[0], "#") {
			continue
		}
		switch strings.ToUpper(fields[0]) {
		case "FROM":
			from = append(from, strings.Join(fields[1:], " "))
		case "USER":
			user = fields[1]
		case "ADD":
			t.Errorf("Dockerfile: %q: ADD can fetch from anywhere; the image copies only the release", sc.Text())
		case "COPY":
			args := slices.DeleteFunc(fields[1:], func(a string) bool { return strings.HasPrefix(a, "--") })
			if len(args) < 2 {
				t.Errorf("Dockerfile: %q: a COPY needs a source and a destination", sc.Text())
				continue
			}
			for _, src := range args[:len(args)-1] {
				for _, arch := range arches {
					s := strings.NewReplacer("${TARGETARCH}", arch, "$TARGETARCH", arch, "${TARGETOS}", "linux").Replace(src)
					rel, ok := strings.CutPrefix(s, "dist/")
					if !ok || strings.Contains(rel, "/") || strings.ContainsAny(rel, "*?$") {
						t.Errorf("Dockerfile: COPY %s: not a file of dist/ (what make release produces)", src)
						break
					}
					if _, err := os.Stat(filepath.Join(dist, rel)); err != nil {
						t.Errorf("Dockerfile: COPY %s (%s): make release did not produce %s", src, arch, rel)
					}
				}
				copies++
			}
		}
	}
	if !slices.Equal(from, []string{"scratch"}) {
		t.Errorf("Dockerfile: FROM %v, want only scratch (no base image to pull)", from)
	}
	uid, _, _ := strings.Cut(user, ":")
	if uid == "" || uid == "0" || strings.Trim(uid, "0123456789") != "" {
		t.Errorf("Dockerfile: USER %q, want a numeric user other than root (scratch has no user database)", user)
	}
	if copies == 0 {
		t.Error("Dockerfile: copies nothing")
	}
}

// moduleRoot is the repository root, two directories up from this
// package's.
func moduleRoot(t *testing.T) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Dir(filepath.Dir(wd))
}

// run runs bin in dir, with a minute to finish, and returns what it wrote
// and its exit code.
func run(t *testing.T, dir, bin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = dir
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	var ee *exec.ExitError
	if err := cmd.Run(); errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("%s %s: %v", filepath.Base(bin), strings.Join(args, " "), err)
	}
	return out.String(), errb.String(), code
}
