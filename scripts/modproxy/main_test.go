package main

import (
	"archive/zip"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
)

// testRepo makes a git repository with a root module, a nested module that
// requires it through a replace, a vendor directory, test data and a
// go.work, committed at a fixed committer time.
func testRepo(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git not found")
	}
	dir := t.TempDir()
	files := map[string]string{
		"go.mod":                "module example.com/m\n\ngo 1.26.0\n",
		"m.go":                  "package m\n\nfunc F() {}\n",
		"testdata/x.txt":        "data\n",
		"vendor/modules.txt":    "# nothing\n",
		"vendor/v/v.go":         "package v\n",
		"internal/i/i.go":       "package i\n",
		"sub/go.mod":            "module example.com/m/sub\n\ngo 1.26.0\n\nrequire example.com/m v0.0.0\n\nreplace example.com/m => ../\n",
		"sub/s.go":              "package sub\n",
		"other/go.mod":          "module example.com/m/other\n\ngo 1.26.0\n",
		"testdata/mod/go.mod":   "module example.com/m/testdata/mod\n\nrequire example.com/m v0.0.0\n",
		"go.work":               "go 1.26.0\n\nuse (\n\t.\n\t./sub\n)\n\nreplace example.com/m v0.0.0-20240102030405-000000000000 => ./\n",
		".gitignore":            "ignored/\n",
		"ignored/go.mod":        "module example.com/m/ignored\n\nrequire example.com/m v0.0.0\n",
		"sub/deeper/nothing.go": "package deeper\n",
	}
	for name, data := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o777); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o666); err != nil {
			t.Fatal(err)
		}
	}
	run(t, dir, "git", "init", "-q")
	run(t, dir, "git", "add", "-A")
	commitAt(t, dir, "2024-01-02T03:04:05Z", "first")
	return dir
}

func commitAt(t *testing.T, dir, when, msg string) string {
	t.Helper()
	cmd := exec.Command("git", "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "--allow-empty", "-m", msg)
	cmd.Dir = dir
	// The author time differs on purpose: the go command takes the committer's.
	cmd.Env = append(os.Environ(), "GIT_COMMITTER_DATE="+when, "GIT_AUTHOR_DATE=2001-01-01T00:00:00Z")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("git commit: %v\n%s", err, out)
	}
	return strings.TrimSpace(run(t, dir, "git", "rev-parse", "HEAD"))
}

func run(t *testing.T, dir string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		msg := ""
		if ee, ok := err.(*exec.ExitError); ok {
			msg = string(ee.Stderr)
		}
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, msg)
	}
	return string(out)
}

func TestPseudoVersionUntagged(t *testing.T) {
	dir := testRepo(t)
	hash := strings.TrimSpace(run(t, dir, "git", "rev-parse", "HEAD"))
	r := &repoDir{dir: dir}
	m, err := r.versionOf("HEAD")
	if err != nil {
		t.Fatal(err)
	}
	want := "v0.0.0-20240102030405-" + hash[:12]
	if m.Path != "example.com/m" || m.Version != want {
		t.Fatalf("versionOf(HEAD) = %v, want example.com/m@%s", m, want)
	}
	if _, err := r.check(want); err != nil {
		t.Fatalf("check(%s): %v", want, err)
	}
}

func TestPseudoVersionTags(t *testing.T) {
	dir := testRepo(t)
	r := &repoDir{dir: dir}
	run(t, dir, "git", "tag", "v0.1.0")
	run(t, dir, "git", "tag", "sub/v0.9.0") // another module's tag
	run(t, dir, "git", "tag", "v2.0.0")     // would need a /v2 module path
	run(t, dir, "git", "tag", "v0.3")       // not canonical
	second := commitAt(t, dir, "2024-02-03T04:05:06Z", "second")
	m, err := r.versionOf("HEAD")
	if err != nil {
		t.Fatal(err)
	}
	if want := "v0.1.1-0.20240203040506-" + second[:12]; m.Version != want {
		t.Fatalf("after tag v0.1.0: %s, want %s", m.Version, want)
	}
	if _, err := r.check(m.Version); err != nil {
		t.Fatalf("check(%s): %v", m.Version, err)
	}
	// The zero form stays acceptable after tagging, as for the go command.
	if _, err := r.check("v0.0.0-20240203040506-" + second[:12]); err != nil {
		t.Fatalf("check(zero-based pseudo-version): %v", err)
	}

	run(t, dir, "git", "tag", "v0.2.0-rc.1")
	third := commitAt(t, dir, "2024-03-04T05:06:07Z", "third")
	m, err = r.versionOf(third)
	if err != nil {
		t.Fatal(err)
	}
	if want := "v0.2.0-rc.1.0.20240304050607-" + third[:12]; m.Version != want {
		t.Fatalf("after tag v0.2.0-rc.1: %s, want %s", m.Version, want)
	}

	run(t, dir, "git", "tag", "-a", "-m", "release", "v0.2.0")
	m, err = r.versionOf("HEAD")
	if err != nil {
		t.Fatal(err)
	}
	if m.Version != "v0.2.0" {
		t.Fatalf("tagged commit: %s, want v0.2.0", m.Version)
	}
	if _, err := r.check("v0.2.0"); err != nil {
		t.Fatalf("check(v0.2.0): %v", err)
	}
}

func TestCheckRejects(t *testing.T) {
	dir := testRepo(t)
	hash := strings.TrimSpace(run(t, dir, "git", "rev-parse", "HEAD"))
	r := &repoDir{dir: dir}
	for _, tc := range []struct{ version, want string }{
		{"v0.0.0-20240102030406-" + hash[:12], "does not match the time"},
		{"v0.0.0-20240102030405-" + hash[:10], "not the 12-character short hash"},
		{"v0.0.0-20240102030405-0123456789ab", "is not a commit"},
		{"v0.4.1-0.20240102030405-" + hash[:12], "no tag v0.4.0"},
		{"v1.0.0-20240102030405-" + hash[:12], "must be v0"},
		{"v0.5.0", "no tag v0.5.0"},
		{"v0.0.0", "no tag v0.0.0"},
		{"master", "not a canonical module version"},
	} {
		_, err := r.check(tc.version)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("check(%s) = %v, want an error containing %q", tc.version, err, tc.want)
		}
	}
}

func TestWriteProxy(t *testing.T) {
	dir := testRepo(t)
	r := &repoDir{dir: dir}
	m, err := r.versionOf("HEAD")
	if err != nil {
		t.Fatal(err)
	}
	proxy := t.TempDir()
	zipSum, modSum, err := r.write(proxy, m)
	if err != nil {
		t.Fatal(err)
	}
	// Writing again (another nested module with the same pin) is harmless.
	if _, _, err := r.write(proxy, m); err != nil {
		t.Fatal(err)
	}
	vdir := filepath.Join(proxy, "example.com", "m", "@v")

	list, err := os.ReadFile(filepath.Join(vdir, "list"))
	if err != nil {
		t.Fatal(err)
	}
	if string(list) != m.Version+"\n" {
		t.Errorf("list = %q, want %q", list, m.Version+"\n")
	}

	var info struct {
		Version string
		Time    time.Time
	}
	data, err := os.ReadFile(filepath.Join(vdir, m.Version+".info"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &info); err != nil {
		t.Fatal(err)
	}
	if info.Version != m.Version || !info.Time.Equal(time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)) {
		t.Errorf("info = %s", data)
	}

	mod, err := os.ReadFile(filepath.Join(vdir, m.Version+".mod"))
	if err != nil {
		t.Fatal(err)
	}
	if string(mod) != "module example.com/m\n\ngo 1.26.0\n" {
		t.Errorf(".mod = %q", mod)
	}

	zr, err := zip.OpenReader(filepath.Join(vdir, m.Version+".zip"))
	if err != nil {
		t.Fatal(err)
	}
	defer zr.Close()
	var names []string
	for _, f := range zr.File {
		names = append(names, strings.TrimPrefix(f.Name, m.String()+"/"))
	}
	slices.Sort(names)
	want := []string{".gitignore", "go.mod", "go.work", "internal/i/i.go", "m.go", "testdata/x.txt"}
	if !slices.Equal(names, want) {
		t.Errorf("zip holds %q,\nwant %q (no nested modules, even in testdata/; no vendor/; nothing ignored)", names, want)
	}

	// The go command, reading the proxy, gets the same hashes.
	gocmd := exec.Command("go", "mod", "download", "-json", m.String())
	gocmd.Dir = t.TempDir()
	gocmd.Env = append(os.Environ(),
		"GOWORK=off", "GOFLAGS=-modcacherw", "GOMODCACHE="+t.TempDir(),
		"GOPROXY=file://"+filepath.ToSlash(proxy), "GONOPROXY=none", "GOPRIVATE=example.com", "GONOSUMDB=example.com")
	out, err := gocmd.Output()
	if err != nil {
		msg := ""
		if ee, ok := err.(*exec.ExitError); ok {
			msg = string(ee.Stderr)
		}
		t.Fatalf("go mod download: %v\n%s%s", err, out, msg)
	}
	var dl struct{ Version, Sum, GoModSum string }
	if err := json.Unmarshal(out, &dl); err != nil {
		t.Fatal(err)
	}
	if dl.Version != m.Version || dl.Sum != zipSum || dl.GoModSum != modSum {
		t.Errorf("go mod download: %+v; modproxy: %s %s", dl, zipSum, modSum)
	}
}

func TestPinsAndWork(t *testing.T) {
	dir := testRepo(t)
	// An untracked nested module counts too (a new one, not yet committed).
	if err := os.MkdirAll(filepath.Join(dir, "newmod"), 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "newmod", "go.mod"), []byte("module example.com/m/newmod\n\nrequire example.com/m v0.0.0-20240102030405-abcdefabcdef // indirect\n"), 0o666); err != nil {
		t.Fatal(err)
	}
	pins, err := nestedPins(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := []pin{
		{dir: "newmod", version: "v0.0.0-20240102030405-abcdefabcdef"},
		{dir: "sub", version: "v0.0.0", replace: "../"},
	}
	if !slices.Equal(pins, want) {
		t.Errorf("pins = %+v, want %+v (other/ does not require the root; testdata/ and ignored/ are not nested modules)", pins, want)
	}

	reps, err := workReplaces(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(reps) != 1 || reps[0].Old != (module.Version{Path: "example.com/m", Version: "v0.0.0-20240102030405-000000000000"}) || reps[0].New.Path != "./" {
		t.Errorf("go.work replaces = %+v", reps)
	}
}

func TestCopyWork(t *testing.T) {
	dir := testRepo(t)
	if err := os.WriteFile(filepath.Join(dir, "go.work.sum"), []byte("sums\n"), 0o666); err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	if err := copyWork(dir, out); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(out, "go.work"))
	if err != nil {
		t.Fatal(err)
	}
	wf, err := modfile.ParseWork("go.work", data, nil)
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, u := range wf.Use {
		paths = append(paths, u.Path)
	}
	for _, r := range wf.Replace {
		paths = append(paths, r.New.Path)
	}
	want := []string{dir, filepath.Join(dir, "sub"), dir}
	if !slices.Equal(paths, want) {
		t.Errorf("go.work copy: use and replace paths %q, want %q:\n%s", paths, want, data)
	}
	if sum, err := os.ReadFile(filepath.Join(out, "go.work.sum")); err != nil || string(sum) != "sums\n" {
		t.Errorf("go.work.sum copy: %q, %v", sum, err)
	}
}
